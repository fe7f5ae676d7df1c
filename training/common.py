"""What both training stages share: the starting model, the run folder, per-step metrics, the result.

A run folder holds `checkpoint/` (model or adapter, and tokenizer), `config.json` (the settings used,
the starting model, the data), `metrics.jsonl` (one line per logged step), `summary.json` and
`loss.png`; under `trainer/`, the local files of the trackers `training.report_to` names (TensorBoard's
`trainer/runs/*/events.out.tfevents.*`). The Dagster assets read these whichever way the stage was launched.
A summary's `tokens_per_second` leaves out the first step (its warm-up: allocation, the first batches
loaded) when there are two or more, as its `tokens_per_second_excludes` says.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.core.layout import Layout
from pipeline.core.pictures import line_chart_png
from training.tiny_model import build_tiny_model

PRECISION_DTYPES = {"fp32": "float32", "bf16-mixed": "float32", "bf16": "bfloat16", "fp16": "float16"}  # weights
Reporter = Callable[[dict[str, Any]], None]
ROW_IDS = ("instance_id", "rollout_id", "chosen_rollout_id", "rejected_rollout_id")  # what names a row in an error


class TrainingDataError(ValueError):
    """The stage has nothing it can train on (no rows, every group of equal rewards, ...)."""


WINDOW_FIX = "set training.rounds_window to 0 (every batch's rows) or to more rounds"
_ROW_BATCHES: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("row_batches", default=None)


@contextlib.contextmanager
def rows_of_batches(batches: tuple[str, ...] | None) -> Iterator[None]:
    """Within it `read_split` keeps only the rows of `batches` (training.rounds_window); None: every row."""
    token = _ROW_BATCHES.set(None if batches is None else tuple(batches))
    try:
        yield
    finally:
        _ROW_BATCHES.reset(token)


def read_split(dataset_folder: str | Path, config: str, split: str = "train"):
    """One config's split of an exported folder as an in-memory `datasets.Dataset`, read from its shard; only the
    rows of the batches `rows_of_batches` names, when inside it.

    Not `load_dataset(folder, config)`: its cache of a local folder is keyed on the card, so a folder
    rewritten in place with the same row counts and sizes could load yesterday's rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from datasets import Dataset
    from datasets.table import InMemoryTable

    from pipeline.datasets.card import shard_path

    folder = Path(dataset_folder)
    if not (folder / "README.md").exists():
        raise TrainingDataError(f"{folder} is not an exported dataset folder (no README.md); "
                                "materialize dataset_export first")
    path = folder / shard_path(config, split)
    if not path.exists():
        raise TrainingDataError(f"{folder}: no '{config}' {split} rows (no {path.relative_to(folder)}); "
                                f"the datasets stage made none for this stage to train on")
    table, batches = pq.read_table(path), _ROW_BATCHES.get()
    if table.num_rows == 0:
        raise TrainingDataError(f"{path}: the '{config}' {split} split is empty")
    kept = table if batches is None else table.filter(pc.is_in(table["batch"], pa.array(batches, pa.string())))
    if kept.num_rows == 0:
        raise TrainingDataError(f"{path}: none of the {table.num_rows} '{config}' {split} rows comes from the batches "
                                f"this run trains on ({', '.join(batches)}: training.rounds_window), they come from "
                                f"{', '.join(sorted(set(table['batch'].to_pylist())))}; {WINDOW_FIX}")
    return Dataset(InMemoryTable(kept))


def on_gpu() -> bool:
    """Whether this process trains on a CUDA device."""
    import torch

    return torch.cuda.is_available()


def resolved_precision(precision: str) -> str:
    """`precision` with 'auto' made concrete: bf16-mixed on a GPU that has bf16, else fp32 (a CPU).

    Mixed, not pure bf16: AdamW's step at the learning rates these methods use (1e-6 and below) is smaller than
    bf16's resolution on most weights, so weights held in bf16 would mostly not move."""
    if precision != "auto":
        return precision
    import torch

    return "bf16-mixed" if on_gpu() and torch.cuda.is_bf16_supported() else "fp32"


def autocast(model, precision: str):
    """The context a forward runs in: bf16 autocast under bf16-mixed (fp32 weights), else nothing added."""
    import contextlib

    import torch

    if resolved_precision(precision) != "bf16-mixed":
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16)


def checkpointing_on(setting: str) -> bool:
    """Whether gradient checkpointing is on for the setting: 'on', 'off', or 'auto' (on when training on a GPU)."""
    return setting == "on" or (setting == "auto" and on_gpu())


def starting_model(model: str, layout: Layout) -> str:
    """`model`, or the tiny offline model built (once) in the data folder (`layout.tiny_model()`)."""
    return model or str(build_tiny_model(layout.tiny_model()))


