"""Persisted records and their explicit Parquet schemas.

Every record is a frozen dataclass with one pyarrow schema carrying `schema_version`
in its metadata. Lists of strings stay lists; free-form structures are JSON strings,
because Arrow widens heterogeneous dicts into null-filled structs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

TASK_SCHEMA_VERSION = "1"


@dataclass(frozen=True)
class Task:
    """A SWE-bench instance plus what running it needs."""

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    """The gold patch (source changes only)."""
    test_patch: str
    problem_statement: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    image: str
    """Docker image the task runs in."""
    workdir: str
    """Repository location inside the image."""
    test_cmd: str
    """Command that runs the tests (test names are appended by the verifier when it narrows)."""
    log_parser: str
    """A name in swebench's PARSER_REGISTRY (e.g. 'parse_log_pytest')."""
    source: str
    """Where the task came from: 'swe-bench', 'swe-bench-verified', 'swe-gym', 'swe-smith', 'synth'."""
    hints_text: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    created_at: str = ""
    setup_patch: str = ""
    """Applied (and committed as the only history) when a sandbox starts; synthesized bugs live here."""
    test_files: tuple[str, ...] = ()
    """Files the verifier restores to pristine before running the tests (conftest.py included)."""
    provenance: str = "{}"
    """JSON: dataset name and split, or package, version and mutation for synthesized tasks."""

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        for name in ("FAIL_TO_PASS", "PASS_TO_PASS", "test_files"):
            row[name] = list(row[name])
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Task":
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in row.items() if k in names}
        for name in ("FAIL_TO_PASS", "PASS_TO_PASS", "test_files"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values)


def _schema(fields: list[pa.Field], version: str, record: str) -> pa.Schema:
    return pa.schema(fields, metadata={"schema_version": version, "record": record})


TASK_SCHEMA = _schema(
    [
        pa.field(f.name, pa.list_(pa.string()) if f.name in ("FAIL_TO_PASS", "PASS_TO_PASS", "test_files")
                 else pa.string(), nullable=False)
        for f in dataclasses.fields(Task)
    ],
    TASK_SCHEMA_VERSION,
    "Task",
)


@dataclass(frozen=True)
class RejectedTask:
    """A row or candidate set aside, with the reason; reported, never silently dropped."""

    item: str
    """The row's instance_id (or its index when it has none), or the package / candidate name."""
    stage: str
    reason: str


REJECT_SCHEMA = _schema(
    [pa.field(n, pa.string(), nullable=False) for n in ("item", "stage", "reason")], "1", "RejectedTask"
)


def schema_version(schema: pa.Schema) -> str:
    return (schema.metadata or {}).get(b"schema_version", b"").decode()


__all__ = ["Task", "TASK_SCHEMA", "RejectedTask", "REJECT_SCHEMA", "schema_version"]
