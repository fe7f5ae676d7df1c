"""Parquet reading and atomic writing with explicit schemas."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq


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
    """All rows of a Parquet file (or folder of files) as dicts."""
    return pq.read_table(path).to_pylist()
