"""`handhold run` / `status` against a temporary DAGSTER_HOME, its exit codes, and the instance config it
writes (the `sandboxes` pool capped)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.storage.dagster_run import DagsterRun

from assets.cli import main
from assets.instance import (POOL, UsageError, ensure_dagster_home, instance_with_pool_limit, owner_tags,
                               release_dead_runs)

# task_sources with no package and no dataset: a real materialization that needs neither network nor Docker
CHEAP = ["--select", "task_sources", "--set", "synth.packages=[]"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HANDHOLD_SANDBOX_POOL_LIMIT", raising=False)
    return tmp_path / "home"


def test_run_materializes_the_selection_and_status_reports_it(home, tmp_path, capsys):
    assert main(["run", *CHEAP, "--set", f"data_dir={tmp_path / 'data'}"]) == 0
    out = capsys.readouterr().out
    assert "[....................] 0/1  task_sources started" in out
    assert "[####################] 1/1  task_sources succeeded" in out
    assert "task_sources  succeeded  dataset_rows=0 dataset_rejects=0" in out
    assert (tmp_path / "data/sources/dataset_tasks.parquet").is_file()
    instance = dg.DagsterInstance.from_config(str(home))
    [run] = instance.get_runs()
    assert run.status == dg.DagsterRunStatus.SUCCESS and run.asset_selection == {dg.AssetKey("task_sources")}
    assert instance.get_latest_materialization_event(dg.AssetKey("task_sources")).run_id == run.run_id

    assert main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    [sources] = [line for line in lines if line.split()[:1] == ["task_sources"]]
    assert sources.endswith("dataset_rows=0 dataset_rejects=0")
    assert [line.split()[1] for line in lines if line.split()[:1] == ["tasks"]] == ["never"]
    assert f"latest run {run.run_id[:8]} (main): success" in "\n".join(lines)
    assert f"pool {POOL}: limit 2, 0 in use, 0 waiting" in lines


def test_a_failed_step_exits_1_and_says_what_failed(home, tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("data_dir must be a folder")
    code = main(["run", "--select", "key:task_sources+1", "--set", "synth.packages=[]", "--set", f"data_dir={blocker}"])
    out = capsys.readouterr().out
    assert code == 1
    assert "1/2  task_sources FAILED" in out
    assert "task_sources        FAILED" in out and "environment_images  not run" in out
    assert "\nFAILED task_sources: " in out


@pytest.mark.parametrize("args, message", [
    (["run", "--select", "nope"], "the assets: sandbox_base_image, task_sources, environment_images"),
    (["run", "--select", "key:nope"], "selects no asset"),
    (["run", "--select", "tasks or"], "a Dagster asset selection, e.g. 'key:tasks+'"),
    (["run", "--set", "rollout.atempts=3"], "unknown setting 'rollout.atempts'"),
    (["run", "--set", "rollout.attempts"], "expected key=value"),
    (["run", "--config", "missing.yaml"], "missing.yaml: no such settings file"),
    (["status", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_usage_exits_2_before_anything_runs(home, capsys, args, message):
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not home.exists()


def test_the_installed_command_exits_2_on_an_unknown_asset(home):
    done = subprocess.run([str(Path(sys.executable).parent / "handhold"), "run", "--select", "dpo_modle"],
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "--select 'dpo_modle'" in done.stderr and "dpo_model" in done.stderr


def test_dagster_yaml_caps_the_sandboxes_pool(home, monkeypatch):
    monkeypatch.setenv("HANDHOLD_SANDBOX_POOL_LIMIT", "3")
    ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    assert instance.event_log_storage.get_concurrency_info(POOL).limit == 3
    # What every executor does before a step of the pool: the fourth step at once waits.
    with InstanceConcurrencyContext(instance, DagsterRun(job_name="main", run_id="r1")) as steps:
        assert [steps.claim(POOL, f"step{i}") for i in range(4)] == [True, True, True, False]

    monkeypatch.setenv("HANDHOLD_SANDBOX_POOL_LIMIT", "1")  # handhold's own file is brought up to date
    ensure_dagster_home()
    assert "default_limit: 1\n" in (home / "dagster.yaml").read_text()
    instance = instance_with_pool_limit()
    assert instance.event_log_storage.get_concurrency_info(POOL).limit == 1
    with InstanceConcurrencyContext(instance, DagsterRun(job_name="main", run_id="r2")) as steps:
        assert [steps.claim(POOL, f"step{i}") for i in range(2)] == [False, False]  # r1 holds 3 claims


def test_a_dagster_yaml_of_ones_own_is_left_alone(home, monkeypatch, capsys):
    home.mkdir()
    mine = "telemetry:\n  enabled: true\n"
    (home / "dagster.yaml").write_text(mine)
    ensure_dagster_home()
    assert (home / "dagster.yaml").read_text() == mine
    assert f"dagster instance concurrency set {POOL} N" in capsys.readouterr().err
    monkeypatch.setenv("HANDHOLD_SANDBOX_POOL_LIMIT", "none")
    with pytest.raises(UsageError, match="HANDHOLD_SANDBOX_POOL_LIMIT='none'"):
        ensure_dagster_home()


HOLDS_A_SLOT = """
import sys, time
import dagster as dg
from assets.instance import POOL, instance_with_pool_limit, owner_tags

