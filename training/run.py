"""Run one training stage in its own process under Dagster Pipes: `python -m training.run sft|dpo|actguide`.

The asset launches it (`training.launcher: pipes`, or `k8s` in a pod), directly or through `accelerate launch ... -m
training.run <stage>`, with the stage's settings, the starting model, the dataset folder and the run
folder, the batches whose rows it trains on (`training.rounds_window`), and the experiment trackers to log to
(`training.report_to`). Every logged step goes to the asset's logs; the run's summary comes back as the asset's
materialization metadata. Under several processes only rank 0 talks to Dagster. The settings travel in a JSON file
(`--spec`), so every rank reads them, and the module runs without Dagster too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from training.config import ActGuideTrainingConfig, DPOTrainingConfig, SFTTrainingConfig

STAGES = {"sft": SFTTrainingConfig, "dpo": DPOTrainingConfig, "actguide": ActGuideTrainingConfig}


def trainer(stage: str):
    """The in-process training function of a stage."""
    if stage == "sft":
        from training.sft import train_sft

        return train_sft
    if stage == "dpo":
        from training.dpo import train_dpo

        return train_dpo
    if stage == "actguide":
        from training.actguide import train_actguide

        return train_actguide
    raise ValueError(f"unknown training stage {stage!r}; choose {sorted(STAGES)}")


def main(argv: list[str] | None = None) -> int:
    from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

    from pipeline.core.config_tree import from_mapping
    from training.common import rows_of_batches

    parser = argparse.ArgumentParser(prog="python -m training.run", description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=sorted(STAGES))
    parser.add_argument("--spec", required=True, help="JSON file: settings, model, dataset, out, report_to, batches")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    config = from_mapping(STAGES[args.stage], spec["settings"], f"training.{args.stage} in {args.spec}")
    train = trainer(args.stage)
    report_to = tuple(spec.get("report_to", ()))
    batches = spec.get("batches")  # the rows of these batches only (training.rounds_window); null: every batch's
    with rows_of_batches(None if batches is None else tuple(batches)):
        if os.environ.get("RANK", "0") != "0" or not PipesEnvVarParamsLoader().is_dagster_pipes_process():
            train(config, spec["model"], spec["dataset"], spec["out"], report_to=report_to)
            return 0
        with open_dagster_pipes() as pipes:
            result = train(config, spec["model"], spec["dataset"], spec["out"], report_to=report_to,
                           report=lambda row: pipes.log.info(f"{args.stage} step " + json.dumps(row)))
            pipes.report_asset_materialization(metadata={
                k: v for k, v in result.summary.items() if isinstance(v, (int, float, str, bool))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
