"""Guidance that gives the answer away: prose referring to guidance, ungrounded edits, hints holding gold lines,
and quoting judged on prose alone in both tool formats; the datasets built from a real local batch."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest

from pipeline.agent.heuristic import HeuristicPolicy, action_hint as replayed
from pipeline.agent.loop import AgentConfig
from pipeline.datasets import DatasetConfig, build_rows
from pipeline.datasets.card import CardInfo, render_card
from pipeline.datasets.export import split_tables
from pipeline.datasets.guided import rows_referring_to_guidance
from pipeline.guidance.actions import action_hint
from pipeline.guidance.expert import expert_actions
from pipeline.guidance.references import (REFERENCE, guidance_references, hint_leaks_gold, quotes_guidance,
                                          ungrounded, without_references)
from pipeline.core.records import Guidance
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.verifier.environment import LocalTaskSandboxes
from tests.test_batch_local import GOLD, PLAN, HintFollower, calc_task, make_repo

HINT = "Guidance (plan):\n1. Where to look: `calc.py`, in `add`, around line 2."
CMD = "cd /testbed && grep -rln calc --include='*.py' . | head -n 20"


def native(content, name="bash", args=None, i=0) -> list[dict]:
    call = {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args or {})}}
    return [{"role": "assistant", "content": content, "tool_calls": [call]}]


def text_format(content, name="bash", args=None) -> list[dict]:
    call = json.dumps({"name": name, "arguments": args or {}})
    return [{"role": "assistant", "content": f"{content}\n<tool_call>{call}</tool_call>"}]


@pytest.mark.parametrize("turn", [native, text_format], ids=["native", "text"])
def test_running_a_hinted_command_verbatim_is_not_quoting_in_either_format(turn):
    hint = action_hint([{"name": "bash", "args": {"command": CMD}}], 1)
    assert not quotes_guidance(turn("Look for the module.", "bash", {"command": CMD}), hint, n=8)
    assert quotes_guidance(turn(f"I will run {CMD} now.", "bash", {"command": "ls"}), hint, n=8)


@pytest.mark.parametrize("prose,expected", [
    ("Following the reference action.", "phrase: Following the reference"),
    ("Submitting, as the reference trajectory does.", "phrase: reference trajectory"),
    ("As the hint suggests, the bug is in the sum.", "phrase: As the hint suggests"),
    ("Now step 2 of the plan: change it.", "phrase: step 2 of the plan"),
    ("Per the guidance I open the file.", "phrase: Per the guidance"),
    ("Open calc.py around line 2.", "hint term: calc.py"),  # named before any output showed it
    ("Run the test suite to see what fails.", None),
    ("Try a one-line repair near the failure.", None),
])
def test_prose_that_refers_to_guidance_is_found(prose, expected):
    messages = native(prose)
    assert guidance_references(messages, HINT, "add(2, 3) returns -1.") == ([(0, expected)] if expected else [])


@pytest.mark.parametrize("prose", [
    "THE REFERENCE FIX is applied.", "Your Hints were right.", "like my instructions told me", "what the Teacher said",
    "According to the plan, edit it.", "As in the reference: submit.", "Step 12 of the trajectory.", "As advised.",
    "as suggested", "I was hinted there.", "Comme prévu, as the hint suggests", "Ａs the hint says — as instructed.",
    "\u212aeep going, as the guidance shows", "Done as planned.", "Nothing here at all."])
def test_the_word_prefilter_finds_every_phrase_the_pattern_finds(prose):
    """The phrase pattern runs only on prose holding one of REFERENCE_WORDS (or any non-ASCII character)."""
    match = REFERENCE.search(prose)
    found = guidance_references(native(prose), "", "")
    assert found == ([(0, f"phrase: {match.group(0)}")] if match else [])


def test_a_hint_term_shown_by_a_tool_output_first_and_tool_arguments_are_not_references():
    shown = native(None, "bash", {"command": "grep -rl add ."}) + [
        {"role": "tool", "content": "./calc.py", "tool_call_id": "c0"}] + native("Open calc.py around line 2.", i=1)
    assert guidance_references(shown, HINT, "add(2, 3) returns -1.") == []
    assert guidance_references(native("Look.", "edit", {"path": "calc.py", "note": "reference action"}), HINT, "") == []
    assert guidance_references(native("Open calc.py."), HINT, "calc.py: add(2, 3) returns -1.") == []  # task's own


def test_a_rewrite_removes_only_the_referring_sentences_and_keeps_tool_calls():
    messages = native("Following the reference action. Checking the sum.", "bash", {"command": CMD}) + text_format(
        "As the hint says, submit. Done.", "submit")
    out, rewrites = without_references(messages, HINT, "")
    assert [m["content"] for m in out] == ["Checking the sum.", 'Done.\n<tool_call>{"name": "submit", "arguments": '
                                                                '{}}</tool_call>']
    assert out[0]["tool_calls"] == messages[0]["tool_calls"]
    assert rewrites == [{"message": 0, "reason": "phrase: Following the reference", "removed": 1},
                        {"message": 1, "reason": "phrase: As the hint says", "removed": 1}]


EDIT = {"command": "str_replace", "path": "calc.py", "old_str": "a - b", "new_str": "a + b"}


@pytest.mark.parametrize("before,expected", [
    ([], ["calc.py"]),
    ([("bash", {"command": "ls"}, "calc.py\ntests")], []),  # its path in a listing
    ([("edit", {"command": "view", "path": "calc.py"}, "1\tdef add(a, b):")], []),  # its content
    ([("edit", {"command": "view", "path": "calc.py"}, "Error: no such file")], ["calc.py"]),  # a failed read
    ([("bash", {"command": "ls"}, "setup.py")], ["calc.py"]),
])
def test_an_edit_before_any_output_showed_the_file_is_ungrounded(before, expected):
    messages = []
    for i, (name, args, out) in enumerate(before):
        messages += native(None, name, args, i) + [{"role": "tool", "content": out, "tool_call_id": f"c{i}"}]
    assert ungrounded(messages + native(None, "edit", EDIT, 9)) == expected


def test_an_action_hint_whose_edits_are_the_gold_patch_leaks_it():
    actions = expert_actions(calc_task())  # grep, view, str_replace (the gold edit), test run, submit
    assert [hint_leaks_gold(action_hint(actions, k), actions[:k], GOLD) for k in (2, 3)] == [False, True]
    other = [{"name": "edit", "args": {"command": "str_replace", "path": "calc.py", "old_str": "a - b",
                                       "new_str": "b + a"}}]
    assert not hint_leaks_gold(action_hint(other, 1), other, GOLD)


class Parrot(HeuristicPolicy):
    """The heuristic as it narrated before: 'Following the reference action.' on every replayed action."""

    name = "parrot"

    def act(self, messages, tools, *, seed=None):
        turn = super().act(messages, tools, seed=seed)
        if sum(m["role"] == "assistant" for m in messages) < len(replayed(messages[1]["content"])):
            turn.message["content"] = "Following the reference action."
        return turn


CONFIG = RolloutConfig(attempts=1, workers=1, agent=AgentConfig(max_steps=12))


@pytest.fixture(scope="module")
def guided_batch(tmp_path_factory):
    """One calc task: an unguided failure, a plan-guided success that edits at once (ungrounded), and
    action-guided successes (expert prefix k=3) of the heuristic and of the old-style narrator."""
    data = tmp_path_factory.mktemp("guided")
    sandboxes = LocalTaskSandboxes(repos={"local/calc": str(make_repo(data / "repo"))})
    task, actions = calc_task(), expert_actions(calc_task())
    act = Guidance("action", action_hint(actions, 3), tuple(actions), 3, "expert")
    runs = [(HintFollower(), None), (HintFollower(), PLAN), (HeuristicPolicy(), act), (Parrot(), act)]
    out = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", f"unix://{data}/no-engine.sock")
        for i, (policy, guidance) in enumerate(runs):
            jobs = plan_jobs([task], policy, CONFIG, "b1", {task.instance_id: guidance} if guidance else None)
            out += run_batch(jobs, policy, CONFIG, data / f"run{i}", "b1", sandboxes=sandboxes).trajectories
    return out


def test_the_heuristic_narrates_replayed_actions_as_it_does_unguided(guided_batch):
    heuristic = guided_batch[2]
    assert (heuristic.policy, heuristic.resolved, heuristic.guidance_kind) == ("heuristic", True, "action")
    said = [m["content"] for m in heuristic.messages[len(heuristic.prompt):] if m["role"] == "assistant"]
    assert said[:3] == ["Find the code for calc.", "Open calc.py around line 1.",
                        "Try a one-line repair near the failure."]
    assert guidance_references(list(heuristic.messages[len(heuristic.prompt):]), heuristic.guidance_text,
                               heuristic.unguided_prompt[1]["content"]) == []


def test_chosen_rows_never_refer_to_guidance_nor_come_ungrounded_by_default(guided_batch):
    idle, planned, heuristic, parrot = guided_batch
    assert [t.resolved for t in guided_batch] == [False, True, True, True]
    rows = build_rows(guided_batch, DatasetConfig(), gold={"calc__1": GOLD})
    assert rows.sft["rollout_id"].to_list() == [heuristic.rollout_id]
    assert rows.dpo.select("chosen_rollout_id", "rejected_rollout_id").rows() == [(heuristic.rollout_id,
                                                                                  idle.rollout_id)]
    assert (rows.dropped["refers_to_guidance"], rows.dropped["ungrounded"]) == (1, 1)
    assert rows.checks == {"references_dropped.plan": 0, "ungrounded_left_out.plan": 1, "hint_has_gold.plan": 1,
                           "references_dropped.action": 1, "ungrounded_left_out.action": 0,
                           "hint_has_gold.action": 2, "actguide_groups_lost": 0}
    assert rows.dpo["chosen_hint_has_gold"].to_list() == [True] and rows.sft["rewrites"].to_list() == ["[]"]
    trajectories = pl.DataFrame({"rollout_id": [t.rollout_id for t in guided_batch],
                                 "guidance_text": [t.guidance_text for t in guided_batch]})
    assert rows_referring_to_guidance(rows.dpo, trajectories) == []
    assert rows_referring_to_guidance(rows.sft, trajectories) == []


def test_settings_keep_ungrounded_successes_and_rewrite_referring_prose(guided_batch):
    idle, planned, heuristic, parrot = guided_batch
    rows = build_rows(guided_batch, DatasetConfig(guidance_references="rewrite", keep_ungrounded=True),
                      gold={"calc__1": GOLD})
    assert sorted(rows.sft["rollout_id"]) == sorted([planned.rollout_id, heuristic.rollout_id, parrot.rollout_id])
    assert rows.checks["references_rewritten.action"] == 1 and rows.checks["ungrounded_kept.plan"] == 1
    row = rows.sft.filter(pl.col("rollout_id") == parrot.rollout_id).row(0, named=True)
    stored = parrot.messages[len(parrot.prompt):]
    rewritten = row["messages"][len(parrot.unguided_prompt):]
    assert [m["content"] for m in rewritten if m["role"] == "assistant"][:4] == ["", "", "", "Run the test suite "
                                                                                 "to see what fails."]
    assert [json.loads(json.dumps(m["tool_calls"])) for m in rewritten if m["role"] == "assistant"] == [
        [{**c, "function": dict(c["function"])} for c in m["tool_calls"]] for m in stored if m["role"] == "assistant"]
    assert [r["message"] for r in json.loads(row["rewrites"])] == [0, 2, 4]
    trajectories = pl.DataFrame({"rollout_id": [parrot.rollout_id], "guidance_text": [parrot.guidance_text]})
    assert rows_referring_to_guidance(rows.sft, trajectories) == []
    as_stored = build_rows([dataclasses.replace(parrot, guidance_kind="none", guidance_text="")], DatasetConfig()).sft
    unrewritten = as_stored.with_columns(source=pl.lit("guided:action"), rollout_id=pl.lit(parrot.rollout_id))
    assert rows_referring_to_guidance(unrewritten, trajectories) == [parrot.rollout_id]  # what the check fails on


def members(rows) -> list[tuple[str, str]]:
    return [(m["rollout_id"], m["sampled_under"]) for row in rows.actguide.iter_rows(named=True)
            for m in row["trajectories"]]


def test_actguide_members_pass_the_checks_chosen_rows_pass(guided_batch):
    """The parrot's and the heuristic's action-guided successes share one rescued group; the parrot's prose refers
    to its guidance, so it is no member, as it is no chosen row; alone, its group is no row and is counted."""
    idle, planned, heuristic, parrot = guided_batch
    rows = build_rows(guided_batch, DatasetConfig(), gold={"calc__1": GOLD})
    assert members(rows) == [(idle.rollout_id, "unguided"), (heuristic.rollout_id, "guided")]
    assert (rows.dropped["actguide.refers_to_guidance"], rows.dropped["actguide.ungrounded"]) == (1, 0)
    assert rows.dropped["actguide.rescued_lost_to_guidance_checks"] == 0
    alone = build_rows([idle, parrot], DatasetConfig(), gold={"calc__1": GOLD})
    assert alone.actguide.height == 0 and alone.dpo.height == 0 and alone.sft.height == 0
    assert alone.dropped["actguide.rescued_lost_to_guidance_checks"] == alone.checks["actguide_groups_lost"] == 1
    assert alone.groups == {"mixed": 0, "rescued": 0, "zero_advantage": 1}
    plain = tuple({**m, "content": "Next step."} if m.get("content") == "Following the reference action." else m
                  for m in parrot.messages)  # the same attempt without the referring prose
    kept = build_rows([idle, dataclasses.replace(parrot, messages=plain)], DatasetConfig(), gold={"calc__1": GOLD})
    assert members(kept) == [(idle.rollout_id, "unguided"), (parrot.rollout_id, "guided")]


def test_a_rewritten_actguide_member_takes_the_chosen_rows_rewrite(guided_batch):
    idle, planned, heuristic, parrot = guided_batch
    rows = build_rows([idle, parrot], DatasetConfig(guidance_references="rewrite"), gold={"calc__1": GOLD})
    (member,) = [m for m in rows.actguide["trajectories"][0] if m["sampled_under"] == "guided"]
    (sft,) = rows.sft.iter_rows(named=True)
    assert member["rollout_id"] == sft["rollout_id"] == parrot.rollout_id
    assert member["completion"] == sft["messages"][len(parrot.unguided_prompt):]
    assert member["rewrites"] == sft["rewrites"] != "[]" and rows.checks["actguide_groups_lost"] == 0
    said = [m["content"] for m in member["completion"] if m["role"] == "assistant"]
    assert "Following the reference action." not in said and said[3] == "Run the test suite to see what fails."
    assert (member["temperature"], member["top_p"], member["top_k"]) == (0.0, 1.0, 0)  # the heuristic: greedy


def test_the_card_counts_checks_per_kind_and_the_share_of_chosen_rows_from_gold_hints(guided_batch):
    rows = build_rows(guided_batch, DatasetConfig(), gold={"calc__1": GOLD})
    splits = split_tables({"dpo": rows.dpo, "sft": rows.sft})
    card = render_card(CardInfo("t", run_id="r", checks=rows.checks), splits,
                       {"dpo": {"train": 1}, "sft": {"train": 1}}, None, {"dpo": {"train": 1}, "sft": {"train": 1}})
    section = card.split("## Guidance checks", 1)[1].split("\n## ", 1)[0]
    assert ("| guidance kind | referring prose: dropped | ungrounded: left out | hint held gold lines |\n"
            "|---|---|---|---|\n| action | 1 | 0 | 2 |\n| plan | 0 | 1 | 1 |") in section
    assert "Chosen rows of `dpo` from a hint holding gold lines: 1 of 1 (100.0%)." in section
    assert "Chosen rows of `sft` from a hint holding gold lines: 1 of 1 (100.0%)." in section
    assert "Rescued ActGuide groups whose every guided success failed these checks (no row): 0." in section
    lost = build_rows([guided_batch[0], guided_batch[3]], DatasetConfig(), gold={"calc__1": GOLD})
    card = render_card(CardInfo("t", run_id="r", checks=lost.checks), {}, {"dpo": {}}, None, {"dpo": {}})
    assert "Rescued ActGuide groups whose every guided success failed these checks (no row): 1." in card
