"""Whole batches without Docker: a small buggy repository on this host, LocalTaskSandboxes, a scripted policy."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import threading

import pytest

from pipeline.agent.loop import AgentConfig
from pipeline.agent.policy import AssistantTurn, Usage
from pipeline.core.records import Action
from pipeline.core.records import Guidance, GuidancePlan, Task
from pipeline.core.layout import probe_batch
from pipeline.rollouts.rescue import GuidanceConfig, action_plans, probe_job
from pipeline.rollouts import batch as batch_module
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.rollouts.sandbox_pool import PoolConfig
from pipeline.verifier.environment import LocalTaskSandboxes
from pipeline.verifier.empty_patch import known_grade
from pipeline.verifier.grading import grade

BUG, FIX = "return a - b  # bug", "return a + b"
GOLD = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a - b  # bug
+    return a + b
 
 
 def sub(a, b):
"""
TEST_IDS = ("tests/test_calc.py::test_add", "tests/test_calc.py::test_sub")


def make_repo(path):
    """A git repository whose add() subtracts, with pytest tests that catch it and pass for sub()."""
    (path / "tests").mkdir(parents=True)
    (path / "calc.py").write_text(f"def add(a, b):\n    {BUG}\n\n\ndef sub(a, b):\n    return a - b\n")
    (path / "tests" / "test_calc.py").write_text(
        "from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_sub():\n    assert sub(5, 3) == 2\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *command], cwd=path, check=True)
    return path


def slow_repo(path, seconds: int):
    """`make_repo`'s repository, its test_add taking `seconds` (a grade that outlasts something)."""
    repo = make_repo(path)
    test = repo / "tests" / "test_calc.py"
    slow = test.read_text().replace("def test_add():\n", f"def test_add():\n    time.sleep({seconds})\n")
    test.write_text("import time\n" + slow)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "slow"], cwd=repo, check=True)
    return repo


def calc_task(instance_id: str = "calc__1") -> Task:
    return Task(instance_id=instance_id, repo="demo/calc", base_commit="", patch=GOLD, test_patch="",
                problem_statement="add(2, 3) returns -1 instead of 5.", FAIL_TO_PASS=TEST_IDS[:1],
                PASS_TO_PASS=TEST_IDS[1:], image="local/calc", workdir="/testbed",
                test_cmd="python -m pytest -rA -p no:cacheprovider tests", log_parser="parse_log_pytest",
                source="synth", setup_patch="")


@pytest.fixture
def sandboxes(tmp_path) -> LocalTaskSandboxes:
    return LocalTaskSandboxes(repos={"local/calc": str(make_repo(tmp_path / "calc"))})


