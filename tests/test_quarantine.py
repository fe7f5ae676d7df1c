"""Tasks that stay sound over time (issue 23, section 2B): re-validations recorded per run, unsound tasks
quarantined, and the quarantine obeyed by rollout planning, the datasets and the card; real Parquet."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest

from pipeline.datasets import read_dataset, update_datasets
from pipeline.datasets.card import CardInfo
from pipeline.datasets.config import DatasetConfig
from pipeline.datasets.export import export_dataset
from pipeline.core.records import TASK_SCHEMA
from pipeline.core.store import write_rows
from pipeline.tasks.flakiness import (RewardMismatch, TaskRecheck, flakiness, left_out, quarantined, read_rechecks,
                                      record_rechecks, rollout_records, task_table, validation_record)
from pipeline.tasks.validate import recheck_task
from pipeline.verifier.environment import LocalTaskSandboxes

from tests.test_datasets_build import OTHERS, TASK_T1, store_batch, traj
from tests.test_package_sources import calc_task, flaky_repo
from tests.test_records import TASK
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()


def report(passed: list[str], failed: list[str]) -> str:
    return json.dumps({"FAIL_TO_PASS": {"success": passed, "failure": failed}})


def record(task: str, run: str, at: float, runs: int = 2, split: int = 0, gold: int = 2, empty: bool = False,
           source: str = "tasks_validate") -> TaskRecheck:
    return TaskRecheck(task, run, source, runs, split, gold, empty, f"evidence of {task} in {run}", at)


def test_a_validation_record_counts_the_runs_that_disagree_with_the_commonest_verdict():
    # three gold runs: test_b fails on the second only (that run is not resolved); the empty patch fails both
    golds = [(True, report(["a", "b"], [])), (False, report(["a"], ["b"])), (True, report(["b", "a"], []))]
    got = validation_record("t1", "night-1", golds, (False, report([], ["a", "b"])), now=5.0)
    assert got == TaskRecheck("t1", "night-1", "tasks_validate", 3, 1, 2, False, "b passed 2/3", 5.0)
    never = validation_record("t1", "n", [(False, report([], ["a"]))] * 2, (True, report(["a"], [])), now=1.0)
    assert (never.runs, never.disagreements, never.gold_resolved, never.empty_resolved) == (2, 0, 0, True)
    assert never.evidence == "never passed: a; the empty patch resolved it"


def test_a_batch_records_the_tasks_it_graded_inconsistently():
    attempts = [traj("r1", iid="t1", reward=1.0, patch="p"), traj("r2", iid="t1", patch="p"),
                traj("r3", iid="t1", reward=1.0, patch="p"),  # same patch: 2 resolved, 1 not
                traj("r4", iid="t2", reward=1.0, patch="q"), traj("r5", iid="t2", reward=1.0, patch="q"),
                traj("r6", iid="t3", patch="s"), traj("r7", iid="t3", patch="s", infra_error="docker"),
                traj("r8", iid="t4", reward=1.0, patch="u")]
    mismatch = [RewardMismatch("r8", 1.0, 0.0, "tests_failed")]
    got = rollout_records(attempts, mismatch, "b7", now=3.0)
    assert [(r.instance_id, r.runs, r.disagreements, r.gold_resolved, r.source) for r in got] == [
        ("t1", 3, 1, -1, "rollouts"), ("t4", 2, 1, -1, "rollouts")]  # t2 agreed; t3's second grade had no verdict
    assert got[0].evidence == "same patch, resolved in r1, r3; not in r2"
    assert got[1].evidence == "r8: stored reward 1.0, re-graded 0.0 (tests_failed)"


RECORDS = [
    record("gold", "n1", 1.0), record("gold", "n2", 2.0, gold=0),  # resolved on n1, on no run of n2
    record("empty", "n2", 2.0, empty=True),
    record("wavering", "n1", 1.0, split=1, gold=1), record("wavering", "n3", 3.0, gold=0),  # the first one counts
    record("rolled", "b4", 4.0, runs=3, split=1, gold=-1, source="rollouts"),
    record("sound", "n1", 1.0), record("sound", "n2", 2.0, runs=3, gold=3),
]


def test_each_reason_quarantines_from_the_first_record_that_gives_it(tmp_path):
    record_rechecks(tmp_path, "n1", "tasks_validate", [r for r in RECORDS if r.run_id == "n1"])
    record_rechecks(tmp_path, "n2", "tasks_validate", [r for r in RECORDS if r.run_id == "n2"])
    record_rechecks(tmp_path, "n3", "tasks_validate", [r for r in RECORDS if r.run_id == "n3"])
    record_rechecks(tmp_path, "b4", "rollouts", [r for r in RECORDS if r.run_id == "b4"])
    stored = read_rechecks(tmp_path)
    assert sorted(stored, key=repr) == sorted(RECORDS, key=repr)  # through Parquet and back
    held = quarantined(stored)
    assert {t: (q.run_id, q.reason) for t, q in held.items()} == {
        "gold": ("n2", "gold_stopped_resolving"), "empty": ("n2", "empty_patch_passes"),
        "wavering": ("n1", "tests_disagree"), "rolled": ("b4", "tests_disagree")}
    assert held["gold"].evidence == "evidence of gold in n2"
    assert set(quarantined(stored, readmit=("gold", "rolled"))) == {"empty", "wavering"}


def test_the_flakiness_columns_and_the_disagreement_filter():
    rates = {r["instance_id"]: (r["recheck_runs"], r["recheck_disagreements"], r["recheck_disagreement_rate"])
             for r in flakiness(RECORDS).iter_rows(named=True)}
    assert rates["wavering"] == (4, 1, 0.25) and rates["rolled"] == (3, 1, 1 / 3) and rates["sound"] == (5, 0, 0.0)
    assert left_out(RECORDS, (), 1.0) == {"gold": "quarantined: gold_stopped_resolving",
                                          "empty": "quarantined: empty_patch_passes",
                                          "wavering": "quarantined: tests_disagree",
                                          "rolled": "quarantined: tests_disagree"}
    readmitted = left_out(RECORDS, ("wavering", "rolled"), 0.3)
    assert readmitted["rolled"] == "disagreement rate 0.33 > 0.3" and "wavering" not in readmitted  # 0.25 <= 0.3
    assert "sound" not in left_out(RECORDS, (), 0.0)


def test_a_recheck_of_a_task_whose_test_flakes_records_the_disagreement(tmp_path):
    repo = flaky_repo(tmp_path / "calc", tmp_path / "counter")
    task = calc_task(repo, "tests/test_calc.py::test_add tests/test_calc.py::test_flaky")
    got = recheck_task(task, "night-9", runs=3, sandboxes=LocalTaskSandboxes({"local/calc": str(repo)}), rules=RULES)
    assert (got.runs, got.disagreements, got.gold_resolved, got.empty_resolved) == (3, 1, 2, False), got
    assert got.evidence == "tests/test_calc.py::test_flaky passed 2/3"
    assert quarantined([got])["calc__1"].reason == "tests_disagree"


@pytest.fixture
def settings(tmp_path):
    from assets.resources import HandholdSettings

    settings = HandholdSettings(data_dir=str(tmp_path), rollout_tasks=0)
    rows = [dataclasses.replace(TASK, instance_id=iid, repo="a/x").to_row() for iid in ("t1", "t2", "t5")]
    write_rows(settings.layout().tasks(), rows, TASK_SCHEMA)
    record_rechecks(settings.layout().rechecks(), "n1", "tasks_validate",
                    [record("t1", "n1", 1.0, split=1, gold=1), record("t2", "n1", 1.0)])
    return settings


def test_rollout_planning_skips_quarantined_tasks_until_readmitted(settings):
    from assets.resources import HandholdSettings
    from assets.rollouts import attemptable, quarantine, rollout_tasks

    assert [t.instance_id for t in rollout_tasks(settings, "heuristic", "b1")] == ["t2", "t5"]
    assert list(quarantine(settings)) == ["t1"] and list(attemptable(settings)) == ["t2", "t5"]  # guidance's tasks
    record_rechecks(settings.layout().rechecks(), "b1", "rollouts", [record("t5", "b1", 2.0, split=1, gold=-1,
                                                                            source="rollouts")])
    assert list(attemptable(settings)) == ["t2"]  # the batch's own grades quarantine it before its guidance
    back = HandholdSettings(data_dir=settings.data_dir, rollout_tasks=0, quarantine={"readmit": ["t1"]})
    assert [t.instance_id for t in rollout_tasks(back, "heuristic", "b1")] == ["t1", "t2"]


T5 = [traj("x0", iid="t5"), traj("x1", iid="t5", reward=1.0, sample=1)]


def test_the_datasets_leave_a_quarantined_tasks_rows_out_from_then_on(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    store_batch(data, "b1", TASK_T1 + OTHERS + T5)
    before = update_datasets(data, out, DatasetConfig())
    assert set(read_dataset(out, "dpo")["instance_id"]) == {"t1", "t5"}
    assert set(read_dataset(out, "sft")["instance_id"]) >= {"t1", "t5"}
    gone = left_out([record("t1", "n1", 1.0, gold=0)], (), 1.0)
    after = update_datasets(data, out, DatasetConfig(), left_out=gone)
    assert after.built == ["b1"] and after.dropped["task_left_out"] == len(TASK_T1)
    for kind in ("dpo", "sft", "actguide"):
        assert "t1" not in set(read_dataset(out, kind)["instance_id"]), kind
    assert set(read_dataset(out, "dpo")["instance_id"]) == {"t5"}
    assert update_datasets(data, out, DatasetConfig(), left_out=gone).built == []  # same quarantine: reused
    again = update_datasets(data, out, DatasetConfig(), left_out={})  # re-admitted: rebuilt with its rows
    assert again.built == ["b1"] and again.rows == before.rows


def test_the_card_lists_the_quarantine_and_the_tasks_table_carries_the_flakiness(tmp_path):
    tasks = pl.DataFrame([dataclasses.replace(TASK, instance_id=i).to_row() for i in ("gold", "sound", "new")])
    table = task_table(tasks, RECORDS)
    columns = table.select("instance_id", "recheck_runs", "recheck_disagreements", "quarantine_reason").rows()
    assert sorted(columns) == [("gold", 4, 0, "gold_stopped_resolving"), ("new", 0, 0, ""), ("sound", 5, 0, "")]
    dpo = pl.DataFrame({"prompt": ["p"], "chosen": ["c"], "rejected": ["r"], "instance_id": ["t5"], "split": ["train"]})
    held = tuple(quarantined(RECORDS).values())
    export_dataset(tmp_path / "hf", {"dpo": dpo, "tasks": table}, CardInfo("t", "b1", quarantine=held))
    card = (tmp_path / "hf" / "README.md").read_text()
    section = card.split("## Quarantined tasks", 1)[1].split("\n## ", 1)[0]
    assert "| gold | n2 | gold_stopped_resolving | evidence of gold in n2 |" in section
    assert "| wavering | n1 | tests_disagree |" in section and "sound" not in section
    export_dataset(tmp_path / "none", {"dpo": dpo}, CardInfo("t", "b1"))
    assert "(no task is quarantined)" in (tmp_path / "none" / "README.md").read_text()
