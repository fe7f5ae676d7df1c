"""SWE-bench-format rows (SWE-bench, SWE-bench Verified, SWE-Gym, SWE-smith) loaded into Tasks.

Rows come from the Hugging Face Hub (`datasets.load_dataset`) or a local .json, .jsonl or
.parquet file; each row's dataset is read from its columns. A row that cannot become a Task
raises `TaskRowError` (pipeline/sources/task_rows.py); `load_tasks` keeps the good rows and returns the others as
`RejectedTask`s with the reason. A row is graded by what SWE-bench's harness runs for it
(`harness_specs`); rows whose repository the harness has no spec for are named in a warning.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq

from pipeline.core.records import RejectedTask, Task
from pipeline.sources.harness_specs import spec_repos
from pipeline.sources.task_rows import NO_SPEC, SOURCE_KINDS, TaskRowError, instance_id_of, task_from_row
from pipeline.tasks import decontam

log = logging.getLogger(__name__)

REJECT_STAGE = "load"
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")


@dataclass(frozen=True)
class SweDatasetConfig:
    """Where SWE-bench-format rows come from and which of them become Tasks."""

    dataset: str
    """A Hub dataset name (e.g. 'SWE-bench/SWE-bench_Verified') or a local .json/.jsonl/.parquet file."""
    kind: Literal["auto", "swe-bench", "swe-bench-verified", "swe-gym", "swe-smith"] = "auto"
    """Row convention; 'auto' decides it for each row from its columns (`row_kind`)."""
    split: str = "test"
    """Hub split to load; recorded in provenance for local files too."""
    limit: int | None = None
    """Read at most this many rows (after the instance_ids filter); None reads them all."""
    instance_ids: tuple[str, ...] = ()
    """Keep only these instances; empty keeps every row."""
    image_namespace: str = ""
    """Registry namespace of derived sweb.eval.* images; '' uses the one each dataset published under."""
    decontaminate: Literal["off", "flag", "exclude"] = "flag"
    """Rows whose repository an `eval_benchmarks` benchmark draws on: kept, kept and flagged, or set aside."""
    eval_benchmarks: tuple[str, ...] = ("swe-bench-verified",)
    """Evaluation benchmarks (shipped lists, or files of owner/name lines) whose repositories are decontaminated."""


def load_tasks(
    source: str, *, kind: str | None = None, split: str = "test", limit: int | None = None,
    decontaminate: str = "flag", eval_benchmarks: tuple[str, ...] = ("swe-bench-verified",),
) -> tuple[list[Task], list[RejectedTask]]:
    """Tasks from a Hub dataset or local file, and the rows set aside with their reasons."""
    config = SweDatasetConfig(source, kind or "auto", split, limit, decontaminate=decontaminate,
                              eval_benchmarks=tuple(eval_benchmarks))
    return load_tasks_from_config(config)


def load_tasks_from_config(config: SweDatasetConfig) -> tuple[list[Task], list[RejectedTask]]:
    """Tasks for `config`, and a RejectedTask for each bad row or requested id not found."""
    if config.kind not in ("auto", *SOURCE_KINDS):
        raise ValueError(f"kind {config.kind!r} is not one of {('auto', *SOURCE_KINDS)}; pass one of them")
    decontam.check_settings(config.decontaminate, config.eval_benchmarks)
    rows = _selected_rows(config)
    tasks: dict[str, Task] = {}
    rejects: list[RejectedTask] = []
    for index, row in rows:
        try:
            task = task_from_row(row, kind=config.kind, dataset=config.dataset, split=config.split,
                                 index=index, image_namespace=config.image_namespace)
            if task.instance_id in tasks:
                raise TaskRowError(task.instance_id, "instance_id", "repeats an earlier row", "drop one")
            tasks[task.instance_id] = task
        except TaskRowError as err:
            rejects.append(RejectedTask(item=err.item, stage=REJECT_STAGE, reason=str(err)))
    if config.limit is None:  # under a limit, a requested id may simply lie past it
        missing = set(config.instance_ids) - {instance_id_of(row) for _, row in rows}
        reason = f"not in {config.dataset} ({config.split})"
        rejects += [RejectedTask(i, REJECT_STAGE, f"{i}: {reason}") for i in sorted(missing)]
    _warn_unspecified(tasks.values())
    kept, set_aside = decontam.decontaminate(tasks.values(), config.decontaminate, config.eval_benchmarks)
    return kept, rejects + set_aside


def _warn_unspecified(tasks: Iterable[Task]) -> None:
    """One warning per repository whose rows run a fallback command (no harness spec, no command in the row)."""
    groups: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        if json.loads(task.provenance).get("test_cmd_from") == NO_SPEC:
            groups[task.repo].append(task)
    for repo, group in groups.items():
        known = "has no spec for its version(s)" if repo in spec_repos() else "does not know the repository"
        versions = ", ".join(sorted({t.version or "(none)" for t in group}))
        ids = ", ".join(t.instance_id for t in group[:5]) + (" ..." if len(group) > 5 else "")
        log.warning("%s (version %s): swebench's harness %s, so %d row(s) (%s) run a fallback, e.g. `%.120s`; "
                    "give the rows a test_cmd or eval_script column to grade them the harness's way",
                    repo, versions, known, len(group), ids, group[0].test_cmd)


def _selected_rows(config: SweDatasetConfig) -> list[tuple[int, Any]]:
    """(index in the dataset, row) for the rows the config asks for."""
    wanted = set(config.instance_ids)
    indexed = enumerate(dataset_rows(config.dataset, config.split))
    picked = ((i, row) for i, row in indexed if not wanted or instance_id_of(row) in wanted)
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
