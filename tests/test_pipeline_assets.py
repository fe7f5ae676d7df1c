"""The Dagster graph end to end on a small slice: tasks, unguided rollouts, guidance, guided rollouts."""

from __future__ import annotations

import dagster as dg
import polars as pl

from assets.datasets import dataset_checks
from assets.definitions import all_assets
from assets.resources import Credentials, HandholdSettings
from pipeline.cli import run_config
from pipeline.records import GUIDANCE_PLAN_SCHEMA, GuidancePlan
from pipeline.store import read_records
from tests.test_datasets_build import check_rows_against_stored_attempts


def test_graph_materializes_on_a_small_slice(base_image, tmp_path):
    settings = HandholdSettings(data_dir=str(tmp_path / "data"), batch="test", rollout_tasks=2,
                                synth={"packages": ["toolz"], "tasks_per_package": 2},
                                rollout={"attempts": 2, "agent": {"max_steps": 30}},
                                guidance={"compare_linear": False})
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([*all_assets, *dataset_checks], instance=instance,
                            resources={"settings": settings, "credentials": Credentials()})
    assert result.success
    meta = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    assert meta["tasks"]["tasks"].value == 2
    assert meta["unguided_rollouts"]["attempts"].value == 4
    assert meta["unguided_rollouts"]["policy"].value == "heuristic"
    unguided = pl.read_parquet(tmp_path / "data/trajectories/unguided/test/trajectories.parquet")
    assert unguided.height == 4 and set(unguided["policy"]) == {"heuristic"}
    assert meta["unguided_rollouts"]["lost_patches"].value == 0
    assert meta["unguided_rollouts"]["regrade_mismatches"].value == 0
    assert meta["guidance"]["failed_tasks"].value >= 1  # the heuristic fails a toolz task (seeded, deterministic)
    assert meta["guidance"]["reference_replay_failures"].value == 0
    assert meta["guidance"]["edit_prefix_failures"].value == 0
    plans = [GuidancePlan.from_row(r) for r in read_records(tmp_path / "data/guidance/test/guidance.parquet",
                                                             GUIDANCE_PLAN_SCHEMA)]
    guided = pl.read_parquet(tmp_path / "data/trajectories/guided/test/trajectories.parquet")
    accepted = [p for p in plans if p.accepted and p.text]
    assert guided.height == 2 * len(accepted) >= 2
    assert sorted(set(guided["guidance_kind"])) == sorted({p.kind for p in accepted})
    assert meta["guided_rollouts"]["lost_patches"].value == 0

    checks = {e.asset_check_key.name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"dpo_rows_hold_no_guidance": True, "no_infra_error_attempts": True,
                      "splits_are_disjoint_by_task": True, "export_has_no_secrets": True}
    exported = {k: sum(v.values()) for k, v in meta["dataset_export"]["rows"].value.items()}
    for kind in ("dpo", "actguide", "sft"):
        assert exported.get(kind, 0) == meta[f"{kind}_dataset"]["rows"].value
    assert meta["actguide_dataset"]["rows"].value == len({p.instance_id for p in accepted if p.kind == "action"})
    assert exported["trajectories"] == unguided.height + guided.height and exported["tasks"] == 2
    assert meta["hub_publication"]["skipped"].value == "no publish.repo_id is set"
    assert check_rows_against_stored_attempts(tmp_path / "data") >= 1


def test_cli_run_config(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("rollout:\n  attempts: 4\n")
    assert run_config(str(exp), ["guidance.kinds=[plan, action]", "guidance.teacher=rule"]) == {
        "resources": {"settings": {"config": {"rollout": {"attempts": 4},
                                              "guidance": {"kinds": ["plan", "action"], "teacher": "rule"}}}}}
    assert run_config(None, []) == {}
