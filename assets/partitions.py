"""Batches as Dagster partitions, and the automation that adds them: the nightly schedule and the sensor
that notices a new task source, each starting a run of the `batch` job; and the declarative automation that
brings everything after a batch up to date.

The rollout stages (unguided rollouts, guidance, guided rollouts) are partitioned by batch: one failed
batch re-runs alone, and a nightly run adds a partition without touching the old ones. Everything
downstream (datasets, export, publication, training, evaluation) is unpartitioned, reads every batch on
disk, and carries `after_new_batch()`: the automation sensor requests it once its inputs have updated.
"""

import os
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg

BATCHES = dg.DynamicPartitionsDefinition(name="batches")
NIGHTLY_CRON = "0 2 * * *"  # 02:00 UTC; HANDHOLD_NIGHTLY_CRON overrides it
AUTOMATION_INTERVAL_S = 30  # between the automation sensor's evaluations; HANDHOLD_AUTOMATION_INTERVAL_S overrides it
INCOMING = "incoming"  # under data_dir: drop a SWE-bench-format row file here for the sensor
SOURCE_SUFFIXES = (".json", ".jsonl", ".parquet")


def batch_key(configured: str = "", now: datetime | None = None) -> str:
    """The batch a run writes: the configured name, or the UTC date."""
    return configured or (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d")


def ensure_batch(instance: dg.DagsterInstance, key: str) -> str:
    """Add `key` to the batch partitions (a no-op when it is there); return it."""
    if not instance.has_dynamic_partition(BATCHES.name, key):
        instance.add_dynamic_partitions(BATCHES.name, [key])
    return key


BATCH_STAGES = dg.AssetSelection.assets("guided_rollouts").upstream()  # what a batch run materializes


def batch_job():
    """The day's batch: new tasks and their environments, unguided rollouts, guidance, guided rollouts."""
    return dg.define_asset_job("batch", selection=BATCH_STAGES,
                               description="One batch: tasks, environments, unguided rollouts, guidance, guided "
                                           "rollouts. The automation sensor brings everything after it up to date.")


def after_new_batch() -> dg.AutomationCondition:
    """Dagster's eager condition (requested when a dependency updated, not while one is in progress), except
    that a missing dependency does not hold it back: a batch that failed and was never re-run would otherwise
    leave an unpartitioned asset reading every batch waiting on that partition forever."""
    return dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing()).with_label(
        "after_new_batch")


def automation_interval() -> int:
    """Seconds between the automation sensor's evaluations: HANDHOLD_AUTOMATION_INTERVAL_S, else
    AUTOMATION_INTERVAL_S."""
    value = os.environ.get("HANDHOLD_AUTOMATION_INTERVAL_S", str(AUTOMATION_INTERVAL_S)).strip()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"HANDHOLD_AUTOMATION_INTERVAL_S={value!r}: set a whole number of seconds, 1 or more "
                         f"(or unset it for {AUTOMATION_INTERVAL_S})")
    return int(value)


def automation_sensor() -> dg.AutomationConditionSensorDefinition:
    """Evaluates the assets' automation conditions every AUTOMATION_INTERVAL_S seconds at most; off until a user
    switches it on, like the other sensors."""
    return dg.AutomationConditionSensorDefinition(
        "automation", target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.STOPPED,
        minimum_interval_seconds=automation_interval(),
        description="Requests the datasets, export, publication, training and evaluation once a batch's rollouts "
                    "(or anything else they read) have updated.")


def nightly_schedule(job) -> dg.ScheduleDefinition:
    """At NIGHTLY_CRON (UTC), add that day's batch partition and run `job` (the batch stages) for it."""

    @dg.schedule(name="nightly", job=job, cron_schedule=os.environ.get("HANDHOLD_NIGHTLY_CRON", NIGHTLY_CRON),
                 execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.STOPPED,
                 description="A new batch every night: new tasks, rollouts, guidance; the automation sensor "
                             "then builds the datasets, release, training and evaluation from it.")
    def nightly(context: dg.ScheduleEvaluationContext):
        key = ensure_batch(context.instance, batch_key(now=context.scheduled_execution_time))
        return dg.RunRequest(run_key=key, partition_key=key)

    return nightly


def task_source_sensor(job, data_dir: str = "data") -> dg.SensorDefinition:
    """A row file dropped in `data_dir/incoming/` starts a batch of its own with that file as the dataset
    source; the cursor holds the files seen (name and modification time), so each is taken once."""

    @dg.sensor(name="new_task_source", job=job, minimum_interval_seconds=60,
               default_status=dg.DefaultSensorStatus.STOPPED,
               description=f"A SWE-bench-format row file ({', '.join(SOURCE_SUFFIXES)}) dropped in "
                           f"{data_dir}/{INCOMING}/ gets its own batch: its tasks validated, rolled out, guided.")
    def new_task_source(context: dg.SensorEvaluationContext):
        folder = Path(os.environ.get("HANDHOLD_DATA_DIR", data_dir)) / INCOMING
        seen = set(context.cursor.split("\n")) if context.cursor else set()
        files = sorted(p for p in folder.glob("*") if p.suffix in SOURCE_SUFFIXES) if folder.is_dir() else []
        stamps = {f"{p.name}@{p.stat().st_mtime_ns}": p for p in files}
        new = [stamp for stamp in stamps if stamp not in seen]
        if not new:
            return dg.SkipReason(f"no new row file in {folder}")
        requests, keys = [], []
        for stamp in new:
            path = stamps[stamp]
            key = f"{batch_key()}-{path.stem}"
            keys.append(key)
            requests.append(dg.RunRequest(run_key=stamp, partition_key=key, run_config={
                "resources": {"settings": {"config": {"sources": {"dataset": str(path.resolve())}}}}}))
        return dg.SensorResult(run_requests=requests, cursor="\n".join(sorted(seen | set(new))),
                               dynamic_partitions_requests=[BATCHES.build_add_request(keys)])

    return new_task_source
