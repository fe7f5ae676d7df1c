"""Resources shared by the assets: where outputs go and which tasks are made."""

from __future__ import annotations

from pathlib import Path

import dagster as dg


class HandholdSettings(dg.ConfigurableResource):
    """Run-wide settings; every field can be set per run in the Dagster launchpad."""

    data_dir: str = "data"
    """Folder all Parquet files and datasets are written under (relative to the working dir)."""
    base_image: str = "handhold/base:bookworm-py3"
    """Tag of the sandbox base image that environment images are built on."""
    packages: list[str] = ["toolz", "tabulate", "boltons"]
    """Built-in packages to synthesize tasks from (names in pipeline.tasks.packages.DEFAULT_PACKAGES)."""
    tasks_per_package: int = 10
    """Synthesized tasks kept per package."""
    dataset: str = ""
    """Optional SWE-bench-format dataset (Hub name or local JSON/JSONL/Parquet) loaded next to them."""
    dataset_split: str = "test"
    """Split of `dataset` to load."""
    dataset_limit: int = 0
    """Most rows of `dataset` loaded (0: all)."""
    workers: int = 2
    """Sandboxes run at once by any stage."""

    def path(self, *parts: str) -> Path:
        out = Path(self.data_dir).resolve().joinpath(*parts)
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def synth_config(self):
        from pipeline.tasks.packages import DEFAULT_PACKAGES
        from pipeline.tasks.synth import SynthConfig

        known = {p.name: p for p in DEFAULT_PACKAGES}
        unknown = [name for name in self.packages if name not in known]
        if unknown:
            raise ValueError(f"settings.packages has unknown names {unknown}; choose from {sorted(known)}")
        return SynthConfig(packages=tuple(known[n] for n in self.packages),
                           tasks_per_package=self.tasks_per_package, workers=self.workers)
