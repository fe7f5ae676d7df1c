"""Trajectory files in, row files out: a batch's files read a run of tasks at a time, and how rows are written.

A batch's rows are made per task, in instance-id order, a run of tasks at a time (`build.task_chunks`).
`TaskRuns` reads only the instance ids of every file up front, then streams each file's used columns in
slices of READ_ROWS rows, handing each run exactly the rows `frame.filter(instance_id in run)` of the whole
batch would hold, in the same order. A file holds back the rows it read for a later run, so memory stays
flat when files list their tasks in name order, and is at most the whole batch (as a whole read) when not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.datasets.pairs import USED
from pipeline.core.records import TRAJECTORY_SCHEMA
from pipeline.core.store import check_contract

READ_ROWS = 256  # rows decoded at once per file, the most a run holds back of each (1024: 120 MB more)
ROW_GROUP_ROWS = 256  # rows per written row group: what `load_dataset(..., streaming=True)` holds at once
COMPRESSION, COMPRESSION_LEVEL = "zstd", 3  # level 3: a fifth fewer bytes than level 1 for rows of repeated text
DICTIONARY = ("tools", "instance_id", "split", "batch", "chosen_source", "source", "group_id", "group_kind",
              "actions")  # columns of few distinct values
MESSAGE_TEXT = ("content", "arguments")  # chat leaves repeated within a row group: a task's pairs repeat whole
# completions and every row its prompt, so a dictionary stores each once (a tenth fewer bytes per DPO and SFT row)
DICTIONARY_PAGE_BYTES = 64 << 20  # above a row group's message texts: the dictionary is kept for the whole chunk
FIX = ("rerun the rollouts that wrote it with this version of handhold, or move it away; "
       "datasets.skip_bad_files: true builds without it")


@dataclass(frozen=True)
class SkippedFile:
    """A trajectory file left out of a build, and why."""

    path: str
    reason: str


class BadTrajectoryFile(ValueError):
    """A trajectory file this version cannot read; the message names the file and the fix."""

    def __init__(self, path: str | os.PathLike, problem: str):
        super().__init__(f"{path}{problem}; {FIX}")
        self.path = str(path)


def _leaves(path: str, type_: pa.DataType) -> Iterator[tuple[str, pa.DataType]]:
    """(Parquet column path, type) of each leaf under a field: lists nest as `<name>.list.element`."""
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        yield from _leaves(f"{path}.list.element", type_.value_type)
    elif pa.types.is_struct(type_):
        for child in type_:
            yield from _leaves(f"{path}.{child.name}", child.type)
    else:
        yield path, type_


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The Parquet columns of `schema` written with a dictionary: DICTIONARY's and every MESSAGE_TEXT leaf."""
    text = [path for f in schema for path, type_ in _leaves(f.name, f.type)
            if "." in path and path.rsplit(".", 1)[1] in MESSAGE_TEXT and pa.types.is_string(type_)]
    return [n for n in DICTIONARY if n in schema.names] + text


def write_options(schema: pa.Schema) -> dict:
    """`pq.write_table` / `pq.ParquetWriter` settings of every row file, for a table of `schema`: nested floats
    (log-probs) byte-stream-split, whose exponent bytes then compress; min/max statistics for every leaf but the
    nested texts (message fields, tool-call arguments: nothing filters on them, and each row group's and page's
    min/max content is kilobytes of text in the footer and page headers). 1% fewer bytes."""
    leaves = [(path, type_) for f in schema for path, type_ in _leaves(f.name, f.type)]
    return {"compression": COMPRESSION, "compression_level": COMPRESSION_LEVEL,
            "use_dictionary": dictionary_columns(schema), "dictionary_pagesize_limit": DICTIONARY_PAGE_BYTES,
            "column_encoding": {path: "BYTE_STREAM_SPLIT" for path, type_ in leaves
                                if "." in path and pa.types.is_floating(type_)},
            "write_statistics": [path for path, type_ in leaves if "." not in path or not pa.types.is_string(type_)]}


def write_rows_table(table: pa.Table, path: str | os.PathLike) -> None:
    """`table` as one Parquet file with the row-file settings and row groups of ROW_GROUP_ROWS rows."""
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, **write_options(table.schema))


