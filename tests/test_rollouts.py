"""Batched rollouts on real synthesized tasks: heuristic and LLM policies, resume, infra faults, crashes, reaping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import docker
import pyarrow.parquet as pq
import pytest

from pipeline.agent.anthropic_policy import AnthropicPolicy, AnthropicPolicyConfig
from pipeline.agent.heuristic import HeuristicPolicy
from pipeline.agent.loop import AgentConfig
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
from pipeline.guidance.expert import expert_actions
from pipeline.core.records import TRAJECTORY_SCHEMA, TRAJECTORY_SCHEMA_VERSION
from pipeline.core.schema import schema_version
from pipeline.rollouts.rescue import failed_groups
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.core.store import read_batch
from pipeline.verifier.grading import grade
from sandbox.images import LABEL
from tests.loopback import AnthropicServer, OpenAIServer, Reply, ToolCall

FAST = RolloutConfig(attempts=2, workers=2, agent=AgentConfig(max_steps=30))


def test_heuristic_batch_is_stored_and_resumes(synth_run, tmp_path):
    tasks = synth_run[0][:2]
    policy = HeuristicPolicy()
    jobs = plan_jobs(tasks, policy, FAST, batch="b1")
    summary = run_batch(jobs, policy, FAST, tmp_path / "b1", batch="b1")
    assert summary.ran == 4 and summary.skipped == 0
    ids = [t.rollout_id for t in summary.trajectories]
    assert ids == [j.rollout_id for j in jobs] and len(set(ids)) == 4
    by_id = {t.instance_id: t for t in tasks}
    regrades = [grade(by_id[t.instance_id], t.patch, FAST.grade_rules()) for t in summary.trajectories]
    for traj, again in zip(summary.trajectories, regrades):
        assert traj.policy == "heuristic" and json.loads(traj.policy_settings)["kind"] == "heuristic"
        assert (traj.exit_status, traj.infra_error, traj.error) == ("submitted", "", "")
        # The stored reward is the grade of the stored patch, graded again from scratch.
        assert (traj.reward, traj.resolved, traj.grade_reason) == (again.reward, again.resolved, again.reason)
        assert traj.unguided_prompt == traj.prompt and traj.messages[: len(traj.prompt)] == traj.prompt
    metrics = summary.metrics()
    solved = sum(g.resolved for g in regrades)
    assert (metrics["attempts"], metrics["resolved"], metrics["pass_rate"]) == (4, solved, solved / 4)
    assert (metrics["infra_errors"], metrics["crashed"], metrics["exit_status"]) == (0, 0, {"submitted": 4})

    path = tmp_path / "b1" / "trajectories.parquet"
    assert schema_version(pq.read_schema(path)) == TRAJECTORY_SCHEMA_VERSION
    assert pq.read_schema(path).remove_metadata() == TRAJECTORY_SCHEMA.remove_metadata()
    import datasets
    import polars as pl

    assert pl.read_parquet(path).height == 4
    assert datasets.load_dataset("parquet", data_files=str(path), split="train",
                                 cache_dir=str(tmp_path / "hf")).num_rows == 4

    again = run_batch(jobs, policy, FAST, tmp_path / "b1", batch="b1")
    assert again.ran == 0 and again.skipped == 4
    assert again.trajectories == summary.trajectories


def test_killed_batch_resumes_without_duplicates(synth_run, docker_client, tmp_path):
    tasks = synth_run[0][:2]
    script = """
