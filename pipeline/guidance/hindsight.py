"""Hindsight guidance: a hint written from a failed group's own attempts, naming the mistake they share and
the direction to take, never the fix (hindsight hint distillation). The rule teacher derives it offline
from the attempts and the gold patch; an LLM teacher writes it from the attempts, abridged to fit."""

from __future__ import annotations

import json
import re
from importlib.resources import files
from string import Template

from pipeline.guidance.expert import patch_edits
from pipeline.guidance.teacher_guidance import (TeacherError, TeacherGuidance, abridged, changed_line, describe_change,
                                            enclosing_function)
from pipeline.core.records import Task, Trajectory

ATTEMPT_CHARS = 6000
"""Characters of each failed attempt the LLM teacher is shown (whole attempts: `ATTEMPT_CHARS * attempts`)."""


def edited_files(traj: Trajectory) -> list[str]:
    """The files an attempt's patch changes, in patch order."""
    return list(dict.fromkeys(re.findall(r"^diff --git a/(\S+)", traj.patch, re.M)))


def ran_test(traj: Trajectory, test: str) -> bool:
    """Whether any command of the attempt named the test (its id, or its name alone)."""
    name = test.split("::")[-1].split("[")[0]
    commands = " ".join(call["function"]["arguments"] for m in traj.messages for call in m.get("tool_calls") or [])
    return test in commands or name in commands


def rule_hindsight(task: Task, group: list[Trajectory], teacher: str = "rule") -> TeacherGuidance:
    """What the group's attempts got wrong, from their patches and commands against the gold patch: the file
    and function they should have edited, the failing test none of them ran, the wrong edit they kept."""
    path, start, old, new = patch_edits(task.patch)[0]
    func = enclosing_function(task, path)
    place = f"`{path}`" + (f" (`{func}`)" if func else "")
    test, n = task.FAIL_TO_PASS[0], len(group)
    edited = [edited_files(t) for t in group]
    notes = []
    if not any(edited):
        notes.append(f"None of the {n} attempts changed the repository: each stopped before making an edit.")
    elif not any(path in e for e in edited):
        others = sorted({f for e in edited for f in e})
        notes.append(f"The failure comes from {place}, which none of the {n} attempts changed: they all edited "
                     f"{', '.join(f'`{f}`' for f in others)} instead.")  # the right place named first
    else:
        kept = sum(path in e for e in edited)
        notes.append(f"{kept} of {n} attempts edited {place} and kept an edit there although `{test}` still failed "
                     "afterwards: that edit was not the fix; put the code back as it was before looking again.")
    if not any(ran_test(t, test) for t in group):
        notes.append(f"No attempt ran the failing test `{test}` on its own; run it first and read its assertion.")
    line = changed_line(start, old, new)
    notes.append(f"Direction: start from what `{test}` expects, read {place} around line {line}, where "
                 f"{describe_change(old, new)}.")
    return TeacherGuidance("hindsight", " ".join(notes), (path,), (func,) if func else (), teacher)


def hindsight_prompt(task: Task, group: list[Trajectory], show_gold: bool) -> str:
    template = Template(files("pipeline.guidance").joinpath("prompts/hindsight.txt").read_text())
    attempts = "\n\n".join(f"### Attempt {i + 1} (exit: {t.exit_status}; its patch touches: "
                           f"{', '.join(edited_files(t)) or 'nothing'})\n{abridged(t, ATTEMPT_CHARS)}\n"
                           f"Test output (tail):\n{t.test_log[-1500:]}" for i, t in enumerate(group))
    gold = f"\n## The reference fix (for you only: never quote it)\n{task.patch}" if show_gold else ""
    return template.substitute(problem_statement=task.problem_statement, failing_tests="\n".join(task.FAIL_TO_PASS),
                               attempts=attempts, gold=gold)


def parse_hindsight_answer(text: str, teacher: str, item: str) -> TeacherGuidance:
    """The hint from the teacher's JSON answer {"hindsight": ..., "files": [...], "functions": [...]}."""
    match = re.search(r"\{.*\}", text, re.S)
    try:
        data = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("hindsight"), str) or not data["hindsight"].strip():
        raise TeacherError(f"{item}: the teacher's hindsight answer is not a JSON object with a non-empty "
                           f"'hindsight'; got: {text[:300]!r}")
    return TeacherGuidance("hindsight", data["hindsight"], tuple(str(f) for f in data.get("files") or []),
                           tuple(str(f) for f in data.get("functions") or []), teacher)
