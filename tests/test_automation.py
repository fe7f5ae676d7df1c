"""The nightly schedule and the new-task-source sensor (in Dagster's test contexts, and one real daemon tick), the
declarative automation after a batch (evaluated over an instance, and one real daemon tick), the freshness
policies, and the retries of infrastructure errors."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
import types
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import docker
import pytest
import yaml

from assets.definitions import definitions
from assets.partitions import AUTOMATION_INTERVAL_S, BATCHES, automation_sensor, batch_key, ensure_batch
from assets.resources import retry_on_infra
from pipeline.agent.policy import PolicyError
from sandbox.base import SandboxError

ROOT = Path(__file__).resolve().parents[1]
ROW = '{"instance_id": "x"}\n'
BATCH = ("sandbox_base_image", "task_sources", "environment_images", "tasks", "unguided_rollouts", "guidance",
         "guided_rollouts")
AFTER_BATCH = ("dpo_dataset", "actguide_dataset", "sft_dataset", "dataset_export", "hub_publication", "sft_model",
               "dpo_model", "actguide_model", "policy_evaluation")


@pytest.fixture
def defs():
    return definitions("local")


@pytest.fixture
def stack():
    with contextlib.ExitStack() as stack:
        yield stack


def test_the_nightly_schedule_adds_the_day_s_batch_and_runs_only_the_batch_stages(defs, stack):
    schedule = defs.resolve_schedule_def("nightly")
    assert schedule.cron_schedule == "0 2 * * *" and schedule.execution_timezone == "UTC"
    assert schedule.job_name == "batch" and schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert {k.to_user_string() for k in defs.resolve_job_def("batch").asset_layer.executable_asset_keys} == set(BATCH)
    instance = stack.enter_context(dg.instance_for_test())
    context = dg.build_schedule_context(instance=instance,
                                        scheduled_execution_time=datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc))
    request = schedule(context)
    assert (request.partition_key, request.run_key) == ("2026-12-01", "2026-12-01")
    assert instance.get_dynamic_partitions(BATCHES.name) == ["2026-12-01"]
    schedule(context)  # a retried tick adds nothing twice
    assert instance.get_dynamic_partitions(BATCHES.name) == ["2026-12-01"]


def test_a_row_file_dropped_in_incoming_gets_one_batch_of_its_own(defs, tmp_path, monkeypatch, stack):
    monkeypatch.setenv("HANDHOLD_DATA_DIR", str(tmp_path))
    sensor = defs.resolve_sensor_def("new_task_source")
    instance = stack.enter_context(dg.instance_for_test())
    result = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(result, dg.SkipReason) and "incoming" in result.skip_message
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    (incoming / "gym.jsonl").write_text(ROW)
    (incoming / "notes.txt").write_text("not rows")
    result = sensor(dg.build_sensor_context(instance=instance))
    (request,) = result.run_requests
    key = f"{batch_key()}-gym"
    assert request.partition_key == key
    assert request.run_config["resources"]["settings"]["config"]["sources"]["dataset"] == str(incoming / "gym.jsonl")
    assert result.dynamic_partitions_requests[0].partition_keys == [key]
    again = sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor))
    assert isinstance(again, dg.SkipReason)  # each file once
    time.sleep(0.01)
    (incoming / "gym.jsonl").write_text(ROW + ROW)  # a rewritten file is new again
    assert len(sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor)).run_requests) == 1


def test_one_real_daemon_tick_queues_a_run_for_a_new_source(tmp_path):
    """dagster-daemon evaluates the sensor in its own code server; the run it requests is queued (the queue
    launches nothing here), with its batch partition added."""
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    (home / "dagster.yaml").write_text("run_queue:\n  max_concurrent_runs: 0\ntelemetry:\n  enabled: false\n")
    (data / "incoming").mkdir(parents=True)
    (data / "incoming" / "swe.jsonl").write_text(ROW)
    env = {**os.environ, "DAGSTER_HOME": str(home), "HANDHOLD_DATA_DIR": str(data)}
    dagster = str(Path(sys.executable).with_name("dagster"))
    subprocess.run([dagster, "sensor", "start", "new_task_source", "-m", "assets.definitions"], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=120)
    daemon = _daemon(home, env)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            deadline = time.monotonic() + 120
            runs = []
            while time.monotonic() < deadline and not (runs and runs[0].status != dg.DagsterRunStatus.NOT_STARTED):
                time.sleep(2)
                runs = instance.get_runs()  # created NOT_STARTED, then submitted to the queue
            assert runs, "the daemon requested no run within 120 s"
            (run,) = runs
            key = f"{batch_key()}-swe"
            assert run.tags["dagster/partition"] == key and run.job_name == "batch"
            assert run.status == dg.DagsterRunStatus.QUEUED
            assert instance.get_dynamic_partitions(BATCHES.name) == [key]
    finally:
        _stop(daemon)


def test_everything_after_a_batch_carries_the_automation_and_its_sensor_is_off(defs):
    graph = defs.resolve_asset_graph()
    conditions = {key.to_user_string(): graph.get(key).automation_condition for key in graph.get_all_asset_keys()}
    assert {k for k, c in conditions.items() if c is not None} == set(AFTER_BATCH)
    assert all(conditions[k].get_label() == "after_new_batch" for k in AFTER_BATCH)
    sensor = defs.resolve_sensor_def("automation")
    assert isinstance(sensor, dg.AutomationConditionSensorDefinition)
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    assert {s.name: s.default_status for s in defs.sensors if s.name != "automation"} == {
        "new_task_source": dg.DefaultSensorStatus.STOPPED, "run_failure_report": dg.DefaultSensorStatus.STOPPED}


def _materialize_batch(instance: dg.DagsterInstance, key: str) -> None:
    """What a finished batch run leaves in the instance: its partition and its rollout stages' materializations."""
    ensure_batch(instance, key)
    for asset in ("unguided_rollouts", "guidance", "guided_rollouts"):
        instance.report_runless_asset_event(dg.AssetMaterialization(asset, partition=key))


