"""Build the DPO, ActGuide and SFT datasets from stored trajectories, one batch at a time.

Layout under the output folder: `{dpo,dpo_divergence,actguide,sft}/<batch>.parquet` (one shard per batch and kind,
every row with its `split`; `dpo_divergence`: the `dpo` pairs cut at divergence) and `manifest.json`, which records
for each built batch the input files it read (size, mtime), the gold patches of its tasks and its counts. An update
builds only the batches whose inputs changed or that are new, and those after them in name order: rows are
deduplicated against every earlier batch, so the shards together equal one build of all batches in order, whatever
the history. `datasets.load_dataset("parquet", data_files=...)` reads the shards as they are (`dataset_files`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.datasets.files import BadTrajectoryFile, SkippedFile, TaskRuns, append_rows, instance_ids, rows_writer
from pipeline.datasets.divergence import divergence_rows
from pipeline.datasets.formats import ACTGUIDE_SCHEMA, DPO_DIVERGENCE_SCHEMA, DPO_SCHEMA, SFT_SCHEMA
from pipeline.datasets.manifest import read_manifest, stamps, tasks_digest, write_manifest
from pipeline.datasets.actguide_groups import LOST, actguide_rows
from pipeline.datasets.pairs import candidates, dpo_rows, prepare, sft_rows
from pipeline.datasets.config import DatasetConfig
from pipeline.datasets.guided import GROUPS_LOST, guided_checks
from pipeline.datasets.splits import Counter, token_counter
from pipeline.core.layout import PROBE_SUFFIX, Layout
from pipeline.core.records import TRAJECTORY_SCHEMA, Trajectory
from pipeline.core.schema import to_row

BUILDER_VERSION = "6"  # bump when a rule changes: every batch is rebuilt (6: the dpo pairs cut at divergence)
SCHEMAS = {"dpo": DPO_SCHEMA, "dpo_divergence": DPO_DIVERGENCE_SCHEMA, "actguide": ACTGUIDE_SCHEMA, "sft": SFT_SCHEMA}
EXPORT_ONLY = ("dpo_pair_at",)  # settings that choose what the export holds, never what a row is
SEEN_KEYS = {"dpo": ["instance_id", "chosen_hash", "rejected_hash"], "sft": ["instance_id", "completion_hash"]}
CHUNK = 1000  # trajectories built at once (runs read, built and written at once: 2000 made RSS grow with batches)
WRITERS = 2  # shards encoded at once: each holds a row group's pages and dictionaries (~50 MiB); two fill two cores


@dataclass
class BatchRows:
    """The rows one build made (polars frames of the SCHEMAS schemas' columns) and what it left out, by reason."""

    dpo: pl.DataFrame
    dpo_divergence: pl.DataFrame
    actguide: pl.DataFrame
    sft: pl.DataFrame
    dropped: dict[str, int]
    groups: dict[str, int] = field(default_factory=dict)
    """ActGuide groups by learning signal: 'mixed', 'rescued' (rows) and 'zero_advantage' (tasks, no row)."""
    checks: dict[str, int] = field(default_factory=dict)
    """Guided successes per '<check>.<guidance kind>' (`guided.guided_checks`); GROUPS_LOST: rescued groups lost."""


def trajectory_frame(trajectories: Iterable[Trajectory]) -> pl.DataFrame:
    """Trajectory records as a frame of their stored columns."""
    return pl.from_arrow(pa.Table.from_pylist([to_row(t) for t in trajectories], schema=TRAJECTORY_SCHEMA))


def build_rows(trajectories: pl.DataFrame | Iterable[Trajectory], config: DatasetConfig,
               gold: dict[str, str] | None = None, seen: dict[str, pl.DataFrame] | None = None,
               count: Counter | None = None, task_groups: Mapping[str, str] | None = None) -> BatchRows:
    """DPO, ActGuide and SFT rows of one or more batches of trajectories (pure: no I/O).

    `gold` maps instance ids to gold patches (chosen attempts holding one are left out); `seen`
    holds the SEEN_KEYS columns of rows already in the dataset, never made again; `task_groups` maps
    instance ids to split groups (`splits.split_groups`: a combined task and its parts share one).
    """
    frame = trajectories if isinstance(trajectories, pl.DataFrame) else trajectory_frame(trajectories)
    count = count or token_counter(config.tokenizer)[0]
    return rows_of(prepared(frame, config, count, gold, task_groups), config, gold, seen, count)


Prepared = tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]


