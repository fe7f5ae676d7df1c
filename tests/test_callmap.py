"""The call map (pipeline/synthesis/callmap.py): which tests run which functions, traced for real by the plugin
on this host in a local sandbox, and a bug candidate running only the test files that can see it."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from pipeline.synthesis.callmap import CallMap, changed_functions, traced_run
from pipeline.synthesis.candidates import BugCandidate
from pipeline.synthesis.synth import SynthConfig, SynthReport, baseline, try_candidate
from sandbox.local_sandbox import LocalSandbox
from tests.test_package_sources import SPEC, tree

CALC = '''import functools


def table():
    return {"twice": 2}


TABLE = table()  # runs at import


class Box:
    @functools.lru_cache
    def size(self, n):
        total = n * TABLE["twice"]
        return total


def add(a, b):
    total = a + b
    return total


def unused(a):
    value = a * 3
    return value
'''
TESTS = {
    "tests/test_add.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "tests/test_box.py": "from calc import Box\n\n\ndef test_size():\n    assert Box().size(4) == 8\n",
}


def candidate(old: str, new: str, function: str) -> BugCandidate:
    assert CALC.count(old) == 1
    return BugCandidate("calc.py", function, "test", 1, CALC, CALC.replace(old, new), "test", f"cand-{function}")


def test_changed_functions_are_the_outermost_around_each_edit_from_the_first_decorator():
    size = candidate("total = n * TABLE", "total = n + TABLE", "Box.size")
    assert changed_functions(size) == [(12, 15)]  # the decorator's line is where its code begins
    dropped = candidate('    value = a * 3\n', "", "unused")
    assert changed_functions(dropped) == [(23, 25)]
    inserted = candidate("    total = a + b\n", "    total = a + b\n    total += 1\n", "add")
    assert changed_functions(inserted) == [(18, 20)]
    assert changed_functions(candidate("TABLE = table()", "TABLE = {}", "-")) is None  # outside every function


def test_a_candidate_runs_the_files_of_the_tests_that_enter_its_function():
    calls = CallMap({("calc.py", 12): frozenset({"tests/test_box.py::test_size"}),
                     ("calc.py", 18): frozenset({"tests/test_add.py::test_add", "tests/test_x.py::test_a"})},
                    outside=frozenset({("calc.py", 4)}))
    assert calls.test_files(candidate("total = a + b", "total = a - b", "add")) == ("tests/test_add.py",
                                                                                  "tests/test_x.py")
    assert calls.test_files(candidate("total = n * TABLE", "total = n + TABLE", "Box.size")) == ("tests/test_box.py",)
    assert calls.test_files(candidate("value = a * 3", "value = a * 4", "unused")) == ()  # no test runs it
    assert calls.test_files(candidate('"twice": 2', '"twice": 3', "table")) is None  # runs at import: all


def repo(path: Path) -> Path:
    tree(path, {"calc.py": CALC, **TESTS})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *command], cwd=path, check=True)
    return path


def test_the_traced_suite_maps_each_function_to_the_tests_that_run_it(tmp_path):
    spec = dataclasses.replace(SPEC, test_command="", test_paths=("tests",), pytest_args=())
    with LocalSandbox(repo(tmp_path / "calc"), timeout=120) as sandbox:
        calls = traced_run(sandbox, spec, 120)
        assert sorted(p.name for p in Path(sandbox.scratch).iterdir()) == []  # the plugin and its output removed
    assert calls.by_site[("calc.py", 12)] == {"tests/test_box.py::test_size"}
    assert calls.by_site[("calc.py", 18)] == {"tests/test_add.py::test_add"}
    assert ("calc.py", 23) not in calls.by_site and ("calc.py", 4) in calls.outside
    assert traced_run(sandbox, SPEC, 120) is None  # a custom test command: nothing to add the plugin to


def test_a_bug_runs_only_its_tests_files_and_one_no_test_runs_costs_no_run(tmp_path):
    spec = dataclasses.replace(SPEC, test_command="", test_paths=("tests",), pytest_args=())
    marker = tmp_path / "box-ran"
    box_test = (f"from pathlib import Path\n\nfrom calc import Box\n\n\ndef test_size():\n"
                f"    Path({str(marker)!r}).touch()\n    assert Box().size(4) == 8\n")
    root = repo(tmp_path / "calc")
    tree(root, {"tests/test_box.py": box_test})
    config, report = SynthConfig(validation_runs=3, min_pass_rate=0.5), SynthReport()
    with LocalSandbox(root, timeout=120) as sandbox:
        base = baseline(sandbox, spec, config)
        base = dataclasses.replace(base, callmap=traced_run(sandbox, spec, 120))
        marker.unlink()
        broke = try_candidate(sandbox, spec, candidate("total = a + b", "total = a - b", "add"), base, config, report)
        assert not marker.exists()  # the two runs with the bug and the probe ran tests/test_add.py alone
        never = try_candidate(sandbox, spec, candidate("value = a * 3", "value = a * 4", "unused"), base, config,
                              report)
        at_import = try_candidate(sandbox, spec, candidate('"twice": 2', '"twice": 3', "table"), base, config,
                                  report)
        assert marker.exists()  # a function run at import: the whole suite
        assert sandbox.read_file("calc.py").decode() == CALC
    assert broke[0] == ["tests/test_add.py::test_add"] and never is None
    assert at_import[0] == ["tests/test_box.py::test_size"]
    counts = report.per_package[SPEC.key]
    assert (counts["tested"], counts["run_by_no_test"], counts["broke_tests"], counts["stable"]) == (2, 1, 2, 2)
