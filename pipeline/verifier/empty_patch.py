"""An empty patch is graded once per task in a process: its grade is that of the task as it is.

An attempt that leaves the tree as it was (an agent that gave up and undid its edits, a model that never made a
valid tool call) has the empty patch. Its grade is the task's own: the same tests fail the same way every time
(validation requires the empty patch to fail), so the first such grade of a task runs and every later one, in any
batch of the process, gets its verdict, report and log (its last KEPT_LOG characters) back with no time spent.
Attempts of one task that end at once wait for the one grade that runs. The key is the task, the grade rules
(sandbox limits, test timeout, enforcement) and the factory that makes the sandboxes (another factory is another environment); a
warm pool's expected sandbox for a grade that does not run is forgone (`SandboxPool.forgo`).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Callable

from pipeline.core.records import Task
from pipeline.verifier.rules import GradeRules

_GRADES: dict[tuple, tuple] = {}  # key -> (factory, the empty patch's grade), per process
KEPT_LOG = 100_000  # characters of a known grade's log kept (its tail; a stored trajectory keeps 20,000)
_LOCKS: dict[tuple, threading.Lock] = {}  # key -> held by the one grade of it that runs


def _factory(sandboxes):
    """What makes the sandboxes: a warm pool's own factory (`SandboxPool.factory`), else `sandboxes` itself."""
    return getattr(sandboxes, "factory", sandboxes)


def _key(task: Task, rules: GradeRules, sandboxes) -> tuple:
    return task, rules, id(_factory(sandboxes))


def known_grade(task: Task, patch: str, rules: GradeRules, sandboxes):
    """The grade of the empty patch already run for the task in this process, with no time spent; None when
    `patch` is not empty or none ran yet."""
    if patch.strip():
        return None
    made, known = _GRADES.get(_key(task, rules, sandboxes), (None, None))
    return replace(known, duration=0.0, test_seconds=0.0) if made is _factory(sandboxes) else None


def graded_once(task: Task, rules: GradeRules, sandboxes, run: Callable):
    """The empty patch's grade of `task`: `run()`'s the first time (kept unless an infra fault), known after."""
    key = _key(task, rules, sandboxes)
    with _LOCKS.setdefault(key, threading.Lock()):  # attempts of one task ending at once wait for one grade
        known = known_grade(task, "", rules, sandboxes)
        if known is None:
            verdict = run()
            if verdict.fault != "infra":
                _GRADES[key] = (_factory(sandboxes), replace(verdict, log=verdict.log[-KEPT_LOG:]))
            return verdict
    forgo = getattr(sandboxes, "forgo", None)
    if forgo is not None:
        forgo(task, rules.sandbox)
    return known
