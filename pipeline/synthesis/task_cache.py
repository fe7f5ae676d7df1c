"""The kept tasks of a package, cached per settings under `<cache>/tasks/`, so a second run rebuilds nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.agent.policy import Policy
from pipeline.core.records import Task
from pipeline.core.store import read_rows
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.statements import TEMPLATES_VERSION
from pipeline.synthesis.synth_config import SynthConfig
from pipeline.verifier.grading import GRADER_VERSION
from pipeline.verifier.rules import GradeRules


def cache_file(spec: PackageSpec, image: str, config: SynthConfig, cache: Path, writer: Policy | None,
               rewriter: Policy | None, rules: GradeRules = GradeRules()) -> Path:
    """Where the package's tasks of these settings are kept: named by a hash of every setting but
    `tasks_per_package`, then that number (see `cached_tasks`). `rules`: what the tasks were run and validated
    under (a suite that passes under one timeout or memory limit may not under another)."""
    more = ()  # settings added later join the key only when used, so earlier caches stay valid
    if rules != GradeRules():
        more += ("rules", rules)
    if config.rewrite:
        more += ("rewrite", config.rewrites_per_package, rewriter.name if rewriter else "none")
    if config.combine:
        more += ("combine", config.combine)
    if config.reject_weak_tests:
        more += ("reject_weak_tests",)
    if config.certify_runs != 1:  # 1: one container, the grades tasks had before certificates
        more += ("certify_runs", config.certify_runs)
    if config.package_budget:  # a package stopped at its budget keeps fewer tasks than a larger budget would
        more += ("package_budget", config.package_budget)
    key = repr((image, spec, config.candidates_per_package, config.max_fail_to_pass, config.max_per_function,
                config.seed, config.min_pass_rate, config.slowdown, config.baseline_runs, config.validation_runs,
                writer.name if writer else f"templates-{TEMPLATES_VERSION}", GRADER_VERSION) + more)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return cache / "tasks" / f"{spec.key}-{digest}-{config.tasks_per_package}.parquet"


def cached_tasks(path: Path, config: SynthConfig) -> list[Task] | None:
    """The tasks an earlier run of these settings kept, else (without `combine`) the first `tasks_per_package`
    of those of a run that asked for more: a run keeps its tasks in candidate order, the first candidates that
    make one, so a 2-task try-out reads the first 2 of the nightly's 8. None when no run of these settings asked
    for as many."""
    if path.exists():
        return [Task.from_row(r) for r in read_rows(path)]
    if config.combine:  # combined tasks merge the kept bugs: those of a larger run are no prefix of it
        return None
    asked = config.tasks_per_package
    larger = sorted((int(n), p) for p in path.parent.glob(f"{path.stem.rsplit('-', 1)[0]}-*.parquet")
                    if (n := p.stem.rsplit("-", 1)[1]).isdigit() and int(n) > asked)
    return [Task.from_row(r) for r in read_rows(larger[0][1])[:asked]] if larger else None
