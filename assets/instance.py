"""The Dagster instance handhold runs in: DAGSTER_HOME and the dagster.yaml handhold writes there, the limit
of the graph's one concurrency pool (`sandboxes`), and the slots of in-process runs whose process died."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import yaml


class UsageError(Exception):
    """Bad arguments or settings: `handhold` reports it with exit code 2 before anything runs."""


POOL = "sandboxes"  # the graph's one concurrency pool: steps that run Docker sandboxes
DEFAULT_POOL_LIMIT = 2  # steps of the pool at once, across runs: the cores of the machine it was sized on
POOL_LIMIT_ENV = "HANDHOLD_SANDBOX_POOL_LIMIT"
MARK = "# Written by handhold"
DAGSTER_YAML = MARK + """ (assets/instance.py), which rewrites it: delete this line to keep your own edits.
# Pipeline logs show in the Dagster UI; no telemetry.
python_logs:
  managed_python_loggers: [pipeline, sandbox, training]
  python_log_level: INFO
telemetry:
  enabled: false
# The daemon checks the freshness policies (the export and the evaluation): a missed night shows as failing.
freshness:
  enabled: true
# At most {limit} steps of the `sandboxes` pool (rollouts, guidance, evaluation) run at once, across
# all runs; the others wait. It is the graph's only pool. {env}=N before `handhold` or
# `make dev` sets another limit.
concurrency:
  pools:
    default_limit: {limit}
"""

def sandbox_pool_limit(limit: int | None = None) -> int:
    """The `sandboxes` pool limit: `limit`, else $HANDHOLD_SANDBOX_POOL_LIMIT, else DEFAULT_POOL_LIMIT."""
    raw = limit if limit is not None else os.environ.get(POOL_LIMIT_ENV) or DEFAULT_POOL_LIMIT
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{POOL_LIMIT_ENV}={raw!r}: the sandboxes pool limit must be a whole number >= 1")
    return value


def ensure_dagster_home(pool_limit: int | None = None) -> Path:
    """DAGSTER_HOME (default .dagster_home) with handhold's dagster.yaml: logs captured, the sandboxes pool
    capped. A dagster.yaml handhold wrote is brought up to date; one a user wrote is left alone."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".dagster_home").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    current = config.read_text() if config.exists() else ""
    wanted = DAGSTER_YAML.format(limit=sandbox_pool_limit(pool_limit), env=POOL_LIMIT_ENV)
    if not current.strip() or current.startswith(MARK):
        if current != wanted:
            config.write_text(wanted)
    elif "concurrency" not in (yaml.safe_load(current) or {}):
        print(f"handhold: {config} is yours, so it is left as it is, and nothing caps the `{POOL}` pool: add\n"
              f"  concurrency:\n    pools:\n      default_limit: {sandbox_pool_limit(pool_limit)}\n"
              f"to it, or run `dagster instance concurrency set {POOL} N`.", file=sys.stderr)
    return home


def instance_with_pool_limit():
    """The DAGSTER_HOME instance, its stored `sandboxes` limit brought to dagster.yaml's now (Dagster itself
    does it at the pool's next step), unless someone set the pool's limit by hand."""
    import dagster as dg

    instance = dg.DagsterInstance.get()
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits:
        info = storage.get_concurrency_info(POOL)
        if info.using_default_limit or not info.slot_count:
            storage.initialize_concurrency_limit_to_default(POOL)
    return instance


HOST_TAG, PROCESS_TAG = "handhold/host", "handhold/process"  # where an in-process run runs: host, pid:start


def process_identity(pid: int) -> str | None:
    """'pid:start' of a live process (its start time in clock ticks since boot, so a reused pid is another
    process), or None when no such process runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, someone else's
    stat = Path(f"/proc/{pid}/stat")
    # the fields after the command name, which is in parentheses and may hold spaces; the start time is the 22nd
    return f"{pid}:{stat.read_text().rsplit(')', 1)[1].split()[19]}" if stat.exists() else f"{pid}:"


def owner_tags() -> dict[str, str]:
    """Tags naming this process as the one running an in-process run."""
    return {HOST_TAG: socket.gethostname(), PROCESS_TAG: process_identity(os.getpid()) or ""}


def release_dead_runs(instance) -> list[str]:
    """Runs `handhold run` started on this host whose process is gone (SIGKILLed, out of memory): each is marked
    failed and its `sandboxes` slots freed, else the pool stays full of claims nobody will release."""
    import dagster as dg

    unfinished = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED],
                               tags={HOST_TAG: socket.gethostname()})
    released = []
    for run in instance.get_runs(filters=unfinished):
        process = run.tags.get(PROCESS_TAG, "")
        if not process or process_identity(int(process.split(":")[0])) == process:
            continue
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        instance.report_run_failed(run, f"its process ({process.split(':')[0]}) ended without finishing the run "
                                        "(killed?): marked failed and its concurrency slots freed by handhold")
        print(f"handhold: run {run.run_id[:8]} lost its process: marked failed, its `{POOL}` slots freed",
              file=sys.stderr)
        released.append(run.run_id)
    return released
