"""Teachers write Agent-RLVR guidance for a failed attempt: a plan, environment feedback, and
environment-interaction advice. An LLM teacher (Anthropic or OpenAI-compatible) or an
offline rule-based one that derives the same three kinds from the gold patch, the failing
tests and the trajectory's tool errors. Guidance that copies the gold patch is flagged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib.resources import files
from string import Template
from typing import Protocol

from pipeline.agent.policy import Policy
from pipeline.guidance.expert import patch_edits
from pipeline.records import Task, Trajectory
from pipeline.vocab import TEACHER_KINDS, TeacherKind

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

    def prompt_text(self) -> str:
        """What the guided attempt's task prompt gets."""
        return f"Guidance ({self.kind.replace('_', ' ')}):\n{self.text.strip()}"


class Teacher(Protocol):
    name: str

    def teach(self, task: Task, failed: Trajectory) -> list[TeacherGuidance]:
        """Guidance of every kind for a task, from one of its failed attempts."""
        ...


class TeacherError(RuntimeError):
    """The teacher's answer could not be used (not JSON, missing kinds)."""


def leaks_patch(text: str, patch: str) -> bool:
    """True when guidance holds a line the gold patch adds (the fix) verbatim."""
    added = {line[1:].strip() for line in patch.splitlines()
             if line.startswith("+") and not line.startswith("+++") and len(line[1:].strip()) >= 6}
    return any(line in text for line in added)


def flag_leaks(items: list[TeacherGuidance], task: Task) -> list[TeacherGuidance]:
    return [TeacherGuidance(g.kind, g.text, g.files, g.functions, g.teacher, leaks_patch(g.text, task.patch))
            for g in items]


# -- the offline, rule-based teacher ------------------------------------------------------------

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


class RuleTeacher:
    """Derives the three kinds of guidance from the gold patch, the failing tests and tool errors."""

    name = "rule"

    def teach(self, task: Task, failed: Trajectory) -> list[TeacherGuidance]:
        path, start, old, new = patch_edits(task.patch)[0]
        line = start + next((i for i, (a, b) in enumerate(zip(old.split("\n"), new.split("\n"))) if a != b), 3)
        func = enclosing_function(task, path)
        where = f"`{path}`" + (f", in `{func}`" if func else "") + f", around line {line}"
        test = task.FAIL_TO_PASS[0]
        plan = (f"1. Where to look: {where}.\n2. What to change: {describe_change(old, new)}; "
                f"compare it with what the failing test expects.\n3. How to check: run "
                f"`python -m pytest -q {test}`, then the whole suite.")
        feedback = self._feedback(failed, path, func, test)
        interaction = self._interaction(failed, path, line, test)
        funcs = (func,) if func else ()
        return [TeacherGuidance("plan", plan, (path,), funcs, self.name),
                TeacherGuidance("environment_feedback", feedback, (path,), funcs, self.name),
                TeacherGuidance("environment_interaction", interaction, (path,), funcs, self.name)]

    def _feedback(self, failed: Trajectory, path: str, func: str, test: str) -> str:
        touched = set(re.findall(r"^diff --git a/(\S+)", failed.patch, re.M))
        seen = " ".join(m.get("content") or "" for m in failed.messages if m["role"] == "tool")
        notes = []
        if touched and path not in touched:
            notes.append(f"You changed {', '.join(sorted(touched))}, but the failure does not come from there.")
        if not touched:
            notes.append("Your attempt left the repository unchanged.")
        if path not in seen:
            notes.append(f"You never looked at `{path}`, where the failing behaviour comes from.")
        notes.append(f"`{test}` exercises `{func or path}` in `{path}`: the wrong result is produced there, "
                     "not in the test.")
        return " ".join(notes)

    def _interaction(self, failed: Trajectory, path: str, line: int, test: str) -> str:
        errors = [m.get("content") or "" for m in _tool_messages(failed)
                  if (m.get("content") or "").startswith("Error")]
        advice = []
        if any("did not appear" in e or "occurs" in e or "matches" in e for e in errors):
            advice.append("Your str_replace calls failed: copy `old_str` exactly from a `view`, whitespace "
                          "included, with enough lines to be unique.")
        if failed.format_errors:
            advice.append("Some of your replies had no valid tool call: call exactly one tool per turn.")
        advice.append(f"Open the code with `edit` `view` on `{path}` and `view_range` [{max(1, line - 5)}, "
                      f"{line + 5}] (line {line}) rather than printing whole files.")
        advice.append(f"Run only the failing test with `python -m pytest -q {test}` to iterate quickly.")
        return " ".join(advice)


def _tool_messages(traj: Trajectory) -> list[dict]:
    return [m for m in traj.messages[len(traj.prompt):] if m["role"] == "tool"]


# -- LLM teachers ------------------------------------------------------------------------------

def teacher_prompt(task: Task, failed: Trajectory, show_gold: bool) -> str:
    template = Template(files("pipeline.guidance").joinpath("prompts/teacher.txt").read_text())
    gold = f"\n## The reference fix (for you only: never quote it)\n{task.patch}" if show_gold else ""
    return template.substitute(problem_statement=task.problem_statement, failing_tests="\n".join(task.FAIL_TO_PASS),
                               trajectory=abridged(failed), test_output=failed.test_log[-3000:], gold=gold)


def abridged(traj: Trajectory, limit: int = 6000) -> str:
    lines = []
    for m in traj.messages[len(traj.prompt):]:
        for call in m.get("tool_calls") or []:
            lines.append(f"> {call['function']['name']} {call['function']['arguments'][:300]}")
        if m["role"] == "tool":
            lines.append((m.get("content") or "")[:400])
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2:]


class LLMTeacher:
    """A teacher behind any Policy client (AnthropicPolicy is the paper's choice; OpenAIPolicy for vLLM)."""

    def __init__(self, client: Policy, show_gold: bool = True):
        self.client, self.show_gold = client, show_gold
        self.name = f"llm:{client.name}"

    def teach(self, task: Task, failed: Trajectory) -> list[TeacherGuidance]:
        prompt = teacher_prompt(task, failed, self.show_gold)
        turn = self.client.act([{"role": "user", "content": prompt}], [], seed=0)
        return parse_teacher_answer(turn.message.get("content") or "", self.name, task.instance_id)


def parse_teacher_answer(text: str, teacher: str, item: str) -> list[TeacherGuidance]:
    """The three kinds from the teacher's JSON answer (a fenced block is fine)."""
    match = re.search(r"\{.*\}", text, re.S)
    try:
        data = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) and data[k].strip() for k in TEACHER_KINDS):
        raise TeacherError(f"{item}: the teacher's answer is not a JSON object with non-empty "
                           f"{', '.join(TEACHER_KINDS)}; got: {text[:300]!r}")
    found_files = tuple(str(f) for f in data.get("files") or [])
    found_funcs = tuple(str(f) for f in data.get("functions") or [])
    return [TeacherGuidance(k, data[k], found_files, found_funcs, teacher) for k in TEACHER_KINDS]
