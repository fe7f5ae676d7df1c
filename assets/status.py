"""`handhold status`: what DAGSTER_HOME records, each asset's latest materialization and numbers, its checks, the
rounds' lineage and the latest run."""

from __future__ import annotations

import argparse
from datetime import datetime

from assets.instance import POOL, ensure_dagster_home, instance_with_pool_limit, release_dead_runs


def headline(metadata: dict, most: int = 6) -> str:
    """A materialization's numbers, `name=value`, the first `most` of them."""
    values = [(name, getattr(value, "value", value)) for name, value in metadata.items()]
    numbers = [f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}" for name, value in values
               if isinstance(value, (int, float)) and not isinstance(value, bool)]
    return " ".join(numbers[:most])


def run_status(args: argparse.Namespace) -> int:
    """What DAGSTER_HOME records: each asset's latest materialization and numbers, checks, the rounds' lineage, the
    latest run."""
    import dagster as dg

    from assets.definitions import defs

    home = ensure_dagster_home()
    instance = instance_with_pool_limit()
    release_dead_runs(instance)
    graph = defs.resolve_asset_graph()
    keys = graph.toposorted_asset_keys
    width = max(len(k.to_user_string()) for k in keys)
    print(f"{home}")
    for key in keys:
        entry = instance.get_latest_materialization_event(key)
        mat = entry.asset_materialization if entry else None
        when = f"{_when(entry.timestamp)}{f' [{mat.partition}]' if mat.partition else ''}" if mat else "never"
        print(f"  {key.to_user_string():<{width}}  {when:<19}  {headline(mat.metadata) if mat else ''}".rstrip())
    checks = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(graph.asset_check_keys))
    for check_key, record in sorted(checks.items(), key=lambda kv: kv[0].to_user_string()):
        evaluation = record.event.asset_check_evaluation if record.event else None
        state = "not evaluated" if evaluation is None else "passed" if evaluation.passed else "FAILED"
        print(f"  check {check_key.to_user_string()}  {state}  {_when(record.create_timestamp)}")
    latest = instance.get_latest_materialization_event(dg.AssetKey("unguided_rollouts"))
    lineage = latest.asset_materialization.metadata.get("lineage") if latest and latest.asset_materialization else None
    if lineage is not None:
        print("rounds (as of the latest unguided_rollouts):")
        print("\n".join(f"  {line}" for line in str(lineage.value).splitlines()))
    runs = instance.get_run_records(limit=1)
    if runs:
        run = runs[0]
        took = f" in {run.end_time - run.start_time:.0f} s" if run.start_time and run.end_time else ""
        print(f"latest run {run.dagster_run.run_id[:8]} ({run.dagster_run.job_name}): "
              f"{run.dagster_run.status.value.lower()}{took}, created {_when(run.create_timestamp.timestamp())}")
    else:
        print("no run yet: `handhold run` or `make dev`")
    pool = instance.event_log_storage.get_concurrency_info(POOL)
    print(f"pool {POOL}: limit {pool.limit if pool.limit is not None else 'none'}, {pool.active_slot_count} in use, "
          f"{pool.pending_step_count} waiting")
    return 0


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).astimezone().strftime("%Y-%m-%d %H:%M:%S")
