"""Releases of the exported dataset (issue 23): each a folder named by its batch and a tag on a loopback Hub,
its card saying what changed; an unchanged export makes no release and no commit; a release loads by its tag
unchanged by later nights. Real Parquet, real HTTP, the real Dagster assets over two simulated nights."""

from __future__ import annotations

import dataclasses
import json
import logging

import dagster as dg
import datasets
import huggingface_hub.constants
import polars as pl
import pytest

from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset
from pipeline.datasets.publish import PublishConfig, PublishError, publish_dataset
from pipeline.datasets.release import (Provenance, Release, RowChange, cut_release, dataset_identity, releases,
                                       row_changes)
from pipeline.core.records import TASK_SCHEMA
from pipeline.core.store import write_rows
from pipeline.tasks.flakiness import record_rechecks

from tests.hub_loopback import HubServer
from tests.test_datasets_build import OTHERS, TASK_T1, store_batch, traj
from tests.test_datasets_publish import TOKEN, _tables
from tests.test_quarantine import record
from tests.test_records import TASK

REPO = "handhold/nightly"


def test_rows_added_and_removed_are_counted_by_content():
    before = {"dpo": {"train": ["a", "b", "c"], "test": ["t"]}, "sft": {"train": ["s"]}}
    after = {"dpo": {"train": ["b", "c", "d", "e"], "test": ["t"]}, "tasks": {"train": ["x"]}}
    assert row_changes(before, after) == (
        RowChange("dpo", "test", 1, 0, 0), RowChange("dpo", "train", 4, 2, 1),
        RowChange("sft", "train", 0, 0, 1), RowChange("tasks", "train", 1, 1, 0))


def _export(folder, tables, batch="b1"):
    export_dataset(folder, tables, CardInfo("handhold test", run_id=batch, repo_id=REPO))
    return folder


def _fewer_rows() -> dict:
    """The test tables with dpo/train's second row gone, and a task added with an attempt and a table row."""
    tables = _tables()
    tables["dpo"]["train"] = tables["dpo"]["train"].filter(pl.col("instance_id") != "toolz-2")
    tables["tasks"] = pl.concat([pl.from_arrow(tables["tasks"]), pl.DataFrame({"instance_id": ["e"],
                                                                               "provenance": ["{}"]})])
    trajectories = tables["trajectories"]
    tables["trajectories"] = pl.concat([trajectories, trajectories.tail(1).with_columns(instance_id=pl.lit("e"))])
    return tables


def test_a_release_is_made_only_when_the_rows_change(tmp_path, caplog):
    export, root = tmp_path / "hf", tmp_path / "releases"
    first = cut_release(_export(export, _tables(), "b1"), root, Provenance("b1", code_version="git abc"))
    assert first.new and first.release.name == "b1" and first.release.previous == ""
    assert (root / "b1" / "data/dpo/train-00000-of-00001.parquet").is_file()
    assert Release.read(export) == first.release == Release.read(root / "b1")
    assert first.release.families == {"guided:action": {"dpo": 1}, "guided:plan": {"dpo": 2, "sft": 2},
                                      "unguided": {"dpo": 1}, "guided:hindsight": {"sft": 1}}
    caplog.set_level(logging.INFO, logger="pipeline")
    same = cut_release(_export(export, _tables(), "b2"), root, Provenance("b2"))
    assert not same.new and same.release.name == "b1" and "identical to release b1" in caplog.text
    assert "run `b1`" in (export / "README.md").read_text()  # the folder is the standing release again
    second = cut_release(_export(export, _fewer_rows(), "b3"), root, Provenance("b3", quarantined=("c",), repo_id=REPO))
    assert (second.release.name, second.release.previous) == ("b3", "b1")
    assert RowChange("dpo", "train", 2, 0, 1) in second.release.changes
    assert RowChange("tasks", "train", 4, 1, 0) in second.release.changes
    assert (second.release.tasks_added, second.release.newly_quarantined) == (("e",), ("c",))
    rerun = cut_release(_export(export, _tables(), "b3"), root, Provenance("b3"))  # the batch again, other rows
    assert rerun.release.name == "b3.2" and [r.name for r in releases(root)] == ["b1", "b3", "b3.2"]
    card = (root / "b3" / "README.md").read_text()
    assert "## Release `b3`" in card and "since release `b1`" in card
    assert "| dpo | train | 2 | 0 | 1 |" in card and "Tasks added: 1 (`e`)" in card
    assert "Tasks quarantined since the previous release: 1 (`c`)" in card
    assert 'load_dataset("handhold/nightly", "dpo", revision="b3")' in card
    assert card.index("## Release") < card.index("## Rows")


def test_a_batch_that_cannot_name_a_tag_is_refused(tmp_path):
    with pytest.raises(ValueError, match="batch 'night 1/2' cannot name a release"):
        cut_release(_export(tmp_path / "hf", _tables()), tmp_path / "r", Provenance("night 1/2"))


