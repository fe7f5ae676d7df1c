"""The handhold code location: `dagster dev -m assets.definitions`."""

from __future__ import annotations

import dagster as dg

from assets.environments import environment_images, sandbox_base_image, task_sources, tasks
from assets.guidance import guidance, guided_rollouts
from assets.resources import HandholdSettings
from assets.rollouts import unguided_rollouts

all_assets = [sandbox_base_image, task_sources, environment_images, tasks, unguided_rollouts, guidance,
              guided_rollouts]

main_job = dg.define_asset_job("main", selection=dg.AssetSelection.all(),
                               description="The whole graph: environments to trained policy.")

nightly = dg.ScheduleDefinition(name="nightly", job=main_job, cron_schedule="0 2 * * *",
                                default_status=dg.DefaultScheduleStatus.STOPPED)

defs = dg.Definitions(
    assets=all_assets,
    jobs=[main_job],
    schedules=[nightly],
    resources={"settings": HandholdSettings()},
)
