"""Problem statements from real pytest logs of mutated code: the failing tests, never the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.synthesis.candidates import generate_candidates
from pipeline.synthesis.patches import gold_patch
from pipeline.synthesis.statements import failure_messages_from_log, problem_statement, trimmed

LIBRARY = '''\
def partition(n, seq):
    """Tuples of n items; a short last chunk is dropped."""
    result = []
    chunk = []
    for item in seq:
        chunk.append(item)
        if len(chunk) == n:
            result.append(tuple(chunk))
            chunk = []
    return result


def last(seq):
    items = list(seq)
    index = len(items) - 1
    return items[index]


def take(n, seq):
    out = []
    for i, item in enumerate(seq):
        if i >= n:
            break
        out.append(item)
    return out
'''
TESTS = '''\
import pytest
from minitoolz.itertoolz import last, partition, take


def test_last():
    assert last([1, 2, 3]) == 3


def test_partition():
    assert partition(2, [1, 2, 3, 4]) == [(1, 2), (3, 4)]


def test_partition_drops_tail():
    assert partition(2, [1, 2, 3]) == [(1, 2)]


@pytest.mark.parametrize("n", [0, 2])
def test_take(n):
    assert take(n, "abc") == list("abc"[:n])


class TestTake:
    def test_take_all(self):
        assert take(10, [1]) == [1]
'''
LOG = """\
============================= test session starts ==============================
collected 5 items

tests/test_core.py F.FE.                                                 [100%]

==================================== ERRORS ====================================
_____________________ ERROR at setup of test_with_fixture ______________________

    @pytest.fixture
    def db():
>       raise RuntimeError("no database")
E       RuntimeError: no database

tests/test_core.py:8: RuntimeError
=================================== FAILURES ===================================
________________________________ test_partition ________________________________

    def test_partition():
>       assert partition(2, [1, 2, 3, 4]) == [(1, 2), (3, 4)]
E       assert [(1, 2)] == [(1, 2), (3, 4)]
E         Right contains one more item: (3, 4)

tests/test_core.py:12: AssertionError
__________________________ TestTake.test_all[a - b] ___________________________

    def test_all(self, pair):
>       assert list(take(2, pair)) == ["a", "b"]
E       TypeError: 'NoneType' object is not iterable

tests/test_core.py:20: TypeError
=========================== short test summary info ============================
PASSED tests/test_core.py::test_ok
FAILED tests/test_core.py::test_partition - assert [(1, 2)] == [(1, 2), (3, 4)]
FAILED tests/test_core.py::TestTake::test_all[a - b] - TypeError: 'NoneType' object is not iterable
ERROR tests/test_core.py::test_with_fixture - RuntimeError: no database
FAILED tests/test_other.py::test_only_summary - ValueError: bad value
==================== 3 failed, 1 passed, 1 error in 0.12s =====================
"""


def test_failure_messages_from_log():
    assert failure_messages_from_log(LOG) == {
        "tests/test_core.py::test_partition":
            "assert [(1, 2)] == [(1, 2), (3, 4)]\n  Right contains one more item: (3, 4)",
        "tests/test_core.py::TestTake::test_all[a - b]": "TypeError: 'NoneType' object is not iterable",
        "tests/test_core.py::test_with_fixture": "RuntimeError: no database",
        "tests/test_other.py::test_only_summary": "ValueError: bad value",
    }


def test_failure_messages_without_summary_fall_back_to_sections():
    log = LOG.split("=========================== short test summary info")[0]
    assert failure_messages_from_log(log)["test_partition"].startswith("assert [(1, 2)]")


def patch_contents(patch: str) -> list[str]:
    """Source text of the patch's changed lines (long enough to mean something)."""
    changed = [line for line in patch.splitlines() if line.startswith(("+", "-")) and line[:3] not in ("+++", "---")]
    lines = [line[1:].strip() for line in changed]
    return [line for line in lines if len(line) >= 4]


def mutated_test_runs(root: Path):
    """(candidate, pytest -rA log) for mutations of the library that break a test."""
    (root / "minitoolz").mkdir()
    (root / "minitoolz/__init__.py").write_text("")
    (root / "tests").mkdir()
    (root / "tests/test_itertoolz.py").write_text(TESTS)
    library = root / "minitoolz/itertoolz.py"
    library.write_text(LIBRARY)
    sampled = generate_candidates(root, include=["minitoolz/*.py"], limit=6, seed=1)
    # off-by-one in `last` raises inside the library, so the traceback shows the mutated line.
    off_by_one = generate_candidates(root, include=["minitoolz/*.py"], kinds={"off_by_one"})
    raising = [c for c in off_by_one if c.function == "last"]
    for candidate in {c.candidate_id: c for c in sampled + raising}.values():
        library.write_text(candidate.mutated_source)
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-rA", "--tb=long", "-p", "no:cacheprovider", "tests"],
            cwd=root, capture_output=True, text=True, timeout=120,
        )
        if run.returncode == 1:
            yield candidate, run.stdout
    library.write_text(LIBRARY)


