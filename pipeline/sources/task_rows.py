"""One SWE-bench-format row made a Task: which dataset's convention it follows (`row_kind`), its tests,
test command, image and log parser, checked field by field; a row that cannot become a Task raises
`TaskRowError` naming the row, the field and the fix."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, get_args

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from pipeline.core.records import Task
from pipeline.sources.harness_specs import (SWE_GYM_NAMESPACE, SWE_GYM_REPOS, eval_script_test_cmd,
                                            harness_test_cmd, repo_parsers, resolve_log_parser, spec_repos,
                                            swe_gym_image, swebench_image)

Kind = Literal["swe-bench", "swe-bench-verified", "swe-gym", "swe-smith"]
SOURCE_KINDS: tuple[str, ...] = get_args(Kind)
WORKDIR = "/testbed"
DEFAULT_TEST_CMD = "pytest -rA"
DEFAULT_LOG_PARSER = "parse_log_pytest"
# where a task's test_cmd came from (provenance 'test_cmd_from')
FROM_ROW, FROM_EVAL_SCRIPT, FROM_SPEC, NO_SPEC = "row test_cmd", "row eval_script", "harness spec", "no harness spec"
_BENCH_REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement")
_SMITH_REQUIRED = ("instance_id", "repo", "patch", "problem_statement", "image_name")
_TESTS_EXAMPLE = '["tests/test_x.py::test_y"]'


class TaskRowError(ValueError):
    """A dataset row that cannot become a Task: which row, which field, and what to change."""

    def __init__(self, item: str, field: str, problem: str, fix: str):
        super().__init__(f"{item}: {field} {problem}; fix: {fix}")
        self.item, self.field, self.problem, self.fix = item, field, problem, fix

    def __reduce__(self):
        # errors cross process boundaries (Dagster steps); the default pickles only args
        return type(self), (self.item, self.field, self.problem, self.fix)


def row_kind(row: dict[str, Any]) -> Kind:
    """The dataset a row comes from, by its columns (each dataset's published schema).

    Values, not keys, decide: a Parquet file or Hub split holding rows of several datasets
    gives every row every column, null where the row's dataset has none.
    """
    repo, filled = _text(row.get("repo")), {key for key, value in row.items() if _text(value).strip()}
    if repo.startswith("swesmith/") or ("image_name" in filled and "test_patch" not in filled):
        return "swe-smith"  # a mirror repo, the image named, no test patch (the tests sit in the image)
    if "difficulty" in filled:
        return "swe-bench-verified"  # the annotators' time estimate only Verified carries
    if repo in SWE_GYM_REPOS or ("environment_setup_commit" not in filled and repo not in spec_repos()):
        return "swe-gym"  # SWE-Gym's rows have no environment_setup_commit
    return "swe-bench"


def task_from_row(
    row: Any, *, kind: str = "auto", dataset: str = "", split: str = "", index: int = 0,
    image_namespace: str = "",
) -> Task:
    """One row as a Task; raises TaskRowError naming the row, the field and the fix."""
    if not isinstance(row, dict):
        raise TaskRowError(f"row {index}", "row", f"is a {type(row).__name__}", "write rows as JSON objects")
    item = instance_id_of(row) or f"row {index}"
    kind = row_kind(row) if kind == "auto" else kind
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
    log_parser = _log_parser(row, item)
    test_cmd, test_cmd_from = _test_command(row, item, kind, fail_to_pass + pass_to_pass)
    provenance = {"dataset": dataset, "split": split, "index": index, "test_cmd_from": test_cmd_from}
    common = dict(
        instance_id=item,
        repo=row["repo"],
        problem_statement=row["problem_statement"],
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        workdir=WORKDIR,
        test_cmd=test_cmd,
        log_parser=log_parser,
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
        image=_image(row, item, kind, image_namespace),
        test_files=_diff_files(row["test_patch"], item, "test_patch"),
        provenance=json.dumps(provenance, sort_keys=True),
    )


def _test_command(row: dict[str, Any], item: str, kind: str, tests: tuple[str, ...]) -> tuple[str, str]:
    """The command that grades the row, and where it came from: the row, the harness's spec, or a fallback."""
    if _text(row.get("test_cmd")).strip():
        return row["test_cmd"], FROM_ROW
    script = _text(row.get("eval_script"))
    if script.strip():  # a swebench 5 row: the harness runs the row's own script
        command = eval_script_test_cmd(script)
        if command is None:
            fix = "give the eval.sh swebench wrote for the instance, or a test_cmd column"
            raise TaskRowError(item, "eval_script", "has no test command between its test-output markers", fix)
        return command, FROM_EVAL_SCRIPT
    if kind != "swe-smith":
        command = harness_test_cmd(row["repo"], _text(row.get("version")), row["test_patch"])
        if command is not None:
            return command, FROM_SPEC
        # no spec: the files the graded tests live in, else the whole suite
        files = dict.fromkeys(test.split("::")[0] for test in tests if "::" in test)
        return " ".join([DEFAULT_TEST_CMD, *files]), NO_SPEC
    # SWE-smith's harness runs a repository's whole suite; its rows carry no command
    return DEFAULT_TEST_CMD, NO_SPEC


def _image(row: dict[str, Any], item: str, kind: str, namespace: str) -> str:
    """The row's own image, else the name its dataset published it under; unknown repositories must name one."""
    named = _text(row.get("image")).strip() or _text(row.get("image_name")).strip()
    if named:
        return named
    repo = row["repo"]
    if kind == "swe-gym" and repo in SWE_GYM_REPOS:
        return swe_gym_image(item, namespace or SWE_GYM_NAMESPACE)
    if kind != "swe-gym" and repo in spec_repos():
        return swebench_image(item, namespace or "swebench")
    fix = "set the row's image_name to an image holding the repository at base_commit in /testbed, or drop the row"
    raise TaskRowError(item, "image_name", f"is missing and {kind} publishes no image for repo {repo!r}", fix)


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


def _log_parser(row: dict[str, Any], item: str) -> str:
    name = _text(row.get("log_parser")) or repo_parsers().get(row["repo"], DEFAULT_LOG_PARSER)
    resolved = resolve_log_parser(name)
    if resolved is None:
        fix = f"set the row's log_parser to a registered name, e.g. {DEFAULT_LOG_PARSER!r}"
        raise TaskRowError(item, "log_parser", f"{name!r} is not in swebench's PARSER_REGISTRY", fix)
    return resolved


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


def instance_id_of(row: Any) -> str:
    return _text(row.get("instance_id")) if isinstance(row, dict) else ""


def _text(value: Any) -> str:
    return "" if value is None else str(value)
