"""The Dagster code location loads, validates and holds the main job and nightly schedule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg


def test_definitions_load():
    from assets.definitions import defs

    assert isinstance(defs, dg.Definitions)
    job = defs.resolve_job_def("main")
    assert job.name == "main"
    assert defs.resolve_schedule_def("nightly").cron_schedule == "0 2 * * *"
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert "sandbox_base_image" in keys


def test_dagster_validates_code_location(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    dagster = Path(sys.executable).with_name("dagster")
    done = subprocess.run([str(dagster), "definitions", "validate", "-m", "assets.definitions"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Validation successful" in done.stdout + done.stderr


def test_loading_the_code_location_imports_no_library_it_only_needs_to_grade_or_train():
    """Every code server, daemon and run loads the definitions: swebench's harness (with its docker, datasets, pandas
    and modal imports) cost each of them ~4 s of CPU, and torch would cost more; they are imported where used."""
    heavy = ("swebench.harness", "datasets", "pandas", "modal", "torch", "transformers", "trl")
    probe = f"import sys, assets.definitions; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
