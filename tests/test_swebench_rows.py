"""SWE-bench-format rows into Tasks: real fixture files, real Parquet, real git apply."""

import json
import logging
import pickle
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.records import TASK_SCHEMA, Task
from pipeline.core.store import read_rows, write_rows
from pipeline.sources.harness_specs import (
    eval_script_test_cmd,
    harness_test_cmd,
    spec_test_cmds,
    swe_gym_image,
    harness_directives,
)
from pipeline.sources.harness_specs import resolve_log_parser
from pipeline.sources.swebench_rows import SweDatasetConfig, load_tasks, load_tasks_from_config
from pipeline.sources.task_rows import TaskRowError, patched_files, reverse_patch, row_kind, task_from_row

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
     "swebench/sweb.eval.x86_64.django_1776_django-11099:latest", f"{DJANGO_CMD} auth_tests.test_validators",
     "parse_log_django", ("tests/auth_tests/test_validators.py",)),
    ("swebench_verified_rows.json", "swe-bench-verified", "pytest-dev__pytest-7432",
     "swebench/sweb.eval.x86_64.pytest-dev_1776_pytest-7432:latest", "pytest -rA testing/test_skipping.py",
     "parse_log_pytest", ("testing/test_skipping.py",)),
    # no swebench spec for SWE-Gym's repos: pytest on the files the graded tests live in
    ("swe_gym_rows.json", "swe-gym", "getmoto__moto-5752",
     "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest", "pytest -rA tests/test_ssm/test_ssm_boto3.py",
     "parse_log_pytest", ("tests/test_ssm/test_ssm_boto3.py",)),
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
    assert task.test_cmd.endswith("bin/test -C --verbose sympy/core/tests/test_basic.py")
    assert task.log_parser == "parse_log_sympy"
    provenance = dict(dataset=str(DATA / "swebench_rows.jsonl"), split="dev", index=1,
                      test_cmd_from="harness spec", eval_overlap=["swe-bench-verified"])
    assert json.loads(task.provenance) == provenance


def test_old_astropy_and_explicit_kind():
    tasks, _ = load_tasks(str(DATA / "swebench_rows.jsonl"), kind="swe-bench-verified")
    astropy = tasks[2]
    assert astropy.source == "swe-bench-verified"
    assert astropy.test_cmd == "pytest -rA -vv -o console_output_style=classic --tb=no astropy/utils/tests/test_misc.py"
    assert astropy.log_parser == "parse_log_pytest_v2"
    assert {t.source for t in tasks} == {"swe-bench-verified"}  # a kind given overrides every row's columns


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
        "image": "registry.example/moto:5752",
        "log_parser": "pytest",
        "test_cmd": "pytest -rA -n0",
    }
    task = task_from_row(row)
    assert (task.image, task.test_cmd) == (row["image"], "pytest -rA -n0")
    assert task.log_parser == "parse_log_pytest"
    assert json.loads(task.provenance)["test_cmd_from"] == "row test_cmd"
    mirrored = task_from_row(json_rows("swe_gym_rows.json")[0], image_namespace="mirror.example/gym")
    assert mirrored.image == "mirror.example/gym/sweb.eval.x86_64.getmoto_s_moto-5752:latest"


def django_row() -> dict:
    return json_rows("swebench_rows.jsonl")[0]


def smith_row() -> dict:
    return json_rows("swe_smith_rows.jsonl")[0]


