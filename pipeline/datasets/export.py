"""Export built row tables as a local Hugging Face dataset folder.

Layout (what `datasets.load_dataset(folder, config)` discovers through the card's `configs:`)::

    <folder>/README.md                              dataset card: YAML header + description
    <folder>/k_star_histogram.png                   k*/K of the guidance plans (when plans are given)
    <folder>/data/<config>/<split>-00000-of-00001.parquet

Configs: `dpo`, and `dpo_divergence` when the datasets' `dpo_pair_at` asks for it (the same pairs cut at the
first turn their attempts differ), `actguide`, `sft`, `trajectories`, `tasks`.

The folder is built next to its destination and renamed into place, so a reader sees the old
export or the new one, never half of one.
"""

from __future__ import annotations

import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Union

import polars as pl
import pyarrow as pa
from huggingface_hub import DatasetCard

from pipeline.datasets.card import (HISTOGRAM_FILE, CardInfo, k_star_histogram, render_card, render_histogram_png,
                                    shard_path)
from pipeline.datasets.files import write_rows_table
from pipeline.datasets.splits import combined_split_conflicts, split_column, split_groups
from pipeline.core.records import Task

Frame = Union[pl.DataFrame, pa.Table]
CONFIGS = ("dpo", "actguide", "sft", "trajectories", "tasks")
"""The configs of the pipeline's default export, in card order."""
ALL_CONFIGS = ("dpo", "dpo_divergence") + CONFIGS[1:]
"""Every config an export may hold, in card order: CONFIGS and the DPO forms `DatasetConfig.dpo_pair_at` adds."""
SPLIT_NAME = re.compile(r"^\w+$")  # what `datasets` accepts as a split name


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote."""

    folder: Path
    files: tuple[str, ...]
    """Paths relative to the folder, sorted."""
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    """config -> split -> rows written."""
    empty: tuple[str, ...] = ()
    """'config/split' pairs left out because they had no rows."""

    @property
    def total_rows(self) -> int:
        return sum(n for splits in self.rows.values() for n in splits.values())


def as_arrow(frame: Frame) -> pa.Table:
    """An Arrow table; polars frames use the oldest compat level so `datasets` reads every type."""
    if isinstance(frame, pl.DataFrame):
        return frame.to_arrow(compat_level=pl.CompatLevel.oldest())
    return frame


def split_tables(tables: Mapping[str, Frame | Mapping[str, Frame]]) -> dict[str, dict[str, pa.Table]]:
    """{config: {split: table}}; a bare table is split by its `split` column, else it is all 'train'."""
    unknown = sorted(set(tables) - set(ALL_CONFIGS))
    if unknown:
        raise ValueError(f"unknown dataset configs {unknown}; export one of {list(ALL_CONFIGS)}")
    out: dict[str, dict[str, pa.Table]] = {}
    for config in (c for c in ALL_CONFIGS if c in tables):
        given = tables[config]
        splits = dict(given) if isinstance(given, Mapping) else _by_split_column(as_arrow(given))
        for split in splits:
            if not SPLIT_NAME.match(split):
                raise ValueError(f"config {config!r} has split {split!r}; split names are letters, digits and _")
        out[config] = {split: as_arrow(t) for split, t in splits.items()}
    return out


def _by_split_column(table: pa.Table) -> dict[str, pa.Table]:
    if "split" not in table.column_names:
        return {"train": table}
    frame = pl.from_arrow(table.select(["split"])).with_row_index("_row")
    return {str(name): table.take(rows["_row"].to_arrow())
            for (name,), rows in frame.group_by("split", maintain_order=True)}


def split_by_task(tables: Mapping[str, pl.DataFrame], tasks: Iterable[Task], test_fraction: float
                  ) -> tuple[dict[str, pl.DataFrame], dict[str, int]]:
    """Every table's `split` set to its task's (its split group's, `split_groups`), and how many rows of
    each table that moves: rows built without the groups carry their own instance id's split."""
    tasks = list(tasks)
    conflicts = combined_split_conflicts(tasks, test_fraction)
    if conflicts:
        raise ValueError(f"combined tasks in another split than their parts: {conflicts[:5]}; every part must "
                         "share its combined task's split group (pipeline.datasets.splits.split_group)")
    groups, out, moved = split_groups(tasks), {}, {}
    for config, frame in tables.items():
        if frame.height and "instance_id" not in frame.columns:
            raise ValueError(f"config {config!r} has no instance_id column: its rows cannot be split by task; "
                             "export a table that names each row's task")
        if not frame.height:
            out[config] = frame
            continue
        split = frame.select(split_column("instance_id", test_fraction, groups).alias("split"))["split"]
        before = frame["split"] if "split" in frame.columns else None
        moved[config] = int((before != split).sum()) if before is not None else 0
        out[config] = frame.with_columns(split)
    return out, moved


def export_dataset(folder: Path, tables: Mapping[str, Frame | Mapping[str, Frame]], card: CardInfo,
                   plans: Frame | None = None) -> ExportReport:
    """Write `tables` as a dataset folder at `folder` (replacing it) and return what was written."""
    folder = Path(folder)
    splits = split_tables(tables)
    rows = {c: {s: t.num_rows for s, t in by_split.items() if t.num_rows} for c, by_split in splits.items()}
    rows = {c: by_split for c, by_split in rows.items() if by_split}
    if not rows:
        raise ValueError(f"nothing to export to {folder}: every table given is empty")
    empty = tuple(f"{c}/{s}" for c, by_split in splits.items() for s, t in by_split.items() if not t.num_rows)
    staging = folder.parent / f".{folder.name}.staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        for config, by_split in rows.items():
            for split in by_split:
                path = staging / shard_path(config, split)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_rows_table(splits[config][split], path)
        sizes = {c: {s: (staging / shard_path(c, s)).stat().st_size for s in by_split} for c, by_split in rows.items()}
        plan_frame = pl.from_arrow(as_arrow(plans)) if plans is not None else None
        histogram = k_star_histogram(plan_frame) if plan_frame is not None else None
        if histogram is not None:
            (staging / HISTOGRAM_FILE).write_bytes(render_histogram_png(histogram))
        DatasetCard(render_card(card, splits, rows, histogram, sizes, plans=plan_frame)).save(staging / "README.md")
        _swap_into_place(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    files = tuple(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()))
    return ExportReport(folder=folder, files=files, rows=rows, empty=empty)


def _swap_into_place(staging: Path, folder: Path) -> None:
    """Rename `staging` to `folder`; an old export is moved aside first and removed after."""
    old = folder.parent / f".{folder.name}.old-{uuid.uuid4().hex[:8]}"
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
