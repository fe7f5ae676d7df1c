"""The Dagster graph end to end on a small slice: tasks, unguided rollouts, guidance, guided rollouts."""

from __future__ import annotations

import json

import dagster as dg
import datasets
import polars as pl
import pytest

from assets.checks import ROLLOUT_CHECKS
from assets.datasets import dataset_checks
from assets.graph import all_assets
from assets.partitions import ensure_batch
from assets.resources import Credentials, HandholdSettings
from assets.cli import head_to_head_report, run_config
from pipeline.datasets.splits import split_group, task_split
from pipeline.core.records import GUIDANCE_PLAN_SCHEMA, TASK_SCHEMA, GuidancePlan, Task
from pipeline.core.store import read_records
from pipeline.tasks.flakiness import read_rechecks
from pipeline.core.vocab import GUIDANCE_KINDS
from tests.conftest import GRAPH_SYNTH, TOOLZ
from tests.test_datasets_build import check_rows_against_stored_attempts

SMALL_TRAINING = {"sft": {"learning_rate": 5e-4, "per_device_batch_size": 2, "gradient_accumulation_steps": 1,
                          "max_steps": 2, "max_length": 4096},
                  "dpo": {"learning_rate": 5e-4, "per_device_batch_size": 2, "gradient_accumulation_steps": 1,
                          "max_steps": 2, "max_length": 4096},
                  # the heuristic samples no tokens (recompute), and its guided attempts of a rescued group all
                  # succeed: replacing the group by them leaves no signal, merged into it they have one
                  "actguide": {"learning_rate": 5e-4, "batch_size": 4, "max_steps": 2, "max_length": 4096,
                               "behaviour_logprobs": "recompute", "guided_group": "merge"},
                  "evaluation": {"max_steps": 3, "max_new_tokens": 32}}