def gym_row() -> dict:
    return json_rows("swe_gym_rows.json")[0]


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
    # missing columns: a row dict simply lacks the key
    ("swe-bench", django_row, {"test_patch": None}, DJANGO, "test_patch"),
    ("swe-bench", django_row, {"FAIL_TO_PASS": None}, DJANGO, "FAIL_TO_PASS"),
    ("swe-bench", django_row, {"problem_statement": None}, DJANGO, "problem_statement"),
    # a repository no dataset published an image for, and the row names none
    ("swe-bench", django_row, {"repo": "octo-org/widgets"}, DJANGO, "image_name"),
    ("swe-gym", gym_row, {"repo": "octo-org/widgets"}, "getmoto__moto-5752", "image_name"),
    ("swe-bench", django_row, {"eval_script": "#!/bin/bash\n./tests/runtests.py\n"}, DJANGO, "eval_script"),
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

    files = {"swe-bench": "swebench_rows.jsonl", "swe-gym": "swe_gym_rows.json", "swe-smith": "swe_smith_rows.jsonl"}
    others = json_rows(files[kind])[1:]
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
    assert json.loads(tasks[1].provenance) == {"dataset": str(snapshot), "split": "train", "index": 1,
                                               "test_cmd_from": "no harness spec"}


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
    assert frame.height == len(tasks) == 13
    assert frame.columns == TASK_SCHEMA.names
    assert frame["FAIL_TO_PASS"].dtype == pl.List(pl.String)
    assert sorted(frame["source"].unique()) == ["swe-bench", "swe-bench-verified", "swe-gym", "swe-smith"]


# The line between the test-output markers of the eval script swebench 4.1.0's harness writes for
# each instance (make_eval_script_list_py: spec test_cmd + get_test_directives of the test_patch),
# computed from the swebench 4.1.0 wheel for these very rows.
HARNESS_COMMANDS = {
    "django__django-11099": f"{DJANGO_CMD} auth_tests.test_validators",
    "django__django-11749": f"{DJANGO_CMD} user_commands.management.commands.mutually_exclusive_required "
                            "user_commands.tests",
    "sympy__sympy-20590": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose "
                          "sympy/core/tests/test_basic.py",
    "astropy__astropy-7166": "pytest -rA -vv -o console_output_style=classic --tb=no astropy/utils/tests/test_misc.py",
    "astropy__astropy-12907": "pytest -rA astropy/modeling/tests/test_separable.py",
    "pytest-dev__pytest-7432": "pytest -rA testing/test_skipping.py",
    "psf__requests-2317": "pytest -rA test_requests.py",
    "astropy__astropy-14995": "pytest -rA astropy/nddata/mixins/tests/test_ndarithmetic.py",
}


def public_tasks() -> dict[str, Task]:
    names = ("swebench_rows.jsonl", "swebench_verified_rows.json", "swe_gym_rows.json", "swe_smith_rows.jsonl")
    return {t.instance_id: t for name in names for t in load_tasks(str(DATA / name))[0]}


@pytest.mark.parametrize("instance_id", HARNESS_COMMANDS)
def test_public_rows_run_what_the_harness_runs(instance_id):
    task = public_tasks()[instance_id]
    assert task.test_cmd == HARNESS_COMMANDS[instance_id]
    # the swebench 5 row carries its eval script; the others are graded by the 4.1.0 spec table
    expected = "row eval_script" if instance_id == "astropy__astropy-14995" else "harness spec"
    assert json.loads(task.provenance)["test_cmd_from"] == expected


TEST_PATCH_WITH_DATA = "".join(
    f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"
    for path in ("tests/forms_tests/tests/test_input_formats.py", "tests/forms_tests/fixtures/data.json",
                 "tests/forms_tests/notes.txt", "tests/forms_tests/tests/__init__.py")
)


@pytest.mark.parametrize("repo,version,expected", [
    ("django/django", "3.0", f"{DJANGO_CMD} forms_tests.tests.test_input_formats forms_tests.tests.__init__"),
    ("django/django", "1.9", "./tests/runtests.py --verbosity 2 forms_tests.tests.test_input_formats "
                             "forms_tests.tests.__init__"),
    ("mwaskom/seaborn", "0.12", "pytest --no-header -rA tests/forms_tests/tests/test_input_formats.py "
                                "tests/forms_tests/tests/__init__.py"),
    ("sphinx-doc/sphinx", "7.1", "tox --current-env -epy39 -v -- tests/forms_tests/tests/test_input_formats.py "
                                 "tests/forms_tests/tests/__init__.py"),
    ("django/django", "9.9", None),  # a version the harness has no spec for
    ("dbt-labs/dbt-core", "1.7", None),  # swebench lists it, with no test_cmd
    ("getmoto/moto", "4.0", None),  # SWE-Gym's: not in swebench
])
def test_harness_command_per_repo_and_version(repo, version, expected):
    """The spec's test_cmd plus the test_patch's files, data files dropped, Django's as module labels."""
    assert harness_test_cmd(repo, version, TEST_PATCH_WITH_DATA) == expected


