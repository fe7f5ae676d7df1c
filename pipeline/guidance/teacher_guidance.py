"""What teachers write and read: the guidance record (and Agent-RLVR's three parts combined into one), the words
that describe a change without making it, where a patch's change lies, and a failed attempt abridged for a prompt."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pipeline.core.records import Task, Trajectory
from pipeline.core.vocab import RLVR_PARTS, TeacherKind


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
    """Tokens that call generated (one call writes Agent-RLVR's three parts and so their combination: each carries
    the call's count)."""

    def prompt_text(self) -> str:
        """What the guided attempt's task prompt gets."""
        about = COMBINED_TITLE if self.kind == "combined" else self.kind.replace("_", " ")
        return f"Guidance ({about}):\n{self.text.strip()}"


class TeacherError(RuntimeError):
    """The teacher's answer could not be used (not JSON, missing kinds); the call's tokens were spent all the same."""

    def __init__(self, message: str, tokens_in: int = 0, tokens_out: int = 0):
        super().__init__(message)
        self.tokens_in, self.tokens_out = tokens_in, tokens_out


PART_TITLES = {"plan": "Plan", "environment_feedback": "Environment feedback",
               "environment_interaction": "Environment interaction"}
"""The heading each of Agent-RLVR's parts gets inside combined guidance."""
COMBINED_TITLE = "plan, environment feedback and environment interaction"
"""What a combined prompt's header says it holds (the policy never sees the word 'combined')."""


def combined_guidance(parts: list[TeacherGuidance]) -> TeacherGuidance:
    """Agent-RLVR's three parts of one teacher answer as one guidance, each under its heading; it carries that
    answer's call tokens like the parts do (no call of its own: pipeline/rollouts/costs.py shares the call among them)."""
    by_kind = {g.kind: g for g in parts}
    missing = [k for k in RLVR_PARTS if k not in by_kind]
    if missing:
        raise TeacherError(f"combined guidance needs all of {', '.join(RLVR_PARTS)}; missing {', '.join(missing)}")
    chosen = [by_kind[k] for k in RLVR_PARTS]
    text = "\n\n".join(f"{PART_TITLES[g.kind]}:\n{g.text.strip()}" for g in chosen)
    first = chosen[0]
    return TeacherGuidance("combined", text, _union(g.files for g in chosen), _union(g.functions for g in chosen),
                           first.teacher, tokens_in=first.tokens_in, tokens_out=first.tokens_out)


def _union(groups) -> tuple[str, ...]:
    """The names of every group, each once, in the order first named."""
    return tuple(dict.fromkeys(name for group in groups for name in group))


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
