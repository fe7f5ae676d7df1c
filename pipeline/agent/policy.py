"""The Policy protocol (the model side of the agent), its turn record and the shared retry loop."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@dataclass(frozen=True)
class Usage:
    """Token counts of one model call, as the server reported them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class PolicyIdentity:
    """Which weights and chat template sampled a turn, and at which sampling settings: what training compares
    with its starting model, and what says whether the turn's log-probs are those of what was sampled."""

    model: str
    """The model's name as loaded or served."""
    revision: str = ""
    """A Hub commit, or 'sha256:<hex>' of the weight files; '' when unknown."""
    chat_template_hash: str = ""
    """sha256 of the chat template text that rendered the prompt; '' when unknown."""
    temperature: float = -1.0
    """Sampling temperature the turns were drawn at; 0.0: greedy (or a deterministic program); -1.0: unknown."""
    top_p: float = -1.0
    """Nucleus (top-p) mass kept; 1.0: off; -1.0: unknown (not sent, so the server's default applied)."""
    top_k: int = -1
    """Most likely tokens kept; 0: off (transformers' convention; vLLM's -1 'off' is stored as 0); -1: unknown."""


@dataclass(frozen=True)
class AssistantTurn:
    """One model reply, in OpenAI chat format, with what it cost and, when the policy knows them, its tokens."""

    message: dict
    """{"role": "assistant", "content": str | None, "tool_calls": [...] (absent when none),
    "reasoning_content": str (only when the model returned reasoning)}; each tool call is
    {"id", "type": "function", "function": {"name", "arguments": <JSON string>}}."""
    usage: Usage
    logprobs: tuple[float, ...] | None = None
    """Log-probability of each generated token under the raw model, when the server gives them."""
    latency: float = 0.0  # seconds, including retries
    finish_reason: str = ""
    """OpenAI's vocabulary: 'stop', 'tool_calls', 'length', or what the server said."""
    prompt_ids: tuple[int, ...] | None = None
    """The token ids the model was given (the rendered chat and generation prompt); None when unknown."""
    token_ids: tuple[int, ...] | None = None
    """The token ids it sampled, end-of-turn included when sampled; aligned one to one with `logprobs`."""
    identity: PolicyIdentity | None = None
    """The weights and template that produced the turn; None when the policy cannot say."""

    def __post_init__(self) -> None:
        if self.token_ids is not None and self.logprobs is not None and len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"AssistantTurn: {len(self.token_ids)} token ids but {len(self.logprobs)} log-probs; "
                             "they must be aligned one to one")


@runtime_checkable
class Policy(Protocol):
    """A model that answers a chat with a message (text and/or tool calls)."""

    name: str
    """'openai:<model>', 'anthropic:<model>', 'hf:<path>', 'heuristic', ..."""
    native_tools: bool
    """True: takes tool schemas and returns tool_calls; False: the agent uses a text tool format."""

    def settings(self) -> dict:
        """Sampling settings and endpoint, for storing with trajectories; never an API key."""
        ...

    def act(self, messages: list[dict], tools: list[dict], *, seed: int | None = None) -> AssistantTurn:
        """Answer `messages` (OpenAI chat format) given OpenAI function-tool schemas."""
        ...


class PolicyError(RuntimeError):
    """The model server failed after retries (infrastructure, not the model's fault), or refused the request
    with an HTTP `status` no retry changes. A policy raises it for every provider error it knows, so the agent
    loop never sees a provider SDK's own exceptions."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status

    @property
    def request_rejected(self) -> bool:
        """The request itself was at fault (a context too long, a malformed message), not the server."""
        return self.status in REQUEST_REJECTED


RETRYABLE_STATUS = frozenset({408, 409, 429})
REQUEST_REJECTED = frozenset({400, 413, 422})


def is_retryable_status(status: int) -> bool:
    """429, timeouts, conflicts and every 5xx (Anthropic's 529 'overloaded' included)."""
    return status in RETRYABLE_STATUS or status >= 500


def call_with_retries(
    call: Callable[[], T],
    *,
    retry_after: Callable[[Exception], float | None],
    status_of: Callable[[Exception], int | None],
    max_retries: int,
    initial_delay: float,
    max_delay: float,
    what: str,
) -> T:
    """Run `call`; on an error `retry_after` accepts, wait with exponential backoff and retry.

    `retry_after(error)` returns None for an error no retry helps, else the server's Retry-After
    hint in seconds (0.0 when none). After `max_retries` retries the last error is raised as
    PolicyError; so is at once an error no retry helps that `status_of` gives an HTTP status (the
    server refused); any other error propagates as is.
    """
    for attempt in range(max_retries + 1):
        try:
            return call()
        except Exception as error:
            hint = retry_after(error)
            if hint is None:
                status = status_of(error)
                if status is not None:
                    raise PolicyError(f"{what} refused the request ({status}): {error}", status) from error
                raise
            if attempt == max_retries:
                raise PolicyError(f"{what} failed after {attempt + 1} attempts: {error}") from error
            backoff = initial_delay * 2**attempt * (0.5 + random.random() / 2)  # jitter spreads herds
            time.sleep(min(max_delay, max(backoff, hint)))
    raise AssertionError("unreachable")


def header_seconds(headers: object) -> float:
    """Seconds from a Retry-After (or retry-after-ms) header; 0.0 when absent or unreadable."""
    get = getattr(headers, "get", None)
    if get is None:
        return 0.0
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = get(name)
        if value:
            try:
                return float(value) * scale
            except ValueError:
                return 0.0
    return 0.0
