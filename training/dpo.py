"""Offline DPO on the exported DPO rows: TRL's DPOTrainer with tool observations masked out of the loss.

    result = train_dpo(DPOTrainingConfig(), model_path, dataset_folder, run_dir)

Rows come from the exported dataset folder's train shard of the form `pair_at` names: `dpo`, the unguided
prompt, a success as chosen and an unguided failure as rejected; or `dpo_divergence`, the same pairs cut at the
first turn their attempts differ, the turns both took in the prompt (context: no prompt token is scored). Only the
policy's own tokens (assistant text, tool-call text, end of turn) count in the log-ratios
(`training.masking.AssistantOnlyDPOTrainer`). Completions longer than `max_length` are cut at
assistant-turn ends; a pair is dropped, and counted, when too few turns fit or its chosen side is cut before
its last edit (`training.masking.TruncationPolicy`); a split whose every pair is dropped is refused before the
first step, naming the longest row. The run folder gets the checkpoint (the full model, or the LoRA adapter),
the tokenizer, the settings used and the metrics of every step.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.datasets.config import DPO_FORMS
from training.common import (MetricsLog, PRECISION_DTYPES, Reporter, TrainResult, TrainingDataError, finish_run,
                             fresh_run_dir, load_model, lora_config, nothing_fits, read_split, resolved_precision,
                             trainer_args)
from training.config import DPOTrainingConfig
from training.throughput import step_clock, throughput

KEPT_METRICS = ("loss", "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected",
                "learning_rate", "grad_norm", "epoch")
COLUMNS = ["prompt", "chosen", "rejected", "tools"]


def load_rows(dataset_folder: str | Path, split: str = "train", pair_at: str = "start"):
    """The rows of an exported folder's config of DPO form `pair_at` (DPO_FORMS), the trainer's columns only."""
    return read_form(dataset_folder, pair_at, split).select_columns(COLUMNS)


def read_form(dataset_folder: str | Path, pair_at: str, split: str = "train"):
    """The split of the folder's config of DPO form `pair_at`; a form the export lacks is named with its fix."""
    try:
        return read_split(dataset_folder, DPO_FORMS[pair_at], split)
    except TrainingDataError as exc:
        if pair_at == "start":
            raise
        raise TrainingDataError(f"{exc}; training.dpo.pair_at is {pair_at!r}: export that form with "
                                f"datasets.dpo_pair_at: [start, {pair_at}], or train on pair_at: start") from exc


def dpo_args(config: DPOTrainingConfig, out_dir: Path, use_cpu: bool, report_to: tuple[str, ...] = ()):
    """TRL's DPOConfig for these settings (masking cuts turns itself, so TRL's max_length is None)."""
    from trl import DPOConfig

    return DPOConfig(**trainer_args(DPOConfig, config, out_dir, use_cpu, report_to), beta=config.beta,
                     loss_type=[config.loss_type], precompute_ref_log_probs=config.precompute_ref_log_probs,
                     max_length=None)


def train_dpo(config: DPOTrainingConfig, model_path: str, dataset_folder: str | Path, out_dir: str | Path,
              report: Reporter | None = None, report_to: tuple[str, ...] = ()) -> TrainResult:
    """Train on the folder's train split of the DPO form `config.pair_at`; write the run folder `out_dir` (emptied
    first); also log to the trackers `report_to` names."""
    import torch
    from transformers import AutoTokenizer, TrainerCallback

    from training.masking import AssistantOnlyDPOTrainer, TruncationPolicy

    split = read_form(dataset_folder, config.pair_at)
    rows = split.select_columns(COLUMNS)
    out = fresh_run_dir(out_dir)
    metrics = MetricsLog(out, report)

    class Metrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                metrics.add({"step": state.global_step, **{k: logs[k] for k in KEPT_METRICS if k in logs}})

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    clock = step_clock()
    trainer = AssistantOnlyDPOTrainer(
        load_model(model_path, config.precision),
        args=dpo_args(config, out, not torch.cuda.is_available(), report_to), processing_class=tokenizer,
        train_dataset=rows, peft_config=lora_config(config.lora), callbacks=[Metrics(), clock],
        truncation=TruncationPolicy(config.max_length, config.min_assistant_turns))
    kept = trainer.truncation_counts.get("train", {})
    if trainer.train_dataset.num_rows == 0:
        raise nothing_fits("DPO", split, kept, f"raise training.dpo.max_length above {config.max_length} "
                                               f"({kept['longest_tokens']} keeps that row whole), or lower "
                                               f"training.dpo.min_assistant_turns ({config.min_assistant_turns})")
    start = time.monotonic()
    output = trainer.train()
    seconds = time.monotonic() - start
    trainer.save_model(str(out / "checkpoint"))  # the adapter alone under LoRA
    tokenizer.save_pretrained(str(out / "checkpoint"))
    tokens = trainer.state.num_input_tokens_seen
    history = metrics.rows
    summary = {
        "stage": "dpo", "starting_model": model_path, "dataset": str(dataset_folder),
        "dataset_config": DPO_FORMS[config.pair_at], "rows": rows.num_rows,
        "rows_trained": trainer.train_dataset.num_rows, "truncation": kept,
        "rows_cut_before_last_edit": kept["chosen_cut_before_last_edit"], "steps": trainer.state.global_step,
        "adapter": config.lora.enabled, "dtype": PRECISION_DTYPES[resolved_precision(config.precision)],
        "first_loss": history[0]["loss"] if history else None, "final_loss": history[-1]["loss"] if history else None,
        "final_reward_margin": history[-1].get("rewards/margins") if history else None,
        "final_reward_accuracy": history[-1].get("rewards/accuracies") if history else None,
        "train_loss": output.training_loss, "seconds": round(seconds, 2), "tokens": int(tokens),
        **throughput(clock, tokens, seconds)}
    return finish_run(out, {"stage": "dpo", "starting_model": model_path, "settings": config, "report_to": report_to},
                      summary, history)
