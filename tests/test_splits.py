"""Held-out tasks stay held out: a task's split comes from its split group, a combined task and the bugs it
was combined from share one, and every exported config carries it. Tasks are made by synthesis's own code
(mutations, combine, make_task) on two small modules."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import datasets
import polars as pl
import pytest

from pipeline.datasets import DatasetConfig, build_rows, trajectory_frame
from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset, split_by_task
from pipeline.datasets.splits import combined_split_conflicts, split_column, split_group, split_groups, task_split
from training.evaluation import held_out_tasks
from pipeline.core.records import TASK_SCHEMA, Task
from pipeline.synthesis.combine import combinations_to_try
from pipeline.synthesis.candidates import collect_candidates
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.suite import Baseline
from pipeline.synthesis.synth import SynthConfig, make_task
from tests.test_datasets_build import traj

SOURCE = '''def add(a, b):
    return a + b


def scale(xs, k):
    out = []
    for x in xs:
        out.append(x * k)
    return out


def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x


def total(xs):
    result = 0
    for x in xs:
        result += x
    return result


def first_positive(xs):
    for x in xs:
        if x > 0:
            return x
    return None
'''
# Hash points of the two modules' groups (sha256 of SPLIT_SALT + group): maths 0.238, strings 0.589, so at
# test_fraction 0.5 every maths task is test and every strings task train.
MATHS, STRINGS = "pypi/calc:pkg/maths.py", "pypi/calc:pkg/strings.py"
HALF = 0.5


def synth_tasks(root: Path) -> list[Task]:
    """Each bug of pkg/maths.py and pkg/strings.py as a task, and every 2-3 of one module combined."""
    for name in ("maths", "strings"):
        (root / "pkg").mkdir(exist_ok=True)
        (root / "pkg" / f"{name}.py").write_text(SOURCE)
    candidates, _ = collect_candidates(root, include=["pkg/*.py"], seed=0, max_per_function=1)
    spec, base = PackageSpec("calc", "1.0", test_paths=("tests",)), Baseline(frozenset({"t"}), 1, 1.0)
    singles = [make_task(spec, "img", c, ["t"], base, "", SynthConfig()) for c in candidates]
    return singles + [make_task(spec, "img", c, ["t"], base, "", SynthConfig(), parts=parts)
                      for c, parts in combinations_to_try(candidates, seed=0)]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> list[Task]:
    return synth_tasks(tmp_path_factory.mktemp("calc"))


def provenance(task: Task) -> dict:
    return json.loads(task.provenance)


def module_of(task: Task) -> str:
    return provenance(task)["file"]


def combined_and_parts(tasks: list[Task]) -> list[tuple[Task, Task]]:
    by_candidate = {provenance(t)["candidate_id"]: t for t in tasks}
    return [(t, by_candidate[c]) for t in tasks for c in provenance(t).get("parts", ())]


def test_the_fixture_holds_chained_combinations_whose_ids_alone_would_split_them(tasks):
    pairs = combined_and_parts(tasks)
    assert len({c.instance_id for c, _ in pairs}) >= 4 and {module_of(t) for t in tasks} == {"pkg/maths.py", "pkg/strings.py"}
    shared = [p.instance_id for p in {p.instance_id: p for _, p in pairs}.values()
              if sum(q.instance_id == p.instance_id for _, q in pairs) > 1]
    assert shared  # a bug in two combined tasks: a key drawn from one combination would not do
    by_id = [(c.instance_id, p.instance_id) for c, p in pairs
             if task_split(c.instance_id, HALF) != task_split(p.instance_id, HALF)]
    assert by_id  # the old key (the instance id) puts some combined task and its part apart


ROW = Task("psf__requests-1", "psf/requests", "abc", "", "", "", (), (), "img", "/repo", "pytest", "p", "swe-bench",
           provenance=json.dumps({"dataset": "SWE-bench", "file": "requests/api.py"}))
"""A dataset row: its own group, whatever file its provenance names; no candidate id, no parts."""


def test_split_group_is_the_module_of_a_synthesized_task_and_the_id_of_any_other(tasks):
    assert {split_group(t) for t in tasks} == {MATHS, STRINGS}
    assert (task_split(MATHS, HALF), task_split(STRINGS, HALF)) == ("test", "train")  # pinned: never moves
    assert split_group(ROW) == "psf__requests-1"
    no_file = dataclasses.replace(tasks[0], provenance=json.dumps({"package": "calc"}))
    with pytest.raises(ValueError, match=f"task {tasks[0].instance_id}: synthesized, but its provenance names no"):
        split_group(no_file)


def test_a_combined_task_and_its_parts_share_a_split_everywhere_it_is_drawn(tasks):
    test_ids = {t.instance_id for t in tasks if module_of(t) == "pkg/maths.py"}
    held = [t.instance_id for t in tasks if t.instance_id in test_ids]
    assert [t.instance_id for t in held_out_tasks(tasks, HALF)] == held
    assert [t.instance_id for t in held_out_tasks(tasks, HALF, limit=2)] == held[:2] and len(held) > 2
    frame = pl.DataFrame({"instance_id": [t.instance_id for t in tasks]})
    splits = frame.select(split_column("instance_id", HALF, split_groups(tasks)))["instance_id"].to_list()
    assert splits == ["test" if t.instance_id in test_ids else "train" for t in tasks]
    assert all(splits[tasks.index(c)] == splits[tasks.index(p)] for c, p in combined_and_parts(tasks))
    assert combined_split_conflicts(tasks + [ROW], HALF) == []
    ungrouped = frame.select(split_column("instance_id", HALF))["instance_id"].to_list()  # ids alone, no groups
    assert ungrouped == [task_split(t.instance_id, HALF) for t in tasks] != splits


def test_a_part_in_another_split_is_named_as_a_conflict(tasks):
    combined, part = next((c, p) for c, p in combined_and_parts(tasks) if module_of(c) == "pkg/maths.py")
    moved = dataclasses.replace(part, provenance=json.dumps({**provenance(part), "file": "pkg/strings.py"}))
    others = [t for t in tasks if t.instance_id in (combined.instance_id,)]
    assert combined_split_conflicts(others + [moved], HALF) == [
        f"{combined.instance_id} (test) vs {part.instance_id} (train)"]
    assert combined_split_conflicts(others + [part], HALF) == []
    with pytest.raises(ValueError, match="combined tasks in another split than their parts"):
        split_by_task({}, others + [moved], HALF)


def attempts(tasks: list[Task]):
    """Per task: an unguided failure and success, an action-guided success (DPO, SFT and ActGuide rows)."""
    for t in tasks:
        iid = t.instance_id
        yield from [traj(f"{iid}-u0", iid=iid), traj(f"{iid}-u1", iid=iid, reward=1.0, sample=1),
                    traj(f"{iid}-a0", iid=iid, kind="action", reward=1.0)]


def test_no_test_split_task_is_in_any_train_split_of_the_exported_folder(tasks, tmp_path):
    trajectories = list(attempts(tasks))
    rows = build_rows(trajectories, DatasetConfig(test_fraction=HALF))  # splits drawn from the ids alone
    tables = {"dpo": rows.dpo, "actguide": rows.actguide, "sft": rows.sft,
              "trajectories": trajectory_frame(trajectories),
              "tasks": pl.DataFrame([t.to_row() for t in tasks], schema=pl.Schema(TASK_SCHEMA))}
    split, moved = split_by_task(tables, tasks, HALF)
    export_dataset(tmp_path / "hf", split, CardInfo("splits", run_id="b1"))
    test_ids = {t.instance_id for t in tasks if module_of(t) == "pkg/maths.py"}
    per_task = {"dpo": 2, "sft": 2, "trajectories": 3, "tasks": 1}  # DPO: u1 and a0 each over u0
    wrong = sum((task_split(t.instance_id, HALF) == "test") != (t.instance_id in test_ids) for t in tasks)
    assert wrong > 0 and (moved["dpo"], moved["sft"]) == (2 * wrong, 2 * wrong)
    assert moved["trajectories"] == moved["tasks"] == 0  # they had no split: each row got its task's
    for config, n in per_task.items():
        loaded = datasets.load_dataset(str(tmp_path / "hf"), config)
        assert set(loaded) == {"train", "test"}, config
        assert set(loaded["test"]["instance_id"]) == test_ids, config
        assert not test_ids & set(loaded["train"]["instance_id"]), config
        assert (loaded["train"].num_rows, loaded["test"].num_rows) == (
            n * (len(tasks) - len(test_ids)), n * len(test_ids)), config
    actguide = datasets.load_dataset(str(tmp_path / "hf"), "actguide")
    assert set(actguide["test"]["instance_id"]) <= test_ids and not test_ids & set(actguide["train"]["instance_id"])
    assert actguide["test"].num_rows > 0


def test_a_table_without_task_ids_is_refused(tasks):
    with pytest.raises(ValueError, match="config 'dpo' has no instance_id column"):
        split_by_task({"dpo": pl.DataFrame({"prompt": ["p"]})}, tasks, HALF)
