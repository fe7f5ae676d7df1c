"""OpenAIPolicy: any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, OpenAI)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass

import openai

from pipeline.agent.policy import (
    AssistantTurn,
    Usage,
    call_with_retries,
    header_seconds,
    is_retryable_status,
)

NO_KEY = "EMPTY"  # what vLLM and SGLang expect when they run without --api-key


@dataclass(frozen=True)
class OpenAIPolicyConfig:
    """How to reach an OpenAI-compatible server and how to sample from it."""

    model: str
    """Model name as the server knows it (vLLM: the --served-model-name)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """Server root including /v1."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 4096
    """Most tokens one reply may generate."""
    timeout: float = 600.0  # seconds per request
    max_retries: int = 5
    """Retries after a 429, 5xx, timeout or connection error before PolicyError."""
    retry_initial_delay: float = 1.0  # seconds, doubled each retry
    retry_max_delay: float = 60.0  # seconds
    request_logprobs: bool = False
    """Ask for token log-probs; dropped for good if the server rejects them."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the key, read when the policy is built (unset: no key)."""


class OpenAIPolicy:
    """The chat-completions API with native tool calls, seeded, with our own bounded retries."""

    native_tools = True

    def __init__(self, config: OpenAIPolicyConfig, api_key: str | None = None):
        self.config = config
        self.name = f"openai:{config.model}"
        self._logprobs = config.request_logprobs
        self._client = openai.OpenAI(
            api_key=api_key or os.environ.get(config.api_key_env) or NO_KEY,  # a key given here wins; never stored
            base_url=config.base_url,
            timeout=config.timeout,
            max_retries=0,  # the retry count is ours
        )

    def settings(self) -> dict:
        """The config minus where the key lives, plus whether log-probs are actually requested."""
        values = dataclasses.asdict(self.config)
        values.pop("api_key_env")
        values["logprobs_requested"] = self._logprobs
        return values

    def act(self, messages: list[dict], tools: list[dict], *, seed: int | None = None) -> AssistantTurn:
        """One chat completion; tool-call arguments come back as JSON strings."""
        start = time.monotonic()
        response = call_with_retries(
            lambda: self._create(messages, tools, seed),
            retry_after=_retry_after,
            max_retries=self.config.max_retries,
            initial_delay=self.config.retry_initial_delay,
            max_delay=self.config.retry_max_delay,
            what=f"{self.name} at {self.config.base_url}",
        )
        return _turn(response, time.monotonic() - start)

    def _create(self, messages: list[dict], tools: list[dict], seed: int | None):
        try:
            return self._client.chat.completions.create(**self._request(messages, tools, seed))
        except openai.BadRequestError as error:
            if not (self._logprobs and "logprob" in str(error).lower()):
                raise
            self._logprobs = False  # remembered: later calls do not ask again
            return self._client.chat.completions.create(**self._request(messages, tools, seed))

    def _request(self, messages: list[dict], tools: list[dict], seed: int | None) -> dict:
        request = dict(
            model=self.config.model,
            messages=messages,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            max_tokens=self.config.max_tokens,
        )
        if tools:
            request["tools"] = tools
        if seed is not None:
            request["seed"] = seed
        if self._logprobs:
            request["logprobs"] = True
        return request


def _retry_after(error: Exception) -> float | None:
    """Seconds the server asked us to wait, 0.0 without a hint, None when not retryable."""
    if isinstance(error, openai.APIStatusError):
        return header_seconds(error.response.headers) if is_retryable_status(error.status_code) else None
    if isinstance(error, openai.APIConnectionError):  # timeouts included
        return 0.0
    return None


def _turn(response, latency: float) -> AssistantTurn:
    choice = response.choices[0]
    message: dict = {"role": "assistant", "content": choice.message.content}
    tool_calls = [_tool_call(call, i) for i, call in enumerate(choice.message.tool_calls or [])]
    if tool_calls:
        message["tool_calls"] = tool_calls
    usage = response.usage
    return AssistantTurn(
        message=message,
        usage=Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else Usage(),
        logprobs=_token_logprobs(choice),
        latency=latency,
        finish_reason=choice.finish_reason or "",
    )


def _tool_call(call, index: int) -> dict:
    arguments = call.function.arguments
    if not isinstance(arguments, str):  # a few servers send an object
        arguments = json.dumps(arguments)
    return {
        "id": call.id or f"call_{index}",
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }


def _token_logprobs(choice) -> tuple[float, ...] | None:
    content = choice.logprobs.content if choice.logprobs else None
    return tuple(float(token.logprob) for token in content) if content else None
