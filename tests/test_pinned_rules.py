"""Three rules no other test pinned (issue 52, section 5): the verifier never pays a patch that breaks a test
that passed before; a probe's success goes through the guided checks as any guided success; an attempt lost to
the infrastructure is charged in the cost tables. Each is built through the pipeline's own parts."""

from __future__ import annotations

import json

import pytest

from pipeline.agent.heuristic import HeuristicPolicy
from pipeline.core.layout import probe_batch
from pipeline.datasets import DatasetConfig, build_rows
from pipeline.guidance.expert import expert_actions
from pipeline.rollouts.batch import plan_jobs, run_batch
from pipeline.rollouts.costs import CostConfig, cost_rows, cost_totals
from pipeline.rollouts.rescue import probe_job
from pipeline.synthesis import packages
from pipeline.synthesis.packages import PackageSpec, resolve
from pipeline.synthesis.env_image import build_environment_image
from pipeline.synthesis.suite import LOG_PARSER
from pipeline.verifier.environment import LocalTaskSandboxes
from pipeline.verifier.grading import grade
from tests.conftest import RULES
from tests.test_answer_hidden import _tarball
from tests.test_batch_local import GOLD, HintFollower, calc_task, make_repo
from tests.test_costs import PRICES, attempt, step
from tests.test_guidance_references import CONFIG, Parrot

# GOLD (add fixed) plus sub() broken: the FAIL_TO_PASS test passes, the PASS_TO_PASS one now fails
BREAKS_SUB = GOLD.replace("@@ -1,5 +1,5 @@", "@@ -1,6 +1,6 @@") + "-    return a - b\n+    return a + b\n"


def _fixed_but_broke_a_passing_test(result) -> None:
    status = json.loads(result.report)
    assert status["FAIL_TO_PASS"]["success"] and not status["FAIL_TO_PASS"]["failure"], status  # the fix works
    assert status["PASS_TO_PASS"]["failure"], status  # and a test that passed before fails
    assert (result.resolved, result.reward, result.fault, result.reason) == (False, 0.0, "patch", "tests_failed")


