"""The SFT stage on the tiny offline model: which tokens are targets, full and LoRA training on exported rows,
the asset launched through Pipes."""

from __future__ import annotations

import json
import shutil

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
from training.common import read_run
from training.config import LoraSettings, SFTTrainingConfig
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


def test_sft_trains_the_tiny_model_and_saves_what_it_used(folder, tiny, tmp_path):
    assert load_rows(folder).num_rows == 4
    result = train_sft(sft_config(), tiny, folder, tmp_path / "run")
    summary, metrics = read_run(result.run_dir)
    assert summary["rows"] == 4 and summary["steps"] == 4 == len(metrics) and summary["rows_truncated"] == 0
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
        "model": tiny, "launcher": "pipes", "sft": {"learning_rate": 1e-3, "per_device_batch_size": 8,
                                                    "gradient_accumulation_steps": 1, "max_steps": 2}})
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


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_checkpointing_is_what_the_settings_say_not_trls_default(checkpointing, tmp_path):
    """TRL's SFTConfig and DPOConfig default it to True; the settings' False must reach the trainer as False."""
    from trl import DPOConfig, SFTConfig

    from training.common import trainer_args
    from training.config import DPOTrainingConfig

    for config_class, config in ((SFTConfig, SFTTrainingConfig(gradient_checkpointing=checkpointing)),
                                 (DPOConfig, DPOTrainingConfig(gradient_checkpointing=checkpointing))):
        args = config_class(**trainer_args(config_class, config, tmp_path, use_cpu=True))
        assert (args.activation_checkpointing, args.gradient_checkpointing) == (checkpointing, checkpointing)
