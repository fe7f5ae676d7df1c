"""SWE-bench-format rows (SWE-bench, SWE-bench Verified, SWE-Gym, SWE-smith) loaded into Tasks.

Rows come from the Hugging Face Hub (`datasets.load_dataset`) or a local .json, .jsonl or
.parquet file. A row that cannot become a Task raises `TaskRowError`; `load_tasks` keeps
the good rows and returns the others as `RejectedTask`s with the reason.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import pkgutil
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import pyarrow.parquet as pq
from swebench.task.checks import expected_image
from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from pipeline.records import RejectedTask, Task

Kind = Literal["swe-bench", "swe-bench-verified", "swe-gym", "swe-smith"]
KINDS: tuple[str, ...] = get_args(Kind)
REJECT_STAGE = "load"
WORKDIR = "/testbed"
DEFAULT_TEST_CMD = "pytest -rA"
DEFAULT_LOG_PARSER = "parse_log_pytest"
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")

# swebench 5 dropped MAP_REPO_VERSION_TO_SPECS (each instance now carries its eval script);
# these are the SWE-bench repos whose 4.x spec ran something other than `pytest -rA`.
_DJANGO = "./tests/runtests.py --verbosity 2"
_OLD_ASTROPY = "pytest -rA -vv -o console_output_style=classic --tb=no -p no:nose"
REPO_TEST_CMDS = {
    "django/django": f"{_DJANGO} --settings=test_sqlite --parallel 1",
    "sympy/sympy": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose",
    "sphinx-doc/sphinx": "tox --current-env -epy39 -v --",
    "mwaskom/seaborn": "pytest --no-header -rA",
}
VERSION_TEST_CMDS = {
    ("django/django", "1.9"): _DJANGO,
    **{("astropy/astropy", v): _OLD_ASTROPY for v in ("0.1", "0.2", "0.3", "0.4", "1.1", "1.2", "1.3")},
}
_BENCH_REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement")
_SMITH_REQUIRED = ("instance_id", "repo", "patch", "problem_statement", "image_name")
_TESTS_EXAMPLE = '["tests/test_x.py::test_y"]'


@dataclass(frozen=True)
class SweDatasetConfig:
    """Where SWE-bench-format rows come from and which of them become Tasks."""

    dataset: str
    """A Hub dataset name (e.g. 'SWE-bench/SWE-bench_Verified') or a local .json/.jsonl/.parquet file."""
    kind: Literal["auto", "swe-bench", "swe-bench-verified", "swe-gym", "swe-smith"] = "auto"
    """Row convention; 'auto' reads it from the dataset name, then from the first row's fields."""
    split: str = "test"
    """Hub split to load; recorded in provenance for local files too."""
    limit: int | None = None
    """Read at most this many rows (after the instance_ids filter); None reads them all."""
    instance_ids: tuple[str, ...] = ()
    """Keep only these instances; empty keeps every row."""
    image_namespace: str = "swebench"
    """Registry namespace of sweb.eval.* images (OpenHands publishes SWE-Gym's under 'xingyaoww')."""


class TaskRowError(ValueError):
    """A dataset row that cannot become a Task: which row, which field, and what to change."""

    def __init__(self, item: str, field: str, problem: str, fix: str):
        super().__init__(f"{item}: {field} {problem}; fix: {fix}")
        self.item, self.field, self.problem, self.fix = item, field, problem, fix

    def __reduce__(self):
        # errors cross process boundaries (Dagster steps); the default pickles only args
        return type(self), (self.item, self.field, self.problem, self.fix)


def load_tasks(
    source: str, *, kind: str | None = None, split: str = "test", limit: int | None = None
) -> tuple[list[Task], list[RejectedTask]]:
    """Tasks from a Hub dataset or local file, and the rows set aside with their reasons."""
    return load_tasks_from_config(SweDatasetConfig(source, kind or "auto", split, limit))


def load_tasks_from_config(config: SweDatasetConfig) -> tuple[list[Task], list[RejectedTask]]:
    """Tasks for `config`, and a RejectedTask for each bad row or requested id not found."""
    if config.kind not in ("auto", *KINDS):
        raise ValueError(f"kind {config.kind!r} is not one of {('auto', *KINDS)}; pass one of them")
    rows = _selected_rows(config)
    first = next((row for _, row in rows if isinstance(row, dict)), None)
    kind = detect_kind(config.dataset, first) if config.kind == "auto" else config.kind
    tasks: dict[str, Task] = {}
    rejects: list[RejectedTask] = []
    for index, row in rows:
        try:
            task = task_from_row(row, kind=kind, dataset=config.dataset, split=config.split,
                                 index=index, image_namespace=config.image_namespace)
            if task.instance_id in tasks:
                raise TaskRowError(task.instance_id, "instance_id", "repeats an earlier row", "drop one")
            tasks[task.instance_id] = task
        except TaskRowError as err:
            rejects.append(RejectedTask(item=err.item, stage=REJECT_STAGE, reason=str(err)))
    if config.limit is None:  # under a limit, a requested id may simply lie past it
        missing = set(config.instance_ids) - {_instance_id(row) for _, row in rows}
        reason = f"not in {config.dataset} ({config.split})"
        rejects += [RejectedTask(i, REJECT_STAGE, f"{i}: {reason}") for i in sorted(missing)]
    return list(tasks.values()), rejects


