"""Export built row tables as a local Hugging Face dataset folder.

Layout (what `datasets.load_dataset(folder, config)` discovers through the card's `configs:`)::

    <folder>/README.md                              dataset card: YAML header + description
    <folder>/k_star_histogram.png                   k*/K of the guidance plans (when plans are given)
    <folder>/data/<config>/<split>-00000-of-00001.parquet

The folder is built next to its destination and renamed into place, so a reader sees the old
export or the new one, never half of one.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Union

import numpy as np
import polars as pl
import pyarrow as pa
from huggingface_hub import DatasetCard, DatasetCardData

from pipeline.datasets.files import write_rows_table
from pipeline.datasets.splits import combined_split_conflicts, split_column, split_groups
from pipeline.pictures import draw_text, png
from pipeline.records import Task
from pipeline.vocab import NO_GUIDANCE_KIND

Frame = Union[pl.DataFrame, pa.Table]
CONFIGS = ("dpo", "actguide", "sft", "trajectories", "tasks")
SPLIT_NAME = re.compile(r"^\w+$")  # what `datasets` accepts as a split name
HISTOGRAM_FILE = "k_star_histogram.png"
RATE_COLUMNS = ("guidance_kind", "resolved", "instance_id", "infra_error")  # of the trajectories table


@dataclass(frozen=True)
class SourcePackage:
    """A package (or upstream dataset) the tasks come from."""

    name: str
    version: str = ""
    licence: str = ""
    """SPDX id; '' reads it from the tasks' provenance ('licence' or 'license'), else 'unknown'."""
    url: str = ""


@dataclass(frozen=True)
class CardInfo:
    """What the dataset card says besides what the tables themselves tell."""

    pretty_name: str
    run_id: str
    """The pipeline run (batch) the rows come from."""
    description: str = ""
    repo_id: str = ""
    """Hub repo the folder will be published to, for the loading snippet; '' shows a placeholder."""
    licence: str = "other"
    """Licence of the dataset itself (Hub licence id); each source's own licence is listed too."""
    sources: tuple[SourcePackage, ...] = ()
    checks: Mapping[str, int] = field(default_factory=dict)
    """Guided successes per '<check>.<guidance kind>' (the datasets build report's `checks`): prose referring
    to guidance dropped or rewritten, ungrounded left out or kept, hints holding gold lines."""
    """Empty: derived from the tasks' provenance (package and version, or upstream dataset)."""


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


def shard_path(config: str, split: str) -> str:
    """Where a split's single shard lives in the folder."""
    return f"data/{config}/{split}-00000-of-00001.parquet"


def as_arrow(frame: Frame) -> pa.Table:
    """An Arrow table; polars frames use the oldest compat level so `datasets` reads every type."""
    if isinstance(frame, pl.DataFrame):
        return frame.to_arrow(compat_level=pl.CompatLevel.oldest())
    return frame


def split_tables(tables: Mapping[str, Frame | Mapping[str, Frame]]) -> dict[str, dict[str, pa.Table]]:
    """{config: {split: table}}; a bare table is split by its `split` column, else it is all 'train'."""
    unknown = sorted(set(tables) - set(CONFIGS))
    if unknown:
        raise ValueError(f"unknown dataset configs {unknown}; export one of {list(CONFIGS)}")
    out: dict[str, dict[str, pa.Table]] = {}
    for config in (c for c in CONFIGS if c in tables):
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
        histogram = k_star_histogram(pl.from_arrow(as_arrow(plans))) if plans is not None else None
        if histogram is not None:
            (staging / HISTOGRAM_FILE).write_bytes(render_histogram_png(histogram))
        DatasetCard(render_card(card, splits, rows, histogram, sizes)).save(staging / "README.md")
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


