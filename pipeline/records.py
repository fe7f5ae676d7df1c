"""Persisted records and their explicit Parquet schemas.

Every record is a frozen dataclass with one pyarrow schema carrying `schema_version`
in its metadata. Lists of strings stay lists; free-form structures are JSON strings,
because Arrow widens heterogeneous dicts into null-filled structs.
"""

from __future__ import annotations

import dataclasses
import json
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


def record_schema(fields: list[pa.Field], version: str, record: str) -> pa.Schema:
    return pa.schema(fields, metadata={"schema_version": version, "record": record})


TASK_SCHEMA = record_schema(
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


REJECT_SCHEMA = record_schema(
    [pa.field(n, pa.string(), nullable=False) for n in ("item", "stage", "reason")], "1", "RejectedTask"
)


def schema_version(schema: pa.Schema) -> str:
    return (schema.metadata or {}).get(b"schema_version", b"").decode()




TRAJECTORY_SCHEMA_VERSION = "1"

MESSAGE_TYPE = pa.struct([
    pa.field("role", pa.string()), pa.field("content", pa.string()),
    pa.field("tool_calls", pa.string()),  # JSON list in OpenAI form, or null
    pa.field("tool_call_id", pa.string()),
])
STEP_TYPE = pa.struct([
    pa.field("policy_latency", pa.float64()), pa.field("tool_time", pa.float64()),
    pa.field("prompt_tokens", pa.int64()), pa.field("completion_tokens", pa.int64()),
    pa.field("tool", pa.string()), pa.field("error", pa.bool_()),
])


def message_row(message: dict) -> dict:
    """A chat message in the stored form: tool calls as a JSON string, every field present."""
    calls = message.get("tool_calls")
    return {"role": message["role"], "content": message.get("content"),
            "tool_calls": json.dumps(calls) if calls else None, "tool_call_id": message.get("tool_call_id")}


def message_from_row(row: dict) -> dict:
    """The OpenAI chat message back from its stored form."""
    message = {"role": row["role"], "content": row["content"]}
    if row.get("tool_calls"):
        message["tool_calls"] = json.loads(row["tool_calls"])
    if row.get("tool_call_id"):
        message["tool_call_id"] = row["tool_call_id"]
    return message


@dataclass(frozen=True)
class Trajectory:
    """One graded attempt at a task, as stored (see TRAJECTORY_SCHEMA)."""

    rollout_id: str
    """Deterministic: sha256 of (instance_id, policy, guidance key, sample_index, seed)."""
    group_id: str
    """Attempts of one task under one guidance in one batch share it (GRPO's group)."""
    batch: str
    instance_id: str
    sample_index: int
    seed: int
    policy: str
    """Policy name; 'heuristic' for the offline baseline."""
    policy_settings: str
    """JSON of the policy's settings (never an API key)."""
    guidance_kind: str
    """'none', 'plan', 'environment_feedback', 'environment_interaction', or 'action'."""
    guidance_text: str
    guidance_actions: str
    """JSON list of {"name", "args"} (action guidance), '[]' otherwise."""
    guidance_k: int
    """Prefix length shown (action guidance); -1 without action guidance."""
    teacher: str
    prompt: tuple[dict, ...]
    """The messages the policy saw first (guidance included)."""
    unguided_prompt: tuple[dict, ...]
    messages: tuple[dict, ...]
    tools: str
    """JSON list of the tool schemas the policy was given."""
    steps: tuple[dict, ...]
    logprobs: tuple[tuple[float, ...], ...] | None
    patch: str
    reward: float
    resolved: bool
    grade_reason: str
    report: str
    """JSON: the grader's FAIL_TO_PASS / PASS_TO_PASS report."""
    test_log: str
    """Tail of the grading test log."""
    exit_status: str
    infra_error: str
    """Empty unless a sandbox, grader or model-server fault remained after retries."""
    infra_retries: int
    format_errors: int
    total_tokens: int
    wall_time: float  # seconds, the attempt
    grade_time: float  # seconds, the grading
    quotes_guidance: bool
    """The response quotes the guidance text (n-gram overlap above the threshold)."""
    created_at: str

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        for name in ("prompt", "unguided_prompt", "messages"):
            row[name] = [message_row(m) for m in getattr(self, name)]
        row["logprobs"] = [list(lp) if lp is not None else None for lp in self.logprobs] \
            if self.logprobs is not None else None
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Trajectory":
        values = dict(row)
        for name in ("prompt", "unguided_prompt", "messages"):
            values[name] = tuple(message_from_row(m) for m in row[name])
        values["steps"] = tuple(row["steps"])
        if row["logprobs"] is not None:
            values["logprobs"] = tuple(tuple(lp) if lp is not None else None for lp in row["logprobs"])
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})


def _trajectory_type(name: str) -> pa.DataType:
    special = {
        "prompt": pa.list_(MESSAGE_TYPE), "unguided_prompt": pa.list_(MESSAGE_TYPE),
        "messages": pa.list_(MESSAGE_TYPE), "steps": pa.list_(STEP_TYPE),
        "logprobs": pa.list_(pa.list_(pa.float32())), "sample_index": pa.int64(), "seed": pa.int64(),
        "guidance_k": pa.int64(), "reward": pa.float64(), "resolved": pa.bool_(), "infra_retries": pa.int64(),
        "format_errors": pa.int64(), "total_tokens": pa.int64(), "wall_time": pa.float64(),
        "grade_time": pa.float64(), "quotes_guidance": pa.bool_(),
    }
    return special.get(name, pa.string())


TRAJECTORY_SCHEMA = record_schema(
    [pa.field(f.name, _trajectory_type(f.name), nullable=f.name == "logprobs")
     for f in dataclasses.fields(Trajectory)],
    TRAJECTORY_SCHEMA_VERSION,
    "Trajectory",
)
