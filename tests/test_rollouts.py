"""Batched rollouts on real synthesized tasks: heuristic and LLM policies, resume, infra faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import docker
import pyarrow.parquet as pq
import pytest

from pipeline.agent.heuristic import HeuristicPolicy
from pipeline.agent.loop import AgentConfig
from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig
from pipeline.agent.anthropic_policy import AnthropicPolicy, AnthropicPolicyConfig
from pipeline.guidance.expert import expert_actions
from pipeline.records import TRAJECTORY_SCHEMA, schema_version
from pipeline.rollouts import RolloutConfig, plan_jobs, read_batch, run_batch
from tests.loopback import AnthropicServer, OpenAIServer, Reply, ToolCall

FAST = RolloutConfig(attempts=2, workers=2, agent=AgentConfig(max_steps=30))


def test_heuristic_batch_is_stored_and_resumes(synth_run, tmp_path):
    tasks = synth_run[0][:2]
    policy = HeuristicPolicy()
    jobs = plan_jobs(tasks, policy, FAST, batch="b1")
    summary = run_batch(jobs, policy, FAST, tmp_path / "b1", batch="b1")
    assert summary.ran == 4 and summary.skipped == 0
    ids = [t.rollout_id for t in summary.trajectories]
    assert len(set(ids)) == 4
    for traj in summary.trajectories:
        assert traj.policy == "heuristic" and json.loads(traj.policy_settings)["kind"] == "heuristic"
        assert traj.exit_status == "submitted" and not traj.infra_error
        assert traj.reward == float(traj.resolved) and traj.grade_reason
        assert traj.unguided_prompt == traj.prompt and traj.messages[: len(traj.prompt)] == traj.prompt
    metrics = summary.metrics()
    assert metrics["attempts"] == 4 and 0 <= metrics["pass_rate"] <= 1 and metrics["attempts_per_minute"] > 0

    path = tmp_path / "b1" / "trajectories.parquet"
    assert schema_version(pq.read_schema(path)) == "1"
    assert pq.read_schema(path).remove_metadata() == TRAJECTORY_SCHEMA.remove_metadata()
    import datasets
    import polars as pl

    assert pl.read_parquet(path).height == 4
    assert datasets.load_dataset("parquet", data_files=str(path), split="train").num_rows == 4

    again = run_batch(jobs, policy, FAST, tmp_path / "b1", batch="b1")
    assert again.ran == 0 and again.skipped == 4
    assert [t.rollout_id for t in again.trajectories] == ids


def test_killed_batch_resumes_without_duplicates(synth_run, tmp_path):
    tasks = synth_run[0][:2]
    script = """
import sys
from pipeline.store import read_rows
from pipeline.records import Task
from pipeline.agent.heuristic import HeuristicPolicy
from pipeline.rollouts import RolloutConfig, plan_jobs, run_batch
from pipeline.agent.loop import AgentConfig
tasks = [Task.from_row(r) for r in read_rows(sys.argv[1])]
config = RolloutConfig(attempts=3, workers=1, agent=AgentConfig(max_steps=30))
run_batch(plan_jobs(tasks, HeuristicPolicy(), config, 'k'), HeuristicPolicy(), config, sys.argv[2], 'k')
"""
    from pipeline.records import TASK_SCHEMA
    from pipeline.store import write_rows

    task_file = write_rows(tmp_path / "tasks.parquet", [t.to_row() for t in tasks], TASK_SCHEMA)
    out = tmp_path / "k"
    proc = subprocess.Popen([sys.executable, "-c", script, str(task_file), str(out)])
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list((out / "shards").glob("*.parquet"))) < 2:
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {t.rollout_id for t in read_batch(out)}
    assert 2 <= len(before) < 6

    config = RolloutConfig(attempts=3, workers=2, agent=AgentConfig(max_steps=30))
    policy = HeuristicPolicy()
    summary = run_batch(plan_jobs(tasks, policy, config, "k"), policy, config, out, "k")
    assert summary.skipped == len(before) and summary.ran == 6 - len(before)
    stored = pq.read_table(out / "trajectories.parquet").column("rollout_id").to_pylist()
    assert len(stored) == len(set(stored)) == 6 and before <= set(stored)
    assert not list((out / "shards").glob("*.parquet"))


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
    assert traj.exit_status == "submitted" and traj.grade_reason


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
    solving = results["solving"]
    assert solving.resolved and solving.exit_status == "submitted", (
        solving.grade_reason, solving.infra_error, solving.patch, solving.messages[-4:])
    assert not results["failing"].resolved and results["failing"].exit_status == "submitted"
    assert results["garbage"].exit_status == "format_errors" and not results["garbage"].resolved
    assert results["garbage"].format_errors >= 3
