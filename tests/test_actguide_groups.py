"""ActGuide groups as Algorithm 1 forms them, from a batch the pipeline itself ran: unguided rollouts of
three local tasks graded for real, the action-prefix search and the guided rollouts of the failed one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from pipeline.agent.heuristic import action_hint
from pipeline.agent.loop import AgentConfig
from pipeline.agent.policy import AssistantTurn, PolicyIdentity, Usage
from pipeline.datasets import DatasetConfig, build_rows, read_dataset, update_datasets
from pipeline.core.records import Action
from pipeline.rollouts.rescue import GuidanceConfig, action_plans, failed_groups, guided_guidance, guided_jobs
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.verifier.environment import LocalTaskSandboxes
from tests.test_batch_local import BUG, FIX, calc_task, make_repo
from tests.test_datasets_build import traj
from training.actguide_examples import group_advantages, prepare_examples, training_group
from training.common import TrainingDataError
from training.config import ActGuideTrainingConfig

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
    pair, four = 0.5 / (0.5 ** 0.5 + 1e-6), 0.5 / (3 ** -0.5 + 1e-6)  # |reward - 0.5| / (sample std + 1e-6)
    expected = {("mixed", "merge"): [-pair, pair], ("mixed", "replace"): [-pair, pair],
                ("rescued", "merge"): [-four, -four, four, four], ("rescued", "replace"): [0.0, 0.0]}
    assert advantages.keys() == expected.keys()
    assert all(advantages[key] == pytest.approx(value, rel=1e-9) for key, value in expected.items())


def test_the_build_report_counts_the_groups_of_stored_batches(rescued_batch, tmp_path):
    data, _ = rescued_batch
    report = update_datasets(data, tmp_path / "rows", DatasetConfig())
    assert report.groups == {"mixed": 1, "rescued": 1, "zero_advantage": 1}
    assert read_dataset(tmp_path / "rows", "actguide")["group_kind"].to_list() == ["mixed", "rescued"]
    assert update_datasets(data, tmp_path / "rows", DatasetConfig()).groups == report.groups  # reused batches too


# Constructed groups, built into rows by the dataset builder, for the rules a batch of binary rewards cannot show.
S3, S5 = 3 ** -0.5, 0.3 ** 0.5  # sample stds (ddof 1) of [1, 0, 1] / [1, 0, 0] and of [0, 0, 1, 0, 1]


def actguide_row(trajectories) -> dict:
    (row,) = build_rows(trajectories, DatasetConfig(test_fraction=0.0)).actguide.to_dicts()
    return row


def hard_group() -> dict:
    """Every unguided attempt failed ([0, 0]); the action-guided ones scored [1, 0, 1]."""
    actions = (Action("bash", '{"command": "ls"}'),)
    return actguide_row([traj(f"u{i}", sample=i) for i in range(2)] + [
        traj(f"a{i}", kind="action", reward=r, sample=i, guidance_actions=actions, guidance_k=1, group_id="g")
        for i, r in enumerate([1.0, 0.0, 1.0])])


@pytest.mark.parametrize("rewards, expected", [
    ([1.0, 0.0, 0.0], [(2 / 3) / (S3 + 1e-6), -(1 / 3) / (S3 + 1e-6), -(1 / 3) / (S3 + 1e-6)]),
    ([0.0, 1.0], [-0.5 / (0.5 ** 0.5 + 1e-6), 0.5 / (0.5 ** 0.5 + 1e-6)]),  # ddof 1: std 0.7071, not 0.5
    ([1.0], [1 / (1 + 1e-6)]),  # a group of one: mean 0, std 1 (VeRL)
    ([0.0], [0.0]),
    ([0.1, 0.1, 0.1], [0.0, 0.0, 0.0]),  # equal rewards: exactly zero, though their float mean is 0.10000000000000002
])
def test_advantages_are_verl_grpo_with_the_sample_std(rewards, expected):
    assert group_advantages(rewards) == pytest.approx(expected, rel=1e-9, abs=0)


def test_a_hard_group_is_replaced_by_its_guided_attempts_by_default_or_merged_with_them(tiny_model):
    row = hard_group()
    replace = [m["rollout_id"] for m in training_group(row["trajectories"])]
    merge = [m["rollout_id"] for m in training_group(row["trajectories"], "merge")]
    assert (replace, merge) == (["a0", "a1", "a2"], ["u0", "u1", "a0", "a1", "a2"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    won, lost = (1 / 3) / (S3 + 1e-6), -(2 / 3) / (S3 + 1e-6)  # rewards [1, 0, 1]: mean 2/3
    examples, counts = prepare_examples([row], tokenizer, ActGuideTrainingConfig())
    assert [(e.rollout_id, e.sampled_under) for e in examples] == [("a0", "guided"), ("a1", "guided"), ("a2", "guided")]
    assert [e.advantage for e in examples] == pytest.approx([won, lost, won], rel=1e-9)
    assert (counts["guided_groups"], counts["rendered_tokens"]) == (1, 3)
    merged, _ = prepare_examples([row], tokenizer, ActGuideTrainingConfig(guided_group="merge"))
    failed, solved = -0.4 / (S5 + 1e-6), 0.6 / (S5 + 1e-6)  # rewards [0, 0, 1, 0, 1]: mean 0.4
    assert [e.advantage for e in merged] == pytest.approx([failed, failed, solved, failed, solved], rel=1e-9)


def test_zero_advantage_members_of_a_group_with_signal_are_kept_unless_skipped(tiny_model):
    row = actguide_row([traj(f"u{i}", sample=i, reward=r) for i, r in enumerate([0.0, 0.5, 1.0])])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    counted, counts = prepare_examples([row], tokenizer, ActGuideTrainingConfig())
    assert [(e.rollout_id, e.advantage) for e in counted] == [  # mean 0.5, std 0.5
        ("u0", pytest.approx(-0.5 / (0.5 + 1e-6), rel=1e-9)), ("u1", 0.0),
        ("u2", pytest.approx(0.5 / (0.5 + 1e-6), rel=1e-9))]
    assert (counts["zero_advantage_members"], counts["rendered_tokens"]) == (1, 3)
    skipped, counts = prepare_examples([row], tokenizer, ActGuideTrainingConfig(zero_advantage_tokens="skip"))
    assert [e.rollout_id for e in skipped] == ["u0", "u2"]
    assert (counts["zero_advantage_members"], counts["rendered_tokens"]) == (1, 2)
    equal = actguide_row([traj(f"v{i}", iid="t9", sample=i, reward=r) for i, r in enumerate([0.0, 1.0])])
    equal["trajectories"][0]["reward"] = 1.0  # the same group, all resolved: no signal, nothing of it is trained
    with pytest.raises(TrainingDataError, match="no trajectory to train on"):
        prepare_examples([equal], tokenizer, ActGuideTrainingConfig())


def bash_turn(index: int, command: str) -> tuple[dict, dict]:
    call = {"id": f"c{index}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    return ({"role": "assistant", "content": f"Step {index}.", "tool_calls": [call]},
            {"role": "tool", "content": f"output {index}", "tool_call_id": f"c{index}"})


def with_commands(rid: str, sample: int, reward: float, commands: list[str]):
    """A stored attempt whose assistant turns run `commands`, then one closing turn."""
    base = traj(rid, sample=sample, reward=reward)
    turns = tuple(m for i, command in enumerate(commands) for m in bash_turn(i, command))
    return dataclasses.replace(base, messages=base.prompt + turns + ({"role": "assistant", "content": "Done."},))


def test_a_resolved_attempt_cut_before_its_last_edit_is_left_out(tiny_model):
    """Three attempts of the same length: the cut keeps their first turns only. The resolved one that edited in its
    first turn keeps its fix and trains; the one that edited in its second does not; the failure, cut before its
    own edit as well, trains as cut (a failed attempt earned no reward the cut could lose)."""
    row = actguide_row([with_commands("late", 0, 1.0, ["ls pkg", "sed -i s/-/+/ add.py"]),
                        with_commands("fail", 1, 0.0, ["ls pkg", "sed -i s/-/*/ add.py"]),
                        with_commands("early", 2, 1.0, ["sed -i s/-/+/ add.py", "ls pkg"])])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    whole, counts = prepare_examples([row], tokenizer, ActGuideTrainingConfig())
    assert [e.rollout_id for e in whole] == ["late", "fail", "early"] and counts["cut_before_last_edit"] == 0
    first_turn = [len(s.prompt_ids) + s.mask.index(0) for e in whole for s in e.segments]  # through its end token
    config = ActGuideTrainingConfig(max_length=max(first_turn))  # every first turn fits, no second one does
    cut, counts = prepare_examples([row], tokenizer, config)
    assert [(e.rollout_id, e.policy_tokens) for e in cut] == [
        ("fail", first_turn[1] - len(whole[1].segments[0].prompt_ids)),
        ("early", first_turn[2] - len(whole[2].segments[0].prompt_ids))]
    assert cut[0].advantage == pytest.approx(-(2 / 3) / (S3 + 1e-6), rel=1e-9)  # the group's, from [1, 0, 1]
    assert (counts["cut_before_last_edit"], counts["too_long"], counts["rendered_tokens"]) == (1, 0, 2)


def stored_attempt(rid: str, sample: int, reward: float, **settings):
    """An attempt with stored ids for both assistant turns, sampled by `IDENTITY`'s model at `settings`."""
    return traj(rid, sample=sample, reward=reward, prompt_token_ids=((1, 2), (1, 2, 3, 4)), token_ids=((3,), (5,)),
                logprobs=((-0.5,), (-0.25,)), policy_model=IDENTITY.model, policy_revision=IDENTITY.revision,
                chat_template_hash=IDENTITY.chat_template_hash, **settings)


