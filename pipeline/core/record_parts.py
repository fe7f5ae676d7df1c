"""The records a trajectory and a guidance plan are made of: a chat message as stored, a reference action
(ActGuide's {"name", "args"}), and one step of the agent loop; each with its Parquet type."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from pipeline.core.schema import fields_of, record_schema


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
