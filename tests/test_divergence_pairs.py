"""DPO pairs cut at the first turn where the two attempts differ: built from stored trajectories by the builder,
exported with the card's numbers, and trained on by the project's DPO stage on the tiny model."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.datasets import DatasetConfig, build_rows, trajectory_frame
from pipeline.datasets.card import CardInfo
from pipeline.datasets.divergence import divergence_cut, divergence_cuts
from pipeline.datasets.formats import CHAT
from pipeline.datasets.export import export_dataset
from pipeline.datasets.splits import heuristic_tokens
from tests.test_datasets_build import ISSUE, SYSTEM, present, traj
from training.common import TrainingDataError, read_split
from training.config import DPOTrainingConfig
from training.dpo import train_dpo


def call(call_id: str, name: str, arguments: str) -> dict:
    """A tool call as a policy returns it: arguments a JSON text, spelled as that policy spelled it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def said(content: str, *calls: dict, reasoning: str | None = None) -> dict:
    message = {"role": "assistant", "content": content}
    return message | ({"tool_calls": list(calls)} if calls else {}) | (
        {"reasoning_content": reasoning} if reasoning else {})


def saw(call_id: str, output: str) -> dict:
    return {"role": "tool", "content": output, "tool_call_id": call_id}


def shared(ids: str, cat: str, listing: str = "def add(a, b):\n    return a - b") -> list[dict]:
    """Two turns both attempts take: `ids` names the calls (each attempt its own), `cat` spells the arguments."""
    return [said("Let me look at the package.", call(f"{ids}1", "bash", '{"command": "ls pkg"}')),
            saw(f"{ids}1", "__init__.py\nadd.py"),
            said("Read add().", call(f"{ids}2", "bash", cat)), saw(f"{ids}2", listing)]


CAT = '{"command": "cat pkg/add.py", "timeout": 5}'
CAT_RESPELLED = '{"timeout":5,"command":"cat pkg/add.py"}'  # same arguments: other key order, no spaces
FIX = [said("The operator is wrong.", call("c3", "bash", '{"command": "sed -i s/-/+/ pkg/add.py"}')),
       saw("c3", ""), said("Fixed.")]
GIVE_UP = [said("The tests look wrong.", call("r3", "bash", '{"command": "pytest -q"}')), saw("r3", "1 failed"),
           said("I could not fix it.")]
MISSING = "cat: pkg/add.py: No such file or directory"
COMPLETIONS = {  # task: (chosen completion, rejected completion)
    "t1": (shared("c", CAT) + FIX, shared("r", CAT_RESPELLED) + GIVE_UP),  # 2 shared turns, then other actions
    "t2": (shared("c", CAT) + FIX, shared("r", CAT_RESPELLED, MISSING) + GIVE_UP),  # the 2nd action saw other output
    "t3": (FIX, GIVE_UP),  # apart from the first turn
    "t4": (shared("c", CAT) + FIX, shared("r", CAT_RESPELLED)),  # the failure stopped where the success went on
}


def attempt(rid: str, iid: str, completion: list[dict], reward: float, sample: int):
    """An unguided attempt stored as a rollout stores it, with this completion."""
    stored = traj(rid, iid=iid, reward=reward, sample=sample)
    return dataclasses.replace(stored, messages=stored.prompt + tuple(completion))


ATTEMPTS = [a for iid, (good, bad) in COMPLETIONS.items()
            for a in (attempt(f"{iid}c", iid, good, 1.0, 0), attempt(f"{iid}r", iid, bad, 0.0, 1))]
BOTH = DatasetConfig(test_fraction=0.0, dpo_pair_at=("start", "divergence"))


@pytest.fixture(scope="module")
def rows():
    return build_rows(ATTEMPTS, BOTH)


def by_task(frame: pl.DataFrame) -> dict[str, dict]:
    return {row["instance_id"]: row for row in frame.iter_rows(named=True)}


def test_a_pair_sharing_two_turns_holds_them_in_its_prompt_and_parts_at_the_third_assistant_turn(rows):
    row, start = by_task(rows.dpo_divergence)["t1"], by_task(rows.dpo)["t1"]
    unguided = [SYSTEM, {"role": "user", "content": f"{ISSUE} (t1)"}]
    assert present(row["prompt"]) == unguided + shared("c", CAT)  # the chosen attempt's copy: its call ids
    assert present(row["chosen"]) == FIX and present(row["rejected"]) == GIVE_UP  # each from its 3rd assistant turn
    assert (row["shared_turns"], row["shared_messages"]) == (2, 4)
    assert (row["chosen_rollout_id"], row["rejected_rollout_id"], row["chosen_hash"], row["rejected_hash"]) == (
        start["chosen_rollout_id"], start["rejected_rollout_id"], start["chosen_hash"], start["rejected_hash"])
    # The shared messages' tokens move from each completion to the prompt, each side's own copy counted
    stored = trajectory_frame([a for a in ATTEMPTS if a.instance_id == "t1"])["messages"].list.slice(2, 4)
    moved_chosen, moved_rejected = heuristic_tokens(stored).to_list()
    assert moved_chosen != moved_rejected  # the copies differ in call ids and spelling
    assert row["prompt_tokens"] == start["prompt_tokens"] + moved_chosen
    assert row["chosen_tokens"] == start["chosen_tokens"] - moved_chosen
    assert row["rejected_tokens"] == start["rejected_tokens"] - moved_rejected


def test_other_output_of_the_same_action_parts_the_pair_at_that_action(rows):
    row = by_task(rows.dpo_divergence)["t2"]
    assert present(row["prompt"])[2:] == shared("c", CAT)[:2]
    assert present(row["chosen"]) == shared("c", CAT)[2:] + FIX
    assert present(row["rejected"]) == shared("r", CAT_RESPELLED, MISSING)[2:] + GIVE_UP
    assert (row["shared_turns"], row["shared_messages"]) == (1, 2)


