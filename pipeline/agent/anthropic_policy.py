"""AnthropicPolicy: the Messages API, with OpenAI-format messages and tools in and out."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass

import anthropic

from pipeline.agent.policy import (
    AssistantTurn,
    PolicyIdentity,
    Usage,
    call_with_retries,
    header_seconds,
    is_retryable_status,
)
from pipeline.agent.server_check import CHECK_TIMEOUT, ServerCheckError, not_served, unanswered

FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}
EMPTY_TEXT = "(empty)"  # the API rejects empty text blocks and messages


@dataclass(frozen=True)
class AnthropicPolicyConfig:
    """Which Claude model to call and how to sample from it."""

    model: str
    """Model id, e.g. 'claude-sonnet-4-5'."""
    base_url: str | None = None
    """Server root without /v1 (None: the SDK's default, api.anthropic.com)."""
    temperature: float | None = None
    """None: the model's own. The SDK (2.x) has no sampling arguments; a value is sent in the body,
    which older models and compatible servers accept and newer models may refuse."""
    max_tokens: int = 4096
    """Most tokens one reply may generate."""
    timeout: float = 600.0  # seconds per request
    max_retries: int = 5
    """Retries after a 429, 5xx (529 overloaded too), timeout or connection error before PolicyError."""
    retry_initial_delay: float = 1.0  # seconds, doubled each retry
    retry_max_delay: float = 60.0  # seconds
    api_key_env: str = "ANTHROPIC_API_KEY"
    """Environment variable holding the key, read when the policy is built."""


class AnthropicPolicy:
    """Claude as a tool-using policy. The API takes no seed: `seed` is accepted and ignored."""

    native_tools = True

    def __init__(self, config: AnthropicPolicyConfig, api_key: str | None = None):
        key = api_key or os.environ.get(config.api_key_env)  # a key given here wins; never stored
        if not key:
            raise ValueError(f"AnthropicPolicy: set the {config.api_key_env} environment variable "
                             "(or point AnthropicPolicyConfig.api_key_env at the one that holds the key)")
        self.config = config
        self.name = f"anthropic:{config.model}"
        # what PolicyIdentity stores: top_p and top_k are never sent, so the server's defaults (unknown) apply
        self.sampling = dict(temperature=-1.0 if config.temperature is None else float(config.temperature))
        self._client = anthropic.Anthropic(
            api_key=key, base_url=config.base_url, timeout=config.timeout, max_retries=0
        )

    def settings(self) -> dict:
        """The config minus where the key lives."""
        values = dataclasses.asdict(self.config)
        values.pop("api_key_env")
        return values

    def check_server(self, role: str = "policy") -> None:
        """Raise ServerCheckError unless the server knows this model: GET /v1/models/{model} (the API resolves
        aliases), else its list (a compatible server, e.g. vLLM, may have no route per model), else (neither route)
        a reply of one token. Asked once before a step's first attempt (pipeline/agent/server_check.py)."""
        url, model = self.config.base_url or "", self.config.model
        client = self._client.with_options(timeout=CHECK_TIMEOUT, max_retries=0)
        try:
            client.models.retrieve(model)
            return
        except anthropic.NotFoundError:
            pass
        except anthropic.APIError as exc:
            raise ServerCheckError(unanswered(role, model, url, exc, openai_compatible=False)) from None
        try:
            listed = sorted(m.id for m in client.models.list().data)
        except anthropic.NotFoundError:  # no model list either
            listed = [model] if self._one_token(client, role) else []
        except anthropic.APIError as exc:
            raise ServerCheckError(unanswered(role, model, url, exc, openai_compatible=False)) from None
        if model not in listed:
            raise ServerCheckError(not_served(role, model, url, listed, openai_compatible=False))

    def _one_token(self, client, role: str) -> bool:
        """Whether a one-token reply of this model comes back (False: the server does not know the model)."""
        try:
            client.messages.create(model=self.config.model, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
            return True
        except anthropic.NotFoundError:
            return False
        except anthropic.APIError as exc:
            raise ServerCheckError(unanswered(role, self.config.model, self.config.base_url or "", exc,
                                              openai_compatible=False)) from None

    def act(self, messages: list[dict], tools: list[dict], *, seed: int | None = None) -> AssistantTurn:
        """One Messages call; tool_use blocks come back as OpenAI tool_calls."""
        system, converted = to_anthropic_messages(messages)
        request = dict(
            model=self.config.model,
            messages=converted,
            max_tokens=self.config.max_tokens,
        )
        if self.config.temperature is not None:
            request["extra_body"] = {"temperature": self.config.temperature}
        if system:
            request["system"] = system
        if tools:
            request["tools"] = to_anthropic_tools(tools)
        start = time.monotonic()
        response = call_with_retries(
            lambda: self._client.messages.create(**request),
            retry_after=_retry_after,
            status_of=_status,
            max_retries=self.config.max_retries,
            initial_delay=self.config.retry_initial_delay,
            max_delay=self.config.retry_max_delay,
            what=f"{self.name} at {self.config.base_url or 'api.anthropic.com'}",
        )
        return AssistantTurn(
            message=to_openai_message(response.content),
            identity=PolicyIdentity(response.model or self.config.model, **self.sampling),
            usage=Usage(response.usage.input_tokens, response.usage.output_tokens),
            latency=time.monotonic() - start,
            finish_reason=FINISH_REASONS.get(response.stop_reason or "", response.stop_reason or ""),
        )


def to_anthropic_tools(tools: list[dict]) -> list[dict]:
    """OpenAI function-tool schemas → Anthropic tool definitions."""
    converted = []
    for tool in tools:
        function = tool["function"]
        converted.append({
            "name": function["name"],
            "description": function.get("description", ""),
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        })
    return converted


def to_anthropic_messages(messages: list[dict]) -> tuple[str, list[dict]]:
    """OpenAI chat messages → (system prompt, Anthropic messages with same-role turns merged)."""
    system: list[str] = []
    converted: list[dict] = []
    for message in messages:
        role = message["role"]
        if role in ("system", "developer"):
            system.append(_text(message.get("content")))
            continue
        blocks = _blocks(message)
        anthropic_role = "assistant" if role == "assistant" else "user"  # tool results are user turns
        if converted and converted[-1]["role"] == anthropic_role:
            converted[-1]["content"].extend(blocks)
        else:
            converted.append({"role": anthropic_role, "content": blocks})
    for message in converted:
        if not message["content"]:
            message["content"] = [{"type": "text", "text": EMPTY_TEXT}]
    return "\n\n".join(s for s in system if s), converted


def _blocks(message: dict) -> list[dict]:
    if message["role"] == "tool":
        return [{"type": "tool_result", "tool_use_id": message["tool_call_id"],
                 "content": _text(message.get("content")) or EMPTY_TEXT}]
    text = _text(message.get("content"))
    blocks = [{"type": "text", "text": text}] if text.strip() else []
    for call in message.get("tool_calls") or []:
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": _arguments(call["function"].get("arguments"))})
    return blocks


def _text(content: str | list | None) -> str:
    """Plain text of OpenAI content: a string, or a list of parts of which text parts are kept."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _arguments(arguments: str | dict | None) -> dict:
    """Tool-call arguments as the object Anthropic wants; malformed JSON is kept under 'arguments'."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def to_openai_message(content: list) -> dict:
    """Anthropic content blocks → an OpenAI assistant message; thinking blocks' text is its `reasoning_content`
    (not sent back: the API rebuilds earlier turns' thinking itself from signed blocks this record does not keep)."""
    texts = [block.text for block in content if block.type == "text"]
    thoughts = [block.thinking for block in content if block.type == "thinking"]
    tool_calls = [
        {"id": block.id, "type": "function",
         "function": {"name": block.name, "arguments": json.dumps(block.input)}}
        for block in content if block.type == "tool_use"
    ]
    message: dict = {"role": "assistant", "content": "".join(texts) if texts or not tool_calls else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if thoughts:
        message["reasoning_content"] = "\n\n".join(thoughts)
    return message


def _status(error: Exception) -> int | None:
    return error.status_code if isinstance(error, anthropic.APIStatusError) else None


def _retry_after(error: Exception) -> float | None:
    """Seconds the server asked us to wait, 0.0 without a hint, None when not retryable."""
    if isinstance(error, anthropic.APIStatusError):
        return header_seconds(error.response.headers) if is_retryable_status(error.status_code) else None
    if isinstance(error, anthropic.APIConnectionError):  # timeouts included
        return 0.0
    return None
