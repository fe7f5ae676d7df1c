"""The rows folder's manifest (`manifest.json`): for each built batch, the input files it read (size,
mtime), a digest of its tasks (gold patches, split groups) and its counts, under a fingerprint of the
settings and rules. An update compares it to rebuild only the batches whose inputs changed."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Mapping

MANIFEST = "manifest.json"


def stamps(paths: list[Path], data_dir: Path) -> list[list]:
    """Each input file as [path under data_dir, size, mtime]: a changed file changes its batch's entry."""
    return [[str(p.relative_to(data_dir)), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]


def tasks_digest(gold: dict[str, str] | None, task_groups: Mapping[str, str] | None, instance_ids: list[str]) -> str:
    """What a batch's rows depend on besides its files: each task's gold patch and split group."""
    pairs = [[i, (gold or {}).get(i, ""), (task_groups or {}).get(i, i)] for i in instance_ids]
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]


def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The output folder's manifest ({} when none was written)."""
    path = Path(out_dir) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def write_manifest(out_dir: Path, manifest: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out_dir / MANIFEST)
