"""Supervised fine-tuning on the exported `sft` rows: TRL's SFTTrainer, loss on the assistant's tokens only.

    result = train_sft(SFTTrainingConfig(), model_path, dataset_folder, run_dir)

Rows come from the exported dataset folder's `sft` train shard: the unguided prompt and a success's
completion as one conversation, with the tool schemas it was sampled under. Each row is rendered here with
the chat template's `{% generation %}` spans (the tokenizer's own, or TRL's marked twin of it) and the same
mask as the DPO stage (`training.masking.assistant_token_mask`): a token is a target only when the policy
sampled it (the assistant's text, its tool-call text, its end-of-turn token), never a tool observation, the
prompt or a role header. SFTTrainer gets the ids and that mask (`assistant_masks`) and builds the labels
from them. The run folder gets the checkpoint (the full model, or the LoRA adapter), the tokenizer, the
settings used and the metrics of every step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from training.common import (MetricsLog, PRECISION_DTYPES, Reporter, TrainResult, TrainingDataError, finish_run,
                             fresh_run_dir, load_model, lora_config, read_split, resolved_precision, trainer_args)
from training.config import SFTTrainingConfig

KEPT_METRICS = ("loss", "mean_token_accuracy", "entropy", "num_tokens", "learning_rate", "grad_norm", "epoch")
COLUMNS = ["messages", "tools"]


def load_rows(dataset_folder: str | Path, split: str = "train"):
    """The `sft` config's rows of an exported folder, the conversation and its tools only."""
    return read_split(dataset_folder, "sft", split).select_columns(COLUMNS)


def tokenize_row(row: dict[str, Any], tokenizer, chat_template: str) -> dict[str, list[int]]:
    """A stored row as `input_ids` and `assistant_masks` (1 on each token the policy sampled)."""
    from training.masking import assistant_token_mask, to_template_row

    row = to_template_row(row)
    ids, mask = assistant_token_mask(tokenizer, row["messages"], row.get("tools") or None, chat_template)
    return {"input_ids": ids, "assistant_masks": mask}


def tokenized_rows(rows, tokenizer):
    """The rows tokenized and masked (`tokenize_row`); a row with no assistant token is refused, naming it."""
    from training.masking import training_chat_template

    template = training_chat_template(tokenizer)
    tokenized = rows.map(tokenize_row, fn_kwargs={"tokenizer": tokenizer, "chat_template": template},
                         remove_columns=rows.column_names, desc="Tokenizing sft rows")
    empty = [i for i, mask in enumerate(tokenized["assistant_masks"]) if 1 not in mask]
    if empty:
        raise TrainingDataError(f"sft rows {empty[:5]} have no assistant token to train on; the chat template's "
                                "{% generation %} spans cover nothing in them")
    return tokenized


def sft_args(config: SFTTrainingConfig, out_dir: Path, use_cpu: bool):
    """TRL's SFTConfig for these settings. The rows arrive tokenized and masked, so TRL's own
    `assistant_only_loss` stays off: the `assistant_masks` column alone decides the labels."""
    from trl import SFTConfig

    return SFTConfig(**trainer_args(SFTConfig, config, out_dir, use_cpu), max_length=config.max_length,
                     truncation_mode="keep_start")


def train_sft(config: SFTTrainingConfig, model_path: str, dataset_folder: str | Path, out_dir: str | Path,
              report: Reporter | None = None) -> TrainResult:
    """Train on the folder's `sft` train split; write the run folder `out_dir` (emptied first)."""
    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTTrainer

    rows = load_rows(dataset_folder)
    out = fresh_run_dir(out_dir)
    metrics = MetricsLog(out, report)

    class Metrics(TrainerCallback):
        reached = 0  # steps in a row at config.stop_at_token_accuracy

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                metrics.add({"step": state.global_step, **{k: logs[k] for k in KEPT_METRICS if k in logs}})
                goal = config.stop_at_token_accuracy
                self.reached = self.reached + 1 if goal and logs.get("mean_token_accuracy", 0) >= goal else 0
                control.should_training_stop |= self.reached >= max(config.stop_patience, 1)

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenized = tokenized_rows(rows, tokenizer)
    lengths = [len(ids) for ids in tokenized["input_ids"]]
    trainer = SFTTrainer(
        load_model(model_path, config.precision), args=sft_args(config, out, not torch.cuda.is_available()),
        processing_class=tokenizer, train_dataset=tokenized, peft_config=lora_config(config.lora), callbacks=[Metrics()])
    start = time.monotonic()
    output = trainer.train()
    seconds = time.monotonic() - start
    trainer.save_model(str(out / "checkpoint"))  # the adapter alone under LoRA
    tokenizer.save_pretrained(str(out / "checkpoint"))
    tokens = trainer.state.num_input_tokens_seen
    history = metrics.rows
    summary = {
        "stage": "sft", "starting_model": model_path, "dataset": str(dataset_folder), "rows": rows.num_rows,
        "rows_truncated": sum(n > config.max_length for n in lengths),
        "cut_tokens": sum(max(0, n - config.max_length) for n in lengths),
        "assistant_tokens": sum(sum(mask) for mask in tokenized["assistant_masks"]),
        "steps": trainer.state.global_step, "stopped_early": trainer.state.global_step < trainer.state.max_steps,
        "adapter": config.lora.enabled, "dtype": PRECISION_DTYPES[resolved_precision(config.precision)],
        "first_loss": history[0]["loss"] if history else None, "final_loss": history[-1]["loss"] if history else None,
        "final_token_accuracy": history[-1].get("mean_token_accuracy") if history else None,
        "train_loss": output.training_loss, "seconds": round(seconds, 2), "tokens": int(tokens),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else None}
    return finish_run(out, {"stage": "sft", "starting_model": model_path, "settings": config}, summary, history)