def card_header(card: CardInfo, rows: dict[str, dict[str, int]], sizes: dict[str, dict[str, int]]) -> DatasetCardData:
    """The YAML header: one `configs:` entry per config with its splits' files (the first is default), and
    `dataset_info` with each split's rows and bytes. `datasets` keys its cache of a local folder on this
    header, so the sizes make a rewritten folder load afresh instead of from yesterday's cache, and it checks
    the row counts on load."""
    configs = [{"config_name": config,
                "data_files": [{"split": s, "path": shard_path(config, s).replace("-00000-of-00001", "-*")}
                               for s in by_split]}
               for config, by_split in rows.items()]
    configs[0]["default"] = True
    info = [{"config_name": config, "splits": [{"name": s, "num_bytes": sizes[config][s], "num_examples": n}
                                               for s, n in by_split.items()],
             "download_size": sum(sizes[config].values()), "dataset_size": sum(sizes[config].values())}
            for config, by_split in rows.items()]
    return DatasetCardData(pretty_name=card.pretty_name, license=card.licence, configs=configs, dataset_info=info,
                           tags=["software-engineering", "agents", "swe-bench", "dpo"])


def render_card(card: CardInfo, splits: dict[str, dict[str, pa.Table]], rows: dict[str, dict[str, int]],
                histogram: pl.DataFrame | None, sizes: dict[str, dict[str, int]]) -> str:
    """The whole README.md: header, description, counts, rates, histogram, sources, loading."""
    trajectories = _concat(splits.get("trajectories", {}), RATE_COLUMNS)
    tasks = _concat(splits.get("tasks", {}), ("provenance",))
    sections = [
        f"---\n{card_header(card, rows, sizes).to_yaml()}\n---\n",
        f"# {card.pretty_name}\n\n{card.description or 'Training data for software-engineering agents.'}\n\n"
        f"Built by the handhold pipeline, run `{card.run_id}`.",
        "## Rows\n\n" + _table(["config", "split", "rows"],
                                [[c, s, n] for c, by_split in rows.items() for s, n in by_split.items()]),
        _rates_section(trajectories),
        _guidance_checks_section(card.checks, splits),
        _histogram_section(histogram),
        "## Sources\n\n" + _table(["source", "version", "licence", "url"], [
            [s.name, s.version, s.licence, s.url] for s in resolve_sources(card.sources, tasks)]),
        _loading_section(card.repo_id, list(rows)),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _concat(by_split: dict[str, pa.Table], columns: tuple[str, ...]) -> pl.DataFrame | None:
    """All splits of a config, only `columns` (so heavy nested columns stay in Arrow); None without them."""
    tables = [t.select(list(columns)) for t in by_split.values() if t.num_rows and set(columns) <= set(t.column_names)]
    return pl.from_arrow(pa.concat_tables(tables, promote_options="permissive")) if tables else None


def _table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table; floats as percentages."""
    def cell(v: object) -> str:
        return f"{v:.1%}" if isinstance(v, float) else str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def _rates_section(trajectories: pl.DataFrame | None) -> str:
    if trajectories is None:
        return "## Pass rates\n\nNo graded trajectories in this export."
    passes, recovery = pass_rates(trajectories), recovery_rates(trajectories)
    return ("## Pass rates\n\nBy guidance kind, over attempts without an infrastructure error.\n\n"
            + _table(passes.columns, passes.rows()) + "\n\n## Recovery rates\n\n"
            "Of the tasks no unguided attempt resolved, the share some attempt under each guidance kind "
            "resolved (among those tried under it).\n\n" + _table(recovery.columns, recovery.rows()))


CHECK_COLUMNS = {"references_dropped": "referring prose: dropped", "references_rewritten": "referring prose: rewritten",
                 "ungrounded_left_out": "ungrounded: left out", "ungrounded_kept": "ungrounded: kept",
                 "hint_has_gold": "hint held gold lines"}
GOLD_HINT_COLUMNS = {"dpo": "chosen_hint_has_gold", "sft": "hint_has_gold"}  # a chosen row's hint held gold lines


def gold_hint_shares(splits: dict[str, dict[str, pa.Table]]) -> dict[str, tuple[int, int]]:
    """Per config (dpo, sft): (chosen rows whose hint held a line of the gold patch, chosen rows)."""
    shares = {}
    for config, column in GOLD_HINT_COLUMNS.items():
        frame = _concat(splits.get(config, {}), (column,))
        if frame is not None:
            shares[config] = (int(frame[column].fill_null(False).sum()), frame.height)
    return shares


def _guidance_checks_section(checks: Mapping[str, int], splits: dict[str, dict[str, pa.Table]]) -> str:
    """Per guidance kind, the guided successes each check caught; the share of chosen rows from gold hints."""
    kinds = sorted({key.split(".", 1)[1] for key in checks if "." in key})
    present = [c for c in CHECK_COLUMNS if any(f"{c}.{k}" in checks for k in kinds)]
    lines = ["## Guidance checks", "A chosen completion is trained under the unguided prompt. Guided successes "
             "whose prose refers to the guidance, that edited a file no tool output had shown (ungrounded), or "
             "whose hint held a line of the gold patch, by guidance kind:"]
    lines.append(_table(["guidance kind"] + [CHECK_COLUMNS[c] for c in present],
                        [[k] + [checks.get(f"{c}.{k}", 0) for c in present] for k in kinds]) if kinds
                 else "No guided success was checked.")
    for config, (gold, total) in gold_hint_shares(splits).items():
        share = f"{gold / total:.1%}" if total else "n/a"
        lines.append(f"Chosen rows of `{config}` from a hint holding gold lines: {gold} of {total} ({share}).")
    return "\n\n".join(lines)


def _histogram_section(histogram: pl.DataFrame | None) -> str:
    if histogram is None:
        return ""
    found = histogram.filter(pl.col("bin") != "not found")
    return (f"## Minimal guidance prefix k*/K\n\n![k*/K histogram]({HISTOGRAM_FILE})\n\n"
            "Share k*/K of the K reference actions a guided attempt needed to succeed, over accepted plans "
            "with K > 0.\n\n" + _table(["k*/K", "plans"], found.rows())
            + f"\n\nPlans where no prefix succeeded: {histogram.filter(pl.col('bin') == 'not found')['plans'].sum()}.")


def resolve_sources(sources: tuple[SourcePackage, ...], tasks: pl.DataFrame | None) -> list[SourcePackage]:
    """The sources (given, else named by the tasks' provenance), each with a licence or 'unknown'."""
    provenance = _provenance(tasks)
    return [replace(s, licence=s.licence or _licence_in(provenance, s))
            for s in sources or _sources_in(provenance)]


def _provenance(tasks: pl.DataFrame | None) -> list[dict]:
    if tasks is None:
        return []
    parsed = []
    for text in tasks["provenance"].drop_nulls().unique(maintain_order=True):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue  # a malformed provenance names no source; the others still do
        if isinstance(value, dict):
            parsed.append(value)
    return parsed


def _sources_in(provenance: list[dict]) -> tuple[SourcePackage, ...]:
    """A synthesized task names its package and version; a dataset row names its dataset."""
    found: dict[tuple[str, str], str] = {}
    for p in provenance:
        if p.get("package"):
            name, version = str(p["package"]), str(p.get("version", ""))
            found[name, version] = f"https://pypi.org/project/{name}/{version}/"
        elif p.get("dataset"):
            found[str(p["dataset"]), ""] = f"https://huggingface.co/datasets/{p['dataset']}"
    return tuple(SourcePackage(name, version, url=url) for (name, version), url in sorted(found.items()))


def _licence_in(provenance: list[dict], source: SourcePackage) -> str:
    for p in provenance:
        same_version = not source.version or str(p.get("version", "")) == source.version
        if str(p.get("package") or p.get("dataset")) == source.name and same_version:
            if p.get("licence") or p.get("license"):
                return str(p.get("licence") or p.get("license"))
    return "unknown"


def pass_rates(trajectories: pl.DataFrame) -> pl.DataFrame:
    """Per guidance kind: attempts, resolved, pass rate, tasks, tasks resolved; infra errors left out."""
    valid = trajectories.filter(pl.col("infra_error").fill_null("") == "")
    return valid.group_by("guidance_kind").agg(
        pl.len().alias("attempts"), pl.col("resolved").sum().alias("resolved"),
        pl.col("resolved").mean().alias("pass_rate"), pl.col("instance_id").n_unique().alias("tasks"),
        pl.col("instance_id").filter(pl.col("resolved")).n_unique().alias("tasks_resolved"),
    ).sort("guidance_kind")


def recovery_rates(trajectories: pl.DataFrame) -> pl.DataFrame:
    """Per guidance kind (and 'any'): tasks failed unguided and tried under it, how many it resolved."""
    valid = trajectories.filter(pl.col("infra_error").fill_null("") == "")
    per_task = valid.group_by("guidance_kind", "instance_id").agg(pl.col("resolved").any())
    failed = per_task.filter((pl.col("guidance_kind") == NO_GUIDANCE_KIND) & ~pl.col("resolved")).select("instance_id")
    guided = per_task.filter(pl.col("guidance_kind") != NO_GUIDANCE_KIND).join(failed, on="instance_id")
    any_kind = guided.group_by("instance_id").agg(pl.col("resolved").any(), guidance_kind=pl.lit("any"))
    return pl.concat([guided, any_kind.select(guided.columns)]).group_by("guidance_kind").agg(
        pl.len().alias("failed_unguided"), pl.col("resolved").sum().alias("recovered"),
        pl.col("resolved").mean().alias("recovery_rate"),
    ).sort(pl.col("guidance_kind") == "any", "guidance_kind")


BINS = 10  # k*/K histogram bins of width 1/BINS, the last one closed


def k_star_histogram(plans: pl.DataFrame) -> pl.DataFrame:
    """Plans (K > 0, accepted) per k*/K bin, labelled '0.0-0.1'..., plus a 'not found' row; columns bin, plans."""
    valid = plans.filter(pl.col("K") > 0)
    if "accepted" in plans.columns:
        valid = valid.filter(pl.col("accepted"))
    found = valid.filter(pl.col("k_star") >= 0)
    index = (found["k_star"] / found["K"] * BINS).floor().clip(0, BINS - 1).cast(pl.Int64).to_list()
    counts = [index.count(i) for i in range(BINS)]
    labels = [f"{i / BINS:.1f}-{(i + 1) / BINS:.1f}" for i in range(BINS)]
    return pl.DataFrame({"bin": labels + ["not found"], "plans": counts + [valid.height - found.height]})


def render_histogram_png(histogram: pl.DataFrame) -> bytes:
    """A bar chart of the found bins as PNG bytes, drawn with numpy and zlib (no plotting library)."""
    counts = histogram.filter(pl.col("bin") != "not found")["plans"].to_list()
    width, height, left, bottom, top = 600, 300, 30, 40, 30  # pixels
    image = np.full((height, width, 3), 255, np.uint8)  # (rows, columns, RGB)
    slot, peak, base = (width - left - 10) // len(counts), max(max(counts), 1), height - bottom
    image[base:base + 2, left - 4:width - 10] = 0
    for i, n in enumerate(counts):
        x, bar = left + i * slot, round((base - top) * n / peak)
        image[base - bar:base, x + 4:x + slot - 4] = (66, 110, 180)
        draw_text(image, x + 6, base - bar - 14, str(n))
        draw_text(image, x + 6, base + 8, f"{i / len(counts):.1f}")
    draw_text(image, width // 2 - 16, height - 14, "k*/K")
    return png(image)


def _loading_section(repo_id: str, configs: list[str]) -> str:
    repo = repo_id or "<owner>/<name>"
    lines = [f'{c} = load_dataset("{repo}", "{c}")' for c in configs]
    return ("## Loading\n\n```python\nfrom datasets import load_dataset\n\n" + "\n".join(lines) + "\n```\n\n"
            "A local copy of this folder loads the same way: `load_dataset(\"path/to/folder\", \"dpo\")`.")
