"""Which assistant turn of a trajectory last changed the repository: a cut before it keeps no success.

A resolved trajectory earns its label with the edits it made. Cut for length before its last edit, the kept
part never made the fix, so it must not be a chosen, SFT or positive-advantage example (the stages drop it and
count it). An edit is an `edit` tool call that writes (create, str_replace, insert) or a `bash` command that
can write a file (a redirection, sed -i, tee, patch, git apply, python -c, ...): a turn that might have changed the tree
counts as one, so a cut is never judged to keep a fix it may have lost.
"""

from __future__ import annotations

import json
import re

WRITING_EDITS = ("create", "str_replace", "insert")
WRITING_SHELL = re.compile(r"(?<![0-9&|<>])>>?(?![&=])|\bsed\b[^|;&]*\s-[a-zA-Z]*i|\bperl\s+-[a-zA-Z]*i|\btee\b|\bpatch\b"
                           r"|\bgit\s+(apply|am|checkout|restore|stash|reset|cherry-pick|merge)\b"
                           r"|\b(mv|cp|rm|truncate|dd)\b|\bpython3?\s+(-c\b|-\s*<<|<<)")


def _arguments(call: dict) -> dict:
    arguments = call.get("function", {}).get("arguments")
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def writes(call: dict) -> bool:
    """Whether an OpenAI tool call may change the repository."""
    name, arguments = call.get("function", {}).get("name"), _arguments(call)
    if name == "edit":
        return arguments.get("command") in WRITING_EDITS
    if name == "bash":
        return bool(WRITING_SHELL.search(str(arguments.get("command", ""))))
    return False


def last_edit_turn(completion: list[dict]) -> int:
    """How many assistant turns a cut must keep to include the last that may have changed the tree (0: none did)."""
    last, turn = 0, 0
    for message in completion:
        if message.get("role") != "assistant":
            continue
        turn += 1
        if any(writes(call) for call in message.get("tool_calls") or []):
            last = turn
    return last


def keeps_last_edit(completion: list[dict], kept_turns: int) -> bool:
    """Whether keeping the first `kept_turns` assistant turns of `completion` keeps its last edit."""
    return kept_turns >= last_edit_turn(completion)
