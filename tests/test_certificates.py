"""Certificates of tasks and the per-package budget (issue #53, sections 2 and 3): a task whose gold patch passes
only in file order is not certified, the datasets and the release leave uncertified tasks out and the card says
why, and a package whose candidates keep failing stops at its time budget and says so. Real synthesis on a tiny
package built here, real Docker, real Parquet."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile

import polars as pl
import pytest

from pipeline.datasets.card import CardInfo
from pipeline.datasets.export import export_dataset
from pipeline.datasets.release import Provenance, Release, cut_release
from pipeline.core.records import TASK_SCHEMA, Task
from pipeline.core.store import write_rows
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.synth import SynthConfig, synthesize
from pipeline.tasks.certificate import certificate_problem, task_rows, uncertified, with_certified
from pipeline.tasks.test_order import shuffled_command

from tests.test_records import TASK
from pipeline.rollouts.batch import RolloutConfig

RULES = RolloutConfig().grade_rules()

# A package whose `scale` feeds a registry that a second test of the same module reads: that test passes only
# after the first ran (file order). `add` is tested on its own, in another file.
ORDERDEP = {
    "pyproject.toml": b'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
                      b'[project]\nname = "orderdep"\nversion = "2.0"\n\n[tool.setuptools]\npackages = ["orderdep"]\n',
    "orderdep/__init__.py": b"_seen = {}\n\n\ndef scale(x, factor=3):\n    if factor == 0:\n"
                            b"        raise ValueError('factor must not be 0')\n    result = x * factor\n"
                            b"    return result\n\n\ndef remember(key, value):\n    if key in _seen:\n"
                            b"        del _seen[key]\n    _seen[key] = value\n    return value\n\n\n"
                            b"def add(a, b):\n    if a == 0:\n        return b\n    total = a + b\n    return total\n",
    "tests/test_order.py": b"from orderdep import _seen, remember, scale\n\n\n"
                           b"def test_scale():\n    assert remember('s', scale(2)) == 6\n\n\n"
                           b"def test_recall_after_scale():\n    assert _seen['s'] == 6\n",
    "tests/test_add.py": b"from orderdep import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
                         b"def test_add_negative():\n    assert add(-2, -3) == -5\n\n\n"
                         b"def test_add_zero():\n    assert add(0, 4) == 4\n",
}


def _sdist(cache, name: str, version: str, files: dict[str, bytes]) -> PackageSpec:
    """An sdist of `files` put where fetch_source finds it (no index is asked)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(f"{name}-{version}/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (cache / "sdist").mkdir(exist_ok=True)
    (cache / "sdist" / f"{name}-{version}.tar.gz").write_bytes(buf.getvalue())
    return PackageSpec(name, version)


@pytest.fixture(scope="module")
def orderdep_run(base_image, docker_client, synth_cache):
    spec = _sdist(synth_cache, "orderdep", "2.0", ORDERDEP)
    config = SynthConfig(packages=(), tasks_per_package=6, candidates_per_package=20, max_per_function=4,
                         certify_runs=3)
    tasks, report = synthesize(config, base_image, synth_cache, docker_client, specs=(spec,), rules=RULES)
    return tasks, report


def test_the_shuffled_command_keeps_the_runner_and_its_arguments():
    command = shuffled_command("PYTHONHASHSEED=0 /opt/venv/bin/python -m pytest -rA tests", 5)
    assert command.startswith("PYTHONHASHSEED=0 /opt/venv/bin/python -c 'import random") and \
        command.endswith("plugins=[Shuffled()]))' -rA tests")
    assert shuffled_command("cd /x && pytest -rA a.py", 5).startswith("cd /x && python -c ")
    assert shuffled_command("./runtests.py --verbosity 2", 5) is None
    assert shuffled_command("python -m pytest_cov x", 5) is None


def test_a_task_whose_gold_passes_only_in_file_order_is_not_certified(orderdep_run):
    tasks, report = orderdep_run
    assert tasks, report.rejects
    # a bug of `scale` or `remember` breaks tests of test_order.py, whose files the later containers run: there
    # test_recall_after_scale (FAIL_TO_PASS or PASS_TO_PASS) runs before test_scale in the shuffled order
    by_order = {t.instance_id: any(f.startswith("tests/test_order.py") for f in t.FAIL_TO_PASS) for t in tasks}
    assert any(by_order.values()) and not all(by_order.values()), by_order  # both kinds of task were kept
    for task in tasks:
        assert task.certificate_containers == 3 and task.certificate_empty_failed == 3, task
        assert task.certificate_orders[0] == "file/suite" and task.certificate_orders[1].startswith("shuffled-")
        assert task.certificate_gold_seconds > 0 and task.certificate_empty_seconds > 0
        if by_order[task.instance_id]:  # resolved in both file-order containers, not in the shuffled one
            assert task.certificate_gold_resolved == 2, task
            assert certificate_problem(task, 3).startswith("the gold patch resolved it in 2 of 3 containers")
        else:
            assert task.certificate_gold_resolved == 3 and certificate_problem(task, 3) == "", task
    assert set(uncertified(tasks, 3)) == {i for i, order in by_order.items() if order}


def test_the_certificate_survives_the_task_file_and_old_rows_still_load(orderdep_run, tmp_path):
    tasks, _ = orderdep_run
    path = write_rows(tmp_path / "tasks.parquet", [t.to_row() for t in tasks], TASK_SCHEMA)
    assert [Task.from_row(r) for r in task_rows(path)] == tasks
    old_schema = TASK_SCHEMA.remove_metadata().with_metadata({"schema_version": "1", "record": "Task"})
    old_schema = old_schema.remove(old_schema.get_field_index("certificate_containers"))
    old = [{k: v for k, v in t.to_row().items() if k != "certificate_containers"} for t in tasks]
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(old, schema=old_schema), tmp_path / "old.parquet")
    loaded = [Task.from_row(r) for r in task_rows(tmp_path / "old.parquet")]
    assert [t.instance_id for t in loaded] == [t.instance_id for t in tasks]
    assert all(certificate_problem(t, 3).startswith("no certificate") for t in loaded)


