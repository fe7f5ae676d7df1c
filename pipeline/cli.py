"""The `handhold` command: run the main job headless, or one stage."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def run_demo(args: argparse.Namespace) -> int:
    """Materialize the whole asset graph in process, recorded in DAGSTER_HOME, and say where outputs are."""
    import dagster as dg

    from assets.definitions import defs

    os.environ.setdefault("DAGSTER_HOME", str(Path(".dagster_home").resolve()))
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    instance = dg.DagsterInstance.get()
    job = defs.resolve_job_def("main")
    result = job.execute_in_process(instance=instance, run_config=args.run_config or None,
                                    raise_on_error=False)
    print(f"\nrun {result.run_id}: {'succeeded' if result.success else 'FAILED'} "
          f"(recorded in {os.environ['DAGSTER_HOME']}; `make dev` shows it in the Dagster UI)")
    for event in result.get_asset_materialization_events():
        mat = event.step_materialization_data.materialization
        print(f"\n{mat.asset_key.to_user_string()}")
        for key, value in mat.metadata.items():
            print(f"  {key}: {getattr(value, 'value', value)}")
    return 0 if result.success else 1


def run_base_image(args: argparse.Namespace) -> int:
    from sandbox.images import ensure_base_image

    print(ensure_base_image())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="handhold", description="Training data for SWE agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="materialize the whole graph headless (the main job)")
    demo.set_defaults(func=run_demo, run_config=None)
    base = sub.add_parser("base-image", help="make sure the sandbox base image exists")
    base.set_defaults(func=run_base_image)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
