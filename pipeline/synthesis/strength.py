"""Whether a synthesized task's FAIL_TO_PASS tests check what the buggy function computes.

A test that only asserts that a call does not raise (`assert split(s)`, a result that is merely
non-empty) fails under a bug that makes the function raise, but it passes just as well when the
function is never called, or computes nothing. Such a task pays a "fix" that routes around the
function (seen in a demo: the agent inverted a condition upstream, so the broken function was skipped,
and every test passed). The probe: the original file with the bug's function reduced to `return None`;
when every FAIL_TO_PASS test still passes, the tests do not look at its result and the task is dropped.
"""

from __future__ import annotations

from pipeline.synthesis.candidates import functions
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.pyparse import parse_python
from pipeline.synthesis.suite import run_suite, with_test_files
from sandbox.base import Sandbox


def stubbed(source: str, qualname: str) -> str | None:
    """`source` with the body of function `qualname` replaced by `return None`; None when there is no such
    function, or its body starts on its `def` line (nothing to cut without rewriting the line)."""
    func = next((f for name, _, f in functions(parse_python(source)) if name == qualname), None)
    if func is None or func.body[0].lineno == func.lineno:
        return None
    lines = source.splitlines(keepends=True)
    first, last = func.body[0].lineno - 1, func.end_lineno  # 0-based first body line; end is inclusive, 1-based
    indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
    return "".join(lines[:first] + [f"{indent}return None\n"] + lines[last:])


def tests_ignore_result(sandbox: Sandbox, spec: PackageSpec, file: str, source: str, function: str,
                        fail_to_pass: list[str], timeout: float) -> bool:
    """Whether every FAIL_TO_PASS test passes with `function` of `file` (original `source`) returning None.
    Runs the test files those tests are in (their outcome is all the probe asks; whole files keep their order
    within a file), the whole suite when a test goes missing that way. Leaves the stubbed file in place: the
    caller restores the original."""
    probe = stubbed(source, function)
    if probe is None:
        return False
    sandbox.write_file(f"{sandbox.workdir}/{file}", probe)
    for subset in (with_test_files(spec, tuple(sorted({t.split("::")[0] for t in fail_to_pass}))), spec):
        statuses, _, timed_out = run_suite(sandbox, subset, timeout)
        if timed_out or all(test in statuses for test in fail_to_pass):
            break
    return not timed_out and all(statuses.get(test) == "PASSED" for test in fail_to_pass)