def _requested(result) -> dict[str, int]:
    return {r.key.to_user_string(): r.true_subset.size for r in result.results if r.true_subset.size}


def test_a_materialized_batch_brings_everything_after_it_up_to_date(defs, stack):
    instance = stack.enter_context(dg.instance_for_test())
    ensure_batch(instance, "2026-11-30")  # a batch that failed and was never re-run: it holds nothing back
    quiet = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert quiet.total_requested == 0
    _materialize_batch(instance, "2026-12-01")
    night = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=quiet.cursor)
    assert _requested(night) == {key: 1 for key in AFTER_BATCH}  # the whole chain, in one tick
    settled = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=night.cursor)
    assert settled.total_requested == 0  # requested once, not again on the next tick


def test_the_export_and_the_evaluation_say_how_old_they_may_be(defs, tmp_path, monkeypatch):
    from assets.datasets import EXPORT_FRESHNESS
    from assets.training import EVALUATION_FRESHNESS
    from assets.instance import ensure_dagster_home

    graph = defs.resolve_asset_graph()
    policies = {k.to_user_string(): graph.get(k).freshness_policy for k in graph.get_all_asset_keys()
                if graph.get(k).freshness_policy is not None}
    assert set(policies) == {"dataset_export", "policy_evaluation"}
    assert policies["dataset_export"].fail_window.to_timedelta() == EXPORT_FRESHNESS == timedelta(hours=30)
    assert policies["policy_evaluation"].fail_window.to_timedelta() == EVALUATION_FRESHNESS
    assert all(p.warn_window.to_timedelta() < p.fail_window.to_timedelta() for p in policies.values())
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    home = ensure_dagster_home()
    assert yaml.safe_load((home / "dagster.yaml").read_text())["freshness"] == {"enabled": True}
    with dg.DagsterInstance.from_config(str(home)) as instance:  # Dagster takes the file as it is
        assert instance.freshness_enabled


