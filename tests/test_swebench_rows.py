"""SWE-bench-format rows into Tasks: real fixture files, real Parquet, real git apply."""

import json
import pickle
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.records import TASK_SCHEMA, Task
from pipeline.store import read_rows, write_rows
from pipeline.tasks.swebench_rows import (
    SweDatasetConfig,
    TaskRowError,
    detect_kind,
    load_tasks,
    load_tasks_from_config,
    patched_files,
    resolve_log_parser,
    reverse_patch,
    task_from_row,
)

DATA = Path(__file__).parent / "data"
DJANGO = "django__django-11099"
DJANGO_CMD = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"


def json_rows(name: str) -> list[dict]:
    path = DATA / name
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    return json.loads(path.read_text())


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def smith_parquet(tmp_path: Path) -> Path:
    """SWE-smith's Hub shape: test lists as list<string> columns."""
    path = tmp_path / "swe_smith_rows.parquet"
    pq.write_table(pa.Table.from_pylist(json_rows("swe_smith_rows.jsonl")), path)
    return path


def source_path(name: str, tmp_path: Path) -> Path:
    return smith_parquet(tmp_path) if name.endswith(".parquet") else DATA / name


# (file, source, first instance, image, test_cmd, log_parser, test_files)
FORMATS = [
    ("swebench_rows.jsonl", "swe-bench", "django__django-11099",
     "swebench/sweb.eval.x86_64.django_1776_django-11099:latest", DJANGO_CMD, "parse_log_django",
     ("tests/auth_tests/test_validators.py",)),
    ("swebench_verified_rows.json", "swe-bench-verified", "pytest-dev__pytest-7432",
     "swebench/sweb.eval.x86_64.pytest-dev_1776_pytest-7432:latest", "pytest -rA", "parse_log_pytest",
     ("testing/test_skipping.py",)),
    ("swe_gym_rows.json", "swe-gym", "getmoto__moto-5752",
     "swebench/sweb.eval.x86_64.getmoto_1776_moto-5752:latest", "pytest -rA", "parse_log_pytest",
     ("tests/test_ssm/test_ssm_boto3.py",)),
    ("swe_smith_rows.parquet", "swe-smith", "pallets__markupsafe.620c06c9.func_pm_remove_cond__k3t9m2qa",
     "swebench/swesmith.x86_64.pallets_1776_markupsafe.620c06c9", "pytest -rA", "parse_log_pytest",
     ("tests/test_markupsafe.py", "tests/test_escape.py", "tests/test_leak.py")),
]


@pytest.mark.parametrize("name,source,first,image,test_cmd,log_parser,test_files", FORMATS)
def test_each_format_loads(tmp_path, name, source, first, image, test_cmd, log_parser, test_files):
    path = source_path(name, tmp_path)
    tasks, rejects = load_tasks(str(path))
    assert rejects == []
    assert len(tasks) == len(pq.read_table(path) if path.suffix == ".parquet" else json_rows(name))
    task = tasks[0]
    assert (task.instance_id, task.source, task.image) == (first, source, image)
    assert (task.test_cmd, task.log_parser, task.test_files) == (test_cmd, log_parser, test_files)
    assert task.workdir == "/testbed"
    assert task.FAIL_TO_PASS and all(isinstance(t, str) for t in task.FAIL_TO_PASS)
    assert json.loads(task.provenance)["dataset"] == str(path)
    assert json.loads(task.provenance)["index"] == 0


def test_swebench_fields_survive(tmp_path):
    row = json_rows("swebench_rows.jsonl")[1]
    tasks, _ = load_tasks(str(DATA / "swebench_rows.jsonl"), split="dev", limit=2)
    task = tasks[1]
    assert task.instance_id == row["instance_id"] == "sympy__sympy-20590"
    assert task.FAIL_TO_PASS == ("test_immutable",)
    assert task.PASS_TO_PASS == tuple(json.loads(row["PASS_TO_PASS"]))
    assert (task.patch, task.test_patch) == (row["patch"], row["test_patch"])
    assert task.base_commit == row["base_commit"]
    assert (task.version, task.hints_text, task.created_at) == ("1.7", row["hints_text"], row["created_at"])
    assert task.environment_setup_commit == row["environment_setup_commit"]
    assert task.test_cmd.endswith("bin/test -C --verbose") and task.log_parser == "parse_log_sympy"
    provenance = dict(dataset=str(DATA / "swebench_rows.jsonl"), split="dev", index=1)
    assert json.loads(task.provenance) == provenance


def test_old_astropy_and_explicit_kind():
    tasks, _ = load_tasks(str(DATA / "swebench_rows.jsonl"), kind="swe-bench-verified")
    astropy = tasks[2]
    assert astropy.source == "swe-bench-verified"
    assert astropy.test_cmd.startswith("pytest -rA -vv -o console_output_style=classic")
    assert astropy.log_parser == "parse_log_pytest_v2"