class HintFollower:
    """Fixes add() when the task prompt says how (a teacher's plan or an action hint showing the edit), else
    submits untouched: a policy whose outcome the guidance alone decides."""

    name, native_tools = "hint-follower", True

    def settings(self) -> dict:
        return {"kind": "scripted"}

    def act(self, messages, tools, *, seed=None) -> AssistantTurn:
        edit = ("edit", {"command": "str_replace", "path": "calc.py", "old_str": BUG, "new_str": FIX})
        script = [edit] if FIX in messages[1]["content"] else []
        name, args = (script + [("submit", {})])[sum(m["role"] == "assistant" for m in messages)]
        call = {"id": f"call_{len(messages)}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
        return AssistantTurn({"role": "assistant", "content": None, "tool_calls": [call]}, Usage(10, 2))


CONFIG = RolloutConfig(attempts=1, workers=2, agent=AgentConfig(max_steps=5))
PLAN = Guidance("plan", f"Guidance (plan):\nIn calc.py, write `{FIX}`.", teacher="rule")


def jobs_for(policy, batch: str):
    task = calc_task()
    return (plan_jobs([task], policy, CONFIG, batch)
            + plan_jobs([task], policy, CONFIG, batch, {task.instance_id: PLAN}))


def test_a_batch_runs_and_grades_without_docker(sandboxes, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # no engine: nothing to reap either
    policy = HintFollower()
    summary = run_batch(jobs_for(policy, "b1"), policy, CONFIG, tmp_path / "b1", "b1", sandboxes=sandboxes)
    idle, fixed = summary.trajectories
    assert (idle.guidance_kind, idle.exit_status, idle.reward, idle.resolved, idle.grade_reason, idle.patch) == (
        "none", "submitted", 0.0, False, "tests_failed", "")
    assert (fixed.guidance_kind, fixed.exit_status, fixed.reward, fixed.resolved, fixed.grade_reason) == (
        "plan", "submitted", 1.0, True, "resolved")
    assert fixed.patch == GOLD.replace("\n---", "\nindex 1763bc7..4c2d043 100644\n---", 1)  # git's blob ids
    assert json.loads(fixed.report)["FAIL_TO_PASS"] == {"success": list(TEST_IDS[:1]), "failure": []}
    assert json.loads(idle.report)["FAIL_TO_PASS"] == {"success": [], "failure": list(TEST_IDS[:1])}
    assert json.loads(idle.report)["PASS_TO_PASS"] == {"success": list(TEST_IDS[1:]), "failure": []}
    assert [len(t.steps) for t in summary.trajectories] == [1, 2] and fixed.steps[0].tool == "edit"
    assert summary.metrics()["resolved"] == 1 and summary.metrics()["pass_rate"] == 0.5

    again = run_batch(jobs_for(policy, "b1"), policy, CONFIG, tmp_path / "b1", "b1", sandboxes=sandboxes)
    assert (again.ran, again.skipped) == (0, 2) and again.trajectories == summary.trajectories


def test_rollout_ids_name_one_stored_attempt():
    policy = HintFollower()
    first, rerun, second = (jobs_for(policy, b) for b in ("b1", "b1", "b2"))
    assert [j.rollout_id for j in first] == [j.rollout_id for j in rerun]
    assert len({j.rollout_id for j in first + second}) == 4
    probe = probe_job(calc_task(), [{"name": "submit", "args": {}}], 1, 0, policy, CONFIG, "b1")
    assert probe.guidance.actions == (Action("submit", "{}"),) and (probe.sample_index, probe.seed) == (0, 1000)
    # A guided attempt under the same hint, index and seed differs from the probe by its batch alone.
    same = dataclasses.replace(CONFIG, seed=1000)
    (guided,) = plan_jobs([calc_task()], policy, same, "b1", {"calc__1": probe.guidance})
    (as_probe,) = plan_jobs([calc_task()], policy, same, probe_batch("b1"), {"calc__1": probe.guidance})
    assert guided.rollout_id != probe.rollout_id == as_probe.rollout_id


def test_one_failing_action_search_leaves_the_others(sandboxes, tmp_path):
    tasks = {iid: calc_task(iid) for iid in ("calc__blocked", "calc__1")}
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "calc__blocked").write_text("a file where the probe folder should go")
    config = GuidanceConfig(kinds=("action",), action_source="expert", probes_per_step=2, max_search_steps=5)
    blocked, searched = action_plans(tasks, {iid: [] for iid in tasks}, [], HintFollower(), CONFIG, config,
                                     tmp_path / "probes", "g", sandboxes=sandboxes)
    assert blocked == GuidancePlan("calc__blocked", "action", "", "", accepted=False, reason=(
        f"action search failed: FileExistsError: [Errno 17] File exists: '{tmp_path / 'probes' / 'calc__blocked'}'"))
    # Expert actions: grep, view, str_replace (the first to show the fix), test run, submit.
    assert (searched.accepted, searched.action_source, searched.K, searched.k_star, searched.found) == (
        True, "expert", 5, 3, True)
    assert (searched.search_steps, searched.probes, searched.linear_k, searched.linear_probes) == (3, 4, 3, 5)
    assert [a.name for a in searched.actions] == ["bash", "edit", "edit", "bash", "submit"]


def test_an_empty_patch_is_graded_once_per_task_and_a_regrade_runs_it_again(sandboxes, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    opened = []

    @contextlib.contextmanager
    def counted(task, config=None):
        with sandboxes(task, config) as sandbox:
            opened.append(task.instance_id)
            yield sandbox

    policy, config = HintFollower(), dataclasses.replace(CONFIG, attempts=3, workers=2)  # unguided: it submits untouched
    first = run_batch(plan_jobs([calc_task()], policy, config, "e1"), policy, config, tmp_path / "e1", "e1",
                      sandboxes=counted)
    metrics = first.metrics()  # three agents' sandboxes taken, one grade's; made ahead and not taken: wasted
    assert metrics["pool_takes"] == 4 and len(opened) == 4 + metrics["pool_wasted"]
    assert [t.patch for t in first.trajectories] == [""] * 3
    logs = {(t.grade_reason, t.report, t.test_log, t.reward) for t in first.trajectories}
    assert len(logs) == 1 and next(iter(logs))[0] == "tests_failed" and "test_add" in next(iter(logs))[2]
    assert sum(t.grade_time > 0 for t in first.trajectories) == 1  # two ending at once: one waits for the other
    opened.clear()
    second = run_batch(plan_jobs([calc_task()], policy, config, "e2"), policy, config, tmp_path / "e2", "e2",
                       sandboxes=counted)  # a later step of the same process: graded already
    assert second.metrics()["pool_takes"] == 3 and {t.test_log for t in second.trajectories} == {logs.pop()[2]}
    opened.clear()
    regrade = grade(calc_task(), "", config.grade_rules(), sandboxes=counted, reuse_empty=False)
    assert len(opened) == 1 and regrade.reason == "tests_failed" and regrade.duration > 0
    elsewhere = LocalTaskSandboxes(repos={"local/calc": str(make_repo(tmp_path / "fixed"))})
    settings = (config.grade_rules(),)
    assert known_grade(calc_task(), "", *settings, elsewhere) is None  # another factory: another environment
    assert known_grade(calc_task(), "\n", *settings, counted).log[-200:] == first.trajectories[0].test_log[-200:]
    assert known_grade(calc_task(), GOLD, *settings, counted) is None


def test_a_worker_starts_its_next_attempt_while_the_last_one_is_graded(tmp_path, monkeypatch):
    """One worker, one grader, three attempts, tests that take two seconds (longer than preparing a sandbox on a
    loaded machine): each grade runs beside the next attempt (two sandboxes open at once), where a worker that
    waited for its grade never had more than one."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    repo = slow_repo(tmp_path / "calc", 2)
    local, lock, open_now, most = LocalTaskSandboxes(repos={"local/calc": str(repo)}), threading.Lock(), [0], [0]

    @contextlib.contextmanager
    def counted(task, config=None):
        with local(task, config) as sandbox:
            with lock:
                open_now[0] += 1
                most[0] = max(most[0], open_now[0])
            try:
                yield sandbox
            finally:
                with lock:
                    open_now[0] -= 1

    policy = HintFollower()
    task = calc_task()
    config = dataclasses.replace(CONFIG, attempts=3, workers=1, grade_workers=1, pool=PoolConfig(size=0))
    jobs = plan_jobs([task], policy, config, "b1", {task.instance_id: PLAN})
    summary = run_batch(jobs, policy, config, tmp_path / "b1", "b1", sandboxes=counted)
    assert [t.resolved for t in summary.trajectories] == [True, True, True]
    assert most[0] == 2


def test_attempts_waiting_for_their_grade_are_at_most_the_workers(tmp_path, monkeypatch):
    """One worker, one grader and four quick attempts whose grades take two seconds: a worker that handed every
    attempt on at once had all four ended and none stored; bounded, an ended attempt waits for a grade slot."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    repo = slow_repo(tmp_path / "calc", 2)
    lock, ended, stored, most = threading.Lock(), [0], [0], [0]

    def counting(name: str, counter: list[int]):
        original = getattr(batch_module, name)

        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            with lock:
                counter[0] += 1
                most[0] = max(most[0], ended[0] - stored[0])
            return result
        monkeypatch.setattr(batch_module, name, wrapper)

    counting("attempt_job", ended)
    counting("_store", stored)
    policy, task = HintFollower(), calc_task()
    config = dataclasses.replace(CONFIG, attempts=4, workers=1, grade_workers=1, pool=PoolConfig(size=0))
    jobs = plan_jobs([task], policy, config, "b1", {task.instance_id: PLAN})
    summary = run_batch(jobs, policy, config, tmp_path / "b1", "b1", sandboxes=LocalTaskSandboxes(
        repos={"local/calc": str(repo)}))
    assert [t.resolved for t in summary.trajectories] == [True] * 4 and stored[0] == 4
    assert most[0] <= 2  # one with the grader, one held by its worker waiting for the slot


def test_grades_at_once_default_to_the_cores():
    assert RolloutConfig().graders() == len(os.sched_getaffinity(0))
    assert RolloutConfig(grade_workers=3).graders() == 3
