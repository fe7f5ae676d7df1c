"""How row files are written (row groups, codec, dictionaries) and how a batch is streamed a run of tasks at a time."""

from __future__ import annotations

import random
from pathlib import Path

import datasets
import polars as pl
import pytest
import pyarrow.parquet as pq

from pipeline.datasets import DatasetConfig, build_rows, read_dataset, update_datasets
from pipeline.datasets import build, files
from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import as_arrow, export_dataset
from pipeline.datasets.files import DICTIONARY, TaskRuns, instance_ids, read_trajectories
from pipeline.core.layout import Layout
from pipeline.core.records import TRAJECTORY_SCHEMA
from pipeline.core.store import write_rows
from tests.test_datasets_build import TASK_T1, store_batch, traj

MANY = [traj(f"{i}-{s}", iid=f"repo__{i:02d}", reward=float(s == 0), sample=s)
        for i in range(12) for s in range(3)] + TASK_T1  # in name order; 12 tasks of 2 pairs each, and t1


def row_groups(path: str | Path) -> list[int]:
    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def dictionary_leaves(path: str | Path) -> set[str]:
    """Parquet columns (leaf paths) dictionary-encoded in the first row group."""
    group = pq.ParquetFile(path).metadata.row_group(0)
    return {group.column(i).path_in_schema for i in range(group.num_columns)
            if any("DICTIONARY" in e for e in group.column(i).encodings)}


def test_shards_are_zstd_in_bounded_row_groups_with_dictionaries_for_repeated_names_and_message_texts(
        tmp_path, monkeypatch):
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 5)
    store_batch(tmp_path / "data", "b1", MANY)
    update_datasets(tmp_path / "data", tmp_path / "out", DatasetConfig())
    shard = build.shard(tmp_path / "out", "dpo", "b1")
    assert row_groups(shard) == [5, 5, 5, 5, 5, 3]  # 28 pairs: 2 of each repo task, 4 of t1
    meta = pq.ParquetFile(shard).metadata
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}
    texts = {f"{column}.list.element.{leaf}" for column in ("prompt", "chosen", "rejected") for leaf in (
        "content", "tool_calls.list.element.function.arguments")}
    names = {"tools", "instance_id", "split", "batch", "chosen_source"}
    assert dictionary_leaves(shard) == names | texts and names <= set(DICTIONARY)
    assert set(files.dictionary_columns(build.SCHEMAS["dpo"])) == names | texts
    frame, _ = read_trajectories(Layout(tmp_path / "data").batch_files("b1"))
    assert read_dataset(tmp_path / "out", "dpo").equals(
        pl.from_arrow(build.rows_table(build_rows(frame, DatasetConfig()).dpo, build.SCHEMAS["dpo"])))


def test_shards_split_the_bytes_of_nested_floats_and_keep_no_min_max_of_message_texts(tmp_path):
    store_batch(tmp_path / "data", "b1", MANY)
    update_datasets(tmp_path / "data", tmp_path / "out", DatasetConfig())
    group = pq.ParquetFile(build.shard(tmp_path / "out", "actguide", "b1")).metadata.row_group(0)
    columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    split = {path for path, column in columns.items() if "BYTE_STREAM_SPLIT" in column.encodings}
    assert split == {"trajectories.list.element.reward", "trajectories.list.element.temperature",
                     "trajectories.list.element.top_p", "trajectories.list.element.logprobs.list.element.list.element"}
    unstated = {path for path, column in columns.items() if not (column.statistics and column.statistics.has_min_max)}
    texts = {path for path, column in columns.items() if "." in path and column.physical_type == "BYTE_ARRAY"}
    assert "trajectories.list.element.completion.list.element.content" in texts and texts <= unstated
    assert "instance_id" not in unstated and "trajectories.list.element.reward" not in unstated


@pytest.mark.parametrize("kind", list(build.SCHEMAS))
def test_shards_load_as_the_rows_built_whole_or_streamed(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 3)  # dictionaries span several row groups of a column
    store_batch(tmp_path / "data", "b1", MANY)
    update_datasets(tmp_path / "data", tmp_path / "out", DatasetConfig(test_fraction=0.3))
    frame, _ = read_trajectories(Layout(tmp_path / "data").batch_files("b1"))
    expected = build.rows_table(getattr(build_rows(frame, DatasetConfig(test_fraction=0.3)), kind), build.SCHEMAS[kind])
    assert expected.num_rows > 3 and pq.read_table(build.shard(tmp_path / "out", kind, "b1")).equals(expected)
    data_files = build.dataset_files(tmp_path / "out", kind)
    loaded = datasets.load_dataset("parquet", data_files=data_files, split="train", cache_dir=str(tmp_path / "c"))
    streamed = datasets.load_dataset("parquet", data_files=data_files, split="train", streaming=True)
    assert loaded.to_list() == list(streamed) == expected.to_pylist()


