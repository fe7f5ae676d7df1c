"""The rollout job on Celery for real: Debian's redis-server on loopback as the broker, two Celery workers
(`dagster-celery worker start`), and two batch partitions of `rollouts_celery` run at once (`dagster job
execute`); both succeed, every step ran in a worker, and the steps spread over both workers.

Why two partitions at once: one run's three steps are a chain, so each could land on the same worker and
prove nothing. Each worker takes one step at a time and fetches a task only when free (`celery_config`),
so while one worker runs a step of batch a, a step submitted by batch b can only go to the other; the test
also checks that two steps on different workers overlapped in time. Every process started is stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import redis
import yaml

from assets.checks import ROLLOUT_CHECKS
from assets.graph import all_assets
from assets.partitions import ensure_batch
from assets.resources import Credentials, HandholdSettings
from assets.scaling import JOB, ROLLOUT_ASSETS, celery_config, rollouts_celery_job, worker_yaml
from tests.conftest import GRAPH_SYNTH
from tests.test_ui import free_port, poll, session_members, start, stop

REPO = Path(__file__).resolve().parent.parent
WORKERS = ("w1", "w2")
BATCHES = ("celery-a", "celery-b")
# tests/test_pipeline_assets.py's slice cut further to keep the test near three minutes (the stages themselves
# are the subject of other tests): one attempt per task, the teacher's plan as the only guidance (no prefix
# search), no re-validation of the stored tasks.
SETTINGS = dict(rollout_tasks=2, recheck_tasks=0, synth=GRAPH_SYNTH,
                rollout={"attempts": 1, "agent": {"max_steps": 30}},
                guidance={"compare_linear": False, "kinds": ["plan"]})
STEPS = sorted(key.to_user_string() for a in ROLLOUT_ASSETS for key in a.keys)
pytestmark = [pytest.mark.slow, pytest.mark.docker]


def stop_session(proc: subprocess.Popen) -> None:
    """SIGTERM every process of the session (`dagster-celery` waits on the `celery` it started, which does
    not hear a signal sent to its parent), then `stop`: SIGKILL what is left, and check nothing survives."""
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    stop(proc)


@pytest.fixture
def broker(tmp_path):
    """Debian's redis-server on a free loopback port, nothing persisted; its URL. Fails (never skips) when
    it is not installed."""
    server = shutil.which("redis-server")
    if not server:
        pytest.fail("tests/test_celery.py needs Debian's redis-server as the Celery broker: `make redis` "
                    "installs it (as root), or `apt-get install redis-server`.")
    port, log = free_port(), tmp_path / "redis.log"
    proc = start([server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                  "--dir", str(tmp_path)], log)
    try:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

        def answers():
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
            try:
                return client.ping()
            except redis.exceptions.ConnectionError:
                return False

        poll("answer from redis-server", answers, timeout=30, every=0.2)
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_session(proc)


@pytest.fixture
def instance(tmp_path, monkeypatch) -> dg.DagsterInstance:
    """A persistent instance (the Celery executor needs one the workers can open): SQLite in DAGSTER_HOME
    under tmp_path, its storage created here, before two workers would race to create it."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return dg.DagsterInstance.get()


@pytest.fixture
def workers(broker, instance, tmp_path):
    """Two Celery workers, `w1@host` and `w2@host`, started as a user would start them; their logs."""
    config = tmp_path / "celery.yaml"
    config.write_text(yaml.safe_dump(worker_yaml(broker)))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    procs, logs = [], {}
    try:
        for name in WORKERS:
            logs[name] = tmp_path / f"{name}.log"
            procs.append(start([str(Path(sys.executable).parent / "dagster-celery"), "worker", "start",
                                "-A", "dagster_celery.app", "-y", str(config), "-n", name, "-l", "INFO"],
                               logs[name], cwd=REPO, env=env))
        yield logs
    finally:
        for proc in procs:
            stop_session(proc)


def celery_app(broker: str):
    from dagster_celery.executor import CeleryExecutor
    from dagster_celery.make_app import make_app

    return make_app(CeleryExecutor.for_cli(**celery_config(broker)).app_args())


def wait_for_workers(broker: str, logs: dict[str, Path]) -> set[str]:
    """The full names of the workers once each answers a ping over the broker."""
    app = celery_app(broker)

    def answered():
        names = {name for reply in app.control.ping(timeout=1.0) for name in reply}
        return names if {n.split("@")[0] for n in names} >= set(WORKERS) else None

    return poll("ping answer from both workers", answered, timeout=120, every=1,
                detail=lambda: "\n".join(f"--- {n}\n{p.read_text()[-2000:]}" for n, p in logs.items()))


