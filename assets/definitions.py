"""The handhold code location: `dagster dev -m assets.definitions` (local) or `-m assets.prod` (prod)."""

from __future__ import annotations

import dagster as dg

from assets.datasets import dataset_checks
from assets.failures import run_failure_report
from assets.graph import all_assets, resources
from assets.partitions import automation_sensor, batch_job, nightly_schedule, task_source_sensor
from assets.scaling import rollouts_celery


def definitions(deployment: str = "local") -> dg.Definitions:
    main_job = dg.define_asset_job("main", selection=dg.AssetSelection.all(),
                                   description="The whole graph: environments to trained policy.")
    batch = batch_job()
    return dg.Definitions(assets=all_assets, asset_checks=dataset_checks, jobs=[main_job, batch, rollouts_celery],
                          schedules=[nightly_schedule(batch)],
                          sensors=[task_source_sensor(batch), run_failure_report, automation_sensor()],
                          resources=resources(deployment))


defs = definitions("local")
