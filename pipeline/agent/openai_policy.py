"""OpenAIPolicy: any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, OpenAI)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass

import openai
from openai.types.chat import ChatCompletion

from pipeline.agent.identity import local_identity
from pipeline.agent.policy import (
    AssistantTurn,
    PolicyIdentity,
    Usage,
    call_with_retries,
    header_seconds,
    is_retryable_status,
)
from pipeline.agent.server_check import ServerCheckError, listed_models, not_served

NO_KEY = "EMPTY"  # what vLLM and SGLang expect when they run without --api-key
# vLLM (>= 0.10.2) extensions: the response's `prompt_token_ids` and each choice's `token_ids`; and, with
# logprobs, each token named 'token_id:<id>' so that ids survive where the text does not
TOKEN_ID_PARAMS = {"return_token_ids": True, "return_tokens_as_token_ids": True}
TOKEN_ID_PREFIX = "token_id:"


@dataclass(frozen=True)
class OpenAIPolicyConfig:
    """How to reach an OpenAI-compatible server and how to sample from it."""

    model: str
    """Model name as the server knows it (vLLM: the --served-model-name)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """Server root including /v1."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    """Sent as the `top_k` extra parameter (vLLM, SGLang, llama.cpp) when set, 0 or -1: off; None: not sent, so the
    server's default applies (vLLM takes the model's generation_config.json, which may set one) and turns store
    top_k unknown (-1). OpenAI's own API takes no top_k."""
    max_tokens: int = 4096
    """Most tokens one reply may generate."""
    timeout: float = 600.0  # seconds per request
    max_retries: int = 5
    """Retries after a 429, 5xx, timeout or connection error before PolicyError."""
    retry_initial_delay: float = 1.0  # seconds, doubled each retry
    retry_max_delay: float = 60.0  # seconds
    request_logprobs: bool = False
    """Ask for token log-probs; dropped for good if the server rejects them."""
    request_token_ids: bool = True
    """With `request_logprobs`: also ask vLLM for the prompt's and the reply's token ids (`return_token_ids`,
    `return_tokens_as_token_ids`); dropped for good if the server rejects them. Without them no ids are stored."""
    identity_model_path: str = ""
    """A local copy of the served model (the directory vLLM was started on): its weights hash and chat template
    identify the policy in stored turns; '': the served name only, which training cannot match to a model."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the key, read when the policy is built (unset: no key)."""


class OpenAIPolicy:
    """The chat-completions API with native tool calls, seeded, with our own bounded retries."""

    native_tools = True

    def __init__(self, config: OpenAIPolicyConfig, api_key: str | None = None):
        self.config = config
        self.name = f"openai:{config.model}"
        self._logprobs = config.request_logprobs
        self._token_ids = config.request_logprobs and config.request_token_ids
        self.token_ids_missing = ""
        """Why turns carry no token ids ('' while every reply had them); said once in the batch metadata."""
        self.identity = _identity(config)
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
        values["token_ids_missing"] = self.token_ids_missing if self._logprobs else "log-probs not requested"
        return values

    def check_server(self, role: str = "policy") -> None:
        """Raise ServerCheckError unless the server answers GET /models listing this model: asked once before a
        step's first attempt, so a server that is down stops the step in seconds (pipeline/agent/server_check.py)."""
        listed = listed_models(self._client, role, self.config.model, self.config.base_url)
        if self.config.model not in listed:
            raise ServerCheckError(not_served(role, self.config.model, self.config.base_url, listed))

    def act(self, messages: list[dict], tools: list[dict], *, seed: int | None = None) -> AssistantTurn:
        """One chat completion; tool-call arguments come back as JSON strings."""
        start = time.monotonic()
        response = call_with_retries(
            lambda: self._create(messages, tools, seed),
            retry_after=_retry_after,
            status_of=_status,
            max_retries=self.config.max_retries,
            initial_delay=self.config.retry_initial_delay,
            max_delay=self.config.retry_max_delay,
            what=f"{self.name} at {self.config.base_url}",
        )
        turn, missing = _turn(response, time.monotonic() - start, self.identity)
        if missing and self._logprobs and not self.token_ids_missing:
            self.token_ids_missing = f"{self.name} at {self.config.base_url}: {missing}"
        return turn

    def _create(self, messages: list[dict], tools: list[dict], seed: int | None) -> ChatCompletion:
        # POSTed as built, not through chat.completions.create: create() walks the whole conversation through the
        # SDK's TypedDict transform on every turn (for aliases chat messages do not have), 70% of the client's CPU
        # at 20 turns and growing with the conversation; the request's bytes, errors and parsed reply are the same
        while True:
            try:
                return self._client.post("/chat/completions", cast_to=ChatCompletion,
                                         body=self._request(messages, tools, seed))
            except openai.BadRequestError as error:
                text = str(error).lower()
                if self._token_ids and "token_id" in text:
                    self._token_ids = False  # remembered: later calls do not ask again
                    self.token_ids_missing = f"{self.name} at {self.config.base_url} refused return_token_ids"
                elif self._logprobs and "logprob" in text:
                    self._logprobs = self._token_ids = False
                else:
                    raise

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
        if self.config.top_k is not None:
            request["top_k"] = self.config.top_k  # vLLM's, SGLang's and llama.cpp's extra parameters
        if self._token_ids:
            request |= TOKEN_ID_PARAMS
        return request