def test_statements_from_real_failures_never_quote_the_fix(tmp_path):
    runs = list(mutated_test_runs(tmp_path))
    assert len(runs) >= 3
    # --tb=long prints the mutated library lines; a careless parser would quote them.
    assert any(content in log for candidate, log in runs for content in patch_contents(gold_patch(candidate)))
    for candidate, log in runs:
        messages = failure_messages_from_log(log)
        failing = sorted(messages)
        assert failing and all(test.startswith("tests/test_itertoolz.py::") for test in failing)
        patch = gold_patch(candidate)
        for seed in range(3):
            statement = problem_statement("pytoolz/minitoolz", failing, messages, seed=seed, patch=patch)
            assert failing[0] in statement
            for content in patch_contents(patch):
                assert content not in statement, (content, statement)


def test_a_message_quoting_the_patch_is_dropped():
    patch = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-    return total / count\n+    return total // count\n"
    messages = {"tests/test_stats.py::test_mean": "ZeroDivisionError: division by zero\n    return total // count"}
    statement = problem_statement("acme/stats", list(messages), messages, seed=0, patch=patch)
    assert "ZeroDivisionError: division by zero" in statement
    assert "total // count" not in statement and "total / count" not in statement


@pytest.mark.parametrize("seed", range(6))
def test_statement_names_the_subject_tests_and_error(seed):
    tests = ["tests/test_itertoolz.py::test_partition", "tests/test_itertoolz.py::test_partition_all[2]"]
    messages = {tests[0]: "IndexError: tuple index out of range"}
    subjects = ["toolz.itertoolz.partition"]
    statement = problem_statement("pytoolz/toolz", tests, messages, seed=seed, subjects=subjects)
    assert "`toolz.itertoolz.partition`" in statement
    assert all(f"`{test}`" in statement for test in tests)
    assert "IndexError: tuple index out of range" in statement
    assert problem_statement("pytoolz/toolz", tests, messages, seed=seed, subjects=subjects) == statement
    # no name of the package found for the tests: the package is the subject, nothing is made up
    statement = problem_statement("pytoolz/toolz", tests, messages, seed=seed)
    assert "`toolz`" in statement and "`toolz." not in statement


def test_templates_vary_with_the_seed():
    tests = ["tests/test_dicttoolz.py::test_merge"]
    statements = {problem_statement("pytoolz/toolz", tests, {}, seed=seed) for seed in range(12)}
    assert len(statements) >= 3


def test_long_test_lists_and_messages_are_trimmed():
    tests = [f"tests/test_core.py::test_case_{i}" for i in range(20)]
    messages = {test: "AssertionError: " + "x" * 1000 + "\nline\n" * 30 for test in tests}
    statement = problem_statement("acme/core", tests, messages, seed=0)
    assert "… and 12 more" in statement
    assert "test_case_19" not in statement
    assert len(statement) < 3000


def test_no_failing_tests_is_refused():
    with pytest.raises(ValueError, match="at least one failing test"):
        problem_statement("acme/core", [], {}, seed=0)


def test_each_synthesized_task_draws_its_own_template(tmp_path):
    from tests.test_splits import synth_tasks

    tasks = synth_tasks(tmp_path)
    openings = {task.problem_statement.split("\n")[0].split("`")[0] for task in tasks}  # "Bug: ", "Regression in "
    assert len(tasks) >= 6 and len(openings) >= 2, openings


def test_object_addresses_are_masked_so_a_task_reads_the_same_in_every_synthesis():
    first = "assert <Counter object at 0x7f66557b08d0> == 3\nwhere <test_dicttoo...x7f66557b08d0> = f()"
    second = "assert <Counter object at 0x7fa0113c2e50> == 3\nwhere <test_dicttoo...x7fa0113c2e50> = f()"
    assert trimmed(first) == trimmed(second) == (
        "assert <Counter object at 0x…> == 3\nwhere <test_dicttoo...x…> = f()")
    assert trimmed("expected 0x10 got 0xdeadbeef") == "expected 0x10 got 0x…"  # short numbers stay
