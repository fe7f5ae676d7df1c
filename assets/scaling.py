"""Scaling out: the rollout stages of a batch as steps on Celery workers (dagster-celery).

`rollouts_celery` is the partitioned rollout job (unguided rollouts, guidance, guided rollouts of one
batch) with Dagster's Celery executor: each step is a Celery task on the broker, and whichever worker
has a free slot runs it. Runs of several batches at once spread over the workers. docs/scaling.md says
how to start the broker and the workers, and how sandboxes, the policy and training scale with them.

A worker reconstructs the job from its origin: from the code location (`-m assets.definitions`) when
the run was launched from the UI or the daemon, or from `rollouts_celery_job` below when a script runs
`dg.execute_job(dg.reconstructable(rollouts_celery_job), ...)`. Either way the worker imports this
project, so it runs in a checkout with the same code and virtual environment.
"""

from __future__ import annotations

import dagster as dg
from dagster_celery import celery_executor

from assets.graph import all_assets, resources
from assets.guidance import guidance, guided_rollouts
from assets.rollouts import unguided_rollouts

JOB = "rollouts_celery"
DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
ROLLOUT_ASSETS = (unguided_rollouts, guidance, guided_rollouts)


def celery_config(broker: str = DEFAULT_BROKER, backend: str = "") -> dict:
    """The executor's config, which the workers must share (`dagster-celery worker start -y` reads it
    under `execution.config`). Each worker runs one step at a time and fetches a task only when it is
    free: a step already runs `rollout.workers` sandboxes, and a task held by a busy worker would wait
    while another worker idles."""
    return {"broker": broker, "backend": backend or broker,
            "config_source": {"worker_concurrency": 1, "worker_disable_prefetch": True}}


def worker_yaml(broker: str = DEFAULT_BROKER, backend: str = "") -> dict:
    """The file a worker is started with: `dagster-celery worker start -A dagster_celery.app -y FILE`."""
    return {"execution": {"config": celery_config(broker, backend)}}


def _celery_config_of(config: dict) -> dict:
    return celery_config(config["broker"], config["backend"])


handhold_celery = celery_executor.configured(
    _celery_config_of, name="celery",
    config_schema={"broker": dg.Field(dg.StringSource, default_value=DEFAULT_BROKER,
                                      description="The Celery broker the workers listen to."),
                   "backend": dg.Field(dg.StringSource, default_value="",
                                       description="Where step results go; empty: the broker.")},
    description="Dagster's Celery executor, each worker one step at a time (see `celery_config`).")

rollouts_celery = dg.define_asset_job(
    JOB, selection=dg.AssetSelection.assets(*ROLLOUT_ASSETS), executor_def=handhold_celery,
    description="One batch's rollouts, guidance and guided rollouts, each step on a Celery worker "
                "(broker and backend: the run config's `execution.config`; see docs/scaling.md).")


def rollouts_celery_job() -> dg.JobDefinition:
    """The job bound to the local deployment's assets and resources, for `dg.reconstructable`."""
    return dg.Definitions(assets=all_assets, jobs=[rollouts_celery],
                          resources=resources("local")).resolve_job_def(JOB)