def sampling(config: OpenAIPolicyConfig) -> dict:
    """The sampling settings every request sends, as PolicyIdentity stores them (top_k not sent: unknown)."""
    top_k = -1 if config.top_k is None else max(config.top_k, 0)  # vLLM's -1 and llama.cpp's 0 both mean off
    return dict(temperature=float(config.temperature), top_p=float(config.top_p), top_k=top_k)


def _identity(config: OpenAIPolicyConfig) -> PolicyIdentity:
    if not config.identity_model_path:
        return PolicyIdentity(config.model, **sampling(config))
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(config.identity_model_path).chat_template
    return local_identity(config.model, config.identity_model_path, template, **sampling(config))


def _status(error: Exception) -> int | None:
    return error.status_code if isinstance(error, openai.APIStatusError) else None


def _retry_after(error: Exception) -> float | None:
    """Seconds the server asked us to wait, 0.0 without a hint, None when not retryable."""
    if isinstance(error, openai.APIStatusError):
        return header_seconds(error.response.headers) if is_retryable_status(error.status_code) else None
    if isinstance(error, openai.APIConnectionError):  # timeouts included
        return 0.0
    return None


def _turn(response, latency: float, identity: PolicyIdentity) -> tuple[AssistantTurn, str]:
    """The turn, and why it has no token ids ('' when it has them)."""
    choice = response.choices[0]
    message: dict = {"role": "assistant", "content": choice.message.content}
    tool_calls = [_tool_call(call, i) for i, call in enumerate(choice.message.tool_calls or [])]
    if tool_calls:
        message["tool_calls"] = tool_calls
    reasoning = _reasoning(choice.message)
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    usage = response.usage
    logprobs = _token_logprobs(choice)
    prompt_ids, token_ids, missing = _token_ids(response, choice, logprobs)
    turn = AssistantTurn(
        message=message,
        usage=Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else Usage(),
        logprobs=logprobs,
        latency=latency,
        finish_reason=choice.finish_reason or "",
        prompt_ids=prompt_ids,
        token_ids=token_ids,
        identity=identity,
    )
    return turn, missing


def _reasoning(message) -> str | None:
    """vLLM's reasoning parser output: `reasoning_content` (older) or `reasoning` (newer), an extra field."""
    for name in ("reasoning_content", "reasoning"):
        value = getattr(message, name, None)
        if isinstance(value, str):
            return value
    return None


def _token_ids(response, choice, logprobs) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, str]:
    """(prompt ids, sampled ids, why they are missing): both from vLLM's extra fields, the sampled ids
    else from 'token_id:<id>' log-prob tokens; none unless both are there and the ids align with `logprobs`."""
    prompt = getattr(response, "prompt_token_ids", None)
    sampled = getattr(choice, "token_ids", None)
    content = choice.logprobs.content if choice.logprobs else None
    if sampled is None and content and all(t.token.startswith(TOKEN_ID_PREFIX) for t in content):
        sampled = [int(t.token[len(TOKEN_ID_PREFIX):]) for t in content]
    if logprobs is None:
        return None, None, "the server returned no log-probs"
    if prompt is None or sampled is None:
        return None, None, "the server returned no prompt_token_ids/token_ids (vLLM >= 0.10.2 returns them)"
    if len(sampled) != len(logprobs):
        return None, None, f"{len(sampled)} token ids but {len(logprobs)} log-probs"
    return tuple(int(i) for i in prompt), tuple(int(i) for i in sampled), ""


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