def test_dataset_identity_names_the_release_or_the_local_build(tmp_path):
    export = _export(tmp_path / "hf", _tables())
    local = dataset_identity(export)
    assert local["dataset_release"] == "" and len(local["dataset_sha256"]) == 64
    made = cut_release(export, tmp_path / "r", Provenance("b1")).release
    assert dataset_identity(export) == {"dataset_release": "b1", "dataset_build": "b1",
                                        "dataset_sha256": made.content_sha256, "dataset_path": str(export)}
    assert made.content_sha256 == local["dataset_sha256"]  # the same rows, the same digest


@pytest.fixture
def hub(online, monkeypatch):
    """A loopback Hub that `datasets.load_dataset(repo, ...)` reads from (the endpoint every client builds on)."""
    server = HubServer(token=TOKEN)
    with server as endpoint:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(datasets.config, "HF_ENDPOINT", endpoint)
        monkeypatch.setattr(datasets.config, "HUB_DATASETS_URL",
                            endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}")
        yield server


def _load(tmp_path, revision: str, config: str = "dpo"):
    loaded = datasets.load_dataset(REPO, config, revision=revision, token=TOKEN, cache_dir=str(tmp_path / "cache"))
    return {split: ds.to_list() for split, ds in loaded.items()}


def test_publishing_tags_the_release_and_an_unchanged_one_makes_no_commit(tmp_path, hub, caplog):
    export, root = tmp_path / "hf", tmp_path / "releases"
    config = PublishConfig(REPO, endpoint=hub.url)
    cut_release(_export(export, _tables(), "b1"), root, Provenance("b1"))
    first = publish_dataset(export, config, "b1", TOKEN)
    assert first.tag == "b1" and not first.unchanged and hub.repo(REPO).tags["b1"].oid == first.commit_oid
    cut_release(_export(export, _tables(), "b2"), root, Provenance("b2"))  # no change: the folder is b1 again
    caplog.set_level(logging.INFO, logger="pipeline")
    asked = len(hub.requests)
    again = publish_dataset(export, config, "b2", TOKEN)
    assert again.unchanged and again.tag == "b1" and again.commit_oid == first.commit_oid
    assert "identical content, no new commit" in again.describe() and "release b1 is on dataset" in caplog.text
    assert len(hub.repo(REPO).commits()) == 2 and hub.routes()[asked:] == ["create_repo", "refs", "resolve", "resolve"]
    cut_release(_export(export, _fewer_rows(), "b3"), root, Provenance("b3"))
    (export / "k_star_histogram.png").write_bytes(b"png")  # a file only this release has ...
    third = publish_dataset(export, config, "b3", TOKEN)
    (export / "k_star_histogram.png").unlink()
    cut_release(_export(export, _tables(), "b4"), root, Provenance("b4"))
    publish_dataset(export, config, "b4", TOKEN)
    assert "k_star_histogram.png" not in hub.repo(REPO).files("b4")  # ... is not left in a later release
    assert hub.repo(REPO).tags["b3"].oid == third.commit_oid and len(hub.repo(REPO).commits()) == 4
    assert len(_load(tmp_path, "b3")["train"]) == 2 and len(_load(tmp_path, "b4")["train"]) == 3


def test_a_tag_holding_other_rows_is_refused_naming_it(tmp_path, hub):
    config = PublishConfig(REPO, endpoint=hub.url)
    cut_release(_export(tmp_path / "one", _tables(), "b1"), tmp_path / "r1", Provenance("b1"))
    publish_dataset(tmp_path / "one", config, "b1", TOKEN)
    cut_release(_export(tmp_path / "two", _fewer_rows(), "b1"), tmp_path / "r2", Provenance("b1"))  # another data dir
    with pytest.raises(PublishError, match=f"dataset {REPO} has a tag b1 holding other rows than .*delete the Hub tag"):
        publish_dataset(tmp_path / "two", config, "b1", TOKEN)
    assert len(hub.repo(REPO).commits()) == 2


def test_a_failed_tag_says_the_commit_landed_and_a_rerun_tags_it(tmp_path, online):
    export = cut_release(_export(tmp_path / "hf", _tables(), "b1"), tmp_path / "r", Provenance("b1")).folder
    with HubServer(token=TOKEN, fail_at=1, fail_route="tag") as endpoint:
        server_config = PublishConfig(REPO, endpoint=endpoint)
        with pytest.raises(PublishError, match="failed at create_tag.*The commit [0-9a-f]+ landed but not the tag b1"):
            publish_dataset(export, server_config, "b1", TOKEN)
        again = publish_dataset(export, server_config, "b1", TOKEN)
    assert again.tag == "b1" and not again.unchanged


# --- two nights through the Dagster assets ---------------------------------------------------

