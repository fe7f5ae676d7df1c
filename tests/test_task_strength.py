"""A bug is kept only when its FAIL_TO_PASS tests check the function's result (pipeline/synthesis/strength.py),
run for real on this host in a local sandbox."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
from pathlib import Path

from pipeline.synthesis.candidates import BugCandidate
from pipeline.synthesis.strength import stubbed
from pipeline.synthesis.strength import tests_ignore_result as ignores_result  # not a test
from pipeline.synthesis.synth import SynthConfig, SynthReport, baseline, try_candidate
from sandbox.local_sandbox import LocalSandbox
from tests.test_package_sources import SPEC, tree  # the same `calc` package spec

SOURCE = '''import functools


class Box:
    """A box."""

    @functools.lru_cache
    def size(self, n):
        """Its size."""
        total = n * 2
        return total

    def one(self): return 1


def render(items):
    out = []
    for item in items:
        out.append(label(item))
    return out


def label(item):
    text = f"<{item}>"
    return text
'''


def test_stubbed_cuts_exactly_the_functions_body():
    method = stubbed(SOURCE, "Box.size")
    assert "    @functools.lru_cache\n    def size(self, n):\n        return None\n\n    def one(self)" in method
    assert "total" not in method and "Its size" not in method and 'text = f"<{item}>"' in method
    last = stubbed(SOURCE, "label")
    assert last.endswith('def label(item):\n    return None\n') and "out.append(label(item))" in last
    ast.parse(method), ast.parse(last)  # still Python
    assert stubbed(SOURCE, "Box.one") is None  # a body on the def line: left alone
    assert stubbed(SOURCE, "missing") is None


CALC = ("def add(a, b):\n    total = a + b\n    return total\n\n\n"
        "def describe(a, b):\n    total = a + b\n    return f'{a}+{b}={total}'\n")
TESTS = ("from calc import add, describe\n\n\n"
         "def test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_describe_runs():\n    describe(1, 2)  # checks only that it does not raise\n")


def repo(path: Path) -> Path:
    tree(path, {"calc.py": CALC, "tests/test_calc.py": TESTS})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *command], cwd=path, check=True)
    return path


def removed_assignment(function: str, line: int) -> BugCandidate:
    """The bug of the demo's weak task: the function's first assignment removed, so it raises NameError."""
    lines = CALC.splitlines(keepends=True)
    return BugCandidate("calc.py", function, "remove_assignment", line, CALC,
                        "".join(lines[:line - 1] + lines[line:]), "test", f"cand-{function}")


def test_a_bug_whose_tests_ignore_the_functions_result_is_dropped(tmp_path):
    strong, weak = removed_assignment("add", 2), removed_assignment("describe", 7)
    config, report = SynthConfig(validation_runs=2, min_pass_rate=0.5), SynthReport()
    with LocalSandbox(repo(tmp_path / "calc"), timeout=120) as sandbox:
        base = baseline(sandbox, SPEC, config)
        kept = try_candidate(sandbox, SPEC, strong, base, config, report)
        dropped = try_candidate(sandbox, SPEC, weak, base, config, report)
        assert sandbox.read_file("calc.py").decode() == CALC  # restored after each, the probe's stub too
        unchecked = try_candidate(sandbox, SPEC, weak, base, SynthConfig(validation_runs=2, reject_weak_tests=False),
                                  SynthReport())
    assert kept[0] == ["tests/test_calc.py::test_add"]
    assert dropped is None  # describe() returning None passes test_describe_runs: a skip-the-call fix would be paid
    assert unchecked[0] == ["tests/test_calc.py::test_describe_runs"]  # what the probe is there to stop
    counts = report.per_package[SPEC.key]
    assert (counts["tested"], counts["broke_tests"], counts["weak_tests"], counts["stable"]) == (2, 2, 1, 1)


def test_the_probe_runs_the_files_of_the_failing_tests_and_agrees_with_the_whole_suite(tmp_path):
    root, marker = repo(tmp_path / "calc"), tmp_path / "ran-elsewhere"
    tree(root, {"tests/test_other.py": f"from pathlib import Path\n\n\ndef test_elsewhere():\n"
                                       f"    Path({str(marker)!r}).touch()\n"})
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "other"], cwd=root, check=True)
    pytest_spec = dataclasses.replace(SPEC, test_command="", test_paths=("tests",), pytest_args=())
    weak, strong = ["tests/test_calc.py::test_describe_runs"], ["tests/test_calc.py::test_add"]
    with LocalSandbox(root, timeout=120) as sandbox:
        verdicts = {}
        for spec in (pytest_spec, SPEC):  # the files of the tests; a custom command: the whole suite
            for name, function, f2p in (("weak", "describe", weak), ("strong", "add", strong)):
                verdicts[spec.test_command, name] = ignores_result(sandbox, spec, "calc.py", CALC, function, f2p,
                                                                   120)
                sandbox.write_file("calc.py", CALC)
            verdicts[spec.test_command, "elsewhere ran"] = marker.exists()
            marker.unlink(missing_ok=True)
        missing = ignores_result(sandbox, pytest_spec, "calc.py", CALC, "describe",
                                      ["tests/test_calc.py::test_gone"], 120)
    assert verdicts == {("", "weak"): True, ("", "strong"): False, ("", "elsewhere ran"): False,
                        (SPEC.test_command, "weak"): True, (SPEC.test_command, "strong"): False,
                        (SPEC.test_command, "elsewhere ran"): True}
    assert missing is False and marker.exists()  # a test the files lack: the whole suite ran


def test_the_tasks_kept_are_the_first_in_candidate_order_whichever_sandbox_finishes_first(monkeypatch):
    """Two sandboxes, two tasks wanted: candidate 0 finishes last, after 1 and 2 were found; 0 and 1 are kept."""
    import threading
    import time

    from pipeline.synthesis import synth

    second_found = threading.Event()

    def try_(sandbox, spec, cand, base, config, report, expect=None):
        if cand.candidate_id == "c0":
            second_found.wait(10)  # candidates 1 and 2 are found on the other sandbox first
            time.sleep(0.05)
        if cand.candidate_id == "c2":
            second_found.set()
        return ("f2p", "log", None)

    monkeypatch.setattr(synth, "try_candidate", try_)
    monkeypatch.setattr(synth, "make_task", lambda spec, image, cand, *args, **kwargs: cand.candidate_id)
    monkeypatch.setattr(synth, "narrowed_task", lambda task, spec, files: None)
    cands = [dataclasses.replace(removed_assignment("add", 2), candidate_id=f"c{i}") for i in range(5)]
    kept = synth._validate_candidates(SPEC, "image", cands, None, ["sb-a", "sb-b"], SynthConfig(), SynthReport(), None,
                                      want=2)
    assert [task for task, _, _ in kept] == ["c0", "c1"]