def _selected_rows(config: SweDatasetConfig) -> list[tuple[int, Any]]:
    """(index in the dataset, row) for the rows the config asks for."""
    wanted = set(config.instance_ids)
    indexed = enumerate(dataset_rows(config.dataset, config.split))
    picked = ((i, row) for i, row in indexed if not wanted or _instance_id(row) in wanted)
    return list(itertools.islice(picked, config.limit))


def dataset_rows(dataset: str, split: str) -> Iterable[Any]:
    """Raw rows of a local .json/.jsonl/.parquet file, else of the Hub dataset's split."""
    path = Path(dataset)
    if path.suffix not in LOCAL_SUFFIXES:
        import datasets  # imported here: slow, and only the Hub needs it

        return datasets.load_dataset(dataset, split=split)
    if not path.is_file():
        raise FileNotFoundError(f"{dataset}: no such file; give an existing file or a Hub dataset name")
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        lines = enumerate(path.read_text().splitlines(), 1)
        return [_json_line(path, number, line) for number, line in lines if line.strip()]
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{dataset}: holds a JSON {type(rows).__name__}; write the rows as one JSON list")
    return rows


def _json_line(path: Path, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{number}: not valid JSON ({err.msg}); fix or remove that line") from None


def detect_kind(dataset: str, row: dict[str, Any] | None = None) -> Kind:
    """The row convention a dataset name (or, failing that, a row's fields) implies."""
    name = Path(dataset).name if Path(dataset).suffix in LOCAL_SUFFIXES else dataset
    key = re.sub(r"[^a-z]", "", name.lower())
    if "swesmith" in key:
        return "swe-smith"
    if "swegym" in key:
        return "swe-gym"
    if "swebench" in key:
        return "swe-bench-verified" if "verified" in key else "swe-bench"
    return "swe-smith" if row and "image_name" in row else "swe-bench"


def task_from_row(
    row: Any, *, kind: Kind, dataset: str = "", split: str = "", index: int = 0,
    image_namespace: str = "swebench",
) -> Task:
    """One row as a Task; raises TaskRowError naming the row, the field and the fix."""
    if not isinstance(row, dict):
        raise TaskRowError(f"row {index}", "row", f"is a {type(row).__name__}", "write rows as JSON objects")
    item = _instance_id(row) or f"row {index}"
    smith = kind == "swe-smith"
    for field in _SMITH_REQUIRED if smith else _BENCH_REQUIRED:
        if not _text(row.get(field)).strip():
            raise TaskRowError(item, field, "is missing or empty", f"give the row a non-empty {field!r}")
    fail_to_pass = _test_names(row, "FAIL_TO_PASS", item)
    if not fail_to_pass:
        fix = "list the tests the fix makes pass, or drop the row"
        raise TaskRowError(item, "FAIL_TO_PASS", "is empty", fix)
    pass_to_pass = _test_names(row, "PASS_TO_PASS", item)
    _diff_files(row["patch"], item, "patch")
    provenance = {"dataset": dataset, "split": split, "index": index}
    common = dict(
        instance_id=item,
        repo=row["repo"],
        problem_statement=row["problem_statement"],
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        workdir=WORKDIR,
        test_cmd=_text(row.get("test_cmd")) or known_test_cmd(row["repo"], _text(row.get("version"))),
        log_parser=_log_parser(row, item),
        source=kind,
        hints_text=_text(row.get("hints_text")),
        version=_text(row.get("version")),
        environment_setup_commit=_text(row.get("environment_setup_commit")),
        created_at=_text(row.get("created_at")),
    )
    if smith:
        return Task(**common, **_smith_fields(row, item, fail_to_pass + pass_to_pass, provenance))
    return Task(
        **common,
        base_commit=row["base_commit"],
        patch=row["patch"],
        test_patch=row["test_patch"],
        image=_text(row.get("image")) or expected_image(item, image_namespace),
        test_files=_diff_files(row["test_patch"], item, "test_patch"),
        provenance=json.dumps(provenance, sort_keys=True),
    )


def _smith_fields(row: dict[str, Any], item: str, tests: tuple[str, ...], provenance: dict) -> dict[str, Any]:
    """SWE-smith's `patch` introduces the bug: it becomes the setup, its reverse the gold patch."""
    # the row's base_commit is the bug commit on a GitHub mirror branch; the image holds
    # the clean commit, which the mirror's name ('swesmith/owner__repo.<commit>') carries
    clean = re.search(r"\.([0-9a-f]{7,40})$", row["repo"])
    if not clean:
        fix = "use the mirror name, 'swesmith/owner__repo.<commit>'"
        raise TaskRowError(item, "repo", "names no commit", fix)
    provenance = {**provenance, "clean_commit": clean.group(1)}
    if row.get("base_commit"):
        provenance = {**provenance, "bug_commit": row["base_commit"]}
    return dict(
        # the bug becomes the repository's only commit when a sandbox starts; its hash is
        # recorded when the task is validated
        base_commit="",
        patch=reverse_patch(row["patch"]),
        setup_patch=row["patch"],
        test_patch="",
        image=row["image_name"],
        # no test patch: the tests the task is graded by already sit in the image's repo
        test_files=tuple(dict.fromkeys(test.split("::")[0] for test in tests if "::" in test)),
        provenance=json.dumps(provenance, sort_keys=True),
    )


def known_test_cmd(repo: str, version: str) -> str:
    """The command SWE-bench's harness runs for repo at version, else `pytest -rA`."""
    return VERSION_TEST_CMDS.get((repo, version)) or REPO_TEST_CMDS.get(repo, DEFAULT_TEST_CMD)


def resolve_log_parser(name: str) -> str | None:
    """The PARSER_REGISTRY key for `name` ('pytest' is short for 'parse_log_pytest'), else None."""
    registry = _parser_registry()
    return next((key for key in (name, f"parse_log_{name}") if key in registry), None)


def _log_parser(row: dict[str, Any], item: str) -> str:
    name = _text(row.get("log_parser")) or _repo_parsers().get(row["repo"], DEFAULT_LOG_PARSER)
    resolved = resolve_log_parser(name)
    if resolved is None:
        fix = f"set the row's log_parser to a registered name, e.g. {DEFAULT_LOG_PARSER!r}"
        raise TaskRowError(item, "log_parser", f"{name!r} is not in swebench's PARSER_REGISTRY", fix)
    return resolved


@functools.cache
def _parser_registry() -> dict[str, Any]:
    from swebench.harness.log_parsers import PARSER_REGISTRY  # imported here: it pulls in docker

    return PARSER_REGISTRY


@functools.cache
def _repo_parsers() -> dict[str, str]:
    """repo -> parser name, from swebench's per-language MAP_REPO_TO_PARSER_* tables."""
    from swebench.harness import log_parsers

    registry = _parser_registry()
    # aliases (parse_log_scikit = parse_log_pytest_v2) share one function: use its own name
    names = {id(fn): fn.__name__ if fn.__name__ in registry else name for name, fn in registry.items()}
    found = pkgutil.iter_modules(log_parsers.__path__, f"{log_parsers.__name__}.")
    modules = [importlib.import_module(m.name) for m in found]
    tables = [t for m in modules for attr, t in vars(m).items() if attr.startswith("MAP_REPO_TO_PARSER")]
    # a parser swebench maps but never registered keeps its own name, so its rows are rejected
    return {repo: names.get(id(fn), fn.__name__) for table in tables for repo, fn in table.items()}


def _test_names(row: dict[str, Any], field: str, item: str) -> tuple[str, ...]:
    value = row.get(field)
    fix = f"write it as a JSON list of test names, e.g. {_TESTS_EXAMPLE}"
    if value is None:
        raise TaskRowError(item, field, "is missing", f"{fix} (PASS_TO_PASS may be [])")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise TaskRowError(item, field, f"is not valid JSON ({err.msg})", fix) from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(test, str) for test in value):
        raise TaskRowError(item, field, "is not a list of strings", fix)
    return tuple(value)


