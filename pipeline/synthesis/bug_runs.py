"""One bug candidate tried in a synthesis sandbox: the test files that can see the bug (the package's call
map, pipeline/synthesis/callmap.py) run with the bug in place until its failures are known to repeat, then
the weak-test probe; the file is always put back. A candidate no test runs costs no run."""

from __future__ import annotations

from pipeline.synthesis.candidates import BugCandidate
from pipeline.synthesis.packages import PackageSpec
from pipeline.synthesis.strength import tests_ignore_result
from pipeline.synthesis.suite import Baseline, run_suite, with_test_files
from pipeline.synthesis.synth_config import SynthConfig, SynthReport
from sandbox.base import Sandbox


def try_candidate(sandbox: Sandbox, spec: PackageSpec, cand: BugCandidate, base: Baseline,
                  config: SynthConfig, report: SynthReport, expect: list[str] | None = None
                  ) -> tuple[list[str], str, tuple[str, ...] | None] | None:
    """(FAIL_TO_PASS, log, test files run: None for the whole suite) when the bug breaks the same tests on each
    of `validation_runs - 1` runs (at least one); the verifier's grade of the empty patch is the last run with
    the bug, of the whole suite, held to the same failures (check_tasks(exact=True)). The file is restored
    after."""
    files = base.callmap.test_files(cand) if base.callmap else None
    if files == ():
        report.count(spec.key, cand.kind, "run_by_no_test")
        return None
    path = f"{sandbox.workdir}/{cand.file}"
    sandbox.write_file(path, cand.mutated_source)
    try:
        report.count(spec.key, cand.kind, "tested")
        # A bug that makes the suite much slower makes a slow task (and often a hang): drop it early.
        limit = max(5.0, config.slowdown * base.seconds)
        with report.clock.stage("bug_runs"):
            first, text, timed_out, files = _run_with_bug(sandbox, spec, base, files, limit)
        if timed_out:
            return None
        f2p = _broken(base, files, first)
        if not 1 <= len(f2p) <= config.max_fail_to_pass or len(f2p) == len(base.passed):
            return None
        report.count(spec.key, cand.kind, "broke_tests")
        if expect is not None and f2p != expect:  # a combined bug must fail exactly its parts' tests
            report.count(spec.key, cand.kind, "fail_to_pass_not_union")
            return None
        for _ in range(config.validation_runs - 2):
            with report.clock.stage("bug_runs"):
                again, _, _ = run_suite(sandbox, with_test_files(spec, files), limit)
            if _broken(base, files, again) != f2p:
                report.count(spec.key, cand.kind, "flaky_with_bug")
                return None
        if config.reject_weak_tests and expect is None and _weak(sandbox, spec, cand, f2p, limit, report):
            report.count(spec.key, cand.kind, "weak_tests")
            return None
        report.count(spec.key, cand.kind, "stable")
        return f2p, text, files
    finally:
        with report.clock.stage("restore"):
            sandbox.write_file(path, cand.original_source)


def _run_with_bug(sandbox, spec, base, files, limit):
    """(statuses, log, timed out, files run: None for the whole suite) of the first run with the bug: of
    `files`, or of the whole suite when a passing test of those files went missing (a test id that differs
    when fewer files are named)."""
    statuses, text, timed_out = run_suite(sandbox, with_test_files(spec, files), limit)
    if files is not None and not timed_out and not all(t in statuses for t in _in_files(base, files)):
        statuses, text, timed_out = run_suite(sandbox, spec, limit)
        files = None
    return statuses, text, timed_out, files


def _in_files(base: Baseline, files: tuple[str, ...] | None) -> list[str]:
    """The reliably passing tests that a run of `files` (None: the whole suite) holds."""
    return [t for t in base.passed if files is None or t.split("::")[0] in files]


def _broken(base: Baseline, files: tuple[str, ...] | None, statuses: dict[str, str]) -> list[str]:
    """The reliably passing tests of the run that did not pass this time, sorted."""
    return sorted(t for t in _in_files(base, files) if statuses.get(t, "FAILED") != "PASSED")


def _weak(sandbox, spec, cand, f2p, limit, report) -> bool:
    """The weak-test probe (a combined bug's parts were probed)."""
    with report.clock.stage("probe"):
        return tests_ignore_result(sandbox, spec, cand.file, cand.original_source, cand.function, f2p, limit)
