"""Shared fixtures. Docker tests fail (never skip) when HANDHOLD_REQUIRE_DOCKER=1, as in CI."""

from __future__ import annotations

import gc
import os
import pickle
import sys
import threading
from pathlib import Path
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()

# Before anything loads torch's OpenMP: its threads sleep at a barrier instead of spinning. The suite's workers share
# two cores, where a spinning thread burns the CPU its sibling waits for: three tiny-model training steps at once took
# 1.6-2.6 CPU s a step spinning, 1.04-1.07 s sleeping (alone on the machine, sleeping costs a step ~15%).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from filelock import FileLock

from pipeline.core.records import Task
from pipeline.synthesis.packages import DEFAULT_PACKAGES
from pipeline.synthesis.synth import SynthConfig, synthesize

TOOLZ = DEFAULT_PACKAGES[0]  # the package CI synthesizes from: small, fast suite
# The files that take minutes, run first so that none is left running alone at the end of a parallel run (the
# Makefile passes --no-loadscope-reorder, so pytest-xdist keeps this order; each worker takes two files at the
# start). The first worker starts with the graph, whose `synth_run` synthesis keeps about one core busy for its
# first ~40 s: the second starts with files that need no synthesized task (package sources, then the automation's
# daemon ticks, mostly waiting, beside the graph's parallel rollouts) instead of waiting for it.
SLOW_FIRST = ("test_pipeline_assets.py", "test_package_sources.py", "test_celery.py", "test_automation.py",
              "test_closed_loop.py", "test_guidance.py", "test_redteam.py", "test_synth_kinds.py", "test_rollouts.py",
              "test_synth_and_grading.py", "test_answer_hidden.py", "test_ui.py", "test_training.py")
# The synthesis settings of the tests that materialize the graph: `synth_run`'s, cut to 2 tasks (see graph_cache)
GRAPH_SYNTH = {"packages": [TOOLZ.name], "tasks_per_package": 2, "candidates_per_package": 30}


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its own order


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, dagster, polars: ~375,000 objects) is never garbage: frozen,
    the collector skips it. A full collection in a worker took ~0.34 s, and the trainers (accelerate's
    `free_memory`) and pytest itself ask for them again and again."""
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def task_test_runs_use_this_venv_and_no_plugin_of_the_suite():
    """The local tasks' test runs (LocalSandbox: `python -m pytest` on the host) run this venv's Python, first on
    PATH, not whichever `python` the shell finds (a pyenv shim costs each run ~0.12 CPU s of bash before Python
    starts, and runs another interpreter's pytest), and load no plugin installed for the suite itself (xdist,
    timeout, anyio, platformdirs), as a task's image holds none: such a run starts in 0.42 s instead of 0.65. Set
    once the worker is up, so only the processes the tests start see it; a Docker sandbox takes nothing from this
    environment."""
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"


@pytest.fixture(scope="session")
def docker_client():
    """A client for a live engine; skips on a laptop without Docker, fails where it is required."""
    import docker

    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as exc:
        if os.environ.get("HANDHOLD_REQUIRE_DOCKER") == "1":
            pytest.fail(f"Docker engine required (HANDHOLD_REQUIRE_DOCKER=1) but none answers: {exc}")
        pytest.skip(f"no Docker engine answers: {exc}")
    return client


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    from sandbox.images import ensure_base_image

    return ensure_base_image(client=docker_client)


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory, worker_id) -> Path:
    """A folder every pytest-xdist worker of this run shares (the session's own one without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if worker_id != "master" else base


@pytest.fixture(scope="session")
def synth_run(base_image, docker_client, shared_dir, synth_cache):
    """Tasks synthesized from toolz: the real thing, cut small for CI; made once per run, whatever the workers."""
    cache = synth_cache
    config = SynthConfig(packages=(TOOLZ.name,), tasks_per_package=3,
                         candidates_per_package=GRAPH_SYNTH["candidates_per_package"])
    saved = shared_dir / "synth-run.pickle"
    with FileLock(str(shared_dir / "synth-run.lock")):
        if saved.exists():
            tasks, report = pickle.loads(saved.read_bytes())
        else:
            tasks, report = synthesize(config, base_image, cache, docker_client, rules=RULES)
            with open(saved, "wb") as f:
                _LocksAnew(f).dump((tasks, report))
    return tasks, report, config, cache


@pytest.fixture(scope="session")
def synth_cache(shared_dir) -> Path:
    """The cache_dir of `synth_run` and of the mutation kinds' synthesis: a cache is shared by design (tasks are
    kept per package and settings, each package locked while it is made), so toolz's sdist, wheels and build
    backend are fetched and built once for both."""
    cache = shared_dir / "synth-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(scope="session")
def tiny_model(shared_dir) -> Path:
    """The offline tiny model (training/tiny_model.py), built once per run for every worker: a build trains the
    tokenizer on this repository's text (~4 s). The tests only read it; each trains into its own folder."""
    from training.tiny_model import build_tiny_model

    with FileLock(str(shared_dir / "tiny-model.lock")):
        return build_tiny_model(shared_dir / "tiny-model" / "model")


@pytest.fixture(scope="session")
def graph_cache(synth_run) -> str:
    """The cache_dir of the tests that materialize the graph from synthesis (tests/test_pipeline_assets.py,
    tests/test_celery.py): `synth_run`'s, made before them. Their `tasks` asset asks for GRAPH_SYNTH, the same
    settings but 2 tasks, and reads the first 2 of its 3 instead of synthesizing toolz again."""
    return str(synth_run[3])


class _LocksAnew(pickle.Pickler):
    """Pickles a lock (the report's clock holds one) as a new lock."""

    def reducer_override(self, obj):
        return (threading.Lock, ()) if isinstance(obj, type(threading.Lock())) else NotImplemented


@pytest.fixture(scope="session")
def toolz_task(synth_run) -> Task:
    return synth_run[0][0]


@pytest.fixture
def online(monkeypatch):
    """The loopback Hub is reachable even where the environment sets HF_HUB_OFFLINE, and nothing else is
    asked: huggingface_hub otherwise fetches its agent-harness registry from huggingface.co (no token)."""
    import huggingface_hub.constants
    from huggingface_hub.utils import _detect_agent

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(_detect_agent, "_registry", {"standardEnvVars": [], "harnesses": {}}, raising=False)
