"""The `handhold` command: materialize a selection of the graph headless, see what is materialized, print settings.

Exit codes: 0 everything asked for succeeded, 1 a step failed, 2 bad usage or settings (nothing ran),
130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import yaml

POOL = "sandboxes"  # the graph's one concurrency pool: steps that run Docker sandboxes
DEFAULT_POOL_LIMIT = 2  # steps of the pool at once, across runs: the cores of the machine it was sized on
POOL_LIMIT_ENV = "HANDHOLD_SANDBOX_POOL_LIMIT"
MARK = "# Written by handhold"
DAGSTER_YAML = MARK + """ (pipeline/cli.py), which rewrites it: delete this line to keep your own edits.
# Pipeline logs show in the Dagster UI; no telemetry.
python_logs:
  managed_python_loggers: [pipeline, sandbox, training]
  python_log_level: INFO
telemetry:
  enabled: false
# At most {limit} steps of the `sandboxes` pool (rollouts, guidance, evaluation) run at once, across
# all runs; the others wait. It is the graph's only pool. {env}=N before `handhold` or
# `make dev` sets another limit.
concurrency:
  pools:
    default_limit: {limit}
"""
DEFAULT_CONFIG = "configs/default.yaml"
SELECTION_HELP = "a Dagster asset selection, e.g. 'key:tasks+', 'key:tasks or key:guidance', 'group:datasets'"


class UsageError(Exception):
    """Bad arguments or settings: reported with exit code 2 before anything runs."""


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


def run_config(config_file: str | None, pairs: list[str]) -> dict:
    """Run config for the `settings` resource: a YAML experiment file, then `dotted.key=value` overrides."""
    from pipeline.settings import SettingsError, read_settings, with_overrides

    try:
        data = read_settings(config_file) if config_file else {}
        values = with_overrides(data, pairs, where=f"{config_file or 'settings'} with --set")
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    return {"resources": {"settings": {"config": values}}} if values else {}


def selected_keys(defs, selection: str) -> list:
    """The asset keys a Dagster selection string names (e.g. `key:tasks+`, `group:datasets`), in graph order."""
    import dagster as dg

    graph = defs.resolve_asset_graph()
    known = ", ".join(k.to_user_string() for k in graph.toposorted_asset_keys)
    try:
        keys = dg.AssetSelection.from_string(selection).resolve(graph)
    except Exception as exc:  # Dagster raises several kinds: bad syntax, unknown key
        raise UsageError(f"--select {selection!r}: {str(exc).splitlines()[0]}\n{SELECTION_HELP}\n"
                         f"the assets: {known}") from None
    if not keys:
        raise UsageError(f"--select {selection!r} selects no asset\nthe assets: {known}")
    return [k for k in graph.toposorted_asset_keys if k in keys]


def batch_partition(defs, instance, keys: list, settings: dict) -> str | None:
    """The batch partition a run of partitioned assets writes (`batch`, else the UTC date), added if new."""
    from assets.partitions import batch_key, ensure_batch

    graph = defs.resolve_asset_graph()
    if not any(graph.get(k).partitions_def for k in keys):
        return None
    return ensure_batch(instance, batch_key(settings.get("batch", "")))


def headline(metadata: dict, most: int = 6) -> str:
    """A materialization's numbers, `name=value`, the first `most` of them."""
    values = [(name, getattr(value, "value", value)) for name, value in metadata.items()]
    numbers = [f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}" for name, value in values
               if isinstance(value, (int, float)) and not isinstance(value, bool)]
    return " ".join(numbers[:most])


class Progress:
    """Prints a line per step started and finished, with a bar, the count done and seconds taken."""

    def __init__(self, steps: int, out=None, width: int = 20):
        self.steps, self.out, self.width, self.done, self.started = steps, out, width, 0, {}

    def __call__(self, entry) -> None:
        event = entry.dagster_event
        if event is None or not event.step_key:
            return
        kind = event.event_type_value
        if kind == "STEP_START":
            self.started[event.step_key] = entry.timestamp
            self.line(f"{event.step_key} started")
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED"):
            self.done += 1
            took = entry.timestamp - self.started.get(event.step_key, entry.timestamp)
            verb = {"STEP_SUCCESS": "succeeded", "STEP_FAILURE": "FAILED", "STEP_SKIPPED": "skipped"}[kind]
            self.line(f"{event.step_key} {verb} ({took:.1f} s)")

    def line(self, text: str) -> None:
        filled = self.width * self.done // max(self.steps, 1)
        print(f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.steps}  {text}",
              file=self.out or sys.stdout, flush=True)


