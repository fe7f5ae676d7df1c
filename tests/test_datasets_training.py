"""TRL trains on the rows the pipeline exports: built from trajectories, written as a dataset folder,
loaded with `datasets`, one DPO step (assistant-only masks) and one SFT step on the tiny offline model."""

from __future__ import annotations

import pytest
from datasets import Dataset, Features, Json, List, load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, SFTConfig, SFTTrainer
from trl.chat_template_utils import qwen2_5_chat_template, qwen2_5_training_chat_template

from pipeline.datasets import DatasetConfig, build_rows
from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset
from training.masking import AssistantOnlyDPOTrainer, TruncationPolicy, to_template_row
from tests.test_datasets_build import TASK_T1, traj
from tests.test_training_masking import train


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The dpo and sft configs of a folder exported from rows the builder made of stored trajectories."""
    rows = build_rows(TASK_T1 + [traj("g5", kind="plan", reward=1.0, sample=5, steps=2)],
                      DatasetConfig(pairs_per_task=50, test_fraction=0.0))
    folder = tmp_path_factory.mktemp("export") / "hf"
    export_dataset(folder, {"dpo": rows.dpo, "sft": rows.sft}, CardInfo("test", run_id="b1"))
    return {kind: load_dataset(str(folder), kind, split="train") for kind in ("dpo", "sft")}


def test_one_dpo_step_on_exported_rows(exported, tiny_model, tmp_path):
    dpo = exported["dpo"]
    assert dpo.num_rows == 8 and set(dpo["chosen_source"]) == {"unguided", "guided:plan", "guided:action"}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = qwen2_5_chat_template
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    args = DPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=3, learning_rate=5e-3,
                     max_length=None, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0)
    trainer = AssistantOnlyDPOTrainer(model, args=args, processing_class=tokenizer,
                                      train_dataset=dpo.select_columns(["prompt", "chosen", "rejected", "tools"]),
                                      truncation=TruncationPolicy(max_length=4096))
    assert len(train(trainer)) == 2


def test_one_sft_step_on_exported_rows(exported, tiny_model, tmp_path):
    sft = exported["sft"]
    assert sft.num_rows == 4
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = qwen2_5_training_chat_template
    template_rows = [to_template_row({"messages": r["messages"], "tools": r["tools"]}) for r in sft]
    dataset = Dataset.from_list(template_rows, features=Features({"messages": List(Json()), "tools": List(Json())}))
    args = SFTConfig(output_dir=str(tmp_path), assistant_only_loss=True, max_steps=2, learning_rate=5e-3,
                     per_device_train_batch_size=2, logging_steps=1, save_strategy="no", report_to=[],
                     use_cpu=True, seed=0)
    trainer = SFTTrainer(AutoModelForCausalLM.from_pretrained(tiny_model), args=args, processing_class=tokenizer,
                         train_dataset=dataset)
    assert len(train(trainer)) == 2