def load_model(path: str, precision: str):
    """A causal LM in the dtype `precision` names ('auto' resolved by `resolved_precision`)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, PRECISION_DTYPES[resolved_precision(precision)])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    score_only_labelled_positions_on_cpu()
    return without_right_padding_mask(model)


def score_only_labelled_positions_on_cpu() -> None:
    """TRL's fused LM head (SFT, DPO: log-probs, entropy, top-1 in vocabulary tiles) scores only the positions that
    carry a label on a CPU too, as it does on a GPU.

    Off Triton devices TRL scores every position, so that a compiling backend (Neuron) sees the same tile shapes on
    every batch; a CPU runs eagerly and compiles nothing. The closed loop's row (4.7k tokens, 1.3k of them the
    assistant's): 0.97 -> 0.69 s a step, the same losses. Process-wide, once; a TRL without this switch is left as
    it is."""
    import trl.trainer.utils as fused

    on_accelerator = getattr(fused, "_use_triton", None)
    if on_accelerator is None or getattr(on_accelerator, "cpu_too", False):
        return

    def compact(device) -> bool:
        return device.type == "cpu" or on_accelerator(device)

    compact.cpu_too = True
    fused._use_triton = compact


def without_right_padding_mask(model):
    """The causal LM `model`, its backbone called without the attention mask of a batch padded on the right.

    In a causal LM a real token attends only to the tokens before it, all real when the padding is on the
    right, so its outputs are the same with or without the mask; without one, torch's attention takes its causal
    kernel instead of materializing a mask (a DPO step of 8 x 4k tokens on the CPU: about half the time). Only
    the pad positions' outputs change, and every loss here masks them. Any other mask (left padding, a row that
    starts with padding), position ids or a cache passed: the call is left as it is. The hook sits on the
    backbone, which PEFT's wrappers and TRL's fused head still call as a module."""
    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if (mask is not None and mask.dim() == 2 and kwargs.get("position_ids") is None
                and kwargs.get("past_key_values") is None and bool(mask[:, 0].all())
                and bool((mask[:, 1:] <= mask[:, :-1]).all())):
            kwargs["attention_mask"] = None
        return args, kwargs

    model.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    return model


def trainer_args(config_class: type, config, out_dir: Path, use_cpu: bool,
                 report_to: tuple[str, ...] = ()) -> dict[str, Any]:
    """The TrainingArguments both TRL stages (SFTConfig, DPOConfig: `config_class`) take alike from their settings:
    schedule, batch, precision, seed, checkpointing, one log line a step, no saving on the way, the trackers
    `report_to` names (none when empty)."""
    # transformers 5.2x renamed gradient_checkpointing; pass whichever this version has, always: TRL's configs default
    # it to True, which recomputes every forward in the backward whatever `gradient_checkpointing: false` says
    names = {f.name for f in dataclasses.fields(config_class)}
    checkpointing = {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing":
                     checkpointing_on(config.gradient_checkpointing)}
    return dict(
        output_dir=str(out_dir / "trainer"), learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler, warmup_steps=config.warmup,
        per_device_train_batch_size=config.per_device_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps, num_train_epochs=config.epochs,
        max_steps=config.max_steps, bf16=resolved_precision(config.precision) in ("bf16", "bf16-mixed"),
        fp16=resolved_precision(config.precision) == "fp16",
        seed=config.seed, **checkpointing, logging_steps=1, save_strategy="no", report_to=list(report_to),
        use_cpu=use_cpu,
        include_num_input_tokens_seen="non_padding", disable_tqdm=True)


def nothing_fits(stage: str, split, counts: dict[str, int], fix: str) -> TrainingDataError:
    """The error for a split whose every row the turn-boundary cuts dropped: the counts, the longest row (its index
    and ids in `split`) and its length, and `fix` (the settings to change)."""
    index = counts["longest_row"]
    ids = ", ".join(f"{column} {split[index][column]}" for column in ROW_IDS if column in split.column_names)
    return TrainingDataError(
        f"every one of {counts['rows']} {stage} rows was dropped by the cuts at assistant-turn ends ({counts}); "
        f"the longest, row {index} ({ids or 'no ids'}), is {counts['longest_tokens']} tokens; {fix}")


def lora_config(lora):
    """PEFT's LoraConfig for the stage's `lora` settings, or None when LoRA is off (full fine-tuning)."""
    if not lora.enabled:
        return None
    from peft import LoraConfig

    modules = lora.target_modules
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=modules[0] if modules == ("all-linear",) else list(modules),
                      task_type="CAUSAL_LM")


def fresh_run_dir(out_dir: str | Path) -> Path:
    """`out_dir`, emptied: a rerun never mixes its files with an earlier run's."""
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


class MetricsLog:
    """Appends each step's metrics to `metrics.jsonl` as it comes and passes it on to `report`."""

    def __init__(self, out_dir: Path, report: Reporter | None = None):
        self.path, self.report, self.rows = out_dir / "metrics.jsonl", report, []

    def add(self, metrics: dict[str, Any]) -> None:
        row = {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
               for k, v in metrics.items()}
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.report:
            self.report(row)


@dataclass
class TrainResult:
    """Where a finished run's files are, and its headline numbers."""

    run_dir: Path
    summary: dict[str, Any]

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoint"


def finish_run(run_dir: Path, used: dict[str, Any], summary: dict[str, Any], metrics: list[dict[str, Any]],
               curves: tuple[str, ...] = ("loss",)) -> TrainResult:
    """Write config.json (`used`: the settings, starting model and data), summary.json and the loss
    curve picture; return the result."""
    (run_dir / "config.json").write_text(json.dumps(used, indent=2, default=_plain))
    losses = [[m[c] for m in metrics if isinstance(m.get(c), float)] for c in curves]
    (run_dir / "loss.png").write_bytes(line_chart_png(losses))
    summary = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return TrainResult(run_dir, summary)


def add_to_config(run_dir: str | Path, extra: dict[str, Any]) -> None:
    """Merge `extra` into a finished run's config.json (what the run started from, said by whoever launched it)."""
    path = Path(run_dir) / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **extra}, indent=2, default=_plain))


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)


def read_run(run_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A finished run's summary and per-step metrics, read back from its folder."""
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    return summary, [json.loads(line) for line in lines]


def enable_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in the backward (non-reentrant, no cache); transformers 5.2x
    renamed gradient checkpointing to activation checkpointing, so whichever this version has."""
    model.config.use_cache = False
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