def run_selection(selection: str, config_file: str | None, pairs: list[str], full: bool = False) -> int:
    """Materialize the selected assets (and their checks) in process, recorded in DAGSTER_HOME; print a summary."""
    from assets.definitions import defs

    config = run_config(config_file, pairs)
    keys = selected_keys(defs, selection)
    home = ensure_dagster_home()
    instance = instance_with_pool_limit()
    release_dead_runs(instance)
    job = defs.resolve_job_def("main")
    steps = len(job.get_subset(asset_selection=frozenset(keys)).graph.nodes)
    settings = config["resources"]["settings"]["config"] if config else {}
    partition = batch_partition(defs, instance, keys, settings)
    run_id = str(uuid.uuid4())
    print(f"handhold run {run_id[:8]}: {len(keys)} asset(s) in {steps} step(s)"
          f"{f', batch {partition}' if partition else ''}, recorded in {home}", flush=True)
    instance.add_event_listener(run_id, Progress(steps))
    # Dagster's console shows the pipeline's INFO logs and errors; Progress shows the steps.
    start = time.monotonic()
    result = job.execute_in_process(
        run_config={**config, "loggers": {"console": {"config": {"log_level": "INFO"}}}}, instance=instance,
        asset_selection=keys, partition_key=partition, run_id=run_id, raise_on_error=False,
        tags=owner_tags())
    print_summary(result, keys, time.monotonic() - start, full)
    errors = [root_error(e) for e in result.get_step_failure_events()]
    interrupted = any(e and e.cls_name == "DagsterExecutionInterruptedError" for e in errors)  # Ctrl-C
    return 0 if result.success else 130 if interrupted else 1


def root_error(failure):
    """What a failed step raised (Dagster wraps it), as Dagster's serializable error info."""
    error = failure.event_specific_data.error
    while error and error.cause:
        error = error.cause
    return error


def print_summary(result, keys: list, seconds: float, full: bool) -> None:
    """Per asset: succeeded, failed or not run, with its numbers; per check: passed or failed; the failures."""
    mats = {e.asset_key: e.step_materialization_data.materialization
            for e in result.get_asset_materialization_events()}
    failed = {e.step_key: e for e in result.get_step_failure_events()}
    graph = result.job_def.asset_layer.asset_graph
    print(f"\nrun {result.run_id[:8]} {'succeeded' if result.success else 'FAILED'} in {seconds:.1f} s "
          f"(`handhold status` or `make dev` to look at it again)")
    width = max(len(k.to_user_string()) for k in keys)
    for key in keys:
        step = graph.get(key).assets_def.node_def.name
        state = "succeeded" if key in mats else "FAILED" if step in failed else "not run"
        print(f"  {key.to_user_string():<{width}}  {state:<9}  {headline(mats[key].metadata) if key in mats else ''}"
              .rstrip())
        for name, value in (mats[key].metadata.items() if full and key in mats else []):
            text = str(getattr(value, "value", value))
            print(f"      {name}: {'(a picture: see the asset in the Dagster UI)' if 'data:image/' in text else text}")
    for check in result.get_asset_check_evaluations():
        print(f"  check {check.asset_key.to_user_string()}:{check.check_name}  "
              f"{'passed' if check.passed else 'FAILED'}")
    for step, event in failed.items():
        error = root_error(event)
        print(f"\nFAILED {step}: {error.message.strip() if error else event.message}")


def run_run(args: argparse.Namespace) -> int:
    return run_selection(args.select, args.config, args.set)


def run_demo(args: argparse.Namespace) -> int:
    """The whole graph with the default experiment, every asset's metadata printed."""
    return run_selection("*", args.config, args.set, full=True)


def run_status(args: argparse.Namespace) -> int:
    """What DAGSTER_HOME records: each asset's latest materialization and numbers, checks, the latest run."""
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


def run_show_config(args: argparse.Namespace) -> int:
    """Print (or write) the documented settings of a YAML file with --set applied, all fields included."""
    from pipeline.settings import HandholdConfig, documented_yaml, from_mapping

    values = run_config(args.config, args.set)
    config = from_mapping(HandholdConfig, values["resources"]["settings"]["config"] if values else {},
                          args.config or "defaults")
    text = documented_yaml(config)
    if args.write:
        Path(args.write).write_text(text)
        print(f"wrote {args.write}")
    else:
        print(text, end="")
    return 0


def run_base_image(args: argparse.Namespace) -> int:
    from sandbox.images import ensure_base_image

    print(ensure_base_image())
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="handhold", description="Training data for SWE agents.", epilog="exit codes: "
                                  "0 succeeded, 1 a step failed, 2 bad usage or settings, 130 interrupted")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="materialize a selection of the graph headless (default: all of it)")
    run.add_argument("--select", default="*", metavar="SELECTION",
                     help=f"{SELECTION_HELP} (default: *, everything)")
    demo = sub.add_parser("demo", help=f"the whole graph with {DEFAULT_CONFIG}, every output printed")
    show = sub.add_parser("config", help="print every setting, documented, as YAML (the defaults, or a file's)")
    show.add_argument("--write", metavar="FILE", help="write it to FILE instead")
    for command in (run, demo, show):
        command.add_argument("--config", metavar="FILE", default=DEFAULT_CONFIG if command is demo else None,
                             help=f"YAML experiment file (default for demo: {DEFAULT_CONFIG})")
        command.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                             help="override one setting, e.g. --set rollout.attempts=4 (see `handhold config`)")
    run.set_defaults(func=run_run)
    demo.set_defaults(func=run_demo)
    show.set_defaults(func=run_show_config)
    sub.add_parser("status", help="each asset's latest materialization and numbers, the latest run") \
        .set_defaults(func=run_status)
    sub.add_parser("base-image", help="make sure the sandbox base image exists").set_defaults(func=run_base_image)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.func is run_base_image:  # in a run, Dagster prints (and keeps) handhold's logs itself
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"handhold: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