def test_a_pair_apart_from_the_first_turn_is_its_start_pair_and_a_prefix_pair_is_left_out(rows):
    start, cut = by_task(rows.dpo), by_task(rows.dpo_divergence)
    assert cut["t3"] == start["t3"] | {"shared_turns": 0, "shared_messages": 0}
    assert sorted(start) == ["t1", "t2", "t3", "t4"] and sorted(cut) == ["t1", "t2", "t3"]
    assert rows.dropped["dpo_divergence.prefix_pair"] == 1


TURN = said("Look.", call("a", "bash", '{"command": "ls", "all": true}'))
SEEN = saw("a", "add.py")
NEXT = said("Edit.", call("b", "bash", '{"command": "sed -i s/-/+/ add.py"}'))


CUTS = [
    ([TURN, SEEN, NEXT], [said("Look.", call("z", "bash", '{"all":true,"command":"ls"}')), saw("z", "add.py"),
                          said("Stop.")], 2),  # ids and spelling are no action
    ([TURN, SEEN, NEXT], [said("Look.", call("a", "bash", '{"command": "ls", "all": false}')), SEEN, NEXT], 0),
    ([TURN, SEEN, NEXT], [said("Look!", *TURN["tool_calls"]), SEEN, NEXT], 0),  # the text is the turn too
    ([TURN, SEEN, NEXT], [said("Look.", *TURN["tool_calls"], reasoning="ls first"), SEEN, NEXT], 0),
    ([TURN, SEEN, NEXT], [said("Look.", call("a", "grep", '{"command": "ls", "all": true}')), SEEN, NEXT], 0),
    ([TURN, SEEN, NEXT, SEEN], [TURN, SEEN, NEXT, saw("b", "sed: no input files")], 2),  # back to the action
    ([TURN, SEEN, NEXT], [TURN, SEEN], None),  # a prefix: nothing divergent left on one side
    ([TURN, SEEN], [TURN, SEEN], None),
]


@pytest.mark.parametrize(("chosen", "rejected", "cut"), CUTS)
def test_the_cut_is_the_last_assistant_turn_at_or_before_the_first_difference(chosen, rejected, cut):
    assert divergence_cut(chosen, rejected) == cut
    assert divergence_cut(rejected, chosen) == cut


def test_the_builder_cuts_a_column_of_pairs_where_the_rule_cuts_each():
    """`divergence_cuts` (polars, a position at a time over the pairs still alike) equals `divergence_cut` per pair,
    the pairs mixed so that some part early, some late and some never (a pair apart from its start among them)."""
    pairs = CUTS + [(FIX, GIVE_UP), ([], [TURN])] + [(list(c) + [NEXT], list(r) + [NEXT]) for c, r, _ in CUTS]
    column = {side: pl.from_arrow(pa.array([p[i] for p in pairs], type=CHAT)) for i, side in enumerate("cr")}
    assert divergence_cuts(column["c"], column["r"]) == [divergence_cut(c, r) for c, r, *_ in pairs]
    assert divergence_cuts(column["r"], column["c"]) == [divergence_cut(r, c) for c, r, *_ in pairs]


@pytest.mark.parametrize("forms", [("divergence",), ("start", "start"), ()])
def test_the_start_form_is_always_built_once(forms):
    with pytest.raises(ValueError, match="dpo_pair_at"):
        DatasetConfig(dpo_pair_at=forms)


@pytest.fixture(scope="module")
def folder(rows, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    export_dataset(out, {"dpo": rows.dpo, "dpo_divergence": rows.dpo_divergence}, CardInfo("test", run_id="b1"))
    return out


def test_the_card_reports_pairs_sharing_a_prefix_and_its_mean_length(folder):
    card = (folder / "README.md").read_text()
    assert ("Pairs: 3; sharing a prefix: 2; mean shared length of those: 1.50 turns (3.00 messages). "
            "Pairs of `dpo` left out, one completion a prefix of the other: 1.") in card
    assert "config_name: dpo_divergence" in card and "| dpo_divergence | train | 3 |" in card


def test_dpo_trains_the_tiny_model_on_the_exported_divergence_rows(folder, tiny_model, tmp_path):
    exported = read_split(folder, "dpo_divergence")
    assert [len(p) for p in exported["prompt"]] == [6, 4, 2]  # t1, t2, t3 as built
    config = DPOTrainingConfig(pair_at="divergence", learning_rate=2e-3, lr_scheduler="constant", warmup=0,
                               per_device_batch_size=3, gradient_accumulation_steps=1, max_steps=3, max_length=4096)
    result = train_dpo(config, str(tiny_model), folder, tmp_path / "run")
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["dataset_config"] == "dpo_divergence" and summary["rows"] == summary["rows_trained"] == 3
    losses = [json.loads(line)["loss"] for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    trained, start = (AutoModelForCausalLM.from_pretrained(p).state_dict() for p in (result.checkpoint, tiny_model))
    assert sum(not torch.equal(trained[k], start[k]) for k in start) > 0


def test_training_on_a_form_the_export_lacks_names_the_setting_that_exports_it(rows, tiny_model, tmp_path):
    out = tmp_path / "hf"
    export_dataset(out, {"dpo": rows.dpo}, CardInfo("test", run_id="b1"))
    with pytest.raises(TrainingDataError, match=r"datasets.dpo_pair_at: \[start, divergence\]"):
        train_dpo(DPOTrainingConfig(pair_at="divergence"), str(tiny_model), out, tmp_path / "run")
