"""Assets that run the policy: unguided rollouts (N attempts per task, graded by the tests)."""

from itertools import zip_longest

import dagster as dg

from assets.checks import rollout_check_specs, rollout_checks
from assets.partitions import BATCHES
from assets.resources import Credentials, HandholdSettings, make_policy, retried_on_infra
from pipeline.records import TASK_SCHEMA, Task
from pipeline.invariants import batch_invariants
from pipeline.rollouts import plan_jobs, run_batch
from pipeline.store import read_records


def load_tasks(settings: HandholdSettings) -> list[Task]:
    """The validated tasks, repositories interleaved, cut to the configured slice."""
    by_repo: dict[str, list[Task]] = {}
    for row in read_records(settings.path("tasks", "tasks.parquet"), TASK_SCHEMA, produced_by="tasks"):
        task = Task.from_row(row)
        by_repo.setdefault(task.repo, []).append(task)
    tasks = [t for group in zip_longest(*by_repo.values()) for t in group if t is not None]
    limit = settings.resolved().rollout_tasks
    return tasks[:limit] if limit else tasks


@dg.asset(group_name="rollouts", kinds={"parquet", "docker"}, deps=["tasks"], pool="sandboxes",
          partitions_def=BATCHES, check_specs=rollout_check_specs("unguided_rollouts"))
@retried_on_infra
def unguided_rollouts(context: dg.AssetExecutionContext, settings: HandholdSettings,
                      credentials: Credentials) -> dg.MaterializeResult:
    """N unguided attempts per task by the configured policy, each graded by the task's tests."""
    tasks, policy, config = load_tasks(settings), make_policy(settings, credentials), settings.resolved().rollout
    batch = settings.batch_name(context)
    jobs = plan_jobs(tasks, policy, config, batch)
    out = settings.path("trajectories", "unguided", batch)
    summary = run_batch(jobs, policy, config, out, batch, progress=context.log.info)
    metrics = summary.metrics()
    invariants = batch_invariants(summary.trajectories, {t.instance_id: t for t in tasks})
    return dg.MaterializeResult(metadata={
        "path": str(out / "trajectories.parquet"), "policy": policy.name, "tasks": len(tasks),
        "attempts_per_task": config.attempts, **metrics, **invariants,
    }, check_results=rollout_checks("unguided_rollouts", out / "trajectories.parquet", batch, summary.trajectories,
                                    invariants, config.max_infra_error_rate))