def test_smith_bug_becomes_setup_and_its_reverse_the_gold(tmp_path):
    row = json_rows("swe_smith_rows.jsonl")[0]
    (task, _), _ = load_tasks(str(smith_parquet(tmp_path)))
    assert task.setup_patch == row["patch"]
    assert task.patch == reverse_patch(row["patch"])
    assert '+        if isinstance(other, str) or hasattr(other, "__html__"):' in task.patch.splitlines()
    assert task.test_patch == ""
    assert task.base_commit == ""  # the bug becomes the only commit; validation records its hash
    assert json.loads(task.provenance)["clean_commit"] == "620c06c9"  # what the image holds, from the mirror name
    assert json.loads(task.provenance)["bug_commit"] == row["base_commit"]


def test_row_fields_override_conventions():
    row = json_rows("swe_gym_rows.json")[0] | {
        "image": "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752",
        "log_parser": "pytest",
        "test_cmd": "pytest -rA -n0",
    }
    task = task_from_row(row, kind="swe-gym")
    assert (task.image, task.test_cmd) == (row["image"], "pytest -rA -n0")
    assert task.log_parser == "parse_log_pytest"
    namespaced = task_from_row(json_rows("swe_gym_rows.json")[0], kind="swe-gym", image_namespace="xingyaoww")
    assert namespaced.image == "xingyaoww/sweb.eval.x86_64.getmoto_1776_moto-5752:latest"


def django_row() -> dict:
    return json_rows("swebench_rows.jsonl")[0]


def smith_row() -> dict:
    return json_rows("swe_smith_rows.jsonl")[0]


TRUNCATED_DIFF = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n"
# (kind, good row, change, item the error names, field)
MALFORMED = [
    ("swe-bench", django_row, {"instance_id": None}, "row 1", "instance_id"),
    ("swe-bench", django_row, {"repo": ""}, DJANGO, "repo"),
    ("swe-bench", django_row, {"base_commit": None}, DJANGO, "base_commit"),
    ("swe-bench", django_row, {"FAIL_TO_PASS": '["test_ascii_validator'}, DJANGO, "FAIL_TO_PASS"),
    ("swe-bench", django_row, {"FAIL_TO_PASS": "[]"}, DJANGO, "FAIL_TO_PASS"),
    ("swe-bench", django_row, {"FAIL_TO_PASS": [1, 2]}, DJANGO, "FAIL_TO_PASS"),
    ("swe-bench", django_row, {"PASS_TO_PASS": None}, DJANGO, "PASS_TO_PASS"),
    ("swe-bench", django_row, {"log_parser": "parse_log_nonsense"}, DJANGO, "log_parser"),
    ("swe-bench", django_row, {"repo": "cypress-io/cypress"}, DJANGO, "log_parser"),
    ("swe-bench", django_row, {"test_patch": "see the PR"}, DJANGO, "test_patch"),
    ("swe-bench", django_row, {"patch": TRUNCATED_DIFF}, DJANGO, "patch"),
    ("swe-smith", smith_row, {"image_name": None}, smith_row()["instance_id"], "image_name"),
    ("swe-smith", smith_row, {"problem_statement": ""}, smith_row()["instance_id"], "problem_statement"),
    ("swe-smith", smith_row, {"repo": "pallets/markupsafe"}, smith_row()["instance_id"], "repo"),
]


@pytest.mark.parametrize("kind,good,change,item,field", MALFORMED)
def test_malformed_row_is_named_and_the_others_load(tmp_path, kind, good, change, item, field):
    bad = {k: v for k, v in (good() | change).items() if v is not None}
    with pytest.raises(TaskRowError) as raised:
        task_from_row(bad, kind=kind, index=1)
    err = raised.value
    assert (err.item, err.field) == (item, field)
    assert err.fix and item in str(err) and field in str(err) and err.fix in str(err)
    assert (pickle.loads(pickle.dumps(err)).item, pickle.loads(pickle.dumps(err)).field) == (item, field)

    others = json_rows("swebench_rows.jsonl" if kind == "swe-bench" else "swe_smith_rows.jsonl")[1:]
    path = write_jsonl(tmp_path / "rows.jsonl", [others[0], bad, *others[1:]])
    tasks, rejects = load_tasks(str(path), kind=kind)
    assert [t.instance_id for t in tasks] == [row["instance_id"] for row in others]
    assert [(r.item, r.stage) for r in rejects] == [(item, "load")]
    assert field in rejects[0].reason


def test_non_object_row_and_duplicate_are_rejected(tmp_path):
    row = django_row()
    path = write_jsonl(tmp_path / "swebench.jsonl", [row, ["not", "a", "row"], row])
    tasks, rejects = load_tasks(str(path))
    assert [t.instance_id for t in tasks] == [row["instance_id"]]
    assert [r.item for r in rejects] == ["row 1", row["instance_id"]]
    assert "repeats" in rejects[1].reason