IDENTITY = PolicyIdentity("tiny", "sha256:abc", "f00d")


@pytest.mark.parametrize("settings, refused", [
    ({"temperature": 0.7, "top_p": 1.0, "top_k": 0}, "temperature 0.7, top-p 1, top-k off"),
    ({"temperature": 0.0, "top_p": 1.0, "top_k": 0}, "greedily"),
    ({"temperature": 1.0, "top_p": 0.95, "top_k": 0}, "top-p 0.95"),
    ({"temperature": 1.0, "top_p": 1.0, "top_k": 20}, "top-k 20"),
    ({"temperature": 1.0, "top_p": 1.0}, "top-k unknown"),
    ({"temperature": 1.0, "top_p": 1.0, "top_k": 0}, ""),
])
def test_stored_logprobs_are_refused_unless_sampled_at_temperature_1_top_p_1(tiny_model, settings, refused):
    row = actguide_row([stored_attempt("s0", 0, 0.0, **settings), stored_attempt("s1", 1, 1.0, **settings)])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    stored = ActGuideTrainingConfig(behaviour_logprobs="stored")
    if refused:
        with pytest.raises(TrainingDataError, match="s0 was sampled at") as error:
            prepare_examples([row], tokenizer, stored, IDENTITY)
        assert refused in str(error.value) and "behaviour_logprobs: recompute" in str(error.value)
        assert "temperature 1" in str(error.value)
    else:  # past the sampling check to the stored ids, which do not start with this tokenizer's prompt
        with pytest.raises(TrainingDataError, match="s0 turn 0: its stored context does not start"):
            prepare_examples([row], tokenizer, stored, IDENTITY)
    examples, counts = prepare_examples([row], tokenizer, ActGuideTrainingConfig(), IDENTITY)  # recompute
    assert [e.rollout_id for e in examples] == ["s0", "s1"] and counts["rendered_tokens"] == 2  # re-rendered