import sys
from pipeline.agent.heuristic import HeuristicPolicy
from pipeline.agent.loop import AgentConfig
from pipeline.core.records import Task
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.core.store import read_rows
tasks = [Task.from_row(r) for r in read_rows(sys.argv[1])]
config = RolloutConfig(attempts=3, workers=1, agent=AgentConfig(max_steps=30))
run_batch(plan_jobs(tasks, HeuristicPolicy(), config, 'k'), HeuristicPolicy(), config, sys.argv[2], 'k')
"""
    from pipeline.core.records import TASK_SCHEMA
    from pipeline.core.store import write_rows

    task_file = write_rows(tmp_path / "tasks.parquet", [t.to_row() for t in tasks], TASK_SCHEMA)
    out = tmp_path / "k"
    proc = subprocess.Popen([sys.executable, "-c", script, str(task_file), str(out)])
    theirs = {"label": [f"{LABEL}.pid={proc.pid}"]}
    stored_at_kill = _kill_with_a_sandbox_live(proc, out, docker_client, theirs)
    assert docker_client.containers.list(all=True, filters=theirs)  # the agent's, and the pool's made ahead
    before = {t.rollout_id for t in read_batch(out)}
    assert len(before) == stored_at_kill and 2 <= stored_at_kill < 6

    config = RolloutConfig(attempts=3, workers=2, agent=AgentConfig(max_steps=30))
    policy = HeuristicPolicy()
    jobs = plan_jobs(tasks, policy, config, "k")
    summary = run_batch(jobs, policy, config, out, "k")
    assert docker_client.containers.list(all=True, filters=theirs) == []  # reaped when the run started
    assert (summary.skipped, summary.ran) == (stored_at_kill, 6 - stored_at_kill)
    assert [t.rollout_id for t in summary.trajectories] == [j.rollout_id for j in jobs]
    stored = pq.read_table(out / "trajectories.parquet").column("rollout_id").to_pylist()
    assert len(stored) == len(set(stored)) == 6 and before <= set(stored)
    assert not list((out / "shards").glob("*.parquet"))


def _kill_with_a_sandbox_live(proc, out, client, theirs) -> int:
    """SIGKILL the batch once 2 attempts are stored and a sandbox of its is live; the attempts stored then."""
    deadline = time.monotonic() + 300
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, "the batch never got to be killed mid-attempt"
        if len(list((out / "shards").glob("*.parquet"))) >= 2:
            proc.send_signal(signal.SIGSTOP)  # stopped, it starts and removes no container while we look
            time.sleep(1.0)  # requests sent before the stop finish on the engine
            if client.containers.list(all=True, filters=theirs):
                stored = len(list((out / "shards").glob("*.parquet")))
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return stored
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.2)


class CrashOnSecondCall:
    """The heuristic policy, except that its 2nd call overall raises: a policy bug in one attempt."""

    name, native_tools = "heuristic-crash", True

    def __init__(self):
        self.inner, self.calls, self.lock = HeuristicPolicy(), 0, threading.Lock()

    def settings(self) -> dict:
        return {"kind": "heuristic", "crashes": "call 2"}

    def act(self, messages, tools, *, seed=None):
        with self.lock:
            self.calls += 1
            call = self.calls
        if call == 2:
            raise RuntimeError("policy bug on call 2")
        return self.inner.act(messages, tools, seed=seed)


def test_a_crashing_attempt_is_stored_and_the_batch_goes_on(synth_run, tmp_path):
    policy = CrashOnSecondCall()
    config = RolloutConfig(attempts=2, workers=1, agent=AgentConfig(max_steps=30))
    jobs = plan_jobs(synth_run[0][:2], policy, config, "c")
    summary = run_batch(jobs, policy, config, tmp_path / "c", "c")
    assert [t.exit_status for t in summary.trajectories] == ["crashed", "submitted", "submitted", "submitted"]
    crashed = summary.trajectories[0]
    assert crashed.infra_error == "crashed: RuntimeError: policy bug on call 2"
    assert crashed.error.startswith("Traceback (most recent call last):\n")
    assert crashed.error.endswith('raise RuntimeError("policy bug on call 2")\nRuntimeError: policy bug on call 2\n')
    assert "in run_attempt" in crashed.error  # the whole stack, from the batch down to the policy
    assert (crashed.reward, crashed.resolved, crashed.infra_retries, crashed.messages, crashed.patch) == (
        0.0, False, 0, (), "")
    assert [t.error for t in summary.trajectories[1:]] == ["", "", ""]
    assert {t.rollout_id: t for t in read_batch(tmp_path / "c")}[crashed.rollout_id] == crashed
    metrics = summary.metrics()
    assert (metrics["attempts"], metrics["ran"], metrics["crashed"], metrics["infra_errors"]) == (4, 4, 1, 0)
    assert metrics["exit_status"] == {"crashed": 1, "submitted": 3}
    assert all(t.exit_status == "submitted" for group in failed_groups(summary.trajectories, 0.0).values()
               for t in group)  # a crash is never a failed sample

    again = run_batch(jobs, policy, config, tmp_path / "c", "c")  # a rerun runs the crashed attempt only
    assert (again.ran, again.skipped) == (1, 3) and again.trajectories[1:] == summary.trajectories[1:]
    assert (again.trajectories[0].exit_status, again.trajectories[0].error) == ("submitted", "")


class KillOnce:
    """A heuristic policy that kills its own container once, at its second step."""

    def __init__(self, image: str):
        self.inner, self.image, self.killed = HeuristicPolicy(), image, False
        self.name, self.native_tools = "heuristic-killer", True

    def settings(self) -> dict:
        return {"kind": "heuristic", "kills": "once"}

    def act(self, messages, tools, *, seed=None):
        if not self.killed and sum(m["role"] == "assistant" for m in messages) == 1:
            self.killed = True
            client = docker.from_env()
            mine = {"label": ["org.handhold=sandbox", f"org.handhold.pid={os.getpid()}"], "ancestor": self.image}
            for c in client.containers.list(filters=mine):  # only this test process's containers
                c.kill()
        return self.inner.act(messages, tools, seed=seed)


def test_container_killed_mid_attempt_is_retried_as_infra(toolz_task, tmp_path):
    policy = KillOnce(toolz_task.image)
    config = RolloutConfig(attempts=1, workers=1, agent=AgentConfig(max_steps=30))
    summary = run_batch(plan_jobs([toolz_task], policy, config, "x"), policy, config, tmp_path / "x", "x")
    (traj,) = summary.trajectories
    assert policy.killed
    assert traj.infra_retries == 1 and traj.infra_error == ""
    # The retry is a whole fresh attempt: it ends exactly as the same seed's attempt that nothing disturbed.
    clean = HeuristicPolicy()
    (undisturbed,) = run_batch(plan_jobs([toolz_task], clean, config, "y"), clean, config, tmp_path / "y",
                               "y").trajectories
    assert (traj.exit_status, traj.patch, traj.reward, traj.grade_reason) == (
        "submitted", undisturbed.patch, undisturbed.reward, undisturbed.grade_reason)


def script_from_actions(actions: list[dict]) -> list[Reply]:
    return [Reply(text="", tool_calls=(ToolCall(a["name"], a["args"]),)) for a in actions]


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_llm_policies_full_rollouts(protocol, toolz_task, tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    solving = script_from_actions(expert_actions(toolz_task))
    failing = script_from_actions([{"name": "bash", "args": {"command": "ls"}}, {"name": "submit", "args": {}}])
    garbage = [Reply(text="I think the answer is 42.")] * 5
    results = {}
    for name, script in [("solving", solving), ("failing", failing), ("garbage", garbage)]:
        server_cls = OpenAIServer if protocol == "openai" else AnthropicServer
        with server_cls(script, repeat_last=True) as base_url:
            if protocol == "openai":
                policy = OpenAIPolicy(OpenAIPolicyConfig(model="scripted", base_url=base_url, max_retries=0))
            else:
                policy = AnthropicPolicy(AnthropicPolicyConfig(model="scripted", base_url=base_url, max_retries=0))
            config = RolloutConfig(attempts=1, workers=1, agent=AgentConfig(max_steps=20, max_format_errors=3))
            jobs = plan_jobs([toolz_task], policy, config, name)
            (traj,) = run_batch(jobs, policy, config, tmp_path / protocol / name, name).trajectories
            results[name] = traj
            assert "test-key" not in traj.policy_settings
    solving, failing, garbage = results["solving"], results["failing"], results["garbage"]
    assert (solving.exit_status, solving.reward, solving.grade_reason) == ("submitted", 1.0, "resolved"), (
        solving.infra_error, solving.patch, solving.messages[-4:])
    assert (failing.exit_status, failing.reward, failing.grade_reason, failing.patch) == (
        "submitted", 0.0, "tests_failed", "")
    assert (garbage.exit_status, garbage.reward, garbage.grade_reason, garbage.patch) == (
        "format_errors", 0.0, "tests_failed", "")
    assert garbage.format_errors == 3 and len(garbage.steps) == 3  # max_format_errors=3 in a row ends it


@pytest.mark.parametrize("reward,infra_error,success", [
    (0.5, "", False),  # at δ: the group this probe would rescue failed with it
    (0.75, "", True),
    (1.0, "sandbox: engine gone", False),
])
def test_a_success_is_a_reward_above_delta_without_an_infra_fault(reward, infra_error, success):
    import dataclasses

    from pipeline.rollouts.rescue import succeeded
    from tests.test_records import TRAJECTORY

    attempt = dataclasses.replace(TRAJECTORY, reward=reward, infra_error=infra_error)
    assert succeeded(attempt, 0.5) is success
    assert (attempt.instance_id in failed_groups([attempt], 0.5)) is (not success and not infra_error)


def test_a_probe_succeeds_by_the_rule_that_failed_its_group(tmp_path, monkeypatch):
    """A real probe (the expert's 3-action hint shows the fix: reward 1.0) decides its step at δ 0, not at δ 1."""
    from pipeline.guidance.expert import expert_actions
    from pipeline.rollouts.rescue import _prober
    from pipeline.verifier.environment import LocalTaskSandboxes
    from tests.test_batch_local import CONFIG, HintFollower, calc_task, make_repo

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")  # no engine: nothing to reap either
    sandboxes = LocalTaskSandboxes(repos={"local/calc": str(make_repo(tmp_path / "calc"))})
    task, policy = calc_task(), HintFollower()
    probes = [_prober(task, expert_actions(task), policy, CONFIG, tmp_path / "probes", "b1", delta, sandboxes)
              for delta in (0.0, 1.0)]
    assert [probe(3, 0) for probe in probes] == [True, False]  # the second reads the stored probe: reward 1.0
    assert [t.reward for t in read_batch(tmp_path / "probes")] == [1.0]
