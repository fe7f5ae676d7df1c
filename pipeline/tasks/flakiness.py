"""Tasks that stay sound over time: every re-validation of a task recorded, and a task that stops behaving
quarantined.

A `TaskRecheck` is what one run saw of one task: the tasks_validate check's sample (the gold patch graded
`runs` times in one sandbox, the empty patch once), or a rollout batch whose grades of the task disagreed
(the same patch resolved in one attempt and not in another, a stored reward a fresh grade did not
reproduce). Records are kept per run under data/tasks/rechecks/, never rewritten. A task is quarantined
from the first record where its gold patch resolved on no run, its empty patch resolved it, or its grades
disagreed; from then on no batch attempts it and the datasets leave its rows out, until
`QuarantineConfig.readmit` names it.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import polars as pl

from pipeline.core.records import Trajectory
from pipeline.core.schema import fields_of, record_schema
from pipeline.core.config_tree import check_ranges
from pipeline.core.setting_ranges import Count
from pipeline.core.store import read_records, write_rows

REASONS = ("gold_stopped_resolving", "empty_patch_passes", "tests_disagree")
"""Why a task is quarantined, in the order a record is read for them."""


@dataclass(frozen=True)
class QuarantineConfig:
    """Re-validation of stored tasks over time, and the tasks set aside when they stop behaving."""

    recheck_runs: Count = 2
    """Gold-patch grades of each task the tasks_validate check re-validates (2 or more tells flaky tests)."""
    readmit: tuple[str, ...] = ()
    """Instance ids taken back out of quarantine (their records are kept; remove an id to quarantine it again)."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class TaskRecheck:
    """What one run saw of one task's grades."""

    instance_id: str
    run_id: str
    """The run that graded it: the Dagster run of a tasks_validate check, or the rollout batch."""
    source: str
    """'tasks_validate' (the gold and empty patches graded afresh) or 'rollouts' (a batch's own grades)."""
    runs: int
    """Grades compared: gold grades (tasks_validate), or attempts graded more than once or sharing a patch."""
    disagreements: int
    """Of `runs`, those whose verdict (resolved, and which FAIL_TO_PASS tests passed) is not the commonest."""
    gold_resolved: int
    """Gold grades that resolved the task; -1 where the gold patch was not graded (rollouts)."""
    empty_resolved: bool
    """The empty patch resolved the task (always False for rollouts)."""
    evidence: str
    """What disagreed or failed: FAIL_TO_PASS tests with their pass counts, failing tests, or rollout ids."""
    recorded_at: float  # seconds since the epoch


RECHECK_SCHEMA = record_schema(fields_of(TaskRecheck), "1", "TaskRecheck")


@dataclass(frozen=True)
class QuarantinedTask:
    """A task no batch attempts and no dataset row comes from, and the record that put it there."""

    instance_id: str
    run_id: str
    reason: str
    """One of REASONS."""
    evidence: str
    recorded_at: float  # seconds since the epoch


def verdict(report: str, resolved: bool) -> tuple[bool, tuple[str, ...]]:
    """A grade's verdict as compared across runs: resolved, and the FAIL_TO_PASS tests that passed."""
    status = json.loads(report or "{}")
    return resolved, tuple(sorted(status.get("FAIL_TO_PASS", {}).get("success", [])))


def disagreements(verdicts: list) -> int:
    """How many verdicts differ from the commonest one."""
    return len(verdicts) - Counter(verdicts).most_common(1)[0][1] if verdicts else 0


def validation_record(instance_id: str, run_id: str, golds: list[tuple[bool, str]], empty: tuple[bool, str],
                      now: float | None = None) -> TaskRecheck:
    """The record of one re-validation from its grades: (resolved, report JSON) of each gold run and of the
    empty patch."""
    verdicts = [verdict(report, resolved) for resolved, report in golds]
    passed = Counter(test for _, tests in verdicts for test in tests)
    tests = sorted({t for _, report in golds for part in json.loads(report or "{}").get("FAIL_TO_PASS", {}).values()
                    for t in part})
    wavering = [f"{t} passed {passed[t]}/{len(golds)}" for t in tests if 0 < passed[t] < len(golds)]
    failing = [t for t in tests if passed[t] == 0]
    evidence = "; ".join(wavering + ([f"never passed: {', '.join(failing)}"] if failing else [])
                         + (["the empty patch resolved it"] if empty[0] else []))
    return TaskRecheck(instance_id, run_id, "tasks_validate", len(golds), disagreements(verdicts),
                       sum(resolved for resolved, _ in golds), empty[0], evidence[:2000],
                       time.time() if now is None else now)


@dataclass(frozen=True)
class RewardMismatch:
    """A stored reward that a fresh grade of the stored patch did not reproduce."""

    rollout_id: str
    stored: float
    now: float
    reason: str
    """The fresh grade's reason."""


