"""The SFT stage on the tiny offline model: which tokens are targets, where an over-long conversation is cut, full
and LoRA training on exported rows, the asset in process (logging to TensorBoard too) and launched through Pipes,
the settings that reach the trainer."""

from __future__ import annotations

import json
import shutil
import struct

import dagster as dg
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from assets.resources import Credentials, HandholdSettings
from assets.training import sft_model
from pipeline.datasets import DatasetConfig, build_rows
from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset
from pipeline.datasets.release import Provenance, cut_release
from tests.test_datasets_build import TASK_T1, traj
from tests.test_training_masking import ROWS, TOOLS
from training.common import TrainingDataError, read_run, read_split
from training.config import LoraSettings, SFTTrainingConfig
from training.edits import last_edit_turn
from training.masking import to_template_row
from training.sft import load_rows, tokenize_row, train_sft
from training.tiny_model import CHAT_TEMPLATE


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An exported dataset folder whose `sft` train split holds the successes of task t1 (four after the builder's selection)."""
    rows = build_rows(TASK_T1 + [traj("g5", kind="plan", reward=1.0, sample=5, steps=2)],
                      DatasetConfig(pairs_per_task=50, test_fraction=0.0))
    out = tmp_path_factory.mktemp("export") / "hf"
    export_dataset(out, {"sft": rows.sft}, CardInfo("test", run_id="b1"))
    return out


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return str(tiny_model)


def sft_config(**changes) -> SFTTrainingConfig:
    """Every row in one batch, the same batch each step: the loss must fall (and the token accuracy rise: from the
    third step at 5e-3 on the one-layer tiny model, the fifth at 2e-3)."""
    return SFTTrainingConfig(**{"learning_rate": 5e-3, "lr_scheduler": "constant", "warmup": 0,
                                "per_device_batch_size": 8, "gradient_accumulation_steps": 1, "max_steps": 4,
                                "max_length": 4096, **changes})


def test_the_targets_are_exactly_what_the_policy_wrote(tiny):
    """Worked out by hand: the targets are each assistant turn's text, its tool call as the template renders it
    and its end-of-turn token; never the system or user prompt, a role header or the tool's output."""
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    call = {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    row = {"tools": "[]", "messages": [
        {"role": "system", "content": "S"}, {"role": "user", "content": "U"},
        {"role": "assistant", "content": "look", "tool_calls": [call]},
        {"role": "tool", "content": "OUT", "tool_call_id": "call_0"},
        {"role": "assistant", "content": "done"}]}
    out = tokenize_row(row, tokenizer, CHAT_TEMPLATE)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask)
    spans, current = [], []
    for token, kept in zip(ids, mask):
        if kept:
            current.append(token)
        elif current:
            spans, current = spans + [tokenizer.decode(current)], []
    spans += [tokenizer.decode(current)] if current else []
    assert spans == ['look\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call><|im_end|>',
                     "done<|im_end|>"]
    assert tokenizer.decode(ids).count("OUT") == 1  # the observation is context, not a target


def rendered_length(tokenizer, messages: list[dict]) -> int:
    row = to_template_row({"messages": messages, "tools": TOOLS})
    return len(tokenizer.apply_chat_template(row["messages"], tools=row["tools"], tokenize=True,
                                             return_dict=True)["input_ids"])


@pytest.mark.parametrize(("budget_end", "kept_end", "dropped"), [
    (None, 5, None),  # no budget: nothing cut
    (5, 5, None),  # a budget of exactly the whole conversation
    (4, 3, None),  # room up to the second observation: cut after turn 2, which holds the edit
    (3, 3, None),  # room up to turn 2's end: the cut falls right after it
    (2, None, "edit"),  # room for turn 1 and its observation: turn 1 alone fits, the edit (turn 2) is cut
    (0, None, "length"),  # room for the prompt alone: no whole turn fits
])
def test_an_sft_conversation_is_cut_after_its_last_turn_that_fits_and_kept_only_with_its_edit(
        tiny, budget_end, kept_end, dropped):
    """A success of 3 turns (`ls`, the `sed -i` fix, submit) after a system and a user message, cut to a budget
    that fits exactly the prompt and its first `budget_end` completion messages."""
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    messages = ROWS[0]["prompt"] + ROWS[0]["chosen"]
    assert last_edit_turn(ROWS[0]["chosen"]) == 2

    def length(end: int) -> int:
        return rendered_length(tokenizer, messages[:2 + end])

    budget = None if budget_end is None else length(budget_end)
    out = tokenize_row({"messages": messages, "tools": TOOLS}, tokenizer, CHAT_TEMPLATE, budget)
    assert out["tokens"] == length(5)
    assert (out["dropped"], out["cut_before_last_edit"]) == (dropped is not None, dropped == "edit")
    if dropped:
        assert out["input_ids"] == out["assistant_masks"] == []
        return
    whole = tokenize_row({"messages": messages[:2 + kept_end], "tools": TOOLS}, tokenizer, CHAT_TEMPLATE)
    assert (out["input_ids"], out["assistant_masks"]) == (whole["input_ids"], whole["assistant_masks"])
    assert out["cut_tokens"] == length(5) - length(kept_end) and len(out["input_ids"]) == length(kept_end)
    assert out["assistant_masks"][-2:] == [1, 0]  # it ends on an assistant turn's end, not mid-turn


def test_sft_refuses_before_the_first_step_when_no_row_fits_naming_the_longest(folder, tiny, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    stored = read_split(folder, "sft")
    lengths = [len(tokenizer.apply_chat_template(r["messages"], tools=r["tools"], tokenize=True,
                                                 return_dict=True)["input_ids"])
               for r in map(to_template_row, stored.select_columns(["messages", "tools"]))]
    longest = lengths.index(max(lengths))
    with pytest.raises(TrainingDataError) as refused:
        train_sft(sft_config(max_length=20), tiny, folder, tmp_path / "run")
    message = str(refused.value)
    assert "every one of 4 SFT rows was dropped" in message
    assert f"row {longest} (instance_id t1, rollout_id {stored['rollout_id'][longest]}), is {max(lengths)} tokens" \
        in message
    assert f"raise training.sft.max_length above 20 ({max(lengths)} keeps that row whole)" in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no step ran


def test_sft_trains_the_tiny_model_and_saves_what_it_used(folder, tiny, tmp_path):
    assert load_rows(folder).num_rows == 4
    result = train_sft(sft_config(), tiny, folder, tmp_path / "run")
    summary, metrics = read_run(result.run_dir)
    assert summary["rows"] == summary["rows_trained"] == 4 and summary["steps"] == 4 == len(metrics)
    assert summary["rows_truncated"] == summary["rows_dropped"] == summary["rows_cut_before_last_edit"] == 0
    assert not list(result.run_dir.rglob("events.out.tfevents*"))  # training.report_to is empty: no tracker
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    assert metrics[-1]["mean_token_accuracy"] > metrics[0]["mean_token_accuracy"]
    assert summary["tokens_per_second"] > 0 and 0 < summary["assistant_tokens"] < summary["tokens"]
    trained = AutoModelForCausalLM.from_pretrained(result.checkpoint)
    start = AutoModelForCausalLM.from_pretrained(tiny)
    changed = sum(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), start.state_dict().values()))
    assert changed > 0
    assert AutoTokenizer.from_pretrained(result.checkpoint).chat_template == CHAT_TEMPLATE
    used = json.loads((result.run_dir / "config.json").read_text())
    assert used["settings"]["learning_rate"] == 5e-3 and used["starting_model"] == tiny
    assert (result.run_dir / "loss.png").read_bytes().startswith(b"\x89PNG")


