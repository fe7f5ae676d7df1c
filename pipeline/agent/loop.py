"""The agent loop: ask the policy, run the one tool it calls, show it the result, until submit or a limit."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Literal

from pipeline.agent.policy import AssistantTurn, Policy, PolicyError, PolicyIdentity
from pipeline.agent.prompts import system_prompt, task_prompt
from pipeline.agent.textformat import FormatError, describe_tools, parse_tool_call, tool_response
from pipeline.agent.tools import TOOLS, check_arguments, execute
from pipeline.core.records import Step, Task
from pipeline.core.config_tree import check_ranges
from pipeline.core.setting_ranges import Count, Seconds
from sandbox.base import Sandbox, SandboxError

ExitStatus = Literal["submitted", "max_steps", "max_tokens", "max_wall_time", "format_errors",
                     "policy_error", "context_error", "sandbox_error", "repo_broken"]
NO_TOOL_CALL = "Format error: your reply has no tool call. Call exactly one tool per turn; call submit when done."


@dataclass(frozen=True)
class AgentConfig:
    """Limits and prompt options of one attempt."""

    max_steps: Count = 50
    """Most model calls in one attempt."""
    max_total_tokens: Count = 2_000_000
    """Most prompt + completion tokens, summed over all model calls of the attempt."""
    max_wall_time: Seconds = 1800.0
    """Seconds one attempt may take, model calls and commands included."""
    max_format_errors: Count = 3
    """Consecutive malformed or unknown tool calls that end the attempt."""
    command_timeout: Seconds = 120.0
    """Seconds one bash command may run before it is killed."""
    show_tests: bool = False
    """List the FAIL_TO_PASS tests in the task prompt."""
    tool_format: Literal["auto", "native", "text"] = "auto"
    """'native': tool schemas through the API; 'text': <tool_call> text; 'auto': native when the policy can."""

    def __post_init__(self) -> None:
        if self.tool_format not in ("auto", "native", "text"):
            raise ValueError(f"AgentConfig.tool_format: {self.tool_format!r} is not 'auto', 'native' or 'text'")
        check_ranges(self)


@dataclass(frozen=True)
class Attempt:
    """One attempt at a task: the conversation, what it cost, the patch and why it ended."""

    messages: tuple[dict, ...]
    """The whole conversation, prompt included, in OpenAI format (tool-call arguments as JSON strings)."""
    prompt: tuple[dict, ...]
    """System and first user message the policy saw, guidance included."""
    unguided_prompt: tuple[dict, ...]
    """The same prompt without guidance."""
    tools: tuple[dict, ...]
    """Tool schemas passed to the policy (empty with the text format, where the prompt describes them)."""
    steps: tuple[Step, ...]
    logprobs: tuple[tuple[float, ...] | None, ...] | None
    """Per assistant turn, the token log-probs (None for a turn without); None when no turn had any."""
    prompt_token_ids: tuple[tuple[int, ...] | None, ...] | None
    """Per assistant turn, the token ids the policy was given; None when no turn had any."""
    token_ids: tuple[tuple[int, ...] | None, ...] | None
    """Per assistant turn, the ids it sampled (aligned with `logprobs`); None when no turn had any."""
    identity: PolicyIdentity | None
    """The weights and template of the turns (the first turn that names one); None when none did."""
    patch: str
    exit_status: ExitStatus
    format_errors: int
    """Malformed or unknown tool calls in total."""
    total_tokens: int
    wall_time: float  # seconds
    error: str = ""
    """The policy, API or sandbox error that ended the attempt; '' otherwise."""


def uses_text_format(config: AgentConfig, native_tools: bool) -> bool:
    """Whether the attempt uses the <tool_call> text format rather than native tool calls."""
    if config.tool_format == "native" and not native_tools:
        raise ValueError("AgentConfig.tool_format='native' but the policy has no native tool calling; "
                         "use 'auto' or 'text'")
    return config.tool_format == "text" or not native_tools


def unguided_prompt(task: Task, config: AgentConfig, *, native_tools: bool = True) -> list[dict]:
    """System and user messages without guidance; `native_tools` (the policy's) settles tool_format='auto'."""
    return _prompt(task, config, uses_text_format(config, native_tools), "")


def _prompt(task: Task, config: AgentConfig, text_format: bool, guidance: str) -> list[dict]:
    return [{"role": "system", "content": system_prompt(describe_tools(TOOLS) if text_format else "")},
            {"role": "user", "content": task_prompt(task, show_tests=config.show_tests, guidance=guidance)}]


@dataclass
class _Run:
    """The mutable state of one attempt."""

    messages: list[dict]
    start: float = field(default_factory=time.monotonic)
    steps: list[Step] = field(default_factory=list)
    logprobs: list[tuple[float, ...] | None] = field(default_factory=list)
    prompt_token_ids: list[tuple[int, ...] | None] = field(default_factory=list)
    token_ids: list[tuple[int, ...] | None] = field(default_factory=list)
    identity: PolicyIdentity | None = None
    format_errors: int = 0
    consecutive_errors: int = 0
    total_tokens: int = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def run_attempt(task: Task, policy: Policy, sandbox: Sandbox, config: AgentConfig, *,
                guidance_text: str = "", seed: int | None = None) -> Attempt:
    """Run the agent on `task` in `sandbox` until it submits or a limit ends it; never raises for model output."""
    text_format = uses_text_format(config, policy.native_tools)
    prompt = _prompt(task, config, text_format, guidance_text)
    run = _Run(messages=list(prompt))
    tools = [] if text_format else TOOLS
    status, error = _loop(run, policy, sandbox, config, tools, text_format, seed)
    try:
        patch = sandbox.diff()
    except SandboxError as exc:
        if status != "sandbox_error" and _answers(sandbox):  # the sandbox is fine: the attempt broke the repo
            patch, status, error = "", "repo_broken", f"the repository cannot be diffed any more: {exc}"
        else:
            patch, status, error = "", "sandbox_error", error or f"diff failed: {exc}"
    return Attempt(
        messages=tuple(run.messages),
        prompt=tuple(prompt),
        unguided_prompt=tuple(_prompt(task, config, text_format, "")),
        tools=tuple(tools),
        steps=tuple(run.steps),
        logprobs=_per_turn(run.logprobs),
        prompt_token_ids=_per_turn(run.prompt_token_ids),
        token_ids=_per_turn(run.token_ids),
        identity=run.identity,
        patch=patch,
        exit_status=status,
        format_errors=run.format_errors,
        total_tokens=run.total_tokens,
        wall_time=run.elapsed(),
        error=error,
    )


def _loop(run: _Run, policy: Policy, sandbox: Sandbox, config: AgentConfig, tools: list[dict],
          text_format: bool, seed: int | None) -> tuple[ExitStatus, str]:
    while True:
        limit = _limit_reached(run, config)
        if limit:
            return limit, ""
        try:
            turn = policy.act(run.messages, tools, seed=step_seed(seed, len(run.steps)))
        except PolicyError as exc:
            return ("context_error" if exc.request_rejected else "policy_error"), str(exc)
        message = _with_string_arguments(turn.message)
        run.messages.append(message)
        _keep_tokens(run, turn)
        run.total_tokens += turn.usage.prompt_tokens + turn.usage.completion_tokens
        name, arguments, problem = _parse(message, text_format)
        if problem:
            run.messages += _observation(message, problem, text_format, tool_output=False)
            _record(run, turn, name, 0.0, error=True)
            run.format_errors += 1
            run.consecutive_errors += 1
            if run.consecutive_errors >= config.max_format_errors:
                return "format_errors", ""
            continue
        run.consecutive_errors = 0
        timeout = max(1.0, min(config.command_timeout, config.max_wall_time - run.elapsed()))
        started = time.monotonic()
        try:
            result = execute(sandbox, name, arguments, timeout=timeout)
        except SandboxError as exc:
            _record(run, turn, name, time.monotonic() - started, error=True)
            return "sandbox_error", str(exc)
        run.messages += _observation(message, result.output, text_format, tool_output=True)
        _record(run, turn, name, time.monotonic() - started, error=result.error)
        if result.submitted:
            return "submitted", ""


def _keep_tokens(run: _Run, turn: AssistantTurn) -> None:
    """Record the turn's log-probs, prompt and sampled ids, one entry per assistant turn."""
    run.logprobs.append(turn.logprobs)
    run.prompt_token_ids.append(turn.prompt_ids)
    run.token_ids.append(turn.token_ids)
    if run.identity is None:
        run.identity = turn.identity


def _per_turn(values: list) -> tuple | None:
    """Per-turn values as a tuple; None when no turn had one."""
    return tuple(values) if any(v is not None for v in values) else None


def _answers(sandbox: Sandbox) -> bool:
    """True when the sandbox's shell still runs commands normally."""
    try:
        result = sandbox.run("true", timeout=30)
    except SandboxError:
        return False
    return result.exit_code == 0 and not result.shell_restarted


def step_seed(seed: int | None, step: int) -> int | None:
    """The seed of one model call: derived per step, as one seed for all would replay the same noise."""
    return None if seed is None else (seed * 1_000_003 + step) % 2**31  # distinct for steps < 1_000_003


def _limit_reached(run: _Run, config: AgentConfig) -> ExitStatus | None:
    if run.elapsed() >= config.max_wall_time:
        return "max_wall_time"
    if run.total_tokens >= config.max_total_tokens:
        return "max_tokens"
    if len(run.steps) >= config.max_steps:
        return "max_steps"
    return None


def _record(run: _Run, turn: AssistantTurn, tool: str, tool_time: float, *, error: bool) -> None:
    run.steps.append(Step(turn.latency, tool_time, turn.usage.prompt_tokens, turn.usage.completion_tokens,
                          tool, error))


def _parse(message: dict, text_format: bool) -> tuple[str, dict, str]:
    """(tool name, arguments, problem): problem is '' when the call can run."""
    calls = message.get("tool_calls") or []
    if not calls and text_format:
        try:
            call = parse_tool_call(message.get("content") or "", (t["function"]["name"] for t in TOOLS))
        except FormatError as exc:
            return "", {}, str(exc)
        name, arguments = call.name, call.arguments
    elif len(calls) == 1:
        name, arguments, problem = _native_call(calls[0])
        if problem:
            return name, {}, problem
    elif not calls:
        return "", {}, NO_TOOL_CALL
    else:
        return "", {}, (f"Format error: {len(calls)} tool calls in one reply; none was run. "
                         "Call exactly one tool per turn.")
    return name, arguments, check_arguments(name, arguments) or ""


def _native_call(call: dict) -> tuple[str, dict, str]:
    name, raw = call["function"]["name"], call["function"]["arguments"]
    try:
        arguments = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        return name, {}, (f"Format error: the arguments of {name} are not valid JSON (line {exc.lineno} "
                          f"column {exc.colno}: {exc.msg}).")
    return name, arguments, ""


def _observation(message: dict, output: str, text_format: bool, *, tool_output: bool) -> list[dict]:
    """The messages answering `message`: one tool message per tool call, else one user message."""
    calls = message.get("tool_calls") or []
    if calls:
        return [{"role": "tool", "tool_call_id": call["id"], "content": output} for call in calls]
    return [{"role": "user", "content": tool_response(output) if text_format and tool_output else output}]


def _with_string_arguments(message: dict) -> dict:
    """The assistant message with every tool call's arguments as a JSON string."""
    calls = message.get("tool_calls")
    return {**message, "tool_calls": [_string_arguments(c) for c in calls]} if calls else message


def _string_arguments(call: dict) -> dict:
    arguments = call["function"].get("arguments")
    if isinstance(arguments, str):
        return call
    return {**call, "function": {**call["function"], "arguments": json.dumps(arguments or {})}}
