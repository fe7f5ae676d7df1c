"""`ast.parse` for code that runs in threads (synthesis validates candidates on several sandboxes at once).

CPython 3.11 keeps the AST constructor's recursion depth in state every thread shares: two threads parsing at
once can fail with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905), which
aborted a whole synthesis. One lock makes the parses take turns; a parse holds the GIL anyway.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    with _LOCK:
        return ast.parse(source, filename)
