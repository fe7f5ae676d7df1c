"""Supervised fine-tuning on the exported `sft` rows: TRL's SFTTrainer, loss on the assistant's tokens only.

    result = train_sft(SFTTrainingConfig(), model_path, dataset_folder, run_dir)

Rows come from the exported dataset folder's `sft` train shard: the unguided prompt and a success's
completion as one conversation, with the tool schemas it was sampled under. Each row is rendered here with
the chat template's `{% generation %}` spans (the tokenizer's own, or TRL's marked twin of it) and the same
mask as the DPO stage (`training.masking.assistant_token_mask`): a token is a target only when the policy
sampled it (the assistant's text, its tool-call text, its end-of-turn token), never a tool observation, the
prompt or a role header.

A conversation longer than `max_length` is cut as the DPO stage cuts a completion (`training.masking.fit_turns`):
after its last assistant turn that fits, the prompt kept whole. It is dropped, and counted, when no whole
assistant turn fits, or when the cut falls before its last edit (`training.edits.keeps_last_edit`: the kept
part never made the fix it would teach). SFTTrainer gets rows already within `max_length`, their ids and that
mask (`assistant_masks`), and builds the labels from them; it cuts nothing. A split whose every row is dropped
is refused before the first step, naming the longest row. The run folder gets the checkpoint (the full model,
or the LoRA adapter), the tokenizer, the settings used and the metrics of every step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from training.common import (MetricsLog, PRECISION_DTYPES, Reporter, TrainResult, TrainingDataError, finish_run,
                             fresh_run_dir, load_model, lora_config, nothing_fits, read_split, resolved_precision,
                             trainer_args)
from training.config import SFTTrainingConfig
from training.throughput import step_clock, throughput

KEPT_METRICS = ("loss", "mean_token_accuracy", "entropy", "num_tokens", "learning_rate", "grad_norm", "epoch")
COLUMNS = ["messages", "tools"]
TRAINED_COLUMNS = ["input_ids", "assistant_masks"]


def load_rows(dataset_folder: str | Path, split: str = "train"):
    """The `sft` config's rows of an exported folder, the conversation and its tools only."""
    return read_split(dataset_folder, "sft", split).select_columns(COLUMNS)


def tokenize_row(row: dict[str, Any], tokenizer, chat_template: str, max_length: int | None = None) -> dict[str, Any]:
    """A stored row as `input_ids` and `assistant_masks` (1 on each token the policy sampled), cut after its last
    assistant turn that fits `max_length` (None: no cut); with `tokens` (uncut), `cut_tokens`, `dropped` and
    `cut_before_last_edit` (dropped for that alone)."""
    from training.edits import keeps_last_edit
    from training.masking import fit_turns, to_template_row

    row = to_template_row(row)
    messages = row["messages"]
    start = next((i for i, message in enumerate(messages) if message["role"] == "assistant"), len(messages))
    prompt, completion = messages[:start], messages[start:]
    fit = fit_turns(tokenizer, prompt, completion, row.get("tools") or None, chat_template, max_length)
    too_long = fit.turns == 0 and fit.cut > 0  # a row with no assistant turn at all is refused by tokenized_rows
    cut_before_edit = not too_long and not keeps_last_edit(completion, fit.turns)
    dropped = too_long or cut_before_edit
    return {"input_ids": [] if dropped else fit.ids, "assistant_masks": [] if dropped else fit.mask,
            "tokens": fit.tokens, "cut_tokens": fit.cut, "dropped": dropped, "cut_before_last_edit": cut_before_edit}


def tokenized_rows(rows, tokenizer, max_length: int | None = None):
    """Every row tokenized, masked and cut (`tokenize_row`); a kept row with no assistant token is refused, naming
    it."""
    from training.masking import training_chat_template

    template = training_chat_template(tokenizer)
    tokenized = rows.map(tokenize_row, remove_columns=rows.column_names, desc="Tokenizing sft rows",
                         fn_kwargs={"tokenizer": tokenizer, "chat_template": template, "max_length": max_length})
    empty = [i for i, (mask, dropped) in enumerate(zip(tokenized["assistant_masks"], tokenized["dropped"]))
             if not dropped and 1 not in mask]
    if empty:
        raise TrainingDataError(f"sft rows {empty[:5]} have no assistant token to train on; the chat template's "
                                "{% generation %} spans cover nothing in them")
    return tokenized


