"""Parquet storage: atomic writes under explicit schemas, reads that check the record contract,
and batch folders of trajectory shards."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.records import TRAJECTORY_SCHEMA, Trajectory
from pipeline.core.schema import schema_record, schema_version


class RecordContractError(ValueError):
    """A stored file holds another record kind, version or set of columns than this code reads."""


def write_rows(path: str | os.PathLike, rows: Iterable[dict[str, Any]], schema: pa.Schema) -> Path:
    """Write rows to `path` under `schema`: to a temporary name in the same folder, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(list(rows), schema=schema)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.chmod(tmp, 0o644)  # mkstemp makes it private; outputs are meant to be shared
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, f"writing {path} failed ({exc.strerror or exc}); free space or fix "
                                 f"permissions under {path.parent} and rerun: files already written are kept")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a Parquet file (or folder of files) as dicts, unchecked (foreign files)."""
    return pq.read_table(path).to_pylist()


def read_records(path: str | os.PathLike, schema: pa.Schema, produced_by: str = "", batch: str = ""
                 ) -> list[dict[str, Any]]:
    """Rows of a file written under `schema` (see read_table)."""
    return read_table(path, schema, produced_by, batch).to_pylist()


def read_table(path: str | os.PathLike, schema: pa.Schema, produced_by: str = "", batch: str = "") -> pa.Table:
    """A file written under `schema`; one clear error when it is missing or holds another contract.

    `produced_by` names the Dagster asset that writes the file and `batch` its partition, so that
    the error says what to rematerialize.
    """
    path = Path(path)
    where = f" for batch {batch}" if batch else ""
    if not path.exists():
        make = f"materialize {produced_by}{where}" if produced_by else "write it first"
        raise FileNotFoundError(f"{path} does not exist: {make}")
    contract_problem = check_contract(pq.read_schema(path), schema)
    if contract_problem:
        fix = f"rematerialize {produced_by}{where}" if produced_by else "rewrite it with this version"
        raise RecordContractError(f"{path} {contract_problem}: {fix}")
    return pq.read_table(path)


def check_contract(found: pa.Schema, expected: pa.Schema) -> str:
    """What is wrong with a file's schema for a reader of `expected` ('' when nothing is)."""
    record, version = schema_record(found) or "unnamed records", schema_version(found) or "(unversioned)"
    want_record, want_version = schema_record(expected), schema_version(expected)
    if record != want_record:
        return f"holds {record} schema {version}, this version reads {want_record} schema {want_version} there"
    if version != want_version:
        return f"holds {record} schema {version}, this version reads {want_version}"
    missing = sorted(set(expected.names) - set(found.names))
    extra = sorted(set(found.names) - set(expected.names))
    if missing or extra or found.remove_metadata() != expected.remove_metadata():
        return (f"holds {record} schema {version} with other columns than this version's (missing {missing}, "
                f"unexpected {extra}): the schema changed without a version bump")
    return ""


def read_batch(out_dir: str | os.PathLike, produced_by: str = "", batch: str = "") -> list[Trajectory]:
    """Every trajectory stored under a batch folder: the compacted file and any shards, contracts checked."""
    out_dir = Path(out_dir)
    files = [out_dir / "trajectories.parquet"] + sorted((out_dir / "shards").glob("*.parquet"))
    seen: dict[str, Trajectory] = {}
    for path in files:  # shards are newer than the compacted file: they win
        if path.exists():
            for row in read_records(path, TRAJECTORY_SCHEMA, produced_by, batch):
                seen[row["rollout_id"]] = Trajectory.from_row(row)
    return list(seen.values())


def compact(out_dir: str | os.PathLike) -> Path:
    """Fold the shards into trajectories.parquet (atomically), then remove them."""
    out_dir = Path(out_dir)
    shards = sorted((out_dir / "shards").glob("*.parquet"))
    target = out_dir / "trajectories.parquet"
    if shards or not target.exists():
        rows = [t.to_row() for t in read_batch(out_dir)]
        write_rows(target, rows, TRAJECTORY_SCHEMA)
        for shard in shards:
            shard.unlink(missing_ok=True)
    return target


def set_aside(out_dir: str | os.PathLike) -> Path:
    """Move a batch folder's stored trajectories (compacted file and shards) into a new stale-<time> folder."""
    out_dir = Path(out_dir)
    aside = out_dir / f"stale-{time.strftime('%Y%m%dT%H%M%S')}"
    aside.mkdir(exist_ok=True)
    for path in [out_dir / "trajectories.parquet", *(out_dir / "shards").glob("*.parquet")]:
        if path.exists():
            path.rename(aside / path.name)
    return aside
