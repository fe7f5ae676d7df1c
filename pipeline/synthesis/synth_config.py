"""What bug synthesis is told (SynthConfig) and what it reports (SynthReport: counts per stage, rejects,
difficulty, and where the time went)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated

from annotated_types import Ge

from pipeline.core.records import RejectedTask
from pipeline.core.config_tree import check_ranges
from pipeline.core.setting_ranges import Count, CountOrZero, Fraction, NonNegative, Seconds, Seed
from pipeline.synthesis.difficulty import summary
from pipeline.synthesis.packages import DEFAULT_PACKAGES, package_specs
from pipeline.tasks.stage_clock import StageClock

_COUNT_LOCK = threading.Lock()  # candidate workers count from several threads


@dataclass(frozen=True)
class SynthConfig:
    """How tasks are synthesized from packages."""

    packages: tuple[str, ...] = tuple(p.name for p in DEFAULT_PACKAGES)
    """Packages to inject bugs into: `name==version`, or `name` for the latest sdist (toolz, tabulate, boltons keep built-in pins), then optional overrides `test_paths=... source_globs=... test_requirements='a b' test_command='...'`; the rest is discovered from the sdist."""
    tasks_per_package: Count = 8
    """Stop validating a package's candidates once this many are kept."""
    candidates_per_package: Count = 60
    """Most bug candidates tried per package."""
    max_fail_to_pass: Count = 10
    """A candidate breaking more tests than this is too blunt to be a task."""
    baseline_runs: Count = 3
    """Runs of the pristine suite; a test that does not pass on every one is left out of PASS_TO_PASS."""
    validation_runs: Count = 3
    """Runs with each bug (same failures every time; the last is the verifier's grade of the empty patch) and
    grades of its gold patch (resolved every time) to keep it."""
    min_pass_rate: Fraction = 0.9
    """A package whose suite passes less than this share of its tests is skipped."""
    suite_timeout: Seconds = 180.0
    """Seconds one run of a package's suite may take; slower packages are skipped."""
    slowdown: Annotated[float, Ge(1)] = 3.0
    """A candidate whose suite runs this many times slower than the clean suite is dropped."""
    workers: Count = 2
    """Sandboxes validating candidates at once."""
    max_per_function: Count = 1
    """Most candidates taken from one function (spreads tasks over the code)."""
    seed: Seed = 0
    """Seed of candidate sampling and problem-statement templates."""
    rewrite: bool = False
    """Also ask the teacher LLM (guidance.teacher, not `rule`) to rewrite functions with a subtle bug, same signature and docstring."""
    rewrites_per_package: CountOrZero = 6
    """Most functions per package the teacher is asked to rewrite (each one request) when `rewrite` is on."""
    combine: CountOrZero = 0
    """Most combined tasks per package: 2-3 kept bugs of one module (disjoint lines) merged, FAIL_TO_PASS their union; 0: none."""
    reject_weak_tests: bool = True
    """Drop a bug whose FAIL_TO_PASS tests all still pass with its function reduced to `return None`: they do not
    check its result, so a fix that skips the function would be paid (`pipeline/synthesis/strength.py`)."""
    certify_runs: Count = 3
    """Fresh containers each validated task's gold and empty patches are graded in, one in a shuffled test order (its certificate, `pipeline/tasks/certificate.py`; dataset rows too); a release takes only tasks whose gold patch resolved in all and empty patch in none."""
    package_budget: NonNegative = 300.0
    """Seconds a package's candidates are tried for (from its first candidate); at the budget it stops trying more, keeps what it found and says so in the report; 0: no limit."""

    def __post_init__(self):
        package_specs(self.packages)  # a malformed entry fails here, naming itself
        check_ranges(self)


@dataclass
class SynthReport:
    """What every stage did, per package and per mutation kind: generated, compiled, tested,
    broke_tests, weak_tests (its tests ignore the function's result), stable (same failures every run), kept
    (checked by the verifier)."""

    per_package: dict[str, Counter] = field(default_factory=dict)
    per_kind: dict[str, Counter] = field(default_factory=dict)
    rejects: list[RejectedTask] = field(default_factory=list)
    seconds: float = 0.0
    difficulty: list[tuple[str, str, dict]] = field(default_factory=list)
    """(package, kind, difficulty record) of every task returned, cached ones included."""
    removed: dict[str, list[str]] = field(default_factory=dict)
    """Per package, the copies of its source its image leaves out (build trees, dists, backups, bytecode:
    pipeline/tasks/copies.py), as paths in the unpacked sdist."""
    clock: StageClock = field(default_factory=StageClock)
    """Wall seconds per stage (pipeline/tasks/stage_clock.py)."""

    def count(self, package: str, kind: str, stage: str, n: int = 1) -> None:
        with _COUNT_LOCK:
            self.per_package.setdefault(package, Counter())[stage] += n
            self.per_kind.setdefault(kind, Counter())[stage] += n

    def note(self, package: str, what: str, n: float) -> None:
        """A per-package figure that belongs to no mutation kind (tests found, flaky tests, seconds)."""
        with _COUNT_LOCK:
            self.per_package.setdefault(package, Counter())[what] += n

    def throughput(self) -> dict:
        """Seconds per kept task, tasks per hour, the wall-time breakdown by stage and the runs in each."""
        kept = sum(c["kept"] for c in self.per_package.values())
        return {"tasks_kept": kept, "seconds_per_task": round(self.seconds / kept, 2) if kept else None,
                "tasks_per_hour": round(3600 * kept / self.seconds, 1) if self.seconds else 0.0,
                "breakdown": self.clock.breakdown(self.seconds), "stage_runs": dict(self.clock.runs)}

    def as_json(self) -> dict:
        by_package, by_kind = {}, {}
        for package, kind, record in self.difficulty:
            by_package.setdefault(package, []).append(record)
            by_kind.setdefault(kind, []).append(record)
        return {"per_package": {k: per_kept_task(v) for k, v in self.per_package.items()}, "removed": self.removed,
                "per_kind": {k: dict(v) for k, v in sorted(self.per_kind.items())},
                "rejects": len(self.rejects), "seconds": round(self.seconds, 1), **self.throughput(),
                "difficulty": {"all": summary([r for _, _, r in self.difficulty]),
                               "per_package": {k: summary(v) for k, v in by_package.items()},
                               "per_kind": {k: summary(v) for k, v in sorted(by_kind.items())}}}


def per_kept_task(counts: Counter) -> dict:
    """A package's counts with `seconds_per_kept_task` (its `seconds` over its kept tasks; None: none kept)."""
    kept = counts.get("kept", 0)
    return {**counts, "seconds_per_kept_task": round(counts["seconds"] / kept, 1) if kept and "seconds" in counts
            else None}