def test_spec_table_covers_swebench_python_repos():
    repos = {repo for repo, _ in spec_test_cmds()}
    assert len(spec_test_cmds()) == 282 and len(repos) == 18
    assert spec_test_cmds()[("astropy/astropy", "v5.3")] == "pytest -rA"
    assert harness_directives("sympy/sympy", TEST_PATCH_WITH_DATA) == [
        "tests/forms_tests/tests/test_input_formats.py", "tests/forms_tests/tests/__init__.py"]


def test_a_swebench5_eval_script_is_what_runs():
    row = json_rows("swebench_verified_rows.json")[2]
    assert eval_script_test_cmd(row["eval_script"]) == HARNESS_COMMANDS[row["instance_id"]]
    changed = row | {"eval_script": row["eval_script"].replace(
        "pytest -rA astropy/nddata", "pytest -rA -p no:cacheprovider astropy/nddata")}
    task = task_from_row(changed)
    assert task.test_cmd == "pytest -rA -p no:cacheprovider astropy/nddata/mixins/tests/test_ndarithmetic.py"
    assert (task.image, task.log_parser, task.source) == (row["image"], "parse_log_pytest_v2", "swe-bench-verified")
    assert eval_script_test_cmd("#!/bin/bash\n: '>>>>> Start Test Output'\n: '>>>>> End Test Output'\n") is None


@pytest.mark.parametrize("name,index,image", [
    ("swebench_rows.jsonl", 3, "swebench/sweb.eval.x86_64.django_1776_django-11749:latest"),
    ("swebench_verified_rows.json", 1, "swebench/sweb.eval.x86_64.psf_1776_requests-2317:latest"),
    ("swe_gym_rows.json", 1, "xingyaoww/sweb.eval.x86_64.python_s_mypy-10401:latest"),
    ("swe_gym_rows.json", 2, "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-3715:latest"),
    ("swe_smith_rows.jsonl", 1, "swebench/swesmith.x86_64.pallets_1776_markupsafe.620c06c9"),
])
def test_image_names_each_dataset_published(name, index, image):
    assert task_from_row(json_rows(name)[index], index=index).image == image


def test_swe_gym_mangling_matches_openhands():
    # OpenHands' get_instance_docker_image: ('xingyaoww/' + 'sweb.eval.x86_64.' + id.replace('__', '_s_')).lower()
    assert swe_gym_image("Project-MONAI__MONAI-3715") == "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-3715:latest"


def mixed_rows() -> list[dict]:
    """One file holding rows of every dataset, interleaved, each in its own schema."""
    bench, verified = json_rows("swebench_rows.jsonl"), json_rows("swebench_verified_rows.json")
    gym, smith = json_rows("swe_gym_rows.json"), json_rows("swe_smith_rows.jsonl")
    return [gym[0], bench[0], smith[0], verified[0], gym[2], verified[2], smith[1], bench[4]]


