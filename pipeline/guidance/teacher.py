"""Teachers write guidance for a failed group: Agent-RLVR's plan, environment feedback and
environment-interaction advice from one failed attempt (each alone, and the three combined in one guidance
from the same answer), and a hindsight hint from all of them (pipeline/guidance/hindsight.py). An LLM
teacher (Anthropic or OpenAI-compatible) or an offline rule-based one that derives every kind from the gold
patch, the failing tests and the attempts.
Guidance that copies the gold patch is flagged.
"""

from __future__ import annotations

import dataclasses
import json
import re
from importlib.resources import files
from string import Template
from typing import Protocol

from pipeline.agent.policy import Policy
from pipeline.agent.server_check import check_server
from pipeline.guidance.expert import patch_edits
from pipeline.guidance.hindsight import hindsight_prompt, parse_hindsight_answer, rule_hindsight
from pipeline.guidance.teacher_guidance import (TeacherError, TeacherGuidance, abridged, changed_line, combined_guidance,
                                            describe_change, enclosing_function, tool_messages)
from pipeline.core.records import Task, Trajectory
from pipeline.core.vocab import RLVR_PARTS

__all__ = ["LLMTeacher", "RuleTeacher", "Teacher", "TeacherError", "TeacherGuidance", "flag_leaks", "leaks_patch"]


class Teacher(Protocol):
    name: str

    def teach(self, task: Task, failed: Trajectory) -> list[TeacherGuidance]:
        """Agent-RLVR's kinds for a task, from one of its failed attempts: its three parts, then them combined."""
        ...

    def hindsight(self, task: Task, group: list[Trajectory]) -> TeacherGuidance:
        """The hindsight hint for a task, from its group's failed attempts."""
        ...


def leaks_patch(text: str, patch: str) -> bool:
    """True when guidance holds a line the gold patch adds (the fix) verbatim."""
    added = {line[1:].strip() for line in patch.splitlines()
             if line.startswith("+") and not line.startswith("+++") and len(line[1:].strip()) >= 6}
    return any(line in text for line in added)


def flag_leaks(items: list[TeacherGuidance], task: Task) -> list[TeacherGuidance]:
    return [dataclasses.replace(g, leaked=leaks_patch(g.text, task.patch)) for g in items]


# -- the offline, rule-based teacher ------------------------------------------------------------

class RuleTeacher:
    """Derives every kind of guidance from the gold patch, the failing tests, tool errors and the attempts."""

    name = "rule"

    def teach(self, task: Task, failed: Trajectory) -> list[TeacherGuidance]:
        path, start, old, new = patch_edits(task.patch)[0]
        line = changed_line(start, old, new)
        func = enclosing_function(task, path)
        where = f"`{path}`" + (f", in `{func}`" if func else "") + f", around line {line}"
        test = task.FAIL_TO_PASS[0]
        plan = (f"1. Where to look: {where}.\n2. What to change: {describe_change(old, new)}; "
                f"compare it with what the failing test expects.\n3. How to check: run "
                f"`python -m pytest -q {test}`, then the whole suite.")
        feedback = self._feedback(failed, path, func, test)
        interaction = self._interaction(failed, path, line, test)
        funcs = (func,) if func else ()
        parts = [TeacherGuidance("plan", plan, (path,), funcs, self.name),
                 TeacherGuidance("environment_feedback", feedback, (path,), funcs, self.name),
                 TeacherGuidance("environment_interaction", interaction, (path,), funcs, self.name)]
        return [*parts, combined_guidance(parts)]

    def hindsight(self, task: Task, group: list[Trajectory]) -> TeacherGuidance:
        return rule_hindsight(task, group, self.name)

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
        errors = [m.get("content") or "" for m in tool_messages(failed)
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


# -- LLM teachers ------------------------------------------------------------------------------

def teacher_prompt(task: Task, failed: Trajectory, show_gold: bool) -> str:
    template = Template(files("pipeline.guidance").joinpath("prompts/teacher.txt").read_text())
    gold = f"\n## The reference fix (for you only: never quote it)\n{task.patch}" if show_gold else ""
    return template.substitute(problem_statement=task.problem_statement, failing_tests="\n".join(task.FAIL_TO_PASS),
                               trajectory=abridged(failed), test_output=failed.test_log[-3000:], gold=gold)


class LLMTeacher:
    """A teacher behind any Policy client (AnthropicPolicy is the paper's choice; OpenAIPolicy for vLLM)."""

    def __init__(self, client: Policy, show_gold: bool = True):
        self.client, self.show_gold = client, show_gold
        self.name = f"llm:{client.name}"

    def check_server(self, role: str = "teacher") -> None:
        """Ask the client's server once before a step relies on it (pipeline/agent/server_check.py)."""
        check_server(self.client, role)

    def teach(self, task: Task, failed: Trajectory) -> list[TeacherGuidance]:
        return self._ask(teacher_prompt(task, failed, self.show_gold),
                         lambda text: parse_teacher_answer(text, self.name, task.instance_id))

    def hindsight(self, task: Task, group: list[Trajectory]) -> TeacherGuidance:
        (found,) = self._ask(hindsight_prompt(task, group, self.show_gold),
                             lambda text: [parse_hindsight_answer(text, self.name, task.instance_id)])
        return found

    def _ask(self, prompt: str, parse) -> list[TeacherGuidance]:
        """One call; what `parse` reads from its answer, each piece carrying the call's tokens (an error too)."""
        turn = self.client.act([{"role": "user", "content": prompt}], [], seed=0)
        used = {"tokens_in": turn.usage.prompt_tokens, "tokens_out": turn.usage.completion_tokens}
        try:
            return [dataclasses.replace(g, **used) for g in parse(turn.message.get("content") or "")]
        except TeacherError as exc:
            raise TeacherError(str(exc), **used) from None


def parse_teacher_answer(text: str, teacher: str, item: str) -> list[TeacherGuidance]:
    """The three parts from the teacher's JSON answer (a fenced block is fine), then them combined: one answer
    writes all four, so combined guidance costs no call of its own."""
    match = re.search(r"\{.*\}", text, re.S)
    try:
        data = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) and data[k].strip() for k in RLVR_PARTS):
        raise TeacherError(f"{item}: the teacher's answer is not a JSON object with non-empty "
                           f"{', '.join(RLVR_PARTS)}; got: {text[:300]!r}")
    found_files = tuple(str(f) for f in data.get("files") or [])
    found_funcs = tuple(str(f) for f in data.get("functions") or [])
    parts = [TeacherGuidance(k, data[k], found_files, found_funcs, teacher) for k in RLVR_PARTS]
    return [*parts, combined_guidance(parts)]
