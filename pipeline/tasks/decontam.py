"""Decontamination: tasks from repositories an evaluation benchmark draws on are flagged or set aside.

A policy trained on a repository's tasks and then scored on a benchmark built from the same
repository has seen its code, its tests and often its fixes. Repositories match by name
(the part after the owner, normalized as PyPI normalizes names): a fork or a SWE-smith mirror
holds the same code, and a synthesized task's repo is `pypi/<package>`, which for every
SWE-bench Verified repository is its repository name.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path
from typing import Literal, get_args

from pipeline.core.records import RejectedTask, Task

log = logging.getLogger(__name__)

Mode = Literal["off", "flag", "exclude"]
MODES: tuple[str, ...] = get_args(Mode)
REJECT_STAGE = "decontaminate"
PROVENANCE_KEY = "eval_overlap"
BENCHMARK_FILES = {"swe-bench-verified": "data/swebench_verified_repos.txt"}
# SWE-smith mirrors are 'swesmith/<owner>__<name>.<commit>'
_SMITH_MIRROR = re.compile(r"^swesmith/(?P<owner>.+?)__(?P<name>.+)\.[0-9a-f]{7,40}$")


def repo_key(repo: str) -> str:
    """The name a repository is matched by: its name part, lower case, runs of '-_.' as one '-'."""
    mirror = _SMITH_MIRROR.match(repo)
    name = mirror.group("name") if mirror else repo.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def benchmark_repos(benchmark: str) -> frozenset[str]:
    """Repository keys of a shipped benchmark list ('swe-bench-verified') or of a file of owner/name lines."""
    if benchmark in BENCHMARK_FILES:
        text = files("pipeline.tasks").joinpath(BENCHMARK_FILES[benchmark]).read_text(encoding="utf-8")
    elif Path(benchmark).is_file():
        text = Path(benchmark).read_text(encoding="utf-8")
    else:
        known = ", ".join(map(repr, BENCHMARK_FILES))
        raise ValueError(f"evaluation benchmark {benchmark!r} is not shipped ({known}) and is no file; "
                         "name a shipped one or give a file of owner/name lines")
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return frozenset(repo_key(line) for line in lines if line)


def overlapping_benchmarks(repo: str, benchmarks: Iterable[str]) -> tuple[str, ...]:
    """The benchmarks, of `benchmarks`, that draw on `repo`."""
    key = repo_key(repo)
    return tuple(name for name in benchmarks if key in benchmark_repos(name))


def check_settings(mode: str, benchmarks: Iterable[str]) -> None:
    """Raise ValueError, naming the fix, for an unknown mode or benchmark."""
    if mode not in MODES:
        raise ValueError(f"decontaminate mode {mode!r} is not one of {MODES}; pass one of them")
    for name in benchmarks:
        benchmark_repos(name)


def decontaminate(tasks: Iterable[Task], mode: str, benchmarks: Iterable[str]) -> tuple[list[Task], list[RejectedTask]]:
    """Tasks kept (flagged in provenance under 'eval_overlap' when mode is 'flag'), and those set aside."""
    tasks, benchmarks = list(tasks), tuple(benchmarks)
    check_settings(mode, benchmarks)
    if mode == "off" or not benchmarks:
        return tasks, []
    kept: list[Task] = []
    rejects: list[RejectedTask] = []
    hits: dict[str, list[str]] = defaultdict(list)
    for task in tasks:
        overlap = overlapping_benchmarks(task.repo, benchmarks)
        if not overlap:
            kept.append(task)
            continue
        hits[f"{task.repo} (in {', '.join(overlap)})"].append(task.instance_id)
        if mode == "exclude":
            reason = (f"{task.instance_id}: repo {task.repo} is in evaluation benchmark {', '.join(overlap)}; "
                      "set sources.decontaminate to 'flag' or 'off', or drop it from sources.eval_benchmarks, "
                      "to train on it")
            rejects.append(RejectedTask(task.instance_id, REJECT_STAGE, reason))
        else:
            provenance = {**json.loads(task.provenance or "{}"), PROVENANCE_KEY: list(overlap)}
            kept.append(dataclasses.replace(task, provenance=json.dumps(provenance, sort_keys=True)))
    for repo, ids in hits.items():
        verb = "set aside" if mode == "exclude" else "flagged"
        log.warning("decontamination: %s %d task(s) of %s: %s", verb, len(ids), repo, _some(ids))
    return kept, rejects


def _some(ids: list[str], shown: int = 5) -> str:
    return ", ".join(ids[:shown]) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")
