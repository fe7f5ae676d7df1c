"""Synthesis parses Python in threads: every parse takes a turn (pipeline/synthesis/pyparse.py)."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

from pipeline.synthesis import pyparse

SYNTHESIS = Path(__file__).resolve().parent.parent / "pipeline" / "synthesis"


def test_parses_from_many_threads_take_turns(monkeypatch):
    inside, most, lock = 0, 0, threading.Lock()

    def slow_parse(source, filename):
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.01)  # the GIL is free here: without the turn-taking lock, the others would come in
        with lock:
            inside -= 1
        return ast.Module(body=[], type_ignores=[])

    monkeypatch.setattr(pyparse.ast, "parse", slow_parse)
    threads = [threading.Thread(target=pyparse.parse_python, args=("x = 1",)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1


def test_synthesis_parses_only_through_the_lock():
    direct = [p.name for p in SYNTHESIS.glob("*.py") if p.name != "pyparse.py" and "ast.parse(" in p.read_text()]
    assert direct == []
    assert isinstance(pyparse.parse_python("def f():\n    return 1\n").body[0], ast.FunctionDef)