NIGHT_1 = TASK_T1 + OTHERS + [traj("x0", iid="t5"), traj("x1", iid="t5", reward=1.0, sample=1)]
NIGHT_2 = [traj("y0", iid="t6"), traj("y1", iid="t6", reward=1.0, sample=1)]


def _night(tmp_path, batch: str, hub_url: str) -> dict:
    """The datasets, export and publication assets of a night's run, as the automation would request them
    (batch '': named by the newest batch stored, as in a run the automation starts)."""
    from assets.datasets import dataset_checks
    from assets.graph import all_assets
    from assets.resources import Credentials, HandholdSettings

    settings = HandholdSettings(data_dir=str(tmp_path / "data"), batch=batch, datasets={"test_fraction": 0.0},
                                publish={"repo_id": REPO, "endpoint": hub_url})
    result = dg.materialize([*all_assets, *dataset_checks], instance=dg.DagsterInstance.ephemeral(),
                            selection=["dpo_dataset", "actguide_dataset", "sft_dataset", "dataset_export",
                                       "hub_publication"],
                            resources={"settings": settings, "credentials": Credentials(hub_token=TOKEN)})
    return {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
            for e in result.get_asset_materialization_events()}


def test_two_nights_make_two_releases_and_the_first_still_loads_by_its_tag(tmp_path, hub):
    data = tmp_path / "data"
    tasks = [dataclasses.replace(TASK, instance_id=i, repo="a/x", source="swe-bench").to_row()
             for i in ("t1", "t2", "t3", "t5", "t6")]
    write_rows(data / "tasks" / "tasks.parquet", tasks, TASK_SCHEMA)
    store_batch(data, "2026-12-01", NIGHT_1)
    first = _night(tmp_path, "2026-12-01", hub.url)
    assert first["dataset_export"]["release"].value == "2026-12-01" and first["dataset_export"]["new_release"].value
    assert first["hub_publication"]["tag"].value == "2026-12-01" and first["hub_publication"]["published"].value
    rows_1 = _load(tmp_path, "2026-12-01")
    assert {r["instance_id"] for r in rows_1["train"]} == {"t1", "t5"}

    # between the nights a re-check finds t5's tests disagreeing: it is quarantined
    flaky = record("t5", "2026-12-02", 2.0, split=1, gold=-1, source="rollouts")  # 1 of 2 grades disagreed
    record_rechecks(data / "tasks" / "rechecks", "2026-12-02", "rollouts", [flaky])
    store_batch(data, "2026-12-02", NIGHT_2)
    (data / "evaluation" / "2026-12-01").mkdir(parents=True)  # the first night's evaluation, as written by it
    (data / "evaluation" / "2026-12-01" / "pass_at_1.json").write_text(json.dumps({"results": [
        {"model": "starting", "pass@1": 0.25}, {"model": "dpo", "pass@1": 0.5}]}))
    second = _night(tmp_path, "", hub.url)
    assert second["dataset_export"]["release"].value == "2026-12-02"
    release = Release.read(data / "datasets" / "releases" / "2026-12-02")
    assert release.previous == "2026-12-01" and release.newly_quarantined == ("t5",)
    assert release.evaluation == {"batch": "2026-12-01", "pass@1/starting": 0.25, "pass@1/dpo": 0.5}
    assert release.code_version.startswith("git ") and len(release.settings_sha256) == 64
    dpo = {(c.split, c.added, c.removed) for c in release.changes if c.config == "dpo"}
    assert dpo == {("train", 1, 1)}  # t6's pair in, t5's out (t1's unchanged)
    card = (data / "datasets" / "releases" / "2026-12-02" / "README.md").read_text()
    assert "since release `2026-12-01`" in card and "| dpo | train | 5 | 1 | 1 |" in card
    assert "Tasks quarantined since the previous release: 1 (`t5`)" in card and "Tasks added: 1 (`t6`)" in card
    assert "| t5 | 2026-12-02 | tests_disagree |" in card  # the quarantine section names it and why
    assert "| pass@1/dpo | 50.0% |" in card and f"settings sha256 `{release.settings_sha256}`" in card
    assert _load(tmp_path, "2026-12-01") == rows_1  # the first night's release, unchanged by the second
    assert {r["instance_id"] for r in _load(tmp_path, "2026-12-02")["train"]} == {"t1", "t6"}
    assert {r["instance_id"] for r in _load(tmp_path, "main")["train"]} == {"t1", "t6"}

    third = _night(tmp_path, "", hub.url)  # nothing new: no release, no commit
    assert not third["dataset_export"]["new_release"].value and third["dataset_export"]["release"].value == "2026-12-02"
    assert third["hub_publication"]["unchanged"].value and not third["hub_publication"]["published"].value
    assert list(hub.repo(REPO).tags) == ["2026-12-01", "2026-12-02"] and len(hub.repo(REPO).commits()) == 3
    assert json.loads((data / "datasets" / "hf" / "release.json").read_text())["name"] == "2026-12-02"