def test_sft_stops_once_the_token_accuracy_held_for_the_patience(folder, tiny, tmp_path):
    goal, patience = 0.05, 2
    result = train_sft(sft_config(max_steps=40, stop_at_token_accuracy=goal, stop_patience=patience), tiny, folder,
                       tmp_path / "run")
    summary, metrics = read_run(result.run_dir)
    accuracy = [m["mean_token_accuracy"] for m in metrics]
    first = next(i for i in range(patience, len(accuracy) + 1) if min(accuracy[i - patience:i]) >= goal)
    assert summary["stopped_early"] and summary["steps"] == len(metrics) == first < 40
    assert (result.checkpoint / "model.safetensors").exists()


def test_sft_with_lora_saves_an_adapter_that_loads(folder, tiny, tmp_path):
    from peft import PeftModel

    result = train_sft(sft_config(max_steps=2, lora=LoraSettings(enabled=True, r=4, alpha=8)), tiny, folder,
                       tmp_path / "run")
    files = {p.name for p in result.checkpoint.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), result.checkpoint)
    ids = torch.tensor([[5, 6, 7, 8]])
    base = AutoModelForCausalLM.from_pretrained(tiny)
    assert not torch.allclose(adapted(ids).logits, base(ids).logits)  # the adapter learned something


def test_the_sft_asset_launched_through_pipes_reports_its_steps(folder, tiny, tmp_path):
    """`training.launcher: pipes`: `accelerate launch ... -m training.run sft` in its own process."""
    data = tmp_path / "data"
    shutil.copytree(folder, data / "datasets" / "hf")
    release = cut_release(data / "datasets" / "hf", data / "datasets" / "releases", Provenance("night-1")).release
    settings = HandholdSettings(data_dir=str(data), batch="b1", training={
        "model": tiny, "launcher": "pipes", "report_to": ["tensorboard"],
        "sft": {"learning_rate": 1e-3, "per_device_batch_size": 8, "gradient_accumulation_steps": 1, "max_steps": 2}})
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([sft_model], instance=instance,
                            resources={"settings": settings, "credentials": Credentials()})
    assert result.success
    meta = result.get_asset_materialization_events()[0].step_materialization_data.materialization.metadata
    assert meta["launcher"].value == "pipes" and meta["stage"].value == "sft"  # reported by the subprocess
    assert meta["steps"].value == 2 and meta["checkpoint"].value.endswith("models/sft/b1/checkpoint")
    assert meta["rows"].value == 4 and meta["loss_curve"].value.startswith("![loss](data:image/png;base64,")
    read = {"dataset_release": "night-1", "dataset_build": "night-1", "dataset_sha256": release.content_sha256,
            "dataset_path": str(data / "datasets" / "hf")}  # which release it trained on, in the UI and its folder
    assert {k: meta[k].value for k in read} == read
    assert json.loads((data / "models" / "sft" / "b1" / "dataset.json").read_text()) == read
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert sum("sft step {" in message for message in logs) == 2
    # training.report_to travelled in the spec to the subprocess's trainer
    assert sorted(tensorboard_scalars(data / "models" / "sft" / "b1" / "trainer")["train/loss"]) == [1, 2]