def rollout_records(trajectories: Iterable[Trajectory], mismatches: Iterable[RewardMismatch], run_id: str,
                    now: float | None = None) -> list[TaskRecheck]:
    """Records of the tasks a batch graded inconsistently: one patch resolved in one attempt and not in
    another, or a stored reward a fresh grade did not reproduce (`RegradeReport.mismatches`)."""
    graded = [t for t in trajectories if not t.infra_error and t.patch.strip()]
    by_patch: dict[tuple[str, str], list[Trajectory]] = {}
    for t in graded:
        by_patch.setdefault((t.instance_id, t.patch), []).append(t)
    task_of = {t.rollout_id: t.instance_id for t in graded}
    runs: Counter = Counter()
    split: Counter = Counter()
    evidence: dict[str, list[str]] = {}
    for (task, _), group in by_patch.items():
        if len(group) > 1:
            runs[task] += len(group)
            split[task] += disagreements([t.resolved for t in group])
            if len({t.resolved for t in group}) > 1:
                evidence.setdefault(task, []).append(
                    "same patch, resolved in " + ", ".join(t.rollout_id for t in group if t.resolved)
                    + "; not in " + ", ".join(t.rollout_id for t in group if not t.resolved))
    for row in mismatches:
        task = task_of.get(row.rollout_id)
        if task:
            runs[task] += 2
            split[task] += 1
            evidence.setdefault(task, []).append(f"{row.rollout_id}: stored reward {row.stored}, "
                                                 f"re-graded {row.now} ({row.reason})")
    stamp = time.time() if now is None else now
    return [TaskRecheck(task, run_id, "rollouts", runs[task], split[task], -1, False,
                        "; ".join(evidence[task])[:2000], stamp) for task in sorted(evidence)]


def reason(record: TaskRecheck) -> str:
    """Why the record quarantines its task ('' when it does not)."""
    if record.gold_resolved == 0 and record.runs > 0:
        return REASONS[0]
    if record.empty_resolved:
        return REASONS[1]
    return REASONS[2] if record.disagreements > 0 else ""


def quarantined(records: Iterable[TaskRecheck], readmit: Iterable[str] = ()) -> dict[str, QuarantinedTask]:
    """Each quarantined task by instance id, with the first record (by time) that put it there."""
    out, readmitted = {}, set(readmit)
    for record in sorted(records, key=lambda r: (r.recorded_at, r.run_id, r.source)):
        why = reason(record)
        if why and record.instance_id not in out and record.instance_id not in readmitted:
            out[record.instance_id] = QuarantinedTask(record.instance_id, record.run_id, why, record.evidence,
                                                      record.recorded_at)
    return out


def flakiness(records: Iterable[TaskRecheck]) -> pl.DataFrame:
    """Per task: `recheck_runs` and `recheck_disagreements` summed over its records, and their ratio."""
    frame = pl.DataFrame([{"instance_id": r.instance_id, "runs": r.runs, "disagreements": r.disagreements}
                          for r in records], schema={"instance_id": pl.String, "runs": pl.Int64,
                                                     "disagreements": pl.Int64})
    return (frame.group_by("instance_id").agg(recheck_runs=pl.col("runs").sum(),
                                              recheck_disagreements=pl.col("disagreements").sum())
            .with_columns(recheck_disagreement_rate=pl.when(pl.col("recheck_runs") > 0).then(
                pl.col("recheck_disagreements") / pl.col("recheck_runs")).otherwise(0.0))
            .sort("instance_id"))


def left_out(records: list[TaskRecheck], readmit: Iterable[str], max_disagreement_rate: float) -> dict[str, str]:
    """The tasks whose rows the datasets leave out, each with why: quarantined, or disagreeing more often than
    `max_disagreement_rate` of its graded runs (a re-admitted task too)."""
    out = {task: f"quarantined: {q.reason}" for task, q in quarantined(records, readmit).items()}
    for task, rate in flakiness(records).select("instance_id", "recheck_disagreement_rate").rows():
        if task not in out and rate > max_disagreement_rate:
            out[task] = f"disagreement rate {rate:.2f} > {max_disagreement_rate}"
    return out


def task_table(tasks: pl.DataFrame, records: list[TaskRecheck], readmit: Iterable[str] = ()) -> pl.DataFrame:
    """The tasks with their flakiness columns (0 where never re-validated) and `quarantine_reason` ('' if none)."""
    held = quarantined(records, readmit)
    reasons = pl.DataFrame({"instance_id": list(held), "quarantine_reason": [q.reason for q in held.values()]},
                           schema={"instance_id": pl.String, "quarantine_reason": pl.String})
    return (tasks.join(flakiness(records), on="instance_id", how="left").join(reasons, on="instance_id", how="left")
            .with_columns(pl.col("recheck_runs", "recheck_disagreements").fill_null(0),
                          pl.col("recheck_disagreement_rate").fill_null(0.0),
                          pl.col("quarantine_reason").fill_null("")))


def record_rechecks(folder: Path, run_id: str, source: str, records: list[TaskRecheck]) -> Path | None:
    """Store one run's records (one file per run and source; None when there are none)."""
    if not records:
        return None
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{run_id}-{source}")
    return write_rows(folder / f"{name}.parquet", [r.__dict__ for r in records], RECHECK_SCHEMA)


def read_rechecks(folder: Path) -> list[TaskRecheck]:
    """Every stored record, oldest first."""
    rows = [r for path in sorted(folder.glob("*.parquet"))
            for r in read_records(path, RECHECK_SCHEMA, produced_by="tasks")]
    return sorted((TaskRecheck(**r) for r in rows), key=lambda r: (r.recorded_at, r.run_id, r.source))


def quarantine_markdown(entries: Iterable[QuarantinedTask]) -> str:
    """The quarantine as a Markdown table (asset metadata and the dataset card)."""
    rows = sorted(entries, key=lambda q: q.instance_id)
    if not rows:
        return "(no task is quarantined)"
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")[:300]  # noqa: E731
    lines = ["| task | run | reason | evidence |", "|---|---|---|---|"]
    lines += [f"| {cell(q.instance_id)} | {cell(q.run_id)} | {q.reason} | {cell(q.evidence)} |" for q in rows]
    return "\n".join(lines)
