"""Resources shared by the assets: where outputs go and how sandboxes are made."""

from __future__ import annotations

from pathlib import Path

import dagster as dg


class HandholdSettings(dg.ConfigurableResource):
    """Run-wide settings; every field can be set per run in the Dagster launchpad."""

    data_dir: str = "data"
    """Folder all Parquet files and datasets are written under (relative to the working dir)."""
    base_image: str = "handhold/base:bookworm-py3"
    """Tag of the sandbox base image that environment images are built on."""

    def path(self, *parts: str) -> Path:
        out = Path(self.data_dir).resolve().joinpath(*parts)
        out.parent.mkdir(parents=True, exist_ok=True)
        return out
