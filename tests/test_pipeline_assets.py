"""The Dagster graph end to end on a small slice: tasks, unguided rollouts, guidance, guided rollouts."""

from __future__ import annotations

import dagster as dg
import polars as pl

from assets.definitions import all_assets
from assets.resources import HandholdSettings
from pipeline.cli import settings_overrides


def test_graph_materializes_on_a_small_slice(base_image, tmp_path):
    settings = HandholdSettings(data_dir=str(tmp_path / "data"), packages=["toolz"], tasks_per_package=2,
                                rollout_tasks=2, attempts=2, max_steps=30, compare_linear=False,
                                batch="test")
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(all_assets, resources={"settings": settings}, instance=instance)
    assert result.success
    meta = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    assert meta["tasks"]["tasks"].value == 2
    assert meta["unguided_rollouts"]["attempts"].value == 4
    assert meta["unguided_rollouts"]["policy"].value == "heuristic"
    unguided = pl.read_parquet(tmp_path / "data/trajectories/unguided/test/trajectories.parquet")
    assert unguided.height == 4 and set(unguided["policy"]) == {"heuristic"}
    failed = meta["guidance"]["failed_tasks"].value
    guided_path = tmp_path / "data/trajectories/guided/test/trajectories.parquet"
    assert guided_path.exists()
    if failed:
        guided = pl.read_parquet(guided_path)
        assert guided.height > 0 and set(guided["guidance_kind"]) <= {
            "plan", "environment_feedback", "environment_interaction", "action"}
        assert "recovery" in meta["guided_rollouts"]


def test_cli_settings_overrides():
    assert settings_overrides(["attempts=4", "guidance_kinds=[plan, action]", "teacher=rule"]) == {
        "resources": {"settings": {"config": {"attempts": 4, "guidance_kinds": ["plan", "action"],
                                              "teacher": "rule"}}}}
    assert settings_overrides([]) == {}
