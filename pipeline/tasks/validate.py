"""Every task is checked before use: its gold patch resolves it and the empty patch does not, in fresh
containers whose grades make its certificate (pipeline/tasks/certificate.py)."""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor

import docker.errors

from pipeline.core.records import RejectedTask, Task
from pipeline.tasks.certificate import ContainerPlan, GradedContainer, certificate_fields, container_plans
from pipeline.tasks.flakiness import TaskRecheck, validation_record
from pipeline.tasks.stage_clock import StageClock
from pipeline.verifier.environment import SandboxFactory, task_sandbox
from pipeline.verifier.grading import Grade, grade_in
from pipeline.verifier.rules import GradeRules
from sandbox.base import Sandbox, SandboxError


FLAKY = "flaky:"
"""How the reason of a task set aside for resolving on some runs and not others begins."""
FLAKY_BUG = "flaky with the bug:"
"""How the reason begins when the empty patch's grade fails other tests than FAIL_TO_PASS (`exact`)."""


def check_task(task: Task, rules: GradeRules, sandboxes: SandboxFactory = task_sandbox,
               runs: int = 1, clock: StageClock | None = None, exact: bool = False,
               repeat: Task | None = None, certify_runs: int = 1) -> Task | RejectedTask:
    """The task with its base_commit and certificate filled in, or the reason it is set aside.

    `certify_runs` fresh containers each grade the gold patch and the empty patch (pipeline/tasks/certificate.py):
    the first the whole task in file order, the second in a shuffled order, the rest in file order; `repeat` (a
    synthesized task cut to the test files its bug can reach, `synth.narrowed_task`; None: the whole task) is
    what the containers after the first grade. The gold patch is graded `runs` times in all (the first container
    grades those the others do not). Set aside: a gold patch that does not resolve on every grade in file order,
    an empty patch that resolves in file order; `exact`: an empty patch's grade in file order must fail every
    FAIL_TO_PASS test and pass every PASS_TO_PASS one (a synthesized bug's last run with the bug). A grade in the
    shuffled order decides only the certificate. `clock` is told where the time went.
    """
    clock = clock or StageClock()
    try:
        graded = [_container(task, plan, rules, sandboxes, clock) for plan in container_plans(
            task, repeat, runs, certify_runs)]
    except (SandboxError, docker.errors.DockerException, OSError) as exc:
        return RejectedTask(task.instance_id, "validate", f"sandbox failed: {exc}")
    golds = [g for c in graded if c.plan.in_file_order for g in c.golds]
    empties = [c.empty for c in graded if c.plan.in_file_order]
    resolved = sum(g.resolved for g in golds)
    gold = next((g for g in golds if not g.resolved), golds[0])
    if 0 < resolved < len(golds):
        return RejectedTask(task.instance_id, "validate", f"{FLAKY} the gold patch resolves it on {resolved} of "
                            f"{len(golds)} runs: {_failures(gold)}")
    if not gold.resolved:
        return RejectedTask(task.instance_id, "validate", f"gold patch does not resolve it ({gold.reason}): "
                            f"{_failures(gold)}")
    if any(e.resolved for e in empties):
        return RejectedTask(task.instance_id, "validate", "the empty patch resolves it: FAIL_TO_PASS tests "
                            "pass without any change")
    inexact = next((e for e in empties if not _fails_exactly_fail_to_pass(e)), None) if exact else None
    if inexact is not None:
        return RejectedTask(task.instance_id, "validate", f"{FLAKY_BUG} the empty patch's grade does not fail "
                            f"exactly the FAIL_TO_PASS tests: {_failures(inexact)}")
    return dataclasses.replace(task, base_commit=graded[0].head, **certificate_fields(graded))


