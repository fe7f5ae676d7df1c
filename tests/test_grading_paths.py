"""What the verifier protects, what it flags, and how it reads pytest's own report (no Docker)."""

from __future__ import annotations

import pytest

from pipeline.core.records import Task
from pipeline.verifier.guard import numstat_paths, protected_reason, suspicious_flags, top_module
from pipeline.verifier.junit import dotted, junit_disagreements

TASK = Task("t", "r", "base", "", "", "issue", ("a",), ("b",), "img", "/testbed", "pytest -rA", "parse_log_pytest",
            "synth", test_files=("pkg/tests",))
INSTALLED = frozenset({"pytest", "_pytest", "os", "json", "pkg"})


@pytest.mark.parametrize("path, new, reason", [
    ("pkg/tests/test_x.py", False, "test file"),
    ("pkg/tests/x b/y z.py", False, "test file"),
    ("other/test_y.py", False, "test file"),
    ("pkg/y_test.py", False, "test file"),
    ("tests", True, "test file"),
    ("pkg/sub/conftest.py", False, "test or interpreter configuration"),
    ("pyproject.toml", False, "test or interpreter configuration"),
    ("setup.cfg", False, "test or interpreter configuration"),
    ("sitecustomize.py", True, "test or interpreter configuration"),
    (".gitattributes", True, "test or interpreter configuration"),
    (".git/hooks/post-checkout", False, "inside .git"),
    ("evil.pth", True, "path configuration"),
    ("x-1.0.dist-info/entry_points.txt", True, "package metadata (entry points)"),
    ("pkg.egg-info/entry_points.txt", False, "package metadata (entry points)"),
    ("pkg/core.cpython-311-x86_64-linux-gnu.so", False, "compiled module"),
    ("pkg/core.pyc", False, "compiled module"),
    ("pytest.py", True, "shadows the installed module 'pytest'"),
    ("_pytest/__init__.py", True, "shadows the installed module '_pytest'"),
    ("json/__init__.py", True, "shadows the installed module 'json'"),
])
def test_protected_paths(path, new, reason):
    assert protected_reason(path, TASK, new, INSTALLED) == reason


@pytest.mark.parametrize("path, new", [("pkg/core.py", False), ("pkg/new_module.py", False), ("setup.py", False),
                                       ("helpers.py", True), ("pkg/my file.py", False), ("README.md", False)])
def test_source_paths_are_not_protected(path, new):
    assert protected_reason(path, TASK, new, INSTALLED) == ""


@pytest.mark.parametrize("path, module", [("pytest.py", "pytest"), ("x.cpython-311-x86_64-linux-gnu.so", "x"),
                                          ("pkg/a.py", "pkg"), ("README.md", "")])
def test_top_module(path, module):
    assert top_module(path) == module


def test_numstat_paths_reads_renames_and_odd_names():
    numstat = b"1\t1\tpkg/a.py\x000\t0\t\x00pkg/tests/test_a.py\x00pkg/core2.py\x00-\t-\tpkg/b\tc.bin\x00"
    assert numstat_paths(numstat) == ["pkg/a.py", "pkg/tests/test_a.py", "pkg/core2.py", "pkg/b\tc.bin"]


def test_suspicious_flags_name_what_and_where():
    patch = ("diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1,4 @@\n x = 1\n"
             "+import atexit, os\n+from _pytest import runner\n+print('PASSED pkg/tests/test_a.py::test_a')\n"
             "+os._exit(0)\n")
    assert suspicious_flags(patch) == ("imports pytest internals in pkg/a.py", "ends the process with os._exit in pkg/a.py",
                                       "registers an exit hook in pkg/a.py", "prints a test verdict in pkg/a.py")
    assert suspicious_flags(patch, allowed={"imports pytest internals", "ends the process with os._exit",
                                            "registers an exit hook"}) == ("prints a test verdict in pkg/a.py",)
    assert suspicious_flags("diff --git a/pkg/a.py b/pkg/a.py\n+++ b/pkg/a.py\n+return a < b\n") == ()


