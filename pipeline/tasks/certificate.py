"""A task's certificate: how stable its grade is, stored in its row, and what a release asks of it.

Validation (pipeline/tasks/validate.py) grades every task's gold patch and empty patch in `certify_runs` fresh
containers (`synth.certify_runs`): the first grades the whole task in file order; the second runs the tests in a
shuffled order (pipeline/tasks/test_order.py: modules and the tests of each shuffled, a test that passes only
after its neighbours ran fails there), the empty patch first; the others in file order, the gold patch first. A
synthesized task's containers after the first grade the test files its bug can reach (`synth.narrowed_task`: the
other tests never run its code). These are the validation's own grades, not extra ones: the gold patch's repeat
grades, once all in one container, are now one per container.

The row keeps, per task: the containers, how many of them the gold patch resolved and how many the empty patch
did not, each container's order and scope, and the grades' wall seconds. A task is certified when the gold patch
resolved it in every one of at least `certify_runs` containers and the empty patch in none; a release takes only
certified tasks (the datasets leave the others' rows out, the card says why).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping

import polars as pl
import pyarrow.parquet as pq

from pipeline.core.records import TASK_SCHEMA, Task
from pipeline.core.schema import schema_record, schema_version
from pipeline.core.store import read_records, read_rows
from pipeline.tasks.test_order import shuffle_seed, shuffled_command

UNCERTIFIED = "uncertified:"
"""How the reason a task's rows are left out for its certificate begins."""
CERTIFICATE_COLUMNS = ("instance_id", "certified", "certificate_problem")
"""The exported tasks table's columns a card reads (`with_certified` adds the last two)."""
FIELDS = ("certificate_containers", "certificate_gold_resolved", "certificate_empty_failed", "certificate_orders",
          "certificate_gold_seconds", "certificate_empty_seconds")
"""The task row's certificate columns (pipeline/core/records.py `Task`)."""


@dataclass(frozen=True)
class ContainerPlan:
    """What one fresh container grades, in order."""

    index: int
    order: str
    """'file' or 'shuffled-<seed>', then '/suite' (the task's whole test command) or '/files' (its bug's files)."""
    steps: tuple[tuple[str, Task], ...]
    """('gold' or 'empty', the task whose test command grades it)."""

    @property
    def in_file_order(self) -> bool:
        return self.order.startswith("file")


@dataclass(frozen=True)
class GradedContainer:
    """A container's grades (pipeline/verifier/grading.py `Grade`): the gold patch's, then the empty patch's."""

    plan: ContainerPlan
    head: str
    golds: tuple
    empty: object


def container_plans(task: Task, repeat: Task | None, runs: int, certify_runs: int) -> list[ContainerPlan]:
    """The containers of one validation: `certify_runs` (at least 1), `runs` gold grades in all (the first container
    grades those the others do not, of `repeat`), the second container in a shuffled order when the task's test
    command is a pytest run."""
    later, scope = (repeat, "files") if repeat is not None else (task, "suite")
    plans = [ContainerPlan(0, "file/suite", (("gold", task),) + (("gold", later),) * max(runs - certify_runs, 0)
                           + (("empty", task),))]
    for index in range(1, max(certify_runs, 1)):
        graded, order = later, "file"
        seed = shuffle_seed(task.instance_id)
        shuffled = shuffled_command(later.test_cmd, seed) if index == 1 else None
        if shuffled is not None:
            graded, order = dataclasses.replace(later, test_cmd=shuffled), f"shuffled-{seed}"
        steps = (("gold", graded), ("empty", graded))
        plans.append(ContainerPlan(index, f"{order}/{scope}", steps[::-1] if index % 2 else steps))
    return plans


def certificate_fields(graded: list[GradedContainer]) -> dict:
    """The task row's certificate columns from its containers' grades (each container's first gold grade)."""
    return {"certificate_containers": len(graded),
            "certificate_gold_resolved": sum(c.golds[0].resolved for c in graded),
            "certificate_empty_failed": sum(not c.empty.resolved for c in graded),
            "certificate_orders": tuple(c.plan.order for c in graded),
            "certificate_gold_seconds": round(sum(c.golds[0].duration for c in graded), 3),
            "certificate_empty_seconds": round(sum(c.empty.duration for c in graded), 3)}


def certificate_problem(row: Mapping, certify_runs: int) -> str:
    """Why a task row (or Task) is not certified under `certify_runs`; '' when it is."""
    get = row.get if isinstance(row, Mapping) else lambda name, default=None: getattr(row, name, default)
    n = get("certificate_containers", 0) or 0
    if n == 0:
        return "no certificate: validated before certificates (task schema 1); validate it again (rematerialize tasks)"
    if n < certify_runs:
        return f"graded in {n} containers, fewer than synth.certify_runs ({certify_runs}); validate it again"
    gold, empty = get("certificate_gold_resolved", 0), get("certificate_empty_failed", 0)
    orders = list(get("certificate_orders", ()) or ())
    if gold < n:
        shuffled = any(not o.startswith("file") for o in orders)
        return (f"the gold patch resolved it in {gold} of {n} containers"
                + (f" (test orders {', '.join(orders)})" if shuffled else ""))
    if empty < n:
        return f"the empty patch resolved it in {n - empty} of {n} containers"
    return ""


def uncertified(tasks: Iterable[Task], certify_runs: int) -> dict[str, str]:
    """The tasks a release leaves out for their certificate, each with why."""
    return {t.instance_id: f"{UNCERTIFIED} {why}" for t in tasks if (why := certificate_problem(t, certify_runs))}


def with_certified(frame: pl.DataFrame, certify_runs: int) -> pl.DataFrame:
    """The tasks table with `certified` and `certificate_problem` ('' when certified): what the card reads."""
    problems = [certificate_problem(row, certify_runs) for row in frame.iter_rows(named=True)]
    return frame.with_columns(certified=pl.Series([not p for p in problems], dtype=pl.Boolean),
                              certificate_problem=pl.Series(problems, dtype=pl.String))


def certificate_summary(frame: pl.DataFrame | None) -> dict:
    """Tasks, certified tasks, and the others counted by why (the problem without its task's numbers)."""
    if frame is None or "certified" not in frame.columns or not frame.height:
        return {}
    others = frame.filter(~pl.col("certified"))
    reasons = others.group_by(pl.col("certificate_problem").str.replace_all(r"\d+", "N").alias("why")).len()
    return {"tasks": frame.height, "certified": frame.height - others.height,
            "left_out": {why: n for why, n in sorted(reasons.rows())},
            "examples": others.select("instance_id", "certificate_problem").head(10).rows()}


def task_rows(path, produced_by: str = "") -> list[dict]:
    """The rows of a stored task file: of this task schema (its contract checked), or of schema 1, written before
    certificates, read as rows without one (`Task.from_row` leaves them uncertified: validated again, they get
    one). Any other contract is refused naming the asset to rematerialize (pipeline/core/store.py)."""
    found = pq.read_schema(path)
    if schema_record(found) == "Task" and schema_version(found) == "1":
        return read_rows(path)
    return read_records(path, TASK_SCHEMA, produced_by=produced_by)