def _daemon(home: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([str(Path(sys.executable).with_name("dagster-daemon")), "run", "-m", "assets.definitions"],
                            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _stop(daemon: subprocess.Popen) -> None:
    os.killpg(daemon.pid, signal.SIGTERM)
    try:
        daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()


def _wait(what: str, found, seconds: float = 150):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := found():
            return value
        time.sleep(2)
    raise AssertionError(f"{what} within {seconds} s")


def test_one_real_daemon_tick_of_the_switched_on_automation_requests_what_follows_a_batch(tmp_path):
    """The user switches the automation sensor on; after its first tick a batch finishes; the daemon's next tick
    queues one run of everything after it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("run_queue:\n  max_concurrent_runs: 0\ntelemetry:\n  enabled: false\n")
    # The sensor evaluates every 5 s instead of 30: the second tick, after the batch, comes sooner
    env = {**os.environ, "DAGSTER_HOME": str(home), "HANDHOLD_DATA_DIR": str(tmp_path / "data"),
           "HANDHOLD_AUTOMATION_INTERVAL_S": "5"}
    subprocess.run([str(Path(sys.executable).with_name("dagster")), "sensor", "start", "automation", "-m",
                    "assets.definitions"], cwd=ROOT, env=env, check=True, capture_output=True, timeout=120)
    daemon = _daemon(home, env)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            (state,) = [s for s in instance.all_instigator_state() if s.instigator_name == "automation"]
            ticks = lambda: instance.get_ticks(state.instigator_origin_id, state.selector_id)  # noqa: E731
            _wait("the automation sensor ticked", lambda: [t for t in ticks() if t.status.value != "STARTED"])
            assert not instance.get_runs()  # nothing before a batch
            _materialize_batch(instance, "2026-12-01")
            (run,) = _wait("the daemon requested a run", instance.get_runs)
            first, second = sorted(t.timestamp for t in ticks())[:2]
            assert second - first < 30, "the daemon's sensor kept its default interval"  # 10 s here
            assert {k.to_user_string() for k in run.asset_selection} == set(AFTER_BATCH)
            assert run.status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED)
    finally:
        _stop(daemon)


def test_the_automation_interval_is_read_from_the_environment_and_a_bad_one_is_named(monkeypatch):
    assert automation_sensor().minimum_interval_seconds == AUTOMATION_INTERVAL_S == 30
    monkeypatch.setenv("HANDHOLD_AUTOMATION_INTERVAL_S", "5")
    assert automation_sensor().minimum_interval_seconds == 5
    for bad in ("0", "five", "-3", "2.5"):
        monkeypatch.setenv("HANDHOLD_AUTOMATION_INTERVAL_S", bad)
        with pytest.raises(ValueError, match=f"HANDHOLD_AUTOMATION_INTERVAL_S={bad!r}: set a whole number"):
            automation_sensor()


@pytest.mark.parametrize("error, retried", [(SandboxError("container died"), True),
                                            (docker.errors.APIError("engine gone"), True),
                                            (PolicyError("model server down after retries"), True),
                                            (ValueError("a bad task row"), False)])
def test_only_infrastructure_errors_are_retried_with_backoff(error, retried):
    context = types.SimpleNamespace(retry_number=2, log=logging.getLogger("test"))
    with pytest.raises(dg.RetryRequested if retried else type(error)) as raised:
        with retry_on_infra(context, retries=3, first_wait=10):
            raise error
    if retried:
        assert (raised.value.max_retries, raised.value.seconds_to_wait) == (3, 40)  # 10 s, 20 s, 40 s
        assert raised.value.__cause__ is error


def test_a_new_batch_takes_the_tasks_its_policy_has_not_attempted_first(tmp_path):
    from assets.resources import HandholdSettings
    from assets.rollouts import rollout_tasks
    from pipeline.core.records import TASK_SCHEMA, TRAJECTORY_SCHEMA
    from pipeline.core.store import write_rows
    from tests.test_datasets_build import traj
    from tests.test_records import TASK

    settings = HandholdSettings(data_dir=str(tmp_path), rollout_tasks=3)
    rows = [dataclasses.replace(TASK, instance_id=f"{repo}-{i}", repo=repo).to_row()
            for i in range(3) for repo in ("a/x", "b/y")]
    write_rows(settings.layout().tasks(), rows, TASK_SCHEMA)
    assert [t.instance_id for t in rollout_tasks(settings, "heuristic", "b1")] == ["a/x-0", "b/y-0", "a/x-1"]
    old = [traj("r1", iid="a/x-0", batch="b0", policy="heuristic").to_row(),
           traj("r2", iid="b/y-0", batch="b0", policy="other").to_row()]
    write_rows(settings.layout().trajectory_file("unguided", "b0"), old, TRAJECTORY_SCHEMA)
    assert [t.instance_id for t in rollout_tasks(settings, "heuristic", "b1")] == ["b/y-0", "a/x-1", "b/y-1"]
    assert [t.instance_id for t in rollout_tasks(settings, "heuristic", "b0")] == ["a/x-0", "b/y-0", "a/x-1"]


def test_a_new_dataset_source_adds_its_tasks_without_revalidating_the_others(synth_run, tmp_path):
    from assets.environments import dataset_tasks
    from assets.resources import HandholdSettings

    settings = HandholdSettings(data_dir=str(tmp_path))
    first, second = synth_run[0][0], synth_run[0][1]
    broken = dataclasses.replace(second, instance_id="broken", patch="")  # an empty gold patch resolves nothing
    tasks, rejects, validated = dataset_tasks(settings, [first], workers=1)
    assert ([t.instance_id for t in tasks], rejects, validated) == ([first.instance_id], [], 1)
    tasks, rejects, validated = dataset_tasks(settings, [first], workers=1)  # the same source again: kept as is
    assert ([t.instance_id for t in tasks], validated) == ([first.instance_id], 0)
    tasks, rejects, validated = dataset_tasks(settings, [second, broken], workers=1)  # a new source adds its own
    assert sorted(t.instance_id for t in tasks) == sorted([first.instance_id, second.instance_id]) and validated == 2
    assert [r.item for r in rejects] == ["broken"]
    assert dataset_tasks(settings, [], workers=1)[0] == tasks  # a run without a source keeps every one