def tensorboard_scalars(folder) -> dict[str, dict[int, float]]:
    """Every scalar of the TensorBoard event files under `folder`: tag -> step -> value, read from the records
    (length, its CRC, an Event proto, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, dict[int, float]] = {}
    for path in folder.rglob("events.out.tfevents*"):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (size,) = struct.unpack("<Q", data[at:at + 8])
            event = Event.FromString(data[at + 12:at + 12 + size])
            at += 12 + size + 4
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def test_the_sft_asset_in_process_logs_to_tensorboard_and_times_the_steps_after_the_first(folder, tiny, tmp_path):
    """`training.report_to: [tensorboard]` reaches the trainer; every step trains the same 4 rows (one batch of 8),
    so steps 2 and 3, the timed ones, saw two thirds of the tokens, each row's rendered tokens twice."""
    data = tmp_path / "data"
    shutil.copytree(folder, data / "datasets" / "hf")
    settings = HandholdSettings(data_dir=str(data), batch="b1", training={
        "model": tiny, "report_to": ["tensorboard"],
        "sft": {"learning_rate": 5e-3, "per_device_batch_size": 8, "gradient_accumulation_steps": 1, "max_steps": 3}})
    result = dg.materialize([sft_model], resources={"settings": settings, "credentials": Credentials()})
    assert result.success
    run = data / "models" / "sft" / "b1"
    summary, metrics = read_run(run)
    assert list((run / "trainer" / "runs").glob("*/events.out.tfevents*"))
    losses = tensorboard_scalars(run / "trainer")["train/loss"]
    assert losses == pytest.approx({m["step"]: m["loss"] for m in metrics}) and sorted(losses) == [1, 2, 3]

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    per_step = sum(len(tokenize_row(r, tokenizer, CHAT_TEMPLATE)["input_ids"]) for r in load_rows(folder))
    assert summary["steps"] == 3 and summary["tokens"] == 3 * per_step
    assert summary["tokens_per_second_excludes"] == "first step" and summary["timed_tokens"] == 2 * per_step
    assert 0 < summary["timed_seconds"] < summary["seconds"]
    assert summary["tokens_per_second"] == pytest.approx(2 * per_step / summary["timed_seconds"], rel=1e-3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="pins what 'auto' means on a CPU")
def test_auto_precision_and_checkpointing_on_a_cpu_and_what_each_setting_passes_to_the_trainer(tmp_path):
    """On a CPU 'auto' is fp32 without checkpointing; 'on' and 'off' reach the trainer as they say, whatever TRL's
    configs default to (both default checkpointing to True)."""
    from trl import DPOConfig, SFTConfig

    from training.common import checkpointing_on, resolved_precision, trainer_args
    from training.config import DPOTrainingConfig

    assert (resolved_precision("auto"), checkpointing_on("auto")) == ("fp32", False)
    assert [resolved_precision(p) for p in ("fp32", "bf16-mixed", "bf16", "fp16")] == ["fp32", "bf16-mixed", "bf16",
                                                                                       "fp16"]
    for setting, on in (("on", True), ("off", False), ("auto", False)):
        for config_class, config in ((SFTConfig, SFTTrainingConfig(gradient_checkpointing=setting)),
                                     (DPOConfig, DPOTrainingConfig(gradient_checkpointing=setting))):
            args = config_class(**trainer_args(config_class, config, tmp_path, use_cpu=True))
            assert (args.activation_checkpointing, args.gradient_checkpointing) == (on, on)
    for precision, flags in (("auto", (False, False)), ("fp32", (False, False)), ("bf16-mixed", (True, False)),
                             ("bf16", (True, False)), ("fp16", (False, True))):
        args = trainer_args(SFTConfig, SFTTrainingConfig(precision=precision), tmp_path, use_cpu=True)
        assert (args["bf16"], args["fp16"]) == flags
    assert trainer_args(SFTConfig, SFTTrainingConfig(), tmp_path, True)["report_to"] == []
    tracked = trainer_args(SFTConfig, SFTTrainingConfig(), tmp_path, True, ("tensorboard",))
    assert tracked["report_to"] == ["tensorboard"]