@pytest.mark.timeout(1800)  # the whole graph, from synthesis to four models evaluated: the suite's longest test
def test_graph_materializes_on_a_small_slice(base_image, graph_cache, tmp_path):
    # One family of each kind (a teacher's plan, hindsight, action prefixes): tests/test_guidance.py covers
    # the other teacher kinds
    values = dict(data_dir=str(tmp_path / "data"), cache_dir=graph_cache, batch="test", rollout_tasks=2,
                  synth=GRAPH_SYNTH,
                  rollout={"attempts": 2, "agent": {"max_steps": 30}},
                  guidance={"compare_linear": False, "kinds": ["plan", "hindsight", "action"]},
                  training=SMALL_TRAINING)
    # Every task in train: a split is drawn per module, and the two tasks' modules may both fall in test, leaving a
    # stage nothing to train on (tests/test_splits.py covers held-out tasks)
    train_all = {"test_fraction": 0.0}
    settings = HandholdSettings(**values, datasets=train_all)
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([*all_assets, *dataset_checks], instance=instance,
                            partition_key=ensure_batch(instance, "test"),
                            resources={"settings": settings, "credentials": Credentials()})
    assert result.success
    meta = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    assert meta["tasks"]["tasks"].value == 2
    synthesized = json.loads((tmp_path / "data/tasks/synth_report.json").read_text())["per_package"]
    assert synthesized[TOOLZ.key]["cached"] == 1  # the first 2 of `synth_run`'s 3 (tests/conftest.py)
    rechecks = read_rechecks(tmp_path / "data/tasks/rechecks")  # the tasks_validate sample, recorded: both sound
    assert [(r.source, r.runs, r.disagreements, r.gold_resolved, r.empty_resolved) for r in rechecks] == \
        [("tasks_validate", 2, 0, 2, False)] * 2
    assert meta["tasks"]["quarantined"].value == 0 and meta["unguided_rollouts"]["quarantined_skipped"].value == 0
    assert meta["unguided_rollouts"]["attempts"].value == 4
    assert meta["unguided_rollouts"]["policy"].value == "heuristic"
    assert (meta["unguided_rollouts"]["round"].value, meta["unguided_rollouts"]["trained_by"].value) == (0, "(settings)")
    assert json.loads((tmp_path / "data/trajectories/unguided/test/round.json").read_text())["kind"] == "heuristic"
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
    families = meta["guided_rollouts"]["families"].value.splitlines()[2:]  # the head-to-head table's rows
    planned = {p.kind for p in plans}
    assert meta["guided_rollouts"]["costs"].value.splitlines()[2].startswith("| unguided | 4 |")  # free prices
    assert [row.split(" | ")[0].strip("| ") for row in families] == [k for k in GUIDANCE_KINDS if k in planned]
    assert meta["guided_rollouts"]["head_to_head"].value.splitlines()[2].startswith("| unguided | - | - | 4 |")

    checks = {(e.asset_key.to_user_string(), e.asset_check_key.name): e.passed
              for e in result.get_asset_check_evaluations()}
    assert checks == {**{(asset, name): True for asset in ("unguided_rollouts", "guided_rollouts")
                         for name in ROLLOUT_CHECKS},
                      ("tasks", "tasks_validate"): True, ("tasks", "tasks_answer_hidden"): True,
                      ("dpo_dataset", "dpo_rows_hold_no_guidance"): True,
                      ("dpo_dataset", "chosen_rows_never_refer_to_guidance"): True,
                      ("dpo_dataset", "no_infra_error_attempts"): True,
                      ("dpo_dataset", "splits_are_disjoint_by_task"): True,
                      ("dataset_export", "export_has_no_secrets"): True}
    exported = {k: sum(v.values()) for k, v in meta["dataset_export"]["rows"].value.items()}
    for kind in ("dpo", "actguide", "sft"):
        assert exported.get(kind, 0) == meta[f"{kind}_dataset"]["rows"].value
    groups = meta["actguide_dataset"]["groups"].value  # every task with a learning signal has its row
    assert meta["actguide_dataset"]["rows"].value == groups["mixed"] + groups["rescued"]
    assert sum(groups.values()) == 2
    assert exported["trajectories"] == unguided.height + guided.height and exported["tasks"] == 2
    card = (tmp_path / "data/datasets/hf/README.md").read_text()
    assert "## Quarantined tasks" in card and "(no task is quarantined)" in card
    assert_no_test_task_in_train(tmp_path / "data", 0.0)
    assert meta["hub_publication"]["skipped"].value == "no publish.repo_id is set"
    assert check_rows_against_stored_attempts(tmp_path / "data") >= 1
    costs = meta["dataset_export"]["costs"].value.splitlines()[2:]  # every batch; pairs by the chosen's origin
    assert sum(int(row.split(" | ")[13]) for row in costs) == meta["dpo_dataset"]["rows"].value
    assert "## What it cost" in (tmp_path / "data/datasets/hf/README.md").read_text()
    printed = head_to_head_report(meta)  # what `make demo` ends with
    assert printed.startswith("Rounds: the policy that rolled each batch out")
    assert "\n\nGuidance families head to head" in printed and "per DPO pair, every batch:\n| origin" in printed

    for stage in ("sft", "dpo", "actguide"):  # the tiny offline model trained for real on the exported rows
        assert meta[f"{stage}_model"]["steps"].value == 2, stage
        assert (tmp_path / f"data/models/{stage}/test/checkpoint").is_dir()
        assert meta[f"{stage}_model"]["loss_curve"].value.startswith("![loss](data:image/png;base64,")
        assert (meta[f"{stage}_model"]["round"].value, meta[f"{stage}_model"]["rows_of_batches"].value) == (0, "test")
    assert meta["dpo_model"]["rows"].value == exported["dpo"] - meta["dpo_dataset"]["splits"].value.get("test", 0)
    assert meta["sft_model"]["rows"].value == exported["sft"] - meta["sft_dataset"]["splits"].value.get("test", 0)

    # Every task held out: each model attempts each task unguided, in Docker, graded like any rollout
    held_out = HandholdSettings(**values, datasets={"test_fraction": 1.0})
    evaluation = dg.materialize([*all_assets], selection=["policy_evaluation"], instance=instance,
                                resources={"settings": held_out, "credentials": Credentials()})
    scores = evaluation.get_asset_materialization_events()[0].step_materialization_data.materialization.metadata
    assert scores["held_out_tasks"].value == 2
    report = json.loads((tmp_path / "data/evaluation/test/pass_at_1.json").read_text())
    tasks = [Task.from_row(r) for r in read_records(tmp_path / "data/tasks/tasks.parquet", TASK_SCHEMA)]
    assert report["tasks"]["instance_ids"] == [t.instance_id for t in tasks] and report["temperature"] == 0.0
    release = json.loads((tmp_path / "data/datasets/hf/release.json").read_text())  # cut by the export
    assert report["dataset"]["dataset_release"] == scores["dataset_release"].value == release["name"] == "test"
    assert scores["dataset_sha256"].value == release["content_sha256"] == meta["dataset_export"]["rows_sha256"].value
    assert meta["dpo_model"]["dataset_release"].value == "test"  # what training read, beside what was evaluated
    results = report["results"]
    assert [r["model"] for r in results] == ["starting", "sft", "dpo", "actguide"]
    for r in results:
        stored = pl.read_parquet(r["path"])
        assert (r["attempts"], r["graded"], stored.height, r["infra_errors"]) == (2, 2, 2, 0)
        assert r["pass@1"] == stored["resolved"].mean() and r["ci95_low"] <= r["pass@1"] <= r["ci95_high"]
        assert set(stored["guidance_kind"]) == {"none"} and stored["policy"][0].startswith("hf:")
        assert [t["instance_id"] for t in r["per_task"]] == report["tasks"]["instance_ids"]
        assert r["tokens_per_task"] > 0 and r["cost_per_task"] == 0  # free prices
        # what its attempts spent in sandboxes: their tool calls and grades (an empty patch's known grade: none)
        spent = sum(s["tool_time"] for steps in stored["steps"].to_list() for s in steps) + stored["grade_time"].sum()
        assert r["sandbox_s_per_task"] == pytest.approx(spent / 2, abs=0.1)
    revisions = [r["identity"]["revision"] for r in results]  # trained weights differ from the starting ones
    assert all(v.startswith("sha256:") for v in revisions) and len(set(revisions)) == 4
    assert len(scores["per_task"].value.splitlines()) == 2 + 2  # header, rule, one row per held-out task


def assert_no_test_task_in_train(data, test_fraction: float) -> None:
    """Every exported config, loaded with `datasets`: each row in its task's split, no test task in train."""
    tasks = [Task.from_row(r) for r in read_records(data / "tasks/tasks.parquet", TASK_SCHEMA)]
    split = {t.instance_id: task_split(split_group(t), test_fraction) for t in tasks}
    for config in ("dpo", "actguide", "sft", "trajectories", "tasks"):
        if not (data / "datasets/hf/data" / config).exists():
            continue
        for name, rows in datasets.load_dataset(str(data / "datasets/hf"), config).items():
            assert {split[i] for i in rows["instance_id"]} <= {name}, (config, name)


def test_cli_run_config(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("rollout:\n  attempts: 4\n")
    assert run_config(str(exp), ["guidance.kinds=[plan, action]", "guidance.teacher=rule"]) == {
        "resources": {"settings": {"config": {"rollout": {"attempts": 4},
                                              "guidance": {"kinds": ["plan", "action"], "teacher": "rule"}}}}}
    assert run_config(None, []) == {}
