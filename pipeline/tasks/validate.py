"""Every task is checked before use: its gold patch resolves it and the empty patch does not."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import docker.errors

from pipeline.grading import Grade, grade_in
from pipeline.records import RejectedTask, Task
from pipeline.tasks.environment import SandboxFactory, task_sandbox
from sandbox.base import SandboxError


FLAKY = "flaky:"
"""How the reason of a task set aside for resolving on some runs and not others begins."""


def check_task(task: Task, test_timeout: float = 300, sandboxes: SandboxFactory = task_sandbox,
               runs: int = 1) -> Task | RejectedTask:
    """The task with its base_commit filled in, or the reason it is set aside: the gold patch must resolve
    it on every one of `runs` grades, the empty patch must not.

    All grades run in one sandbox, reset to the base commit in between (a reset is
    exact and about 30 ms; a fresh container is about 700 ms).
    """
    try:
        with sandboxes(task, None) as sandbox:
            head = sandbox.base_commit or ""
            golds = []
            for _ in range(max(runs, 1)):
                golds.append(grade_in(sandbox, task, task.patch, test_timeout))
                sandbox.reset()
            empty = grade_in(sandbox, task, "", test_timeout)
    except (SandboxError, docker.errors.DockerException, OSError) as exc:
        return RejectedTask(task.instance_id, "validate", f"sandbox failed: {exc}")
    resolved = sum(g.resolved for g in golds)
    gold = next((g for g in golds if not g.resolved), golds[0])
    if 0 < resolved < len(golds):
        return RejectedTask(task.instance_id, "validate", f"{FLAKY} the gold patch resolves it on {resolved} of "
                            f"{len(golds)} runs: {_failures(gold)}")
    if not gold.resolved:
        return RejectedTask(task.instance_id, "validate", f"gold patch does not resolve it ({gold.reason}): "
                            f"{_failures(gold)}")
    if empty.resolved:
        return RejectedTask(task.instance_id, "validate", "the empty patch resolves it: FAIL_TO_PASS tests "
                            "pass without any change")
    return dataclasses.replace(task, base_commit=head)


def _failures(g: Grade) -> str:
    return g.report[:600] if g.report != "{}" else g.log[-600:]


def check_tasks(tasks: list[Task], workers: int = 2, sandboxes: SandboxFactory = task_sandbox, runs: int = 1
                ) -> tuple[list[Task], list[RejectedTask]]:
    """Check tasks in parallel (`runs` gold grades each); keep order."""
    with ThreadPoolExecutor(max(workers, 1)) as pool:
        results = list(pool.map(lambda t: check_task(t, sandboxes=sandboxes, runs=runs), tasks))
    return ([r for r in results if isinstance(r, Task)], [r for r in results if isinstance(r, RejectedTask)])
