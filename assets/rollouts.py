"""Assets that run the policy: unguided rollouts (N attempts per task, graded by the tests)."""

from itertools import zip_longest
from typing import Mapping

import dagster as dg
import polars as pl

from assets.checks import rollout_check_specs, rollout_checks
from assets.partitions import BATCHES
from assets.resources import Credentials, HandholdSettings, make_policy, retried_on_infra
from pipeline.agent.server_check import check_server
from pipeline.rollouts.invariants import batch_invariants
from pipeline.core.records import Task
from pipeline.rollouts.batch import plan_jobs, run_batch
from pipeline.rollouts.round_report import lineage, lineage_markdown, needed_guidance_before, round_outcome
from pipeline.rollouts.rounds import RoundRecord, finish_round, start_round
from pipeline.tasks.flakiness import (QuarantinedTask, quarantine_markdown, quarantined, read_rechecks,
                                       record_rechecks, rollout_records)


def attempted_elsewhere(settings: HandholdSettings, policy: str, batch: str) -> set[str]:
    """Tasks `policy` already attempted unguided in another batch."""
    files = [f for f in settings.layout().trajectory_files("unguided") if f.parent.name != batch]
    if not files:
        return set()
    seen = pl.concat([pl.read_parquet(f, columns=["instance_id", "policy"]) for f in files])
    return set(seen.filter(pl.col("policy") == policy)["instance_id"].to_list())


def quarantine(settings: HandholdSettings) -> dict[str, QuarantinedTask]:
    """The tasks no batch attempts now (pipeline/tasks/flakiness.py), by instance id."""
    return quarantined(read_rechecks(settings.layout().rechecks()), settings.resolved().quarantine.readmit)


def attemptable(settings: HandholdSettings, held: Mapping[str, QuarantinedTask] | None = None) -> dict[str, Task]:
    """The stored tasks a batch may attempt (or rescue), by instance id: those not quarantined (`held`)."""
    held = quarantine(settings) if held is None else held
    return {t.instance_id: t for t in settings.layout().read_tasks() if t.instance_id not in held}


def rollout_tasks(settings: HandholdSettings, policy: str, batch: str, revisit: set[str] = frozenset()) -> list[Task]:
    """The batch's tasks: those not quarantined, those `policy` has not attempted in another batch first (a
    nightly batch takes new tasks), of those the `revisit` ones first (a round after the first: the tasks that
    needed guidance earlier, whose share it solves is the loop's measure), repositories interleaved, cut to
    `rollout_tasks`."""
    done = attempted_elsewhere(settings, policy, batch)
    by_repo: dict[str, list[Task]] = {}
    for task in attemptable(settings).values():
        by_repo.setdefault(task.repo, []).append(task)
    tasks = [t for group in zip_longest(*by_repo.values()) for t in group if t is not None]
    tasks.sort(key=lambda t: (t.instance_id in done, t.instance_id not in revisit))  # stable: interleaving kept
    limit = settings.resolved().rollout_tasks
    return tasks[:limit] if limit else tasks


def round_metadata(record: RoundRecord, settings: HandholdSettings) -> dict:
    """The batch's round as metadata: policy, the run and data that made it, what it solved without guidance, and
    every round so far."""
    made, outcome = record.trained_by, record.outcome
    return {"round": record.round, "policy_revision": record.revision or "(none on disk)",
            "trained_by": f"{made.stage} in batch {made.batch} (round {made.round})" if made.stage else "(settings)",
            "trained_on_dataset": f"{made.dataset_release or 'local export'} {made.dataset_sha256}" if made.stage
            else "(none)", "needed_guidance_before": len(outcome.needed_guidance),
            "solved_without_guidance": len(outcome.solved),
            "solved_without_guidance_share": dg.MetadataValue.float(outcome.share) if outcome.needed_guidance
            else dg.MetadataValue.null(),
            "lineage": dg.MetadataValue.md(lineage_markdown(lineage(settings.layout())))}


@dg.asset(group_name="rollouts", kinds={"parquet", "docker"}, deps=["tasks"], pool="sandboxes",
          partitions_def=BATCHES, check_specs=rollout_check_specs("unguided_rollouts"))
@retried_on_infra
def unguided_rollouts(context: dg.AssetExecutionContext, settings: HandholdSettings,
                      credentials: Credentials) -> dg.MaterializeResult:
    """N unguided attempts per task by the batch's policy (its round: pipeline/rollouts/rounds.py), each graded by the task's
    tests; what it solves of the tasks that needed guidance in an earlier round."""
    config, batch, layout = settings.resolved(), settings.batch_name(context), settings.layout()
    policy = make_policy(settings, credentials, batch)
    check_server(policy, "policy")  # a server that does not answer stops the step here, before anything is written
    record, _ = start_round(layout, config.policy, batch, credentials.key("policy"))
    skipped = quarantine(settings)  # as the plan saw it: this batch's own records quarantine from the next one
    revisit = needed_guidance_before(layout, batch, config.guidance.delta) if record.round else set()
    tasks = rollout_tasks(settings, policy.name, batch, revisit)
    jobs = plan_jobs(tasks, policy, config.rollout, batch)
    out = layout.trajectories("unguided", batch)
    summary = run_batch(jobs, policy, config.rollout, out, batch, progress=context.log.info)
    record = finish_round(layout, record, round_outcome(layout, batch, summary.trajectories, config.guidance.delta))
    metrics = summary.metrics()
    invariants = batch_invariants(summary.trajectories, {t.instance_id: t for t in tasks}, config.rollout.grade_rules())
    records = rollout_records(summary.trajectories, invariants.regrade.mismatches, batch)
    record_rechecks(settings.layout().rechecks(), batch, "rollouts", records)
    return dg.MaterializeResult(metadata={
        "path": str(out / "trajectories.parquet"), "policy": policy.name, "tasks": len(tasks),
        "quarantined_skipped": len(skipped), "quarantine": dg.MetadataValue.md(quarantine_markdown(skipped.values())),
        "graded_inconsistently": [r.instance_id for r in records],
        "attempts_per_task": config.rollout.attempts, **metrics, **invariants.metadata(), **round_metadata(record, settings),
    }, check_results=rollout_checks("unguided_rollouts", out / "trajectories.parquet", batch, summary.trajectories,
                                    invariants, config.rollout.max_infra_error_rate))