def test_instance_ids_filter_limit_and_missing_ids():
    path = str(DATA / "swebench_rows.jsonl")
    config = SweDatasetConfig(path, instance_ids=("astropy__astropy-7166", "django__django-99999"))
    tasks, rejects = load_tasks_from_config(config)
    assert [t.instance_id for t in tasks] == ["astropy__astropy-7166"]
    assert json.loads(tasks[0].provenance)["index"] == 2
    assert [r.item for r in rejects] == ["django__django-99999"]
    limited, _ = load_tasks(path, limit=2)
    assert [t.instance_id for t in limited] == [DJANGO, "sympy__sympy-20590"]


def test_hub_layout_loads_through_datasets_offline(tmp_path, monkeypatch):
    """A directory laid out like a Hub snapshot takes the `datasets.load_dataset` path."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    snapshot = tmp_path / "SWE-Gym"
    (snapshot / "data").mkdir(parents=True)
    table = pa.Table.from_pylist(json_rows("swe_gym_rows.json"))
    pq.write_table(table, snapshot / "data" / "train-00000-of-00001.parquet")
    tasks, rejects = load_tasks(str(snapshot), split="train")
    assert rejects == []
    expected = [(row["instance_id"], "swe-gym") for row in table.to_pylist()]
    assert [(t.instance_id, t.source) for t in tasks] == expected
    assert json.loads(tasks[1].provenance) == {"dataset": str(snapshot), "split": "train", "index": 1}


def test_bad_sources_fail_loudly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_tasks(str(tmp_path / "missing.jsonl"))
    (tmp_path / "rows.jsonl").write_text('{"instance_id": "a"}\n{not json\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not valid JSON"):
        load_tasks(str(tmp_path / "rows.jsonl"))
    (tmp_path / "rows.json").write_text('{"instance_id": "a"}')
    with pytest.raises(ValueError, match="one JSON list"):
        load_tasks(str(tmp_path / "rows.json"))
    with pytest.raises(ValueError, match="kind 'swe-bench-lite'"):
        load_tasks(str(DATA / "swebench_rows.jsonl"), kind="swe-bench-lite")


@pytest.mark.parametrize(
    "dataset,row,kind",
    [
        ("SWE-bench/SWE-bench", None, "swe-bench"),
        ("princeton-nlp/SWE-bench_Lite", None, "swe-bench"),
        ("SWE-bench/SWE-bench_Verified", None, "swe-bench-verified"),
        ("princeton-nlp/SWE-bench_Verified", None, "swe-bench-verified"),
        ("SWE-Gym/SWE-Gym", None, "swe-gym"),
        ("SWE-bench/SWE-smith", None, "swe-smith"),
        ("/data/swe_gym/tasks.jsonl", {"instance_id": "x"}, "swe-bench"),  # only the file name counts
        ("/data/tasks.parquet", {"image_name": "swebench/swesmith.x86_64.a_1776_b.1234567"}, "swe-smith"),
    ],
)
def test_detect_kind(dataset, row, kind):
    assert detect_kind(dataset, row) == kind


def test_log_parser_names_are_registered():
    from swebench.harness.log_parsers import PARSER_REGISTRY

    assert resolve_log_parser("pytest") == "parse_log_pytest"
    assert resolve_log_parser("parse_log_django") == "parse_log_django"
    assert resolve_log_parser("junit") is None
    names = ("swebench_rows.jsonl", "swebench_verified_rows.json", "swe_gym_rows.json")
    tasks = [t for name in names for t in load_tasks(str(DATA / name))[0]]
    assert {t.log_parser for t in tasks} <= set(PARSER_REGISTRY)


def test_patched_files_in_diff_order():
    diff = json_rows("swebench_rows.jsonl")[0]["test_patch"] + (
        "diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1 @@\n+import pytest\n"
    )
    assert patched_files(diff) == ("tests/auth_tests/test_validators.py", "tests/conftest.py")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_reverse_patch_undoes_the_bug_under_git_apply(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b")
    (repo / "gone.py").write_text("VALUE = 1\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "clean")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a + b\n")
    (repo / "gone.py").unlink()
    (repo / "extra.py").write_text("BUG = True\n")
    git(repo, "add", "-A")
    bug = git(repo, "diff", "--cached")
    (repo / "gold.diff").write_text(reverse_patch(bug))
    git(repo, "apply", "--index", "gold.diff")
    (repo / "gold.diff").unlink()
    assert git(repo, "diff", "--cached", "HEAD") == ""
    assert git(repo, "status", "--porcelain") == ""


def test_parquet_round_trip_readable_by_polars(tmp_path):
    tasks = [
        task
        for name, *_ in FORMATS
        for task in load_tasks(str(source_path(name, tmp_path)))[0]
    ]
    path = write_rows(tmp_path / "tasks.parquet", [t.to_row() for t in tasks], TASK_SCHEMA)
    assert [Task.from_row(row) for row in read_rows(path)] == tasks
    frame = pl.read_parquet(path)
    assert frame.height == len(tasks) == 9
    assert frame.columns == TASK_SCHEMA.names
    assert frame["FAIL_TO_PASS"].dtype == pl.List(pl.String)
    assert sorted(frame["source"].unique()) == ["swe-bench", "swe-bench-verified", "swe-gym", "swe-smith"]
