"""The `handhold` command: materialize a selection of the graph headless, see what is materialized, print settings.

Exit codes: 0 everything asked for succeeded, 1 a step failed, 2 bad usage or settings (nothing ran),
130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid
from pathlib import Path

from pipeline.core.config_tree import SettingsError
from assets.instance import UsageError, ensure_dagster_home, instance_with_pool_limit, owner_tags, release_dead_runs
from assets.status import headline, run_status

DEFAULT_CONFIG = "configs/default.yaml"
SELECTION_HELP = "a Dagster asset selection, e.g. 'key:tasks+', 'key:tasks or key:guidance', 'group:datasets'"


def run_config(config_file: str | None, pairs: list[str]) -> dict:
    """Run config for the `settings` resource: a YAML experiment file, then `dotted.key=value` overrides."""
    from assets.settings import SettingsError, read_settings, with_overrides

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


HEAD_TO_HEAD = (
    ("unguided_rollouts", "lineage", "Rounds: the policy that rolled each batch out, the run and data that made "
                                     "it, and of the tasks that needed guidance in an earlier round those it solved "
                                     "without"),
    ("guided_rollouts", "head_to_head", "Guidance families head to head on the same failed groups, with costs"),
    ("guided_rollouts", "cascade", "What the cascade saved"),
    ("dataset_export", "costs", "Cost per resolved task and per DPO pair, every batch"),
    ("policy_evaluation", "results", "Evaluation: pass@1 and cost per task"))


def head_to_head_report(metadata: dict[str, dict]) -> str:
    """The tables a demo ends with, from each asset's metadata (by asset key): the families head to head with
    their costs, the cascade's saving, cost per DPO pair, the evaluation; '' when none was materialized."""
    parts = [f"{title}:\n{str(getattr(value, 'value', value)).strip()}" for asset, name, title in HEAD_TO_HEAD
             if (value := metadata.get(asset, {}).get(name)) is not None]
    return "\n\n".join(parts)


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
    report = head_to_head_report({k.to_user_string(): m.metadata for k, m in mats.items()}) if full else ""
    if report:
        print(f"\n{report}")
    for step, event in failed.items():
        error = root_error(event)
        print(f"\nFAILED {step}: {error.message.strip() if error else event.message}")


def run_run(args: argparse.Namespace) -> int:
    return run_selection(args.select, args.config, args.set)


# The demo's next round: the next batch rolled out by the checkpoint the first round trained, on 2 tasks (those that
# needed guidance in the first come first: pipeline/rollouts/rounds.py); then every batch's rows exported and that stage
# trained on from the checkpoint. The round's rescue (guidance, guided rollouts), the other stages and the evaluation
# are left out to keep the demo under 10 minutes. The tiny checkpoint solves nothing, so its batch adds no row to
# train on: it trains on both rounds' rows (training.rounds_window=2).
DEMO_ROUND = ("rollout_tasks=2", "training.rounds_window=2")
DEMO_ROUND_ROWS = "key:dpo_dataset or key:actguide_dataset or key:sft_dataset or key:dataset_export"


def run_demo(args: argparse.Namespace) -> int:
    """The whole graph with the default experiment, every asset's metadata printed; with `policy.from_stage` set and
    its checkpoint made, the next round (`DEMO_ROUND`); then every round's lineage."""
    from assets.partitions import batch_key
    from pipeline.core.layout import Layout
    from pipeline.rollouts.round_report import lineage, lineage_markdown
    from assets.settings import HandholdConfig, from_mapping

    config = run_config(args.config, args.set)
    values = from_mapping(HandholdConfig, config["resources"]["settings"]["config"] if config else {}, "the demo")
    first, stage, layout = batch_key(values.batch), values.policy.from_stage, Layout(Path(values.data_dir))
    code = run_selection("*", args.config, [*args.set, f"batch='{first}'"], full=True)
    if not stage:
        return code
    if first not in layout.checkpoint_batches(stage):
        print(f"\nno next round: batch {first} made no {stage} checkpoint", flush=True)
        return code or 1
    second, pairs = f"{first}-next", [*args.set, f"batch='{first}-next'", *DEMO_ROUND]
    print(f"\nthe next round: batch {second} rolled out by the latest {stage} checkpoint ({', '.join(DEMO_ROUND)}), "
          f"then its rows exported and {stage} trained on from that checkpoint", flush=True)
    code = run_selection("key:unguided_rollouts", args.config, pairs, full=True) or code
    code = run_selection(f"{DEMO_ROUND_ROWS} or key:{stage}_model", args.config, pairs, full=True) or code
    print(f"\nRounds (pipeline/rollouts/rounds.py):\n{lineage_markdown(lineage(layout))}")
    return code


def run_show_config(args: argparse.Namespace) -> int:
    """Print (or write) the documented settings of a YAML file with --set applied, all fields included."""
    from assets.settings import HandholdConfig, documented_yaml, from_mapping

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


def run_prune_images(args: argparse.Namespace) -> int:
    from sandbox.prune import prune_derived_images

    print(prune_derived_images(older_than_s=args.older_than_days * 86400, task=args.task).report())
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
    prune = sub.add_parser("prune-images", help="remove the prepared and only-reachable images no container uses "
                           "(each is made again when a sandbox needs it)")
    prune.add_argument("--older-than-days", type=float, default=0.0, metavar="DAYS", help="only those made earlier")
    prune.add_argument("--task", metavar="INSTANCE_ID", help="only this task's prepared images")
    prune.set_defaults(func=run_prune_images)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.func is run_base_image:  # in a run, Dagster prints (and keeps) handhold's logs itself
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (UsageError, SettingsError) as exc:  # settings are checked (keys, types, ranges) before anything runs
        print(f"handhold: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
