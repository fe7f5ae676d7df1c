"""One bug candidate tried in a synthesis sandbox: the suite run with the bug in place until its failures
are known to repeat, and the weak-test probe; the file is always put back."""

from __future__ import annotations

from pipeline.synthesis.mutations import BugCandidate
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.strength import tests_ignore_result
from pipeline.synthesis.suite import Baseline, run_suite
from pipeline.synthesis.synth_config import SynthConfig, SynthReport
from sandbox.base import Sandbox


def try_candidate(sandbox: Sandbox, spec: PackageSpec, cand: BugCandidate, base: Baseline,
                  config: SynthConfig, report: SynthReport, expect: list[str] | None = None
                  ) -> tuple[list[str], str] | None:
    """(FAIL_TO_PASS, log) when the bug breaks the same tests on each of `validation_runs - 1` runs (at least
    one); the verifier's grade of the empty patch is the last run with the bug, held to the same failures
    (check_tasks(exact=True)). The file is restored after."""
    path = f"{sandbox.workdir}/{cand.file}"
    sandbox.write_file(path, cand.mutated_source)
    try:
        report.count(spec.key, cand.kind, "tested")
        # A bug that makes the suite much slower makes a slow task (and often a hang): drop it early.
        limit = max(5.0, config.slowdown * base.seconds)
        with report.clock.stage("bug_runs"):
            first, text, timed_out = run_suite(sandbox, spec, limit)
        if timed_out:
            return None
        f2p = sorted(t for t in base.passed if first.get(t, "FAILED") != "PASSED")
        if not 1 <= len(f2p) <= config.max_fail_to_pass or len(f2p) == len(base.passed):
            return None
        report.count(spec.key, cand.kind, "broke_tests")
        if expect is not None and f2p != expect:  # a combined bug must fail exactly its parts' tests
            report.count(spec.key, cand.kind, "fail_to_pass_not_union")
            return None
        for _ in range(config.validation_runs - 2):
            with report.clock.stage("bug_runs"):
                again, _, _ = run_suite(sandbox, spec, limit)
            if sorted(t for t in base.passed if again.get(t, "FAILED") != "PASSED") != f2p:
                report.count(spec.key, cand.kind, "flaky_with_bug")
                return None
        if config.reject_weak_tests and expect is None and _weak(sandbox, spec, cand, f2p, limit, report):
            report.count(spec.key, cand.kind, "weak_tests")
            return None
        report.count(spec.key, cand.kind, "stable")
        return f2p, text
    finally:
        with report.clock.stage("restore"):
            sandbox.write_file(path, cand.original_source)


def _weak(sandbox, spec, cand, f2p, limit, report) -> bool:
    """The weak-test probe (a combined bug's parts were probed)."""
    with report.clock.stage("probe"):
        return tests_ignore_result(sandbox, spec, cand.file, cand.original_source, cand.function, f2p, limit)