def test_the_synthesis_report_shows_seconds_per_package_and_per_kept_task(orderdep_run):
    _, report = orderdep_run
    row = report.as_json()["per_package"]["orderdep-2.0"]
    assert row["seconds"] > 0 and row["seconds_per_kept_task"] == round(row["seconds"] / row["kept"], 1)
    assert report.as_json()["breakdown"]["certify_setup"] > 0


def test_a_package_stops_at_its_budget_and_says_so(base_image, docker_client, synth_cache, orderdep_run):
    """A budget of a millisecond: the first candidates handed out run, no further one; the package says so."""
    spec = _sdist(synth_cache, "orderdep", "2.0", ORDERDEP)
    config = SynthConfig(packages=(), tasks_per_package=6, candidates_per_package=20, max_per_function=4,
                         package_budget=0.001, certify_runs=1)
    tasks, report = synthesize(config, base_image, synth_cache, docker_client, specs=(spec,), rules=RULES)
    counts = report.per_package["orderdep-2.0"]
    assert counts["budget_stopped"] == 1 and counts["tested"] <= config.workers and counts["candidates_untried"] > 0
    [budget] = [r for r in report.rejects if r.stage == "budget"]
    assert budget.item == "orderdep-2.0" and "synth.package_budget (0 s)" in budget.reason \
        and "raise synth.package_budget" in budget.reason
    if not tasks:  # no task from the candidates it tried: the package's own reject names the budget too
        assert any("stopped at synth.package_budget" in r.reason for r in report.rejects if r.stage == "synthesize")


def _certified(instance_id: str, gold: int = 3) -> dict:
    return dataclasses.replace(TASK, instance_id=instance_id, certificate_gold_resolved=gold).to_row()


def test_the_release_leaves_uncertified_tasks_out_and_the_card_says_why(tmp_path):
    tasks = [Task.from_row(_certified("sure")), Task.from_row(_certified("order", gold=2)),
             dataclasses.replace(TASK, instance_id="old", certificate_containers=0)]
    gone = uncertified(tasks, 3)
    assert gone == {"order": "uncertified: the gold patch resolved it in 2 of 3 containers (test orders file/suite, "
                             "shuffled-7/suite, file/suite)",
                    "old": "uncertified: no certificate: validated before certificates (task schema 1); validate it "
                           "again (rematerialize tasks)"}
    table = with_certified(pl.DataFrame([t.to_row() for t in tasks]), 3)
    dpo = pl.DataFrame({"prompt": ["p", "q"], "chosen": ["c", "c"], "rejected": ["r", "r"],
                        "instance_id": ["sure", "order"], "split": ["train", "train"]})
    export = tmp_path / "hf"
    export_dataset(export, {"dpo": dpo, "tasks": table}, CardInfo("t", "b1", certify_runs=3))
    with pytest.raises(ValueError, match=r"dpo/train holds rows of tasks without a certificate \(order\): a release "
                                         "takes only certified tasks"):
        cut_release(export, tmp_path / "releases", Provenance("b1"))
    kept = dpo.filter(~pl.col("instance_id").is_in(list(gone)))  # what the datasets build with `_left_out`
    export_dataset(export, {"dpo": kept, "tasks": table}, CardInfo("t", "b1", certify_runs=3))
    release = cut_release(export, tmp_path / "releases", Provenance("b1")).release
    assert release.certificates == {"tasks": 3, "certified": 1, "left_out": {
        "no certificate: validated before certificates (task schema N); validate it again (rematerialize tasks)": 1,
        "the gold patch resolved it in N of N containers (test orders file/suite, shuffled-N/suite, file/suite)": 1}}
    assert Release.read(tmp_path / "releases" / "b1") == release
    card = (tmp_path / "releases" / "b1" / "README.md").read_text()
    assert "Tasks certified (gold patch resolved in every fresh container, empty patch in none): 1 of 3 (33.3%)" in card
    section = card.split("## Certified tasks", 1)[1].split("\n## ", 1)[0]
    assert "Certified: 1 of 3 tasks (33.3%)." in section and "synth.certify_runs: 3" in section
    assert "| order | the gold patch resolved it in 2 of 3 containers (test orders file/suite, shuffled-7/suite, " \
           "file/suite) |" in section
    assert json.loads((export / "release.json").read_text())["certificates"]["certified"] == 1
