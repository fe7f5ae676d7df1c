"""Which changes of a candidate patch reach the grader: never tests or what pytest loads."""

from __future__ import annotations

import pytest

from pipeline.grading import eval_script, without_test_changes
from pipeline.records import Task

TASK = Task("t", "r", "base", "", "", "issue", ("a",), ("b",), "img", "/testbed", "pytest -rA", "parse_log_pytest",
            "synth", test_files=("pkg/tests",))


def section(old: str, new: str, extra: str = "") -> str:
    return f"diff --git a/{old} b/{new}\n{extra}--- a/{old}\n+++ b/{new}\n@@ -1 +1 @@\n-a\n+b\n"


@pytest.mark.parametrize("path", ["pkg/tests/test_x.py", "pkg/tests/x b/y z/conftest.py", "conftest.py",
                                  "pyproject.toml", "setup.cfg", "tox.ini", "other/test_y.py", "pkg/y_test.py"])
def test_test_paths_are_dropped(path):
    kept, dropped = without_test_changes(section(path, path), TASK)
    assert kept == "" and path in dropped


def test_source_with_spaces_is_kept_and_renames_from_tests_are_dropped():
    source = section("src/my file.py", "src/my file.py")
    rename = ("diff --git a/pkg/tests/test_a.py b/pkg/core2.py\nsimilarity index 90%\n"
              "rename from pkg/tests/test_a.py\nrename to pkg/core2.py\n")
    kept, dropped = without_test_changes(source + rename, TASK)
    assert kept == source and set(dropped) == {"pkg/tests/test_a.py", "pkg/core2.py"}


def test_eval_script_restores_quoted_test_files_and_caps_the_log():
    script = eval_script(TASK, "abc123")
    assert "git checkout -q abc123 -- \"$f\"" in script and "for f in pkg/tests;" in script
    assert script.index(">>>>> Start Test Output") < script.index("pytest -rA") < script.index(">>>>> End Test Output")
    assert "head -c" in script and "PIPESTATUS[0]" in script
