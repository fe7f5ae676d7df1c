"""Persisted records and their Parquet schemas, each declared once: the parts (a chat message as stored, a
reference action, one step of the agent loop) and the records made of them (task, guidance, plan, trajectory).

Every record is a frozen dataclass; its pyarrow schema is derived from the dataclass's fields in order
(pipeline/core/schema.py `fields_of`: str, int, float, bool, tuples of str or of a nested record; an Optional
field is nullable), with an explicit map for the few columns stored otherwise, and metadata naming the
record and its `schema_version` (what `pipeline.core.store.read_records` checks). Lists of strings stay lists; free-form
structures are JSON strings, because Arrow widens heterogeneous dicts into null-filled structs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline.core.schema import TURN_IDS, fields_of, flat, record_schema
from pipeline.core.vocab import NO_GUIDANCE_KIND


@dataclass(frozen=True)
class Message:
    """A chat message as stored: OpenAI's fields, every one present, tool calls as a JSON string."""

    role: str
    content: str | None
    tool_calls: str | None
    """JSON list of OpenAI tool calls, or None."""
    tool_call_id: str | None
    reasoning_content: str | None = None
    """The model's reasoning as the server returned it apart from `content` (vLLM's reasoning parser,
    Anthropic's thinking blocks); chat templates that show reasoning (Qwen3) render this key."""

    @classmethod
    def from_openai(cls, message: dict) -> "Message":
        calls = message.get("tool_calls")
        return cls(message["role"], message.get("content"), json.dumps(calls) if calls else None,
                   message.get("tool_call_id"), message.get("reasoning_content"))

    def to_openai(self) -> dict:
        """The OpenAI chat message: absent keys stay absent."""
        message: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = json.loads(self.tool_calls)
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        return message


MESSAGE_FIELDS = fields_of(Message)
MESSAGE_TYPE = pa.struct(MESSAGE_FIELDS)
MESSAGE_SCHEMA = record_schema(MESSAGE_FIELDS, "2", "Message")


@dataclass(frozen=True)
class Action:
    """One reference tool call in ActGuide's form {"name", "args"}, its arguments as a JSON object string."""

    name: str
    args: str

    @classmethod
    def of(cls, action: "Action | dict") -> "Action":
        """An Action from itself or from {"name", "args": {...}}."""
        if isinstance(action, Action):
            return action
        return cls(action["name"], json.dumps(action["args"], ensure_ascii=False))

    def as_dict(self) -> dict:
        return {"name": self.name, "args": json.loads(self.args)}


ACTION_FIELDS = fields_of(Action)
ACTION_TYPE = pa.struct(ACTION_FIELDS)
ACTION_SCHEMA = record_schema(ACTION_FIELDS, "1", "Action")


def actions_tuple(actions) -> tuple[Action, ...]:
    """Actions as records, from records or {"name", "args"} dicts."""
    return tuple(Action.of(a) for a in actions)


@dataclass(frozen=True)
class Step:
    """One model call and the tool call it made (the agent loop records these as they happen)."""

    policy_latency: float  # seconds
    tool_time: float  # seconds
    prompt_tokens: int
    completion_tokens: int
    tool: str
    """The tool called ('' when the reply held no usable call)."""
    error: bool
    """The call was malformed, or the tool reported an error."""


STEP_FIELDS = fields_of(Step)
STEP_TYPE = pa.struct(STEP_FIELDS)
STEP_SCHEMA = record_schema(STEP_FIELDS, "1", "Step")


TASK_SCHEMA_VERSION = "2"  # 2: the certificate columns (pipeline/tasks/certificate.py)


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
    certificate_containers: int = 0
    """Fresh containers its gold and empty patches were each graded in at validation (pipeline/tasks/certificate.py);
    0: none recorded (a dataset row before validation, or a row of task schema 1)."""
    certificate_gold_resolved: int = 0
    """Of those containers, the ones whose gold grade resolved it."""
    certificate_empty_failed: int = 0
    """Of those containers, the ones whose empty-patch grade did not resolve it."""
    certificate_orders: tuple[str, ...] = ()
    """Each container's test order ('file', 'shuffled-<seed>') and scope ('/suite', '/files': its bug's test files)."""
    certificate_gold_seconds: float = 0.0
    """Wall seconds of the certificate's gold grades, summed."""
    certificate_empty_seconds: float = 0.0
    """Wall seconds of the certificate's empty-patch grades, summed."""

    def to_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Task":
        """A task from a stored row or a dataset row (absent optional columns take their defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in row.items() if k in names}
        for name in ("FAIL_TO_PASS", "PASS_TO_PASS", "test_files", "certificate_orders"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values)


TASK_SCHEMA = record_schema(fields_of(Task), TASK_SCHEMA_VERSION, "Task")


@dataclass(frozen=True)
class RejectedTask:
    """A row or candidate set aside, with the reason; reported, never silently dropped."""

    item: str
    """The row's instance_id (or its index when it has none), or the package / candidate name."""
    stage: str
    reason: str