def cut_counts(tokenized) -> dict[str, int]:
    """Rows, dropped rows (and of those, cut before their last edit), kept rows that lost tokens, tokens cut from
    kept rows, and the longest row (its index and uncut tokens)."""
    dropped, lengths = tokenized["dropped"], tokenized["tokens"]
    kept_cuts = [cut for cut, gone in zip(tokenized["cut_tokens"], dropped) if not gone]
    longest = max(range(len(lengths)), key=lengths.__getitem__, default=-1)
    return {"rows": len(dropped), "dropped": sum(dropped),
            "cut_before_last_edit": sum(tokenized["cut_before_last_edit"]),
            "truncated": sum(cut > 0 for cut in kept_cuts), "cut_tokens": sum(kept_cuts),
            "longest_row": longest, "longest_tokens": lengths[longest] if lengths else 0}


def sft_args(config: SFTTrainingConfig, out_dir: Path, use_cpu: bool, report_to: tuple[str, ...] = ()):
    """TRL's SFTConfig for these settings. The rows arrive tokenized, masked and cut at turn ends, so TRL's own
    `assistant_only_loss` stays off (the `assistant_masks` column alone decides the labels) and its max_length is
    None (a cut of its own would fall mid-turn)."""
    from trl import SFTConfig

    return SFTConfig(**trainer_args(SFTConfig, config, out_dir, use_cpu, report_to), max_length=None)


def train_sft(config: SFTTrainingConfig, model_path: str, dataset_folder: str | Path, out_dir: str | Path,
              report: Reporter | None = None, report_to: tuple[str, ...] = ()) -> TrainResult:
    """Train on the folder's `sft` train split; write the run folder `out_dir` (emptied first); also log to the
    trackers `report_to` names."""
    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTTrainer

    split = read_split(dataset_folder, "sft")
    rows = split.select_columns(COLUMNS)
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
    tokenized = tokenized_rows(rows, tokenizer, config.max_length)
    cuts = cut_counts(tokenized)
    kept = tokenized.filter(lambda row: not row["dropped"]).select_columns(TRAINED_COLUMNS)
    if kept.num_rows == 0:
        raise nothing_fits("SFT", split, cuts, f"raise training.sft.max_length above {config.max_length} "
                                               f"({cuts['longest_tokens']} keeps that row whole)")
    clock = step_clock()
    trainer = SFTTrainer(
        load_model(model_path, config.precision),
        args=sft_args(config, out, not torch.cuda.is_available(), report_to), processing_class=tokenizer,
        train_dataset=kept, peft_config=lora_config(config.lora), callbacks=[Metrics(), clock])
    start = time.monotonic()
    output = trainer.train()
    seconds = time.monotonic() - start
    trainer.save_model(str(out / "checkpoint"))  # the adapter alone under LoRA
    tokenizer.save_pretrained(str(out / "checkpoint"))
    tokens = trainer.state.num_input_tokens_seen
    history = metrics.rows
    summary = {
        "stage": "sft", "starting_model": model_path, "dataset": str(dataset_folder), "rows": rows.num_rows,
        "rows_trained": kept.num_rows, "rows_truncated": cuts["truncated"], "rows_dropped": cuts["dropped"],
        "rows_cut_before_last_edit": cuts["cut_before_last_edit"], "cut_tokens": cuts["cut_tokens"],
        "assistant_tokens": sum(sum(mask) for mask in kept["assistant_masks"]),
        "steps": trainer.state.global_step, "stopped_early": trainer.state.global_step < trainer.state.max_steps,
        "adapter": config.lora.enabled, "dtype": PRECISION_DTYPES[resolved_precision(config.precision)],
        "first_loss": history[0]["loss"] if history else None, "final_loss": history[-1]["loss"] if history else None,
        "final_token_accuracy": history[-1].get("mean_token_accuracy") if history else None,
        "train_loss": output.training_loss, "seconds": round(seconds, 2), "tokens": int(tokens),
        **throughput(clock, tokens, seconds)}
    return finish_run(out, {"stage": "sft", "starting_model": model_path, "settings": config, "report_to": report_to},
                      summary, history)