def test_a_fix_that_breaks_a_passing_test_is_not_paid_locally(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # no engine: the local sandbox only
    sandboxes = LocalTaskSandboxes(repos={"local/calc": str(make_repo(tmp_path / "calc"))})
    assert grade(calc_task(), GOLD, RULES, sandboxes=sandboxes).resolved  # the task can be resolved
    _fixed_but_broke_a_passing_test(grade(calc_task(), BREAKS_SUB, RULES, sandboxes=sandboxes))


CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = ("from pinnedcalc.calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_sub():\n    assert sub(5, 3) == 2\n")
HEAD = "diff --git a/pinnedcalc/calc.py b/pinnedcalc/calc.py\n--- a/pinnedcalc/calc.py\n+++ b/pinnedcalc/calc.py\n"
BUG_PATCH = HEAD + "@@ -1,5 +1,5 @@\n def add(a, b):\n-    return a + b\n+    return a - b\n \n \n def sub(a, b):\n"
DOCKER_GOLD = HEAD + "@@ -1,5 +1,5 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n \n \n def sub(a, b):\n"
DOCKER_BREAKS_SUB = HEAD + ("@@ -1,6 +1,6 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n \n \n"
                            " def sub(a, b):\n-    return a - b\n+    return a + b\n")


def test_a_fix_that_breaks_a_passing_test_is_not_paid_in_docker(base_image, docker_client, synth_cache):
    """A synthesized-style task (the package's environment image, its bug as the setup patch) graded in Docker."""
    from pipeline.core.records import Task

    files = {"setup.py": "from setuptools import setup\nsetup(name='pinnedcalc', version='1.0', "
                         "packages=['pinnedcalc'])\n",
             "pinnedcalc/__init__.py": "", "pinnedcalc/calc.py": CALC, "tests/test_calc.py": TESTS}
    (synth_cache / "sdist").mkdir(parents=True, exist_ok=True)
    (synth_cache / "sdist" / "pinnedcalc-1.0.tar.gz").write_bytes(
        _tarball({f"pinnedcalc-1.0/{k}": v for k, v in files.items()}))
    spec = resolve(PackageSpec("pinnedcalc", "1.0", ("tests",), ("pinnedcalc/calc.py",)), synth_cache)
    image = build_environment_image(spec, base_image, synth_cache, docker_client)
    task = Task(instance_id="pinnedcalc__1", repo="pypi/pinnedcalc", base_commit="", patch=DOCKER_GOLD,
                test_patch="", problem_statement="add(2, 3) returns -1.", FAIL_TO_PASS=("tests/test_calc.py::test_add",),
                PASS_TO_PASS=("tests/test_calc.py::test_sub",), image=image, workdir="/testbed",
                test_cmd=packages.test_command(spec), log_parser=LOG_PARSER, source="synth", setup_patch=BUG_PATCH,
                test_files=spec.test_paths)
    assert grade(task, DOCKER_GOLD, RULES).resolved  # the task can be resolved
    _fixed_but_broke_a_passing_test(grade(task, DOCKER_BREAKS_SUB, RULES))


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """One calc task: an unguided failure and two probes of the action search (expert prefix k=3, stored as the
    search stores them: `probe_job` under the probe batch), one by the heuristic, one by the narrating parrot."""
    data = tmp_path_factory.mktemp("probed")
    sandboxes = LocalTaskSandboxes(repos={"local/calc": str(make_repo(data / "repo"))})
    task, actions = calc_task(), expert_actions(calc_task())
    out = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", f"unix://{data}/no-engine.sock")
        jobs = plan_jobs([task], HintFollower(), CONFIG, "b1")
        out += run_batch(jobs, HintFollower(), CONFIG, data / "unguided", "b1", sandboxes=sandboxes).trajectories
        for i, policy in enumerate([HeuristicPolicy(), Parrot()]):
            job = probe_job(task, actions, 3, i, policy, CONFIG, "b1")
            out += run_batch([job], policy, CONFIG, data / f"probe{i}", probe_batch("b1"),
                             sandboxes=sandboxes).trajectories
    return out


def test_a_probe_success_referring_to_its_guidance_is_dropped_or_rewritten(probed):
    idle, heuristic, parrot = probed
    assert [(t.batch, t.guidance_kind, t.resolved) for t in probed] == [
        ("b1", "none", False), ("b1-probes", "action", True), ("b1-probes", "action", True)]
    rows = build_rows(probed, DatasetConfig(), gold={"calc__1": GOLD})
    assert rows.sft["rollout_id"].to_list() == [heuristic.rollout_id]  # the parrot's probe is left out
    assert rows.dpo["chosen_rollout_id"].to_list() == [heuristic.rollout_id]
    assert rows.dropped["refers_to_guidance"] == rows.checks["references_dropped.action"] == 1
    rewritten = build_rows(probed, DatasetConfig(guidance_references="rewrite"), gold={"calc__1": GOLD})
    assert rewritten.checks["references_rewritten.action"] == 1
    row = rewritten.sft.filter(rewritten.sft["rollout_id"] == parrot.rollout_id).row(0, named=True)
    said = [m["content"] for m in row["messages"][len(parrot.unguided_prompt):] if m["role"] == "assistant"]
    assert "Following the reference action." not in said and json.loads(row["rewrites"])


def test_an_attempt_lost_to_the_infrastructure_is_charged():
    """The infra-fault attempt ran two steps before its sandbox died: its tokens and seconds were paid for."""
    attempts = [
        attempt("u1", "t1", steps=(step(100, 10, 2.0),), grade_time=1.0, wall_time=4.0),
        attempt("u2", "t1", steps=(step(1000, 100, 5.0), step(2000, 200, 4.0)), grade_time=0.0, wall_time=12.0,
                infra_error="sandbox_error: container died"),
        attempt("u3", "t2", reward=1.0, steps=(step(300, 30, 1.0),), grade_time=1.0, wall_time=3.0)]
    (row,) = cost_rows(attempts, PRICES)
    # u1: (100 x 2 + 10 x 10) / 1e6 + 3 s x 0.01 = 0.0303; u2: (3000 x 2 + 300 x 10) / 1e6 + 9 s x 0.01 = 0.099;
    # u3: (300 x 2 + 30 x 10) / 1e6 + 2 s x 0.01 = 0.0209. Without u2: 2 attempts, 0.0512.
    assert row == {"origin": "unguided", "attempts": 3, "tokens_in": 3400, "tokens_out": 340, "sandbox_s": 12.0,
                   "grading_s": 2.0, "wall_s": 19.0, "teacher_tokens_in": 0, "teacher_tokens_out": 0,
                   "teacher_cost": 0, "cost": 0.1502, "tasks_resolved": 1, "cost_per_resolved_task": 0.1502,
                   "dpo_pairs": None, "cost_per_dpo_pair": None}
    assert (cost_totals([row])["attempts"], cost_totals([row])["cost"]) == (3, 0.1502)
