"""A real synthesis run on one small package, and the verifier on hand-made patches."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import pytest

from pipeline.core.records import TASK_SCHEMA, Task
from pipeline.core.store import read_rows, write_rows
from pipeline.synthesis.packages import fetch_source
from pipeline.synthesis.subjects import api_index
from pipeline.synthesis.synth import synthesize
from pipeline.synthesis.task_cache import cached_tasks
from pipeline.tasks.stage_clock import STAGES, StageClock
from pipeline.verifier.grading import grade

from tests.conftest import TOOLZ
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()


def test_synthesis_yields_valid_tasks(synth_run):
    tasks, report, _, cache = synth_run
    names = set(api_index(fetch_source(TOOLZ, cache), TOOLZ.source_globs).names.values())
    assert len(tasks) >= 2, report.as_json()
    counts = report.per_package[TOOLZ.key]
    assert counts["generated"] >= counts["compiled"] >= counts["tested"] >= counts["broke_tests"] >= counts["kept"]
    assert counts["kept"] == len(tasks)
    # the pristine suite ran baseline_runs times: every test found, those passing every time, none flaky here
    assert counts["tests_found"] >= counts["stable_passing"] > 100 and counts["flaky_tests"] == 0
    assert counts["flaky_gold"] == 0 and counts["seconds"] > 0
    for task in tasks:
        assert 1 <= len(task.FAIL_TO_PASS) <= 10 and len(task.PASS_TO_PASS) >= 1
        assert len(task.base_commit) == 40 and task.setup_patch and task.patch
        assert json.loads(task.provenance)["package"] == "toolz" and task.version == "1.0.0"
        assert task.test_cmd == ("python -m pytest -rA --tb=short -p no:cacheprovider -p no:unraisableexception "
                                 "toolz/tests")
        removed = [line[1:].strip() for line in task.patch.splitlines()
                   if line.startswith("+") and not line.startswith("+++") and line[1:].strip()]
        assert not any(line in task.problem_statement for line in removed if len(line) > 12)
        # what the statement names is the package's own, never made up from the tests' names
        assert set(re.findall(r"`(toolz\.[\w.]+)`", task.problem_statement)) <= names, task.problem_statement
    assert any(re.search(r"`toolz\.[\w.]+`", task.problem_statement) for task in tasks)  # `toolz.merge_sorted`


def test_the_time_breakdown_sums_to_the_total_and_counts_every_run(synth_run):
    tasks, report, config, _ = synth_run
    stats = report.as_json()
    breakdown, runs = stats["breakdown"], stats["stage_runs"]
    assert set(breakdown) <= set(STAGES) and breakdown["bug_runs"] > 0 and breakdown["gold_grades"] > 0
    assert sum(breakdown.values()) == pytest.approx(report.seconds, abs=0.01 * len(breakdown))
    assert stats["tasks_kept"] == len(tasks) and stats["seconds_per_task"] == round(report.seconds / len(tasks), 2)
    assert stats["tasks_per_hour"] == round(3600 * len(tasks) / report.seconds, 1)
    verified = len(tasks) + sum(r.stage == "validate" for r in report.rejects)
    assert runs["gold_grades"] == max(config.validation_runs, config.certify_runs) * verified
    assert runs["empty_grade"] == config.certify_runs * verified  # one per fresh container (its certificate)
    assert runs["certify_setup"] == (config.certify_runs - 1) * verified
    assert runs["baseline"] == config.baseline_runs and runs["bug_runs"] >= report.per_package[TOOLZ.key]["tested"]
    assert runs["callmap"] == 1 and report.per_package[TOOLZ.key]["call_map_functions"] > 100  # one traced run


def test_a_parallel_phase_counts_each_worker_share_and_the_idle_rest_as_waiting():
    clock = StageClock()
    clock.add("baseline", 3.0)
    with clock.parallel(2):
        clock.add("bug_runs", 0.1)  # two workers: 0.05 s of the phase's wall time
        time.sleep(0.2)  # the phase lasts at least 0.2 s, so at least 0.15 s of it nobody claimed
    parts = clock.breakdown(10.0)
    assert parts["baseline"] == 3.0 and parts["bug_runs"] == 0.05 and parts["waiting"] >= 0.15
    assert sum(parts.values()) == pytest.approx(10.0, abs=0.03) and parts["other"] == pytest.approx(
        10.0 - 3.05 - parts["waiting"], abs=0.01)
    with pytest.raises(ValueError, match="unknown stage 'bugs'; add it to STAGES"):
        with clock.stage("bugs"):
            pass


def test_second_run_rebuilds_nothing(synth_run, base_image, docker_client):
    tasks, _, config, cache = synth_run
    again, report = synthesize(config, base_image, cache, docker_client, rules=RULES)
    assert [t.instance_id for t in again] == [t.instance_id for t in tasks]
    assert {k: v for k, v in report.per_package[TOOLZ.key].items() if k not in ("seconds", "copies_removed")} \
        == {"cached": 1}


def test_a_run_asking_for_fewer_tasks_reads_the_first_of_a_larger_one(synth_run, base_image, docker_client):
    tasks, _, config, cache = synth_run
    fewer, report = synthesize(dataclasses.replace(config, tasks_per_package=2), base_image, cache, docker_client, rules=RULES)
    assert [t.to_row() for t in fewer] == [t.to_row() for t in tasks[:2]]
    assert report.per_package[TOOLZ.key]["cached"] == 1
    # synth_run's file (its settings' hash, then 3) was read, and nothing written for 2
    [kept] = [f for f in (cache / "tasks").glob(f"{TOOLZ.key}-*-3.parquet")
              if [r["instance_id"] for r in read_rows(f)] == [t.instance_id for t in tasks]]
    two, four = (kept.with_name(kept.name.replace("-3.", f"-{n}.")) for n in (2, 4))
    assert not two.exists()
    assert cached_tasks(four, dataclasses.replace(config, tasks_per_package=4)) is None  # no run asked for 4
    # combined tasks merge the kept bugs: a larger run's are no prefix of a smaller one's
    assert cached_tasks(two, dataclasses.replace(config, tasks_per_package=2, combine=1)) is None


def test_history_does_not_reveal_the_fix(toolz_task):
    from pipeline.verifier.environment import task_sandbox

    with task_sandbox(toolz_task) as sb:
        fixed = [l[1:] for l in toolz_task.patch.splitlines() if l.startswith("+") and not l.startswith("+++")]
        history = sb.run("git log --all -p; git reflog; git stash list; ls /tmp; "
                         "find / -xdev \\( -name '*.tar.gz' -o -name '*.whl' -o -name '*.pyc' \\) "
                         "-path '*toolz*' 2>/dev/null").output
        assert sb.run("git rev-list --all --count").output.strip() == "1"
        assert not [line for line in fixed if line.strip() and line in history]
        assert sb.run("whoami").output.strip() == "agent"


def test_the_tree_is_compiled_but_not_the_files_the_bug_touches(toolz_task):
    from pathlib import PurePosixPath

    from unidiff import PatchSet

    from pipeline.verifier.environment import task_sandbox

    with task_sandbox(toolz_task) as sb:
        compiled = sb.run("find . -path ./.git -prune -o -name '*.pyc' -print").output.split()
    assert any("-pytest-" in p for p in compiled)  # pytest's rewritten test modules
    assert any(p.startswith("./toolz/__pycache__/") and "-pytest-" not in p for p in compiled)
    for path in (PurePosixPath(f.path) for f in PatchSet(toolz_task.setup_patch)):
        assert not [p for p in compiled if p.startswith(f"./{path.parent}/__pycache__/{path.stem}.")], path


def test_task_parquet_round_trip(synth_run, tmp_path):
    import polars as pl

    tasks = synth_run[0]
    path = write_rows(tmp_path / "tasks.parquet", [t.to_row() for t in tasks], TASK_SCHEMA)
    assert [Task.from_row(r) for r in read_rows(path)] == tasks
    assert pl.read_parquet(path).height == len(tasks)


def test_gold_resolves_and_empty_does_not(toolz_task):
    gold = grade(toolz_task, toolz_task.patch, rules=RULES)
    assert gold.resolved and gold.reason == "resolved" and gold.fault == "none"
    assert 0 < gold.test_seconds < gold.duration  # the test command's own time, timed in the sandbox
    empty = grade(toolz_task, "", rules=RULES)
    assert not empty.resolved and empty.fault == "patch" and empty.reason == "tests_failed"
    failed = json.loads(empty.report)["FAIL_TO_PASS"]["failure"]
    assert set(failed) == set(toolz_task.FAIL_TO_PASS)


@pytest.mark.parametrize("clock", ["bash", "date"])
def test_the_test_command_is_timed_in_microseconds_with_or_without_bash_s_clock(clock):
    """The grading script times the tests by bash's EPOCHREALTIME (no process), or by `date` where bash is older
    than 5.0 (some SWE-bench images): both give the time in microseconds."""
    import subprocess

    from pipeline.verifier.steps import _now_us

    script = ("unset EPOCHREALTIME; " if clock == "date" else "") + _now_us("now") + '; echo "$now"'
    before = time.time()
    now = int(subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout)
    assert before * 1e6 - 1e6 < now < time.time() * 1e6 + 1e6


# An agent's edit of one line, same length, the file's modification time then set back
KEPT_TIME_EDIT = """import os, sys
path = sys.argv[1]
before = os.stat(path)
lines = open(path).read().split("\\n")
at = next(i for i, line in enumerate(lines) if len(line) >= 12)
lines[at] = "# _exit(0)".ljust(len(lines[at]))
open(path, "w").write("\\n".join(lines))
os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
"""


def test_the_effective_patch_sees_an_edit_that_kept_its_size_and_time(toolz_task):
    """The grader reads the tree's changes into a copy of its own index, trusting its stat data
    (pipeline/verifier/steps.py): an edit that kept the file's size and modification time is in it all the same, by
    its ctime, which no one can set back."""
    import shlex

    from unidiff import PatchSet

    from pipeline.verifier.environment import task_sandbox
    from pipeline.verifier.grading import grade_in

    touched = {f.path for f in PatchSet(toolz_task.patch)}
    with task_sandbox(toolz_task) as sb:
        path = next(p for p in sb.run("git ls-files 'toolz/*.py'").output.split()
                    if p not in touched and "/tests/" not in p)
        size_and_time = sb.run(f"stat -c %s.%Y {path}").output
        edited = sb.run(f"python3 -c {shlex.quote(KEPT_TIME_EDIT)} {path} && stat -c %s.%Y {path}").output
        assert edited == size_and_time
        verdict = grade_in(sb, toolz_task, toolz_task.patch, fresh=True, rules=RULES)  # as if nothing ran since `prepare`
    assert f"ends the process with os._exit in {path}" in verdict.suspicious


def test_editing_the_tests_does_not_pass(toolz_task, synth_run):
    from pipeline.synthesis.patches import file_diff

    test_file = toolz_task.FAIL_TO_PASS[0].split("::")[0]
    name = toolz_task.FAIL_TO_PASS[0].split("::")[1].split("[")[0]
    old = (synth_run[3] / "src" / TOOLZ.key / test_file).read_text()
    cheat = file_diff(test_file, old, "import pytest\npytest.skip('cheat', allow_module_level=True)\n" + old)
    conftest = ("diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n"
                "@@ -0,0 +1,3 @@\n+import pytest\n+def pytest_collection_modifyitems(items):\n"
                f"+    items[:] = [i for i in items if '{name}' not in i.name]\n")
    result = grade(toolz_task, cheat + conftest, rules=RULES)
    assert (result.resolved, result.fault, result.reason) == (False, "patch", "tests_failed")
    assert set(result.dropped_files) == {test_file, "conftest.py"}
    assert result.enforcement == (f"restored {test_file}: test file",
                                  "restored conftest.py: test or interpreter configuration")


def test_fake_passed_lines_do_not_pass(toolz_task, synth_run):
    from pipeline.synthesis.patches import file_diff

    init = (synth_run[3] / "src" / TOOLZ.key / "toolz" / "__init__.py").read_text()
    body = ["import atexit", "@atexit.register", "def _fake():"]
    body += [f"    print('PASSED {t}')" for t in toolz_task.FAIL_TO_PASS]
    fake = ("diff --git a/toolz/_fake.py b/toolz/_fake.py\nnew file mode 100644\n--- /dev/null\n"
            f"+++ b/toolz/_fake.py\n@@ -0,0 +1,{len(body)} @@\n" + "".join(f"+{line}\n" for line in body)
            + file_diff("toolz/__init__.py", init, init + "from . import _fake\n"))
    result = grade(toolz_task, fake, rules=RULES)
    assert not result.resolved and result.fault == "patch"
    assert any(f"PASSED {t}" in result.log for t in toolz_task.FAIL_TO_PASS)  # the fake lines were printed


def test_patch_that_does_not_apply(toolz_task):
    bad = "diff --git a/toolz/nothere.py b/toolz/nothere.py\n--- a/toolz/nothere.py\n+++ b/toolz/nothere.py\n" \
          "@@ -10,2 +10,2 @@\n-a\n+b\n c\n"
    result = grade(toolz_task, bad, rules=RULES)
    assert not result.resolved and result.fault == "patch" and result.reason == "patch_does_not_apply"


def test_git_reads_the_patch_alike_in_the_session_and_as_root(toolz_task, synth_run, monkeypatch):
    """Once an image is probed, git reads the patch of a fresh sandbox in its session (as the sandbox user); the
    first grade of an image reads it as root. Both readings give the same verdicts, dropped files and enforcement."""
    from pipeline.synthesis.patches import file_diff
    from pipeline.verifier import grading

    test_file = toolz_task.FAIL_TO_PASS[0].split("::")[0]
    old = (synth_run[3] / "src" / TOOLZ.key / test_file).read_text()
    shadow = ("diff --git a/pluggy.py b/pluggy.py\nnew file mode 100644\n--- /dev/null\n+++ b/pluggy.py\n"
              "@@ -0,0 +1 @@\n+X = 1\n")  # a new top-level module named as an installed one
    patches = {"gold, a test edited, a module shadowing": toolz_task.patch + file_diff(
                   test_file, old, old + "\n# edited\n") + shadow,
               "not applying": "diff --git a/toolz/nothere.py b/toolz/nothere.py\n--- a/toolz/nothere.py\n"
                               "+++ b/toolz/nothere.py\n@@ -10,2 +10,2 @@\n-a\n+b\n c\n",
               "empty": ""}
    in_session, verdicts = [], {}
    read = grading._list_in_session
    monkeypatch.setattr(grading, "_list_in_session", lambda *a: in_session.append(read(*a)) or in_session[-1])
    for name, patch in patches.items():
        monkeypatch.setattr(grading, "_PROBED", {})
        readings = [grade(toolz_task, patch, reuse_empty=False, rules=RULES) for _ in ("as root, probing", "in the session")]
        assert len(in_session) == 1 and in_session[0] is not None, (name, readings)  # answered, no fallback
        in_session.clear()
        assert len({(g.resolved, g.reason, g.dropped_files, g.enforcement) for g in readings}) == 1, (name, readings)
        verdicts[name] = (readings[0].resolved, readings[0].reason, set(readings[0].dropped_files))
    assert verdicts == {"gold, a test edited, a module shadowing": (True, "resolved", {test_file, "pluggy.py"}),
                        "not applying": (False, "patch_does_not_apply", set()), "empty": (False, "tests_failed", set())}


def test_missing_image_is_an_infra_fault(toolz_task):
    import dataclasses

    broken = dataclasses.replace(toolz_task, image="handhold/no-such-image:0")
    result = grade(broken, broken.patch, rules=RULES)
    assert not result.resolved and result.fault == "infra" and "no-such-image" in result.reason


def test_bad_packages_are_reported_in_rejects_parquet_and_the_good_one_still_yields(synth_run, base_image,
                                                                                    docker_client, tmp_path):
    """A name not on the index, an sdist without tests, tests in a place that is not there, a requirement
    that does not install: each a row of rejects.parquet naming package, stage and fix; toolz still yields."""
    import polars as pl

    from pipeline.core.records import REJECT_SCHEMA
    from pipeline.synthesis.packages import PackageSpec, parse_entry
    from pipeline.synthesis.synth import SynthConfig

    cache = synth_run[3]
    specs = (parse_entry("handhold-no-such-package-4c1d9e==1.0"), parse_entry("sortedcontainers==2.4.0"),
             PackageSpec("toolz", "1.0.0", ("no_such_tests",), ("toolz/*.py",)),
             parse_entry("tabulate==0.9.0 test_requirements='handhold-no-such-requirement-4c1d9e'"), TOOLZ)
    tasks, report = synthesize(SynthConfig(tasks_per_package=3, candidates_per_package=30), base_image, cache,
                               docker_client, specs=specs, rules=RULES)
    assert len(tasks) >= 2 and {t.repo for t in tasks} == {"pypi/toolz"}  # its cached tasks
    path = write_rows(tmp_path / "rejects.parquet", [dataclasses.asdict(r) for r in report.rejects], REJECT_SCHEMA)
    rows = pl.read_parquet(path).rows(named=True)
    assert [(r["item"], r["stage"]) for r in rows] == [
        ("handhold-no-such-package-4c1d9e-1.0", "fetch"), ("sortedcontainers-2.4.0", "discover"),
        ("toolz-1.0.0", "discover"), ("tabulate-0.9.0", "wheels")]
    reasons = [r["reason"] for r in rows]
    assert "check the name and version on PyPI" in reasons[0]
    assert "the sdist has no tests at any usual place; set test_paths=" in reasons[1]
    assert "no tests at ['no_such_tests']" in reasons[2]
    assert "pip wheel" in reasons[3] and "handhold-no-such-requirement-4c1d9e" in reasons[3] \
        and "set test_requirements=" in reasons[3]


def test_a_malformed_pyproject_rejects_its_package_and_the_others_go_on(synth_run, base_image, docker_client,
                                                                       tmp_path):
    """tomllib's error used to end the whole synthesis; now it is the package's reject row."""
    import io
    import tarfile

    import polars as pl

    from pipeline.core.records import REJECT_SCHEMA
    from pipeline.synthesis.packages import PackageSpec
    from pipeline.synthesis.synth import SynthConfig

    cache = synth_run[3]
    # The hand-built sdist: its pyproject.toml lacks a bracket; tests/test_it.py is the package's own test file, there
    # to be found by discovery, never run (the package is set aside at its build)
    files = {"pyproject.toml": b"[build-system]\nrequires = [\"setuptools\"\n", "badtoml/__init__.py": b"",
             "tests/test_it.py": b"def test_it():\n    assert True\n"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"badtoml-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (cache / "sdist").mkdir(exist_ok=True)
    (cache / "sdist" / "badtoml-1.0.tar.gz").write_bytes(buf.getvalue())
    tasks, report = synthesize(SynthConfig(tasks_per_package=3, candidates_per_package=30), base_image, cache,
                               docker_client, specs=(PackageSpec("badtoml", "1.0"), TOOLZ), rules=RULES)
    assert len(tasks) >= 2 and {t.repo for t in tasks} == {"pypi/toolz"}
    path = write_rows(tmp_path / "rejects.parquet", [dataclasses.asdict(r) for r in report.rejects], REJECT_SCHEMA)
    [row] = pl.read_parquet(path).rows(named=True)
    assert (row["item"], row["stage"]) == ("badtoml-1.0", "build")
    assert "pyproject.toml is not valid TOML" in row["reason"] and "pin another version" in row["reason"]


def test_statement_writer_llm_and_its_fallbacks(toolz_task):
    from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
    from pipeline.synthesis.issue_writer import written_statement
    from tests.loopback import OpenAIServer, Reply

    fix_line = next(l[1:] for l in toolz_task.patch.splitlines() if l.startswith("+") and not l.startswith("+++"))
    issue = "merge_sorted drops items\n\nMerging two sorted lists loses elements from the second one."
    server = OpenAIServer([Reply(text=issue), Reply(text=f"Fix it like this:\n{fix_line}"), Reply(status=500)])
    with server as url:
        writer = OpenAIPolicy(OpenAIPolicyConfig(model="teacher", base_url=url, max_retries=0))
        args = ("toolz", list(toolz_task.FAIL_TO_PASS), {}, toolz_task.patch, 0, ["toolz.itertoolz.merge_sorted"])
        assert written_statement(writer, *args) == issue + "\n"
        template = written_statement(None, *args)
        assert "`toolz.itertoolz.merge_sorted`" in template
        assert written_statement(writer, *args) == template  # quoted the fix: the template instead
        assert written_statement(writer, *args) == template  # the server failed: the template instead
    prompt = server.requests[0]["messages"][0]["content"]
    assert "never write code that fixes it" in prompt and "\ntoolz.itertoolz.merge_sorted\n" in prompt