def _container(task: Task, plan: ContainerPlan, rules: GradeRules, sandboxes: SandboxFactory,
               clock: StageClock) -> GradedContainer:
    """The grades of one fresh container: the gold patch's and the empty patch's, in the plan's order (each
    grade after the first puts the tree back first: exact, and tens of milliseconds)."""
    start = time.monotonic()
    with sandboxes(task, rules.sandbox) as sandbox:
        clock.add("verify_setup" if plan.index == 0 else "certify_setup", time.monotonic() - start)
        head, golds, empty = sandbox.base_commit or "", [], None
        for step, (what, graded) in enumerate(plan.steps):
            with clock.stage("empty_grade" if what == "empty" else "gold_grades"):
                verdict = grade_in(sandbox, graded, task.patch if what == "gold" else "", rules,
                                   fresh=step == 0)
            if what == "empty":
                empty = verdict
            else:
                golds.append(verdict)
        start = time.monotonic()
    clock.add("sandbox_close", time.monotonic() - start)
    return GradedContainer(plan, head, tuple(golds), empty)


def _grades(sandbox: Sandbox, task: Task, rules: GradeRules, runs: int, clock: StageClock,
            repeat: Task | None = None) -> tuple[list[Grade], Grade]:
    """`runs` grades of the gold patch (of `repeat` after the first, when given), then the empty patch's (each
    grade puts the tree back first)."""
    golds = []
    for i in range(max(runs, 1)):
        with clock.stage("gold_grades"):
            golds.append(grade_in(sandbox, task if i == 0 or repeat is None else repeat, task.patch, rules,
                                  fresh=i == 0))
    with clock.stage("empty_grade"):
        return golds, grade_in(sandbox, task, "", rules)


def _fails_exactly_fail_to_pass(g: Grade) -> bool:
    """Every FAIL_TO_PASS test failed and every PASS_TO_PASS one passed, as the grade's report says."""
    status = json.loads(g.report)
    if not status:
        return False
    return not status.get("FAIL_TO_PASS", {}).get("success") and not status.get("PASS_TO_PASS", {}).get("failure")


def _failures(g: Grade) -> str:
    return g.report[:600] if g.report != "{}" else g.log[-600:]


def check_tasks(tasks: list[Task], rules: GradeRules, workers: int = 2, sandboxes: SandboxFactory = task_sandbox, runs: int = 1,
                clock: StageClock | None = None, exact: bool = False, repeats: dict[str, Task] | None = None,
                certify_runs: int = 1) -> tuple[list[Task], list[RejectedTask]]:
    """Check tasks in parallel (`runs` gold grades each, `certify_runs` containers; `exact`, `repeats` by
    instance id: see check_task); keep order."""
    clock, repeats = clock or StageClock(), repeats or {}
    with clock.parallel(workers), ThreadPoolExecutor(max(workers, 1)) as pool:
        results = list(pool.map(lambda t: check_task(t, rules, sandboxes=sandboxes, runs=runs, clock=clock, exact=exact,
                                                     repeat=repeats.get(t.instance_id), certify_runs=certify_runs),
                                tasks))
    return ([r for r in results if isinstance(r, Task)], [r for r in results if isinstance(r, RejectedTask)])


def recheck_task(task: Task, run_id: str, rules: GradeRules, runs: int = 2,
                 sandboxes: SandboxFactory = task_sandbox) -> TaskRecheck | RejectedTask:
    """Re-validate a stored task as validation did (`runs` gold grades and the empty patch's, one sandbox) and
    record what each grade said; a sandbox that fails gives the reason instead (no verdict, no record)."""
    try:
        with sandboxes(task, rules.sandbox) as sandbox:
            golds, empty = _grades(sandbox, task, rules, runs, StageClock())
    except (SandboxError, docker.errors.DockerException, OSError) as exc:
        return RejectedTask(task.instance_id, "recheck", f"sandbox failed: {exc}")
    infra = [g for g in [*golds, empty] if g.fault == "infra"]
    if infra:
        return RejectedTask(task.instance_id, "recheck", f"grading failed: {infra[0].reason}")
    return validation_record(task.instance_id, run_id, [(g.resolved, g.report) for g in golds],
                             (empty.resolved, empty.report))


def recheck_tasks(tasks: list[Task], run_id: str, rules: GradeRules, runs: int = 2, workers: int = 2,
                  sandboxes: SandboxFactory = task_sandbox) -> list[TaskRecheck | RejectedTask]:
    """`recheck_task` of each task in parallel, in order."""
    with ThreadPoolExecutor(max(workers, 1)) as pool:
        return list(pool.map(lambda t: recheck_task(t, run_id, rules, runs, sandboxes=sandboxes), tasks))