def patched_files(diff: str) -> tuple[str, ...]:
    """Paths a unified diff touches (added, changed or removed), in diff order."""
    return tuple(dict.fromkeys(f.path for f in PatchSet(diff)))


def _diff_files(diff: str, item: str, field: str) -> tuple[str, ...]:
    fix = "give the unified diff as `git diff` prints it"
    try:
        paths = patched_files(diff)
    except UnidiffParseError as err:
        raise TaskRowError(item, field, f"is not a valid unified diff ({err})", fix) from None
    if not paths:
        raise TaskRowError(item, field, "touches no files", fix)
    return paths


def reverse_patch(patch: str) -> str:
    """The unified diff that undoes `patch` (git-apply-able; file modes are not carried)."""
    flip = {"+": "-", "-": "+"}
    out = []
    for f in PatchSet(patch):
        out += [f"--- {f.target_file}\n", f"+++ {f.source_file}\n"]
        for h in f:
            section = f" {h.section_header}" if h.section_header else ""
            ranges = f"-{h.target_start},{h.target_length} +{h.source_start},{h.source_length}"
            out.append(f"@@ {ranges} @@{section}\n")
            out += [flip.get(line.line_type, line.line_type) + line.value for line in h]
    return "".join(out)


def _instance_id(row: Any) -> str:
    return _text(row.get("instance_id")) if isinstance(row, dict) else ""


def _text(value: Any) -> str:
    return "" if value is None else str(value)

