"""The data folder's layout: one owner of every path, and the typed readers name what to rematerialize."""

from __future__ import annotations

import pytest

from pipeline.core.layout import Layout, probe_batch
from pipeline.core.records import TASK_SCHEMA, TRAJECTORY_SCHEMA
from pipeline.core.store import RecordContractError, write_rows


def test_paths_sit_under_the_root_with_their_folders_made(tmp_path):
    layout = Layout(tmp_path / "data")
    assert layout.tasks() == tmp_path / "data" / "tasks" / "tasks.parquet" and layout.tasks().parent.is_dir()
    assert layout.trajectory_file("guided", "b1") == tmp_path / "data/trajectories/guided/b1/trajectories.parquet"
    assert layout.guidance("b1").parent.is_dir() and layout.export().name == "hf"
    assert probe_batch("b1") == "b1-probes"
    with pytest.raises(ValueError, match="unknown trajectory origin 'probe'; choose from"):
        layout.trajectories("probe", "b1")


def test_a_shared_cache_folder_is_locked_per_package_across_processes(tmp_path):
    import subprocess
    import sys

    from assets.resources import HandholdSettings
    from pipeline.synthesis.packages import package_lock

    shared = tmp_path / "cache"
    first, second = (HandholdSettings(data_dir=str(tmp_path / d), cache_dir=str(shared)).layout() for d in "ab")
    assert first.cache() == second.cache() == shared and first.tasks().parent == tmp_path / "a" / "tasks"
    assert Layout(tmp_path / "c").cache() == tmp_path / "c" / "cache"
    waits = [sys.executable, "-c", "import sys, pathlib; from pipeline.synthesis.packages import package_lock\n"
             f"with package_lock(pathlib.Path({str(shared)!r}), sys.argv[1]): print('got it')"]
    with package_lock(shared, "toolz"):
        other = subprocess.run([*waits, "boltons"], capture_output=True, text=True, timeout=60)
        assert other.stdout == "got it\n", other.stderr  # another package's lock is free
        held = subprocess.Popen([*waits, "toolz"], stdout=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            held.wait(timeout=2)  # the same package waits for this process
    assert held.communicate(timeout=60)[0] == "got it\n"


def test_batches_are_found_under_every_origin_and_files_in_order(tmp_path):
    layout = Layout(tmp_path)
    write_rows(layout.trajectory_file("unguided", "b2"), [], TRAJECTORY_SCHEMA)
    write_rows(layout.trajectory_file("guided", "b1"), [], TRAJECTORY_SCHEMA)
    probe = layout.trajectories("probes", "b1") / "task__1"
    write_rows(probe / "shards" / "0001.parquet", [], TRAJECTORY_SCHEMA)
    (tmp_path / "trajectories" / "unguided" / ".tmp").mkdir()  # a hidden folder is no batch
    assert layout.batch_names() == ["b1", "b2"]
    assert layout.batch_files("b1") == [layout.trajectory_file("guided", "b1"), probe / "shards" / "0001.parquet"]
    assert layout.batch_files("b1", include_probes=False) == [layout.trajectory_file("guided", "b1")]
    assert layout.trajectory_files() == [layout.trajectory_file("guided", "b1"), layout.trajectory_file("unguided", "b2")]


def test_readers_say_which_asset_to_materialize(tmp_path):
    layout = Layout(tmp_path)
    with pytest.raises(FileNotFoundError, match="materialize tasks"):
        layout.read_tasks()
    with pytest.raises(FileNotFoundError, match="materialize unguided_rollouts for batch b1"):
        layout.read_trajectories("unguided", "b1")
    write_rows(layout.tasks(), [], TRAJECTORY_SCHEMA)  # another record's file where tasks belong
    with pytest.raises(RecordContractError, match="rematerialize tasks"):
        layout.read_tasks()
    write_rows(layout.tasks(), [], TASK_SCHEMA)
    assert layout.read_tasks() == [] and layout.tasks_table().num_rows == 0
