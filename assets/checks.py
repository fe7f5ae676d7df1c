"""Blocking asset checks where bad data must not flow on, evaluated inside the asset that makes the data.

- `tasks`: a sample of stored tasks re-validated in fresh sandboxes (the gold patch resolves, the empty
  patch does not); a sample of task sandboxes searched, as the agent's user and as root, for the code the
  bug replaced (it must be nowhere the agent could read it).
- each rollout batch: the stored file reads back at the current trajectory schema version; a sample of
  stored rewards is reproduced by re-grading their patches; no attempt whose last test run passed lost
  its patch; the infrastructure-error rate stays under `rollout.max_infra_error_rate`.
A failed check stops everything downstream of the asset for that run.
"""

import json
import random
from pathlib import Path

import dagster as dg

from pipeline.core.records import TRAJECTORY_SCHEMA, RejectedTask, Task, Trajectory
from pipeline.tasks.flakiness import (QuarantineConfig, TaskRecheck, quarantined, read_rechecks, reason,
                                       record_rechecks)
from pipeline.core.store import RecordContractError, read_records
from pipeline.rollouts.invariants import BatchInvariants
from pipeline.verifier.rules import GradeRules

ROLLOUT_CHECKS = {
    "trajectory_schema": "The stored batch reads back at the current trajectory schema version.",
    "rewards_reproduce": "A sample of stored rewards is reproduced by re-grading their patches in fresh sandboxes.",
    "no_lost_patches": "No attempt whose last test run passed was stored with an empty patch.",
    "infra_error_rate": "Infrastructure errors stay under rollout.max_infra_error_rate of the batch's attempts.",
}


def rollout_check_specs(asset: str) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec(name, asset=asset, blocking=True, description=text)
            for name, text in ROLLOUT_CHECKS.items()]


def rollout_checks(asset: str, path: Path, batch: str, trajectories: list[Trajectory], invariants: BatchInvariants,
                   max_infra_error_rate: float) -> list[dg.AssetCheckResult]:
    """The results of ROLLOUT_CHECKS for one stored batch."""
    try:
        read_records(path, TRAJECTORY_SCHEMA, produced_by=asset, batch=batch)
        version = TRAJECTORY_SCHEMA.metadata[b"schema_version"].decode()
        schema = dg.AssetCheckResult(check_name="trajectory_schema", passed=True, metadata={"schema_version": version})
    except (RecordContractError, OSError) as error:
        schema = dg.AssetCheckResult(check_name="trajectory_schema", passed=False, metadata={"error": str(error)})
    infra = sum(bool(t.infra_error) for t in trajectories)
    rate = infra / len(trajectories) if trajectories else 0.0
    regrade = invariants.regrade
    return [
        schema,
        dg.AssetCheckResult(check_name="rewards_reproduce", passed=not regrade.mismatches, metadata={
            "regraded": len(regrade.checked), "mismatches": len(regrade.mismatches),
            "mismatch_rows": str(invariants.metadata()["regrade_mismatch_rows"])}),
        dg.AssetCheckResult(check_name="no_lost_patches", passed=not invariants.lost_patch_ids, metadata={
            "lost_patches": len(invariants.lost_patch_ids), "rollout_ids": str(list(invariants.lost_patch_ids[:20]))}),
        dg.AssetCheckResult(check_name="infra_error_rate", passed=rate <= max_infra_error_rate, metadata={
            "infra_errors": infra, "attempts": len(trajectories), "rate": round(rate, 4),
            "threshold": max_infra_error_rate}),
    ]


TASK_CHECK = dg.AssetCheckSpec("tasks_validate", asset="tasks", blocking=True,
                               description="A sample of stored tasks re-validated in fresh sandboxes and recorded: "
                                           "the gold patch resolves each on every run, the empty patch does not; a "
                                           "task that fails is quarantined, and only a re-admitted one fails the check.")


def task_check(tasks: list[Task], sample: int, rechecks: Path, run_id: str, config: QuarantineConfig,
               rules: GradeRules, seed: int = 0) -> dg.AssetCheckResult:
    """Re-validate up to `sample` stored tasks (picked at random, seeded), `config.recheck_runs` gold grades
    each, record every verdict under `rechecks`; fails on a sandbox fault or a failing task left admitted."""
    from pipeline.tasks.validate import recheck_tasks

    picked = random.Random(seed).sample(tasks, min(sample, len(tasks)))
    results = recheck_tasks(picked, run_id, rules, config.recheck_runs)
    records = [r for r in results if isinstance(r, TaskRecheck)]
    record_rechecks(rechecks, run_id, "tasks_validate", records)
    held = quarantined(read_rechecks(rechecks), config.readmit)
    failed = [(r.item, r.reason[:200]) for r in results if isinstance(r, RejectedTask)]
    failed += [(r.instance_id, f"{reason(r)}: {r.evidence[:200]}") for r in records if reason(r)]
    admitted = [(task, why) for task, why in failed if task not in held]
    failures = [f"{task}: {why}" + ("" if task in held else " (admitted)") for task, why in failed]
    return dg.AssetCheckResult(check_name="tasks_validate", passed=not admitted, metadata={
        "checked": len(picked), "runs_each": config.recheck_runs, "failed": len(failed),
        "failed_admitted": len(admitted), "quarantined": len(held),
        "failures": "\n".join(failures) or "(none)"})


ANSWER_CHECK = dg.AssetCheckSpec("tasks_answer_hidden", asset="tasks", blocking=True,
                                 description="A sample of task sandboxes, started as an agent gets them, searched "
                                             "as the agent's user and as root (files, git objects, archives, "
                                             "bytecode) for the code the bug replaced: found nowhere.")


def answer_check(tasks: list[Task], sample: int, seed: int = 0) -> dg.AssetCheckResult:
    """Search up to `sample` task sandboxes (seeded pick) for the original code; fails naming task and path."""
    from pipeline.tasks.answer_search import search_tasks

    found, stats = search_tasks(tasks, sample, seed)
    return dg.AssetCheckResult(check_name="tasks_answer_hidden", passed=not found, metadata={
        "searched": len(stats), "found": len(found), "search": json.dumps(stats),
        "where": "\n".join(f"{f.task}: {f.path} ({f.how}, readable by {f.user})" for f in found) or "(nowhere)"})
