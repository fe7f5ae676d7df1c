"""The `handhold` command: run the main job headless, or one stage."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


DAGSTER_YAML = """\
# Written by handhold when missing: pipeline logs show in the Dagster UI; no telemetry.
python_logs:
  managed_python_loggers: [pipeline, sandbox, training]
  python_log_level: INFO
telemetry:
  enabled: false
"""


def ensure_dagster_home() -> Path:
    """DAGSTER_HOME (default .dagster_home), with a dagster.yaml that captures handhold's logs."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".dagster_home").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists() or not config.read_text().strip():
        config.write_text(DAGSTER_YAML)
    return home


DEFAULT_CONFIG = "configs/default.yaml"


def run_config(config_file: str | None, pairs: list[str]) -> dict:
    """Run config for the `settings` resource: a YAML experiment file, then `dotted.key=value` overrides."""
    from pipeline.settings import SettingsError, read_settings, with_overrides

    try:
        data = read_settings(config_file) if config_file else {}
        values = with_overrides(data, pairs, where=f"{config_file or 'settings'} with --set")
    except SettingsError as exc:
        raise SystemExit(f"handhold: {exc}") from None
    return {"resources": {"settings": {"config": values}}} if values else {}


def run_demo(args: argparse.Namespace) -> int:
    """Materialize the whole asset graph in process, recorded in DAGSTER_HOME, and say where outputs are."""
    import dagster as dg

    from assets.definitions import defs

    home = ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    job = defs.resolve_job_def("main")
    result = job.execute_in_process(instance=instance, run_config=run_config(args.config, args.set) or None,
                                    raise_on_error=False)
    print(f"\nrun {result.run_id}: {'succeeded' if result.success else 'FAILED'} "
          f"(recorded in {home}; `make dev` shows it in the Dagster UI)")
    for event in result.get_asset_materialization_events():
        mat = event.step_materialization_data.materialization
        print(f"\n{mat.asset_key.to_user_string()}")
        for key, value in mat.metadata.items():
            text = str(getattr(value, "value", value))
            print(f"  {key}: {'(a picture: see the asset in the Dagster UI)' if 'data:image/' in text else text}")
    for check in result.get_asset_check_evaluations():
        print(f"\ncheck {check.asset_key.to_user_string()}:{check.check_name}: {'passed' if check.passed else 'FAILED'}")
    for event in result.get_step_failure_events():
        error = event.event_specific_data.error
        print(f"\nFAILED {event.step_key}: {error.message.strip() if error else event.message}")
    return 0 if result.success else 1


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="handhold", description="Training data for SWE agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="materialize the whole graph headless (the main job)")
    show = sub.add_parser("config", help="print every setting, documented, as YAML (the defaults, or a file's)")
    show.add_argument("--write", metavar="FILE", help="write it to FILE instead")
    for command in (demo, show):
        command.add_argument("--config", metavar="FILE", default=DEFAULT_CONFIG if command is demo else None,
                             help=f"YAML experiment file (default for demo: {DEFAULT_CONFIG})")
        command.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                             help="override one setting, e.g. --set rollout.attempts=4 (see `handhold config`)")
    demo.set_defaults(func=run_demo)
    show.set_defaults(func=run_show_config)
    base = sub.add_parser("base-image", help="make sure the sandbox base image exists")
    base.set_defaults(func=run_base_image)
    args = parser.parse_args(argv)
    if args.func is not run_demo:  # in a run, Dagster prints (and keeps) handhold's logs itself
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
