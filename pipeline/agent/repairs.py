"""The heuristic policy's one-line repairs: the inverse of common bugs (a flipped comparison, `and`/`or`, a
stray `not`, a constant off by one, ...) applied to the code lines of what it viewed."""

from __future__ import annotations

import re
from typing import Iterator

REPAIRS = [  # (pattern, replacement): each applied at one match at a time
    (r"==", "!="), (r"!=", "=="), (r"<=", "<"), (r">=", ">"), (r"(?<![<>=!-])<(?![<=])", "<="),
    (r"(?<![<>=!-])>(?![>=])", ">="), (r"(?<![<>=!-])<(?![<=])", ">="), (r"(?<![<>=!-])>(?![>=])", "<="),
    (r"\bis not\b", "is"), (r"\bis\b(?! not)", "is not"), (r"\bnot in\b", "in"), (r"\band\b", "or"),
    (r"\bor\b", "and"), (r"\bnot ", ""), (r"\b(if|while|elif) (?!not )", r"\1 not "), (r"\bTrue\b", "False"),
    (r"\bFalse\b", "True"), (r" \+ ", " - "), (r" - ", " + "), (r" \* ", " // "), (r" // ", " * "),
]


def code_lines(lines: dict[int, str], function_start: int = 0) -> list[int]:
    """Line numbers holding code: no docstrings, comments or blank lines; within the function if given."""
    out, in_string = [], False
    indent = None
    for number in sorted(lines):
        text = lines[number]
        stripped = text.strip()
        if function_start and number > function_start and stripped and indent is not None \
                and len(text) - len(text.lstrip()) <= indent:
            break  # the function ended
        if number == function_start:
            indent = len(text) - len(text.lstrip())
        quotes = stripped.count('"""') + stripped.count("'''")
        if in_string or quotes:
            in_string = in_string != (quotes % 2 == 1)
            continue
        if _is_code(text):
            out.append(number)
    return out


def line_repairs(line: str) -> Iterator[str]:
    """Every single-edit variant of a line under the repair patterns."""
    seen = {line}
    for pattern, replacement in REPAIRS:
        for match in re.finditer(pattern, line):
            new = line[: match.start()] + match.expand(replacement) + line[match.end():]
            if new not in seen:
                seen.add(new)
                yield new
    for match in re.finditer(r"(?<![\w.])(\d+)(?![\w.])", line):
        n = int(match.group(1))
        for m in (n + 1, n - 1):
            new = line[: match.start()] + str(m) + line[match.end():]
            if m >= 0 and new not in seen:
                seen.add(new)
                yield new


def _is_code(text: str) -> bool:
    stripped = text.strip()
    return bool(stripped) and not stripped.startswith(("#", '"', "'", "def ", "class ", "@"))