JUNIT = b"""<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="pkg.tests.test_a" name="test_ok"/>
<testcase classname="pkg.tests.test_a.TestK" name="test_p[1-a/b]"/>
<testcase classname="pkg.tests.test_a" name="test_bad"><failure message="x"/></testcase>
<testcase classname="pkg.tests.test_a" name="test_skip"><skipped/></testcase>
<testcase classname="pkg.tests.test_a" name="test_sig[a, b-1]"/>
<testcase classname="pkg.tests.test_a" name="test_sig[a, c-2]"/>
<testcase classname="pkg.tests.test_a" name="test_cut[x, y]"><failure/></testcase>
<testcase classname="pkg.tests.test_a" name="test_meta[[CMD] [ARGS]]"/>
<testcase classname="pkg.tests.test_a" name="test_meta[[CMD]]"><failure/></testcase>
</testsuite></testsuites>"""


def test_junit_cross_check():
    assert dotted("pkg/tests/test_a.py::TestK::test_p[1-a/b]") == "pkg.tests.test_a.TestK.test_p[1-a/b]"
    ok = ["pkg/tests/test_a.py::test_ok", "pkg/tests/test_a.py::TestK::test_p[1-a/b]"]
    assert junit_disagreements(JUNIT, ok) == []
    # swebench's parser cuts an id at a space in its parameters: the cut id covers every test it begins
    assert junit_disagreements(JUNIT, ["pkg/tests/test_a.py::test_sig[a,"]) == []
    assert junit_disagreements(JUNIT, ["pkg/tests/test_a.py::test_cut[x,"]) == [
        "pkg/tests/test_a.py::test_cut[x,: failed in the JUnit report"]
    # a cut id may end in a bracket of its parameters (click's `[COMMAND] [ARGS]`); it covers the tests it begins
    # followed by whitespace only, never a longer id of its own (`test_meta[[CMD]]`), nor one cut elsewhere
    assert junit_disagreements(JUNIT, ["pkg/tests/test_a.py::test_meta[[CMD]"]) == []
    assert junit_disagreements(JUNIT, ["pkg/tests/test_a.py::test_sig[a"]) == [
        "pkg/tests/test_a.py::test_sig[a: missing in the JUnit report"]
    assert junit_disagreements(JUNIT, ok + ["pkg/tests/test_a.py::test_bad", "pkg/tests/test_a.py::test_skip",
                                            "pkg/tests/test_a.py::test_gone"]) == [
        "pkg/tests/test_a.py::test_bad: failed in the JUnit report",
        "pkg/tests/test_a.py::test_skip: skipped in the JUnit report",
        "pkg/tests/test_a.py::test_gone: missing in the JUnit report"]
    assert junit_disagreements(None, ok) == ["no JUnit report: the test run ended before pytest wrote it"]
    assert junit_disagreements(b"<oops", ok)[0].startswith("the JUnit report does not parse")


def test_test_files_go_back_to_base_in_one_checkout_or_one_by_one(tmp_path):
    """Edited test files are put back as the base holds them; a name the base lacks (a file the task's test patch
    adds) leaves the others to be put back one by one, and the file stays as it is."""
    import subprocess

    from pipeline.verifier.steps import restore_tests_command

    def sh(command: str) -> str:
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout

    sh("git init -q && mkdir tests && echo a > tests/test_a.py && echo b > tests/test_b.py && git add -A "
       "&& git -c user.name=t -c user.email=t@t commit -qm base")
    for files in [("tests/test_a.py", "tests/test_b.py"), ("tests/test_a.py", "tests/test_new.py", "tests/test_b.py")]:
        sh("echo A > tests/test_a.py && git add tests/test_a.py && echo B > tests/test_b.py && echo N > tests/test_new.py")
        sh(restore_tests_command(files, "HEAD"))
        assert [(tmp_path / f"tests/test_{n}.py").read_text() for n in ("a", "b", "new")] == ["a\n", "b\n", "N\n"]
        assert sh("git status --porcelain") == "?? tests/test_new.py\n", files  # the index too
    assert restore_tests_command((), "HEAD") == ""
