"""A difficulty record per task (what its gold patch changes, how many tests it fails, which bug kinds
it holds), stored in the task's provenance and summarised per package and kind in the SynthReport."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from statistics import mean

from pipeline.core.records import Task


def patch_size(patch: str) -> tuple[int, int]:
    """(lines added + removed, files changed) as `git apply --numstat` reads the patch."""
    if not patch.strip():
        return 0, 0
    out = subprocess.run(["git", "apply", "--numstat", "-"], input=patch.encode(), capture_output=True,
                         check=True).stdout.decode()
    rows = [line.split("\t") for line in out.splitlines() if line.strip()]
    return sum(int(a) + int(r) for a, r, _ in rows if a != "-"), len(rows)


def difficulty(patch: str, fail_to_pass: list[str] | tuple[str, ...], kinds: list[str]) -> dict:
    """The record stored under provenance["difficulty"]."""
    lines, files = patch_size(patch)
    return {"lines_changed": lines, "files_changed": files, "fail_to_pass": len(fail_to_pass),
            "kinds": sorted(kinds)}


def task_difficulty(task: Task) -> dict:
    """The record of a stored task (computed from its patch when the provenance predates records)."""
    provenance = json.loads(task.provenance or "{}")
    if "difficulty" in provenance:
        return provenance["difficulty"]
    return difficulty(task.patch, task.FAIL_TO_PASS, provenance.get("kinds") or [provenance.get("kind", "?")])


def summary(records: list[dict]) -> dict:
    """Count, means and histograms of a group of records."""
    if not records:
        return {"tasks": 0}
    return {
        "tasks": len(records),
        "mean_lines_changed": round(mean(r["lines_changed"] for r in records), 2),
        "mean_fail_to_pass": round(mean(r["fail_to_pass"] for r in records), 2),
        "lines_changed": _histogram(r["lines_changed"] for r in records),
        "files_changed": _histogram(r["files_changed"] for r in records),
        "fail_to_pass": _histogram(r["fail_to_pass"] for r in records),
        "bugs_per_task": _histogram(len(r["kinds"]) for r in records),
    }


def _histogram(values) -> dict[str, int]:
    return {str(k): n for k, n in sorted(Counter(values).items())}