def prepared(frame: pl.DataFrame, config: DatasetConfig, count: Counter, gold: dict[str, str] | None,
             task_groups: Mapping[str, str] | None, left_out: Mapping[str, str] | None = None) -> Prepared:
    """`build_rows`' first stage, mostly polars (it runs beside the Python checks of the previous run);
    the attempts at `left_out` tasks (quarantined or too flaky) are dropped and counted."""
    if not config.include_probes:
        frame = frame.filter(~pl.col("batch").str.ends_with(PROBE_SUFFIX))
    gone = frame["instance_id"].is_in(list(left_out or ()))
    t, heavy, dropped = prepare(frame.filter(~gone), config, count, gold, task_groups)
    return t, heavy, dropped | ({"task_left_out": int(gone.sum())} if gone.any() else {})


def rows_of(ready: Prepared, config: DatasetConfig, gold: dict[str, str] | None,
            seen: dict[str, pl.DataFrame] | None, count: Counter) -> BatchRows:
    """`build_rows`' second stage: guided checks, candidates and the rows of each kind (`count`: tokens)."""
    t, heavy, dropped = ready
    t, heavy, checks = guided_checks(t, heavy, config, gold)
    chosen, rejected, pool_dropped = candidates(t, config)
    dpo, dpo_dropped = dpo_rows(chosen, rejected, heavy, config, (seen or {}).get("dpo"))
    divergence, divergence_dropped = divergence_rows(dpo, count)
    sft, sft_dropped = sft_rows(chosen, heavy, config, (seen or {}).get("sft"))
    actguide, act_dropped, groups = actguide_rows(t, heavy, config)
    checks[GROUPS_LOST] = act_dropped[LOST]
    for prefix, counts in [("", pool_dropped), ("dpo.", dpo_dropped), ("dpo_divergence.", divergence_dropped),
                           ("sft.", sft_dropped), ("actguide.", act_dropped)]:
        dropped.update({prefix + k: v for k, v in counts.items()})
    return BatchRows(dpo, divergence, actguide, sft, dropped, groups, checks)


def rows_table(rows: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    """Rows as an Arrow table of exactly `schema` (types, nullability and metadata)."""
    table = rows.select(schema.names).to_arrow(compat_level=pl.CompatLevel.oldest())
    return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(table.columns, schema)], schema=schema)


@dataclass
class BuildReport:
    """What an update did: batches built, reused and removed; rows and leftovers over all batches."""

    built: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    """ActGuide groups by learning signal over all batches (BatchRows.groups)."""
    checks: dict[str, int] = field(default_factory=dict)
    """Guided successes per '<check>.<guidance kind>', and GROUPS_LOST, over all batches (BatchRows.checks)."""
    skipped_files: list[SkippedFile] = field(default_factory=list)
    token_counter: str = ""