def test_kind_is_decided_per_row_in_a_mixed_file(tmp_path):
    path = write_jsonl(tmp_path / "swebench_verified_export.jsonl", mixed_rows())  # the name misleads
    tasks, rejects = load_tasks(str(path))
    assert rejects == []
    assert [(t.instance_id, t.source) for t in tasks] == [
        ("getmoto__moto-5752", "swe-gym"),
        ("django__django-11099", "swe-bench"),
        ("pallets__markupsafe.620c06c9.func_pm_remove_cond__k3t9m2qa", "swe-smith"),
        ("pytest-dev__pytest-7432", "swe-bench-verified"),
        ("Project-MONAI__MONAI-3715", "swe-gym"),
        ("astropy__astropy-14995", "swe-bench-verified"),
        ("pallets__markupsafe.620c06c9.func_pm_op_change_const__w2v8c1n5", "swe-smith"),
        ("astropy__astropy-12907", "swe-bench"),
    ]
    assert [t.image.split("/")[0] for t in tasks] == [
        "xingyaoww", "swebench", "swebench", "swebench", "xingyaoww", "swebench", "swebench", "swebench"]
    columns = dict.fromkeys(key for row in mixed_rows() for key in row)
    as_text = [{k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()} for row in mixed_rows()]
    pq.write_table(pa.Table.from_pylist([{k: row.get(k) for k in columns} for row in as_text]),
                   tmp_path / "mixed.parquet")
    # Parquet gives every row every column (null where its dataset has none): values decide, not keys
    assert "difficulty" in pq.read_table(tmp_path / "mixed.parquet").to_pylist()[0]
    from_parquet, rejects = load_tasks(str(tmp_path / "mixed.parquet"))
    assert rejects == []
    assert [(t.instance_id, t.source) for t in from_parquet] == [(t.instance_id, t.source) for t in tasks]


@pytest.mark.parametrize("name,index,kind", [
    ("swebench_rows.jsonl", 0, "swe-bench"),
    ("swebench_verified_rows.json", 0, "swe-bench-verified"),
    ("swebench_verified_rows.json", 2, "swe-bench-verified"),
    ("swe_gym_rows.json", 1, "swe-gym"),
    ("swe_smith_rows.jsonl", 0, "swe-smith"),
])
def test_row_kind_from_columns(name, index, kind):
    assert row_kind(json_rows(name)[index]) == kind


def test_unknown_repo_with_its_image_loads_with_a_warning(tmp_path, caplog):
    row = django_row() | {"repo": "octo-org/widgets", "instance_id": "octo-org__widgets-12",
                          "image_name": "ghcr.io/octo-org/widgets-env:12",
                          "FAIL_TO_PASS": '["tests/test_w.py::test_a"]', "PASS_TO_PASS": '["tests/test_v.py::test_b"]'}
    path = write_jsonl(tmp_path / "rows.jsonl", [row, json_rows("swe_gym_rows.json")[1]])
    with caplog.at_level(logging.WARNING, logger="pipeline.sources.swebench_rows"):
        (widgets, mypy), rejects = load_tasks(str(path))
    assert rejects == []
    assert (widgets.image, widgets.test_cmd) == (row["image_name"], "pytest -rA tests/test_w.py tests/test_v.py")
    assert json.loads(widgets.provenance)["test_cmd_from"] == "no harness spec"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("octo-org/widgets" in w and "octo-org__widgets-12" in w and "does not know the repository" in w
               for w in warnings)
    assert any("python/mypy" in w and "python__mypy-10401" in w for w in warnings)


def test_decontamination_where_rows_are_loaded():
    path = str(DATA / "swebench_rows.jsonl")
    flagged, rejects = load_tasks(path)
    assert rejects == [] and all(json.loads(t.provenance)["eval_overlap"] == ["swe-bench-verified"] for t in flagged)
    kept, rejects = load_tasks(path, decontaminate="exclude")
    assert kept == [] and [r.stage for r in rejects] == ["decontaminate"] * 5
    assert "django/django is in evaluation benchmark swe-bench-verified" in rejects[0].reason
    plain, _ = load_tasks(path, decontaminate="off")
    assert all("eval_overlap" not in json.loads(t.provenance) for t in plain)
    gym, rejects = load_tasks(str(DATA / "swe_gym_rows.json"), decontaminate="exclude")
    assert len(gym) == 3 and rejects == []
    with pytest.raises(ValueError, match="'swe-bench-pro' is not shipped"):
        load_tasks(path, eval_benchmarks=("swe-bench-pro",))


def test_dataset_config_defaults_follow_the_sources_settings():
    from assets.settings import SourcesConfig

    sources, dataset = SourcesConfig(), SweDatasetConfig("x.jsonl")
    assert (sources.decontaminate, sources.eval_benchmarks) == (dataset.decontaminate, dataset.eval_benchmarks)
