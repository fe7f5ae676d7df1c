"""ActGuide groups as Algorithm 1 forms them, from a batch the pipeline itself ran: unguided rollouts of
three local tasks graded for real, the action-prefix search and the guided rollouts of the failed one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipeline.agent.heuristic import action_hint
from pipeline.agent.loop import AgentConfig
from pipeline.agent.policy import AssistantTurn, Usage
from pipeline.datasets import DatasetConfig, build_rows, read_dataset, update_datasets
from pipeline.rescue import GuidanceConfig, action_plans, failed_groups, guided_guidance, guided_jobs
from pipeline.rollouts import RolloutConfig, plan_jobs, run_batch
from pipeline.verifier.environment import LocalTaskSandboxes
from tests.test_batch_local import BUG, FIX, calc_task, make_repo
from training.actguide_examples import group_advantages, training_group

CONFIG = RolloutConfig(attempts=2, workers=2, agent=AgentConfig(max_steps=8))
SEARCH = GuidanceConfig(kinds=("action",), action_source="expert", compare_linear=False)
OUTCOME = {"calc__mixed": "(fixed on odd seeds)", "calc__rescued": "(never fixed)", "calc__solved": "(always fixed)"}


class SeededFixer:
    """Replays an action hint when the prompt has one; else fixes add() as the task's problem statement says:
    always, never, or on odd attempt seeds. A policy whose outcome the test chooses, graded for real."""

    name, native_tools = "seeded-fixer", True

    def settings(self) -> dict:
        return {"kind": "scripted"}

    def act(self, messages, tools, *, seed=None) -> AssistantTurn:
        prompt, turn = messages[1]["content"], sum(m["role"] == "assistant" for m in messages)
        odd = (seed - turn) % 2 == 1  # the loop's step seed is attempt seed * 1000003 + turn
        fixes = "(always fixed)" in prompt or ("(fixed on odd seeds)" in prompt and odd)
        script = [("edit", {"command": "view", "path": "calc.py"}),
                  ("edit", {"command": "str_replace", "path": "calc.py", "old_str": BUG, "new_str": FIX})]
        script = action_hint(prompt) or (script if fixes else [])
        name, args = (script + [("submit", {})])[min(turn, len(script))]
        thought = {"view": "Read the code.", "str_replace": "Fix the sum."}.get(args.get("command"), "Next step.")
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        return AssistantTurn({"role": "assistant", "content": thought, "tool_calls": [call]}, Usage(10, 2))


def run_rescued_batch(data: Path, batch: str = "b1") -> list:
    """The pipeline's own stages on three calc tasks: unguided rollouts, the action search over the failed
    group (stored probes), the guided rollouts; every stored trajectory, in the layout the assets write."""
    sandboxes = LocalTaskSandboxes(repos={"local/calc": str(make_repo(data / "repo"))})
    tasks = {iid: dataclasses.replace(calc_task(iid), problem_statement=f"add(2, 3) returns -1 {note}.")
             for iid, note in OUTCOME.items()}
    policy, root = SeededFixer(), data / "trajectories"
    unguided = run_batch(plan_jobs(list(tasks.values()), policy, CONFIG, batch), policy, CONFIG,
                         root / "unguided" / batch, batch, sandboxes=sandboxes).trajectories
    failed = failed_groups(unguided, 0.0)
    plans = action_plans(tasks, failed, [t for t in unguided if t.resolved], policy, CONFIG, SEARCH,
                         root / "probes" / batch, batch, sandboxes=sandboxes)
    guided = run_batch(guided_jobs(tasks, guided_guidance(plans), policy, CONFIG, batch), policy, CONFIG,
                       root / "guided" / batch, batch, sandboxes=sandboxes).trajectories
    probes = [t for folder in sorted((root / "probes" / batch).glob("*/"))
              for t in run_batch([], policy, CONFIG, folder, f"{batch}-probes").trajectories]
    return unguided + guided + probes


@pytest.fixture(scope="module")
def rescued_batch(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", f"unix://{data}/no-engine.sock")  # no engine: nothing to reap either
        return data, run_rescued_batch(data)


def members(row) -> list[tuple]:
    return [(m["sample_index"], m["sampled_under"], m["reward"]) for m in row["trajectories"]]


def test_the_batch_is_what_the_fixture_says(rescued_batch):
    _, trajectories = rescued_batch
    outcome = {(t.instance_id, t.guidance_kind, t.batch, t.sample_index): t.reward for t in trajectories}
    unguided = {k: v for k, v in outcome.items() if k[1] == "none"}
    assert unguided == {("calc__mixed", "none", "b1", 0): 0.0, ("calc__mixed", "none", "b1", 1): 1.0,
                        ("calc__rescued", "none", "b1", 0): 0.0, ("calc__rescued", "none", "b1", 1): 0.0,
                        ("calc__solved", "none", "b1", 0): 1.0, ("calc__solved", "none", "b1", 1): 1.0}
    assert {k: v for k, v in outcome.items() if k[2] == "b1" and k[1] == "action"} == {
        ("calc__rescued", "action", "b1", 0): 1.0, ("calc__rescued", "action", "b1", 1): 1.0}
    assert all(not t.infra_error for t in trajectories)


def test_actguide_holds_mixed_groups_as_they_are_and_rescued_groups_with_their_guided_attempts(rescued_batch):
    _, trajectories = rescued_batch
    rows = build_rows(trajectories, DatasetConfig())
    mixed, rescued = rows.actguide.iter_rows(named=True)
    assert (mixed["instance_id"], mixed["group_kind"], mixed["K"], mixed["k_star"], mixed["actions"]) == (
        "calc__mixed", "mixed", 0, -1, "[]")
    assert members(mixed) == [(0, "unguided", 0.0), (1, "unguided", 1.0)]
    assert mixed["guided_prompt"] == mixed["prompt"]  # sampled under the unguided prompt
    # expert actions: grep, view, str_replace, test run, submit; the third is the first to show the fix
    assert (rescued["instance_id"], rescued["group_kind"], rescued["K"], rescued["k_star"]) == (
        "calc__rescued", "rescued", 5, 3)
    assert members(rescued) == [(0, "unguided", 0.0), (1, "unguided", 0.0), (0, "guided", 1.0), (1, "guided", 1.0)]
    assert "Reference action trajectory hint:" in rescued["guided_prompt"][1]["content"]
    assert "Reference action trajectory hint:" not in rescued["prompt"][1]["content"]
    assert rows.groups == {"mixed": 1, "rescued": 1, "zero_advantage": 1}  # calc__solved: all resolved


def test_every_row_gives_the_trainer_a_signal_and_the_merge_rule_decides(rescued_batch):
    _, trajectories = rescued_batch
    mixed, rescued = build_rows(trajectories, DatasetConfig()).actguide.iter_rows(named=True)
    advantages = {(row["group_kind"], rule): group_advantages([m["reward"] for m in training_group(
        row["trajectories"], rule)]) for row in (mixed, rescued) for rule in ("merge", "replace")}
    assert advantages == {("mixed", "merge"): [-1.0, 1.0], ("mixed", "replace"): [-1.0, 1.0],
                          ("rescued", "merge"): [-1.0, -1.0, 1.0, 1.0], ("rescued", "replace"): [0.0, 0.0]}


def test_the_build_report_counts_the_groups_of_stored_batches(rescued_batch, tmp_path):
    data, _ = rescued_batch
    report = update_datasets(data, tmp_path / "rows", DatasetConfig())
    assert report.groups == {"mixed": 1, "rescued": 1, "zero_advantage": 1}
    assert read_dataset(tmp_path / "rows", "actguide")["group_kind"].to_list() == ["mixed", "rescued"]
    assert update_datasets(data, tmp_path / "rows", DatasetConfig()).groups == report.groups  # reused batches too