REJECT_SCHEMA = record_schema(fields_of(RejectedTask), "1", "RejectedTask")


@dataclass(frozen=True)
class Guidance:
    """What an attempt is shown beyond the task: nothing, a teacher's hint, or an action prefix."""

    kind: str = NO_GUIDANCE_KIND
    """'none' (NO_GUIDANCE_KIND), or one of GUIDANCE_KINDS (pipeline/core/vocab.py)."""
    text: str = ""
    """Exactly what is added to the task prompt."""
    actions: tuple[Action, ...] = ()
    """Reference actions (action guidance); dicts {"name", "args"} given here become Actions."""
    k: int = -1
    """Prefix length shown (action guidance); -1 otherwise."""
    teacher: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "actions", actions_tuple(self.actions))

    @property
    def key(self) -> str:
        return NO_GUIDANCE_KIND if self.kind == NO_GUIDANCE_KIND else \
            f"{self.kind}:{hashlib.sha256((self.text + str(self.k)).encode()).hexdigest()[:12]}"

    def to_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Guidance":
        return cls(row["kind"], row["text"], tuple(Action(**a) for a in row["actions"]), row["k"], row["teacher"])


GUIDANCE_SCHEMA = record_schema(fields_of(Guidance), "1", "Guidance")
"""Schema of the Guidance record. guidance.parquet holds GuidancePlan rows: GUIDANCE_PLAN_SCHEMA."""