def steps_by_worker(instance: dg.DagsterInstance, run_id: str) -> dict[str, tuple[str, int, float, float]]:
    """Each step of a run: the Celery worker that ran it, the pid of the step, its start and end (s)."""
    worker, pid, start_at, end_at = {}, {}, {}, {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None or event.step_key is None:
            continue
        if event.is_engine_event and "Celery worker" in event.engine_event_data.metadata:
            worker[event.step_key] = event.engine_event_data.metadata["Celery worker"].value
        elif event.is_step_start:
            pid[event.step_key], start_at[event.step_key] = event.pid, entry.timestamp
        elif event.is_step_success:
            end_at[event.step_key] = entry.timestamp
    return {step: (worker.get(step), pid.get(step), start_at.get(step), end_at.get(step)) for step in pid}


def run_batches(run_config: dict, tmp_path: Path) -> dict[str, tuple[subprocess.Popen, Path]]:
    """Each batch's run launched as a user would from a shell, all at once: `dagster job execute` loads the
    job by module name, which is how the workers load it too."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config))
    runs = {}
    for batch in BATCHES:
        log = tmp_path / f"run-{batch}.log"
        runs[batch] = start([sys.executable, "-m", "dagster", "job", "execute", "-m", "assets.scaling",
                             "-a", rollouts_celery_job.__name__, "-c", str(config),
                             "--tags", json.dumps({"dagster/partition": batch})], log, cwd=REPO), log
    return runs


def test_rollout_partitions_spread_over_two_celery_workers(base_image, graph_cache, broker, instance, workers,
                                                            tmp_path):
    began = time.time()
    values = dict(SETTINGS, data_dir=str(tmp_path / "data"), cache_dir=graph_cache)
    prepared = dg.materialize(all_assets, selection=["sandbox_base_image", "task_sources", "environment_images",
                                                      "tasks"], instance=instance,
                              resources={"settings": HandholdSettings(**values), "credentials": Credentials()})
    assert prepared.success
    prepared_s = time.time() - began
    names = wait_for_workers(broker, workers)

    for batch in BATCHES:
        ensure_batch(instance, batch)
    runs = run_batches({"resources": {"settings": {"config": values}}, "execution": {"config": {"broker": broker}}},
                       tmp_path)
    try:
        for proc, _ in runs.values():
            proc.wait(timeout=600)
    finally:
        for proc, _ in runs.values():
            stop_session(proc)
    ran_s = time.time() - began - prepared_s
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                     for p in [*workers.values(), *(log for _, log in runs.values())])
    records = {r.tags["dagster/partition"]: r for r in instance.get_runs(dg.RunsFilter(job_name=JOB))}
    assert sorted(records) == sorted(BATCHES), logs
    for batch, run in records.items():
        assert run.status == dg.DagsterRunStatus.SUCCESS, f"{batch}: {run.status}\n{logs}"

    steps = {(batch, step): where for batch, run in records.items()
             for step, where in steps_by_worker(instance, run.run_id).items()}
    print(f"prepared in {prepared_s:.0f} s, ran both batches in {ran_s:.0f} s; steps: "
          + "; ".join(f"{b}/{s} on {w} pid {p} {t0 - began:.0f}-{t1 - began:.0f} s"
                      for (b, s), (w, p, t0, t1) in sorted(steps.items())))
    assert sorted(steps) == sorted((batch, step) for batch in BATCHES for step in STEPS)
    assert {w for w, *_ in steps.values()} == names, "every step ran in a worker, and both workers ran steps"
    orchestrators = {proc.pid for proc, _ in runs.values()}
    assert not orchestrators & {p for _, p, *_ in steps.values()}, "no step ran in a run's own process"
    overlapping = [(a, b) for a, (wa, _, sa, ea) in steps.items() for b, (wb, _, sb, eb) in steps.items()
                   if wa < wb and sa < eb and sb < ea]
    assert overlapping, "two steps ran at the same time on different workers"

    for batch, run in records.items():  # what the steps wrote, read back
        unguided = pl.read_parquet(tmp_path / f"data/trajectories/unguided/{batch}/trajectories.parquet")
        assert unguided.height == 2 and set(unguided["batch"]) == {batch}
        assert (tmp_path / f"data/trajectories/guided/{batch}/trajectories.parquet").exists()
        checks = [e.dagster_event.event_specific_data.passed for e in instance.all_logs(
            run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)]
        assert len(checks) == len(ROLLOUT_CHECKS) * 2 and all(checks), f"{batch}: {checks}"
