"""Which tests run which functions of a package, traced once per package (callmap_plugin.py), so a bug
candidate runs only the test files that can see it, and one that no test runs costs no suite run at all.

A test that never enters the function a bug changes passes and fails as before: the bug's runs need only
the files of the tests that enter it. Two ways a test can depend on a function without entering it are
left to the verifier: a value a wider-scoped fixture computed in another test, and state one test leaves
for the next. Its grade of the empty patch runs the whole suite and must fail exactly FAIL_TO_PASS
(pipeline/tasks/validate.py, `exact`), so a bug that breaks a test outside its files is set aside there.
A change outside every function, or in a function that runs at import or collection, runs the whole suite.
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from pipeline.synthesis.combine import edits
from pipeline.synthesis.candidates import BugCandidate
from pipeline.synthesis.packages import PackageSpec, test_command
from pipeline.synthesis.pyparse import parse_python
from sandbox.base import Sandbox

PLUGIN = "handhold_callmap"
PLUGIN_SOURCE = Path(__file__).with_name("callmap_plugin.py")

Site = tuple[str, int]
"""(file relative to the workdir, first line of a function's code: its first decorator's, if any)."""


@dataclass(frozen=True)
class CallMap:
    by_site: dict[Site, frozenset[str]]
    """The tests (ids) that entered each function."""
    outside: frozenset[Site]
    """Functions entered outside every test: at import or collection."""

    def test_files(self, cand: BugCandidate) -> tuple[str, ...] | None:
        """The test files whose tests enter a function the candidate changes, sorted (empty: no test does);
        None when the whole suite must run (a change outside every function, or in one run at import)."""
        spans = changed_functions(cand)
        if spans is None:
            return None
        tests: set[str] = set()
        for first, last in spans:
            sites = [(cand.file, line) for line in range(first, last + 1)]
            if any(site in self.outside for site in sites):
                return None
            tests.update(t for site in sites for t in self.by_site.get(site, ()))
        return tuple(sorted({t.split("::")[0] for t in tests}))


def traced_run(sandbox: Sandbox, spec: PackageSpec, timeout: float) -> CallMap | None:
    """One run of the suite under the tracing plugin; None when it produced no map (a custom test command,
    a run that timed out or crashed: the candidates then run the whole suite, as before)."""
    if spec.test_command:
        return None
    out = f"{sandbox.scratch}/callmap.json"
    sandbox.write_file(f"{sandbox.scratch}/{PLUGIN}.py", PLUGIN_SOURCE.read_text())
    command = (f"cd {sandbox.workdir} && HANDHOLD_CALLMAP_ROOT={sandbox.workdir} HANDHOLD_CALLMAP_OUT={out} "
               f"PYTHONPATH={sandbox.scratch}${{PYTHONPATH:+:$PYTHONPATH}} {test_command(spec)} -p {PLUGIN} "
               f">{sandbox.scratch}/callmap.log 2>&1")
    result = sandbox.run(command, timeout=timeout)
    if result.timed_out:
        return None
    try:
        return parse(sandbox.read_file(out))
    except (OSError, ValueError, KeyError):
        return None
    finally:
        sandbox.run(f"rm -f {out} {sandbox.scratch}/{PLUGIN}.py {sandbox.scratch}/callmap.log")


def parse(raw: bytes) -> CallMap:
    """The plugin's JSON as a CallMap."""
    data = json.loads(raw)
    by_site: dict[Site, set[str]] = defaultdict(set)
    for test, sites in data["tests"].items():
        for file, line in sites:
            by_site[(file, line)].add(test)
    return CallMap({site: frozenset(tests) for site, tests in by_site.items()},
                   frozenset((file, line) for file, line in data["outside"]))


def changed_functions(cand: BugCandidate) -> list[tuple[int, int]] | None:
    """(first, last) lines, 1-based and inclusive, of the outermost function around each of the candidate's
    edits (from its first decorator: the first line of its code); None when an edit is outside every one."""
    spans = _function_spans(cand.original_source)
    found = []
    for start, end, _ in edits(cand):
        lo, hi = (start + 1, end) if end > start else (max(start, 1), max(start, 1))  # an insertion: the line before
        around = [s for s in spans if s[0] <= lo and hi <= s[1]]
        if not around:
            return None
        found.append(min(around, key=lambda s: (s[0], -s[1])))  # the outermost: first to begin, last to end
    return sorted(set(found))


def _function_spans(source: str) -> list[tuple[int, int]]:
    spans = []
    for node in ast.walk(parse_python(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
            spans.append((first, node.end_lineno))
    return spans