@dataclass(frozen=True)
class GuidancePlan:
    """Guidance decided for one failed task and one kind (stored as guidance.parquet)."""

    instance_id: str
    kind: str
    text: str
    """Exactly what the guided prompt gets."""
    teacher: str
    files: tuple[str, ...] = ()
    """Files the guidance names."""
    functions: tuple[str, ...] = ()
    leaked: bool = False
    """The text holds a line of the gold patch verbatim."""
    accepted: bool = True
    reason: str = ""
    """Why the plan was set aside (a leak, a teacher or search error); '' when accepted."""
    actions: tuple[Action, ...] = ()
    """Reference actions (action guidance)."""
    action_source: str = ""
    """'trajectory', 'file' or 'expert' (action guidance; pipeline.guidance.actions.REFERENCE_SOURCES)."""
    reference_rollout: str = ""
    """The rollout_id of the stored success whose tool calls are the reference (action_source 'trajectory')."""
    K: int = -1
    k_star: int = -1
    found: bool = False
    search_steps: int = 0
    probes: int = 0
    linear_k: int = -1
    linear_probes: int = 0
    teacher_tokens_in: int = 0
    """Prompt tokens of the teacher call that wrote this guidance, as its server reported them (0: rule teacher)."""
    teacher_tokens_out: int = 0
    """Tokens that teacher call generated."""
    teacher_call_share: int = 1
    """Plans written by that one call (Agent-RLVR's kinds come from one answer): each is charged its share."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "actions", actions_tuple(self.actions))

    def to_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "GuidancePlan":
        return flat(cls, {**row, "actions": [Action(**a) for a in row["actions"]]})


GUIDANCE_PLAN_SCHEMA = record_schema(fields_of(GuidancePlan), "4", "GuidancePlan")  # 4: reference_rollout


TRAJECTORY_SCHEMA_VERSION = "4"  # 3: reasoning in messages, per-turn token ids, the policy's identity; 4: its sampling
MESSAGE_COLUMNS = ("prompt", "unguided_prompt", "messages")


@dataclass(frozen=True)
class Trajectory:
    """One graded attempt at a task, as stored (see TRAJECTORY_SCHEMA)."""

    rollout_id: str
    """Names one stored attempt: sha256 of (batch, instance_id, policy, guidance key, sample_index, seed)."""
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
    """'none', 'plan', 'environment_feedback', 'environment_interaction', 'hindsight', or 'action'."""
    guidance_text: str
    guidance_actions: tuple[Action, ...]
    """Reference actions (action guidance); empty otherwise."""
    guidance_k: int
    """Prefix length shown (action guidance); -1 without action guidance."""
    teacher: str
    prompt: tuple[dict, ...]
    """The messages the policy saw first (guidance included), OpenAI chat dicts; stored as Message rows."""
    unguided_prompt: tuple[dict, ...]
    messages: tuple[dict, ...]
    tools: str
    """JSON list of the tool schemas the policy was given."""
    steps: tuple[Step, ...]
    logprobs: tuple[tuple[float, ...] | None, ...] | None
    patch: str
    reward: float
    resolved: bool
    grade_reason: str
    report: str
    """JSON: the grader's FAIL_TO_PASS / PASS_TO_PASS report."""
    test_log: str
    """Tail of the grading test log."""
    dropped_files: tuple[str, ...]
    """Files whose changes the grader discarded because the tests read them."""
    enforcement: tuple[str, ...]
    """Every action the grader took on the patched tree ('restored <path>', 'removed <path>: <why>')."""
    suspicious: tuple[str, ...]
    """The grader's static flags on what the patch adds; evidence of tampering."""
    exit_status: str
    """The agent loop's exit status, or 'crashed' when the harness raised during the attempt."""
    infra_error: str
    """Empty unless a sandbox, grader or model-server fault remained after retries, or the attempt
    crashed ('crashed: <ExcType>: <message>'); such rows are rerun and never used as failures."""
    error: str
    """The full traceback of a crash; else the attempt's own error (e.g. the policy error); '' when none."""
    infra_retries: int
    format_errors: int
    total_tokens: int
    wall_time: float  # seconds, the attempt
    grade_time: float  # seconds, the grading
    quotes_guidance: bool
    """The response quotes the guidance text (n-gram overlap above the threshold)."""
    created_at: str
    prompt_token_ids: tuple[tuple[int, ...] | None, ...] | None = None
    """Per assistant turn, the token ids the policy was given (None for a turn without); None when no turn had any."""
    token_ids: tuple[tuple[int, ...] | None, ...] | None = None
    """Per assistant turn, the ids it sampled, aligned one to one with that turn's `logprobs`."""
    policy_model: str = ""
    """The model's name as loaded or served ('' when the policy is no model)."""
    policy_revision: str = ""
    """Hub commit or 'sha256:<hex>' of the weights that sampled the turns; '' when unknown."""
    chat_template_hash: str = ""
    """sha256 of the chat template that rendered the turns' prompts; '' when unknown."""
    temperature: float = -1.0
    """Temperature the turns were sampled at (PolicyIdentity's): 0.0 greedy (the heuristic too); -1.0 unknown."""
    top_p: float = -1.0
    """Top-p the turns were sampled with: 1.0 off; -1.0 unknown (not sent: the server's default applied)."""
    top_k: int = -1
    """Top-k the turns were sampled with: 0 off; -1 unknown (not sent: the server's default applied)."""

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        for name in MESSAGE_COLUMNS:
            row[name] = [dataclasses.asdict(Message.from_openai(m)) for m in getattr(self, name)]
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Trajectory":
        values = {f.name: row[f.name] for f in dataclasses.fields(cls)}
        for name in MESSAGE_COLUMNS:
            values[name] = [Message(**m).to_openai() for m in row[name]]
        values["steps"] = [Step(**s) for s in row["steps"]]
        values["guidance_actions"] = [Action(**a) for a in row["guidance_actions"]]
        for name in ("logprobs", "prompt_token_ids", "token_ids"):
            if row[name] is not None:
                values[name] = tuple(tuple(turn) if turn is not None else None for turn in row[name])
        return flat(cls, values)


TRAJECTORY_SCHEMA = record_schema(fields_of(Trajectory, stored_as={
    **{name: pa.list_(MESSAGE_TYPE) for name in MESSAGE_COLUMNS},  # OpenAI chat dicts, stored as Message rows
    "logprobs": pa.list_(pa.list_(pa.float32())),  # (assistant turns, tokens); null without log-probs
    "prompt_token_ids": TURN_IDS, "token_ids": TURN_IDS,
}), TRAJECTORY_SCHEMA_VERSION, "Trajectory")