@dg.op(pool=POOL)
def sandbox_step():
    print("claimed", flush=True)
    time.sleep(600)

@dg.job
def holder():
    sandbox_step()

holder.execute_in_process(instance=instance_with_pool_limit(), tags=owner_tags())
"""


def test_a_killed_run_gives_its_pool_slots_back(home, tmp_path, capsys):
    ensure_dagster_home()
    child = subprocess.Popen([sys.executable, "-c", HOLDS_A_SLOT], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parent.parent)
    try:
        assert child.stdout.readline().strip() == "claimed"
    finally:
        child.kill()  # SIGKILL: nothing in the process gets to free its slot
        child.wait()
    instance = dg.DagsterInstance.get()
    [run] = instance.get_runs()
    assert run.status == dg.DagsterRunStatus.STARTED
    assert instance.event_log_storage.get_concurrency_info(POOL).active_slot_count == 1

    assert main(["status"]) == 0
    captured = capsys.readouterr()
    assert f"run {run.run_id[:8]} lost its process: marked failed" in captured.err
    assert f"pool {POOL}: limit 2, 0 in use, 0 waiting" in captured.out.splitlines()
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE


def test_a_live_run_keeps_its_slots(home):
    ensure_dagster_home()
    instance = instance_with_pool_limit()
    run = instance.run_storage.add_run(DagsterRun(job_name="main", run_id="alive", status=dg.DagsterRunStatus.STARTED,
                                                  tags=owner_tags()))
    with InstanceConcurrencyContext(instance, run) as steps:
        assert steps.claim(POOL, "step")
    assert release_dead_runs(instance) == []
    assert instance.event_log_storage.get_concurrency_info(POOL).active_slot_count == 1
    assert instance.get_run_by_id("alive").status == dg.DagsterRunStatus.STARTED


def test_status_shows_the_rounds_lineage_the_latest_rollouts_recorded(home, capsys):
    from pipeline.rollouts.round_report import lineage_markdown
    from pipeline.rollouts.rounds import RoundOutcome, RoundRecord, TrainedBy

    made = TrainedBy("sft", "b0", 0, "data/models/sft/b0/checkpoint", "base", "b0", "ab" * 32)
    rounds = [RoundRecord("b0", 0, "heuristic", outcome=RoundOutcome(True)),
              RoundRecord("b1", 1, "hf", "data/models/sft/b0/checkpoint", "sha256:" + "cd" * 32, trained_by=made,
                          outcome=RoundOutcome(True, ("t1", "t2"), ("t2",)))]
    ensure_dagster_home()
    instance_with_pool_limit().report_runless_asset_event(dg.AssetMaterialization(
        "unguided_rollouts", metadata={"lineage": dg.MetadataValue.md(lineage_markdown(rounds))}))
    assert main(["status"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("rounds (as of the latest unguided_rollouts):")
    assert out[at + 1:at + 5] == [
        "  | batch | round | policy | weights | trained by | on dataset | solved without guidance |",
        "  |---|---|---|---|---|---|---|",
        "  | b0 | 0 | heuristic | - | - | - | - |",
        "  | b1 | 1 | hf data/models/sft/b0/checkpoint | sha256:cdcdcdcdcdcd | sft in b0 (round 0) | b0 (abababababab) "
        "| 1/2 (50%) |"]
