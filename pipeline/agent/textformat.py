"""The text tool-call format for policies without native tool calling (Hermes / Qwen style).

A reply ends with exactly one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
the result comes back in a user turn as `<tool_response>...</tool_response>`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"

INSTRUCTIONS = """\
# Tools

You may call one of these tools per reply. Their signatures, as JSON schemas, are inside <tools></tools>:
<tools>
{schemas}
</tools>

To call a tool, end your reply with exactly one JSON object holding the tool's name and arguments \
inside <tool_call></tool_call> tags, for example:
<tool_call>{{"name": "bash", "arguments": {{"command": "ls"}}}}</tool_call>
The result comes back inside <tool_response></tool_response> tags. \
Write exactly one tool call in every reply."""


@dataclass(frozen=True)
class TextToolCall:
    """A tool call read from reply text."""

    name: str
    arguments: dict = field(default_factory=dict)


class FormatError(ValueError):
    """The reply does not hold exactly one well-formed tool call; the message tells the model why."""


def describe_tools(tools: list[dict]) -> str:
    """The tools and the call format, for the system prompt."""
    schemas = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in tools)
    return INSTRUCTIONS.format(schemas=schemas)


def parse_tool_call(text: str, tool_names: Iterable[str]) -> TextToolCall:
    """The one tool call in `text`; FormatError when there is none, several, bad JSON or an unknown tool."""
    count = text.count(OPEN)
    if count == 0:
        raise FormatError(f"Format error: no tool call found. End your reply with exactly one "
                          f'{OPEN}{{"name": ..., "arguments": {{...}}}}{CLOSE}.')
    if count > 1:
        raise FormatError(f"Format error: {count} tool calls found; write exactly one per reply, "
                          "then wait for its result.")
    body = text.split(OPEN, 1)[1]
    if CLOSE not in body:
        raise FormatError(f"Format error: {OPEN} is not closed with {CLOSE}.")
    body = body.split(CLOSE, 1)[0]
    try:
        call = json.loads(body)
    except json.JSONDecodeError as error:
        raise FormatError(f"Format error: invalid JSON at line {error.lineno} column {error.colno} of the "
                          f"tool call: {error.msg}. Write one JSON object with double-quoted keys and "
                          "strings, newlines in strings escaped as \\n.") from None
    return _checked(call, set(tool_names))


def _checked(call: object, tool_names: set[str]) -> TextToolCall:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise FormatError('Format error: the tool call must be a JSON object with a "name" string and an '
                          '"arguments" object.')
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        raise FormatError(f'Format error: "arguments" must be a JSON object, got {type(arguments).__name__}.')
    if call["name"] not in tool_names:
        raise FormatError(f"Format error: unknown tool {call['name']!r}. "
                          f"Available tools: {', '.join(sorted(tool_names))}.")
    return TextToolCall(call["name"], arguments)


def tool_response(output: str) -> str:
    """A tool's output as the user turn that carries it back."""
    return f"<tool_response>\n{output}\n</tool_response>"