def test_an_export_loads_the_same_rows_and_features_from_bounded_row_groups(tmp_path, monkeypatch):
    store_batch(tmp_path / "data", "b1", MANY)
    update_datasets(tmp_path / "data", tmp_path / "out", DatasetConfig(test_fraction=0.3))
    dpo = read_dataset(tmp_path / "out", "dpo")
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 4)
    export_dataset(tmp_path / "export", {"dpo": dpo}, CardInfo(pretty_name="files test", run_id="b1"))
    loaded = datasets.load_dataset(str(tmp_path / "export"), "dpo", cache_dir=str(tmp_path / "cache"))
    assert set(loaded) == {"train", "test"}
    for split, ds in loaded.items():
        expected = as_arrow(dpo.filter(pl.col("split") == split))
        assert ds.features == datasets.Features.from_arrow_schema(expected.schema)
        assert ds.to_list() == expected.to_pylist()
        path = tmp_path / "export" / "data" / "dpo" / f"{split}-00000-of-00001.parquet"
        assert max(row_groups(path)) <= 4 and sum(row_groups(path)) == ds.num_rows > 4


def shuffled_batch(data: Path) -> list[Path]:
    """A batch whose compacted file lists tasks out of name order, plus a shard repeating one rollout."""
    attempts = MANY[:]
    random.Random(3).shuffle(attempts)
    store_batch(data, "b1", attempts)
    shard = data / "trajectories" / "unguided" / "b1" / "shards" / "u0.parquet"
    write_rows(shard, [traj("u0", batch="b1", sample=0, tag="again").to_row()], TRAJECTORY_SCHEMA)
    return Layout(data).batch_files("b1")


def test_each_run_gets_the_rows_a_whole_read_would_give_it_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "READ_ROWS", 2)
    paths = shuffled_batch(tmp_path)
    whole, _ = read_trajectories(paths)
    runs = build.task_chunks(whole, 7)
    ids, _ = instance_ids(paths)
    stream = TaskRuns(ids, runs)
    assert len(runs) > 3
    for i, run in enumerate(runs):
        assert stream.rows(i).equals(whole.filter(pl.col("instance_id").is_in(run)))


def test_files_in_name_order_hold_back_at_most_one_read(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "READ_ROWS", 4)
    store_batch(tmp_path, "b1", MANY)
    paths = Layout(tmp_path).batch_files("b1")
    ids, _ = instance_ids(paths)
    runs = build.task_chunks(pl.DataFrame({"instance_id": pl.concat(list(ids.values()))}), 6)
    stream = TaskRuns(ids, runs)
    for i in range(len(runs)):
        stream.rows(i)
        assert all(sum(h.height for h in f.held) < 4 for f in stream.files)


def test_a_file_found_corrupt_only_while_streaming_is_left_out_like_one_found_at_once(tmp_path):
    paths = shuffled_batch(tmp_path / "data")
    bad = paths[-1]
    meta = pq.ParquetFile(bad).metadata.row_group(0)
    messages = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema.startswith(
        "messages."))
    data = bytearray(bad.read_bytes())
    start = messages.data_page_offset + 40
    data[start:start + 200] = bytes(b ^ 0x5A for b in data[start:start + 200])
    bad.write_bytes(bytes(data))
    assert instance_ids([bad]) and len(instance_ids([bad])[0]) == 1  # its ids still read
    report = update_datasets(tmp_path / "data", tmp_path / "out", DatasetConfig(skip_bad_files=True))
    assert [s.path for s in report.skipped_files] == [str(bad)]
    assert ": corrupt Parquet data (" in report.skipped_files[0].reason
    bad.unlink()
    again = update_datasets(tmp_path / "data", tmp_path / "clean", DatasetConfig())
    assert report.rows == again.rows and report.dropped == again.dropped
    for kind in build.SCHEMAS:
        assert read_dataset(tmp_path / "out", kind).equals(read_dataset(tmp_path / "clean", kind))
