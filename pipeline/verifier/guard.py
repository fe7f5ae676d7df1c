"""What a candidate patch may not change, and what in it looks like tampering with the tests.

The verifier decides on the tree the tests will see. The paths a patch touches are the ones
git itself reads from it (`git apply --numstat`), never a parse of our own; each protected
path is put back as it was before the patch. Static flags mark source that can still reach
into the test run from inside (pytest internals, exit hooks, forged verdicts).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from pipeline.core.records import Task

TEST_DIRS = {"test", "tests", "testing"}
# Files pytest reads for its configuration, or Python loads before any test: a change can fake a pass.
TEST_SUPPORT = {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py",
                "sitecustomize.py", "usercustomize.py", ".gitattributes"}
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".egg")
COMPILED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")
MODULE_SUFFIX = re.compile(r"(\.cpython-[^.]*|\.abi3)?\.(py|pyc|pyo|so|pyd)$")

SUSPICIOUS = {
    "imports pytest internals": re.compile(r"\b_pytest\b"),
    "defines a pytest hook": re.compile(r"\bdef\s+pytest_\w+|\bpytest_plugins\b|\bhookimpl\b"),
    "imports pytest from source": re.compile(r"^\s*(import\s+pytest\b|from\s+pytest\b)"),
    "ends the process with os._exit": re.compile(r"\b_exit\s*\("),
    "registers an exit hook": re.compile(r"\batexit\b"),
    "touches sys.modules": re.compile(r"\bsys\s*\.\s*modules\b"),
    "prints a test verdict": re.compile(r"\b(PASSED|FAILED|XPASS|XFAIL)\b"),
    "writes a harness marker": re.compile(r">>>>>"),
}


def is_test_path(path: str, task: Task) -> bool:
    """True for test files and test folders: the task's listed ones and anything named like a test."""
    p = PurePosixPath(path)
    listed = any(path == f or path.startswith(f.rstrip("/") + "/") for f in task.test_files)
    return (listed or bool(TEST_DIRS & set(p.parts)) or p.name.startswith("test_") or p.name.endswith("_test.py"))


def top_module(path: str) -> str:
    """The module name a top-level path would import as ('' for a nested path or a non-module)."""
    parts = PurePosixPath(path).parts
    if len(parts) > 1:
        return parts[0]  # a folder at the root is a package (or namespace package) of that name
    name = MODULE_SUFFIX.sub("", parts[0])
    return name if name != parts[0] else ""


def protected_reason(path: str, task: Task, new: bool, installed: frozenset[str]) -> str:
    """Why the tests must not see this patch's change of `path` ('' when they may).

    `new`: the path's top-level entry is not in the base tree (a new module or package at the root).
    """
    p = PurePosixPath(path)
    if ".git" in p.parts:
        return "inside .git"
    if is_test_path(path, task):
        return "test file"
    if p.name in TEST_SUPPORT:
        return "test or interpreter configuration"
    if p.suffix == ".pth":
        return "path configuration"
    if any(part.endswith(METADATA_SUFFIXES) for part in p.parts):
        return "package metadata (entry points)"
    if p.name.endswith(COMPILED_SUFFIXES):
        return "compiled module"
    module = top_module(path)
    if new and module and module in installed:
        return f"shadows the installed module {module!r}"
    return ""


def numstat_paths(numstat: bytes) -> list[str]:
    """Every path `git apply --numstat -z` reports (both sides of a rename), in order."""
    fields = numstat.split(b"\0")
    paths, i = [], 0
    while i < len(fields):
        field = fields[i]
        if not field:
            i += 1
            continue
        counts = field.split(b"\t", 2)
        if len(counts) == 3 and counts[2]:
            paths.append(counts[2])
            i += 1
        else:  # a rename or copy: "added\tdeleted\t" then the old and the new path
            paths += [fields[i + 1], fields[i + 2]]
            i += 3
    return [p.decode("utf-8", errors="surrogateescape") for p in paths]


def added_lines(patch: str) -> dict[str, list[str]]:
    """Lines each file of a git diff adds, by the file's new path."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            current = line.rsplit(" b/", 1)[-1]
        elif line.startswith("+++ "):
            current = line[4:].removeprefix("b/")
        elif line.startswith("+") and current:
            out.setdefault(current, []).append(line[1:])
    return out


def suspicious_flags(patch: str, allowed: set[str] = frozenset()) -> tuple[str, ...]:
    """'<what> in <path>' for each flagged kind of line a patch adds; kinds in `allowed` are not flagged."""
    flags = []
    for path, lines in added_lines(patch).items():
        for what, pattern in SUSPICIOUS.items():
            if what not in allowed and any(pattern.search(line) for line in lines):
                flags.append(f"{what} in {path}")
    return tuple(flags)


def flag_kinds(patch: str) -> set[str]:
    """The kinds of flag a patch raises (the gold patch's kinds are allowed to every candidate)."""
    return {flag.split(" in ", 1)[0] for flag in suspicious_flags(patch)}
