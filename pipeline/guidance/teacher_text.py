"""What teachers write and read: the guidance record, the words that describe a change without making it,
where a patch's change lies, and a failed attempt abridged for a prompt."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pipeline.records import Task, Trajectory
from pipeline.vocab import TeacherKind


@dataclass(frozen=True)
class TeacherGuidance:
    """One piece of guidance for one task."""

    kind: TeacherKind
    text: str
    files: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    teacher: str = ""
    leaked: bool = False
    """The text contains a changed line of the gold patch verbatim."""
    tokens_in: int = 0
    """Prompt tokens of the teacher call that wrote it, as the server reported them (0: the rule teacher)."""
    tokens_out: int = 0
    """Tokens that call generated (one call writes Agent-RLVR's three kinds: each carries the call's count)."""

    def prompt_text(self) -> str:
        """What the guided attempt's task prompt gets."""
        return f"Guidance ({self.kind.replace('_', ' ')}):\n{self.text.strip()}"


class TeacherError(RuntimeError):
    """The teacher's answer could not be used (not JSON, missing kinds); the call's tokens were spent all the same."""

    def __init__(self, message: str, tokens_in: int = 0, tokens_out: int = 0):
        super().__init__(message)
        self.tokens_in, self.tokens_out = tokens_in, tokens_out


CHANGE_WORDS = [  # (test on removed+added text, description): what kind of change, never the change
    (lambda old, new: bool(set(re.findall(r"[<>=!]=?|\bnot\b|\bis\b|\bin\b", old))
                           ^ set(re.findall(r"[<>=!]=?|\bnot\b|\bis\b|\bin\b", new))),
     "a comparison or condition there is the wrong way round"),
    (lambda old, new: set(re.findall(r"\band\b|\bor\b", old)) != set(re.findall(r"\band\b|\bor\b", new)),
     "a boolean combination there joins its conditions the wrong way"),
    (lambda old, new: re.findall(r"\b\d+\b", old) != re.findall(r"\b\d+\b", new),
     "a numeric constant or bound there is off"),
    (lambda old, new: old.count("\n") < new.count("\n"), "something the code needs there is missing"),
]


def describe_change(old: str, new: str) -> str:
    for test, words in CHANGE_WORDS:
        if test(old, new):
            return words
    return "the logic there does not do what the tests expect"


def enclosing_function(task: Task, path: str) -> str:
    prov = json.loads(task.provenance or "{}")
    if prov.get("file") == path and prov.get("function"):
        return prov["function"].split(".")[-1]
    match = re.search(rf"\+\+\+ b/{re.escape(path)}\n@@[^@]*@@ .*?def (\w+)", task.patch)
    return match.group(1) if match else ""


def abridged(traj: Trajectory, limit: int = 6000) -> str:
    lines = []
    for m in traj.messages[len(traj.prompt):]:
        for call in m.get("tool_calls") or []:
            lines.append(f"> {call['function']['name']} {call['function']['arguments'][:300]}")
        if m["role"] == "tool":
            lines.append((m.get("content") or "")[:400])
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2:]


def tool_messages(traj: Trajectory) -> list[dict]:
    return [m for m in traj.messages[len(traj.prompt):] if m["role"] == "tool"]


def changed_line(start: int, old: str, new: str) -> int:
    """The first line a hunk starting at `start` changes (its context lines skipped)."""
    return start + next((i for i, (a, b) in enumerate(zip(old.split("\n"), new.split("\n"))) if a != b), 3)