def rows_writer(path: str | os.PathLike, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer of `schema` rows with the row-file settings; append with `append_rows`."""
    return pq.ParquetWriter(path, schema, **write_options(schema))


def append_rows(writer: pq.ParquetWriter, table: pa.Table) -> None:
    """`table` appended in row groups of ROW_GROUP_ROWS rows."""
    writer.write_table(table, row_group_size=ROW_GROUP_ROWS)


def _checked(path: Path) -> None:
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise BadTrajectoryFile(path, f": not a readable Parquet file ({exc})") from exc
    problem = check_contract(schema, TRAJECTORY_SCHEMA)
    if problem:
        raise BadTrajectoryFile(path, f" {problem}")


def _corrupt(path: Path, exc: Exception) -> BadTrajectoryFile:
    return BadTrajectoryFile(path, f": corrupt Parquet data ({exc})")


READ_ERRORS = (pl.exceptions.PolarsError, pa.ArrowException, OSError)


def read_trajectory_file(path: str | os.PathLike) -> pl.DataFrame:
    """The columns the builders use from one trajectory file; BadTrajectoryFile when it cannot be read."""
    _checked(Path(path))
    try:
        return pl.read_parquet(path, columns=USED)
    except READ_ERRORS as exc:
        raise _corrupt(Path(path), exc) from exc


def read_trajectories(paths: Iterable[Path], skip_bad_files: bool = False) -> tuple[pl.DataFrame, list[SkippedFile]]:
    """Every file's rows in file order (`prepare` keeps the last of a repeated rollout_id: shards are
    newer than the compacted file); a bad file raises, or with `skip_bad_files` is left out and reported."""
    frames, skipped = [], []
    for path in paths:
        try:
            frames.append(read_trajectory_file(path))
        except BadTrajectoryFile as exc:
            if not skip_bad_files:
                raise
            skipped.append(SkippedFile(str(path), str(exc)))
    if not frames:
        return empty_trajectories(), skipped
    return pl.concat(frames, how="vertical"), skipped


def empty_trajectories() -> pl.DataFrame:
    return pl.from_arrow(TRAJECTORY_SCHEMA.empty_table().select(USED))


def instance_ids(paths: Iterable[Path], skip_bad_files: bool = False
                 ) -> tuple[dict[Path, pl.Series], list[SkippedFile]]:
    """Each readable file's instance_id column (file order kept), and the files left out, as `read_trajectories`."""
    ids, skipped = {}, []
    for path in paths:
        try:
            _checked(path)
            try:
                # ParquetFile, not pq.read_table: that imports pyarrow.dataset and pandas (a second of CPU)
                ids[path] = pl.from_arrow(pq.ParquetFile(path).read(columns=["instance_id"])["instance_id"])
            except READ_ERRORS as exc:
                raise _corrupt(path, exc) from exc
        except BadTrajectoryFile as exc:
            if not skip_bad_files:
                raise
            skipped.append(SkippedFile(str(path), str(exc)))
    return ids, skipped


class _FileRows:
    """One file's used columns, streamed in order and handed out by run (`run` gives each row's run)."""

    def __init__(self, path: Path, run: np.ndarray):
        self.path, self.run, self.read = path, run, 0
        runs, from_end = np.unique(run[::-1], return_index=True)
        self.last = dict(zip(runs.tolist(), (len(run) - 1 - from_end).tolist()))  # each run's last row
        self.held: list[pl.DataFrame] = []  # rows read, not yet handed out, with their `_run`
        self.batches: Iterator[pa.RecordBatch] | None = None

    def take(self, run: int) -> pl.DataFrame | None:
        """The file's rows of `run`, in file order (None when it has none); earlier runs were taken."""
        if run not in self.last:
            return None
        try:
            self.batches = self.batches or pq.ParquetFile(  # one thread: for 256 rows, threads held more memory
                self.path, buffer_size=1 << 20, pre_buffer=False).iter_batches(READ_ROWS, columns=USED,
                                                                               use_threads=False)
            while self.read <= self.last[run]:
                part = pl.from_arrow(next(self.batches))
                self.held.append(part.with_columns(_run=pl.Series(self.run[self.read:self.read + part.height])))
                self.read += part.height
        except (*READ_ERRORS, StopIteration) as exc:
            raise _corrupt(self.path, exc) from exc
        held = pl.concat(self.held) if len(self.held) > 1 else self.held[0]
        runs = held["_run"].to_numpy()
        first = int((runs == run).sum())
        if (runs[:first] == run).all():  # the run's rows lead (files in name order): slices, no copy
            self.held = [held.slice(first)] if first < held.height else []
            return held.slice(0, first).drop("_run")
        mine = pl.Series(runs == run)
        self.held = [held.filter(~mine)]
        return held.filter(mine).drop("_run")


class TaskRuns:
    """A batch's rows, run by run: `rows(i)` equals the rows of `runs[i]` in a read of all `files` in order."""

    def __init__(self, ids: dict[Path, pl.Series], runs: list[list[str]]):
        index = {i: n for n, run in enumerate(runs) for i in run}
        self.files = [_FileRows(p, np.array([index[i] for i in s.to_list()], dtype=np.int64)) for p, s in ids.items()]

    def rows(self, run: int) -> pl.DataFrame:
        parts = [p for p in (f.take(run) for f in self.files) if p is not None]
        return pl.concat(parts, how="vertical") if parts else empty_trajectories()