def _fingerprint(config: DatasetConfig) -> str:
    """What every row depends on besides the inputs: the settings, the rules and the row schemas."""
    versions = {k: s.metadata[b"schema_version"].decode() for k, s in SCHEMAS.items()}
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in EXPORT_ONLY}
    key = json.dumps([BUILDER_VERSION, versions, settings], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def shard(out_dir: str | os.PathLike, kind: str, batch: str) -> Path:
    return Path(out_dir) / kind / f"{batch}.parquet"


class _Keys:
    """The dedup keys (SEEN_KEYS) of the batches built or reused so far in one update, each shard's read once."""

    def __init__(self, out_dir: Path):
        self.out_dir, self.frames = out_dir, {kind: [] for kind in SEEN_KEYS}

    def add(self, batch: str) -> None:
        for kind, keys in SEEN_KEYS.items():  # ParquetFile on one thread: a scan of every shard held ~40 MiB more
            table = pq.ParquetFile(shard(self.out_dir, kind, batch)).read(columns=keys, use_threads=False)
            self.frames[kind].append(pl.from_arrow(table))

    def of(self, tasks: pl.Series) -> dict[str, pl.DataFrame]:
        """The keys of `tasks`; a key holds its instance id: no other task's can match."""
        mine = pl.col("instance_id").is_in(tasks.implode())
        return {kind: pl.concat(frames).filter(mine) for kind, frames in self.frames.items() if frames}


def update_datasets(data_dir: str | os.PathLike, out_dir: str | os.PathLike, config: DatasetConfig,
                    gold: dict[str, str] | None = None, task_groups: Mapping[str, str] | None = None,
                    left_out: Mapping[str, str] | None = None) -> BuildReport:
    """Build the batches under `data_dir` whose rows are missing or stale into `out_dir`; reuse the rest.
    `left_out`: tasks no row may come from (`flakiness.left_out`), a change of those in a batch rebuilds it."""
    data_dir, out_dir, left_out = Path(data_dir), Path(out_dir), dict(left_out or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    count, counter_name = token_counter(config.tokenizer)
    manifest = read_manifest(out_dir)
    fingerprint, previous = _fingerprint(config), manifest.get("batches", {})
    old = previous if manifest.get("fingerprint") == fingerprint else {}  # other settings: rebuild all
    manifest = {"fingerprint": fingerprint, "config": dataclasses.asdict(config), "token_counter": counter_name,
                "batches": {}}
    layout = Layout(data_dir)
    report, names, keys = BuildReport(token_counter=counter_name), layout.batch_names(), _Keys(out_dir)
    for i, name in enumerate(names):
        files = layout.batch_files(name, config.include_probes)
        entry = old.get(name)
        if (not report.built and entry and entry["files"] == stamps(files, data_dir) and entry["before"] == names[:i]
                and entry["gold"] == tasks_digest(gold, task_groups, entry["instance_ids"])
                and entry.get("left_out", []) == sorted(set(left_out) & set(entry["instance_ids"]))):
            manifest["batches"][name] = entry
            report.reused.append(name)
            keys.add(name)
            continue
        manifest["batches"][name] = _build_batch(data_dir, out_dir, name, names[:i], files, config, gold,
                                                 task_groups, count, left_out, keys)
        report.built.append(name)
        keys.add(name)
        write_manifest(out_dir, manifest)  # a killed update keeps the batches it finished
    for name in sorted(set(previous) - set(names)):
        for kind in SCHEMAS:
            shard(out_dir, kind, name).unlink(missing_ok=True)
        report.removed.append(name)
    write_manifest(out_dir, manifest)
    for entry in manifest["batches"].values():
        for name in ("rows", "dropped", "groups", "checks"):
            for key, value in entry[name].items():
                getattr(report, name)[key] = getattr(report, name).get(key, 0) + value
        report.skipped_files += [SkippedFile(**s) for s in entry["skipped"]]
    return report


def _build_batch(data_dir: Path, out_dir: Path, name: str, before: list[str], files: list[Path],
                 config: DatasetConfig, gold: dict[str, str] | None, task_groups: Mapping[str, str] | None,
                 count: Counter, left_out: Mapping[str, str], keys: _Keys) -> dict:
    """Build one batch's shards, a run of tasks at a time; its manifest entry. A file found bad only
    while streaming is left out by building the batch again without it (`skip_bad_files`), else raised."""
    inputs = stamps(files, data_dir)  # before reading: a file rewritten meanwhile is rebuilt next time
    ids, skipped = instance_ids(files, config.skip_bad_files)
    seen = keys.of(pl.concat([pl.Series([], dtype=pl.String), *ids.values()]).unique())
    while True:
        runs = task_chunks(pl.DataFrame({"instance_id": pl.concat([pl.Series([], dtype=pl.String), *ids.values()])}))
        stream = TaskRuns(ids, runs)

        def ready(run: int) -> Prepared:
            return prepared(stream.rows(run), config, count, gold, task_groups, left_out)

        try:
            parts = (rows_of(ready(run), config, gold, seen, count) for run in range(len(runs)))
            rows, dropped, groups, checks = _write_shards(out_dir, name, parts)
            break
        except BadTrajectoryFile as exc:
            if not config.skip_bad_files:
                raise
            skipped.append(SkippedFile(exc.path, str(exc)))
            ids.pop(Path(exc.path))
    skipped.sort(key=lambda s: files.index(Path(s.path)))
    task_ids = sorted({i for run in runs for i in run})
    return {"files": inputs, "before": before, "instance_ids": task_ids,
            "gold": tasks_digest(gold, task_groups, task_ids), "left_out": sorted(set(left_out) & set(task_ids)),
            "rows": rows, "dropped": dropped, "groups": groups, "checks": checks,
            "skipped": [dataclasses.asdict(s) for s in skipped]}


def task_chunks(frame: pl.DataFrame, size: int | None = None) -> list[list[str]]:
    """Instance ids in name order, in runs of about `size` trajectories (a task is never cut): rows
    are made per task, so building run by run gives the rows of one build, in the same order."""
    counts = frame.group_by("instance_id").len().sort("instance_id")
    runs = counts.with_columns(run=(pl.col("len").cum_sum() - pl.col("len")) // (size or CHUNK))
    return [ids.to_list() for ids in runs.group_by("run", maintain_order=True).agg("instance_id")["instance_id"]]


def _write_shards(out_dir: Path, batch: str, parts: Iterable[BatchRows]
                  ) -> tuple[dict[str, int], dict[str, int], dict[str, int], dict[str, int]]:
    """Append each part's rows to the batch's shard of each kind (temporary names, renamed at the end);
    a part is written before the next is made (the writers' buffers beside the next run's reading held
    ~90 MiB more from a batch of two runs on). Returns the row counts and the summed leftovers, groups
    and checks."""
    paths = {kind: shard(out_dir, kind, batch) for kind in SCHEMAS}
    tmps = {kind: _temporary(path) for kind, path in paths.items()}
    writers = {kind: rows_writer(tmps[kind], schema) for kind, schema in SCHEMAS.items()}
    rows, dropped, groups, checks = dict.fromkeys(SCHEMAS, 0), {}, {}, {}

    def append(kind: str, part: BatchRows) -> None:
        table = rows_table(getattr(part, kind), SCHEMAS[kind])
        if table.num_rows:
            append_rows(writers[kind], table)

    try:
        with ThreadPoolExecutor(WRITERS) as pool:  # Arrow encodes and compresses without the GIL
            for part in parts:
                for done in [pool.submit(append, kind, part) for kind in SCHEMAS]:
                    done.result()
                for kind in SCHEMAS:
                    rows[kind] += getattr(part, kind).height
                for total, counts in ((dropped, part.dropped), (groups, part.groups), (checks, part.checks)):
                    for key, value in counts.items():
                        total[key] = total.get(key, 0) + value
        for kind, writer in writers.items():
            writer.close()
            os.chmod(tmps[kind], 0o644)
            os.replace(tmps[kind], paths[kind])
    finally:
        for kind, writer in writers.items():
            writer.close()
            Path(tmps[kind]).unlink(missing_ok=True)
    return rows, dropped, groups, checks


def _temporary(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return tmp


def dataset_files(out_dir: str | os.PathLike, kind: str) -> list[str]:
    """The shards of one kind in batch order, for `datasets.load_dataset("parquet", data_files=...)`."""
    return [str(shard(out_dir, kind, b)) for b in read_manifest(out_dir).get("batches", {})]


def read_dataset(out_dir: str | os.PathLike, kind: str, split: str | None = None) -> pl.DataFrame:
    """All rows of one kind (optionally one split), in batch order."""
    files = dataset_files(out_dir, kind)
    frame = pl.concat([pl.read_parquet(f) for f in files]) if files else pl.from_arrow(SCHEMAS[kind].empty_table())
    return frame if split is None else frame.filter(pl.col("split") == split)
