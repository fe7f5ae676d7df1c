"""A package's own test suite before any bug: run and parsed, its reliably passing tests (the baseline),
and the spec under which its tests collect the same way every run."""

from __future__ import annotations

import dataclasses
import logging
import shlex
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.synthesis.callmap import CallMap
from pipeline.synthesis.packages import PackageError, PackageSpec, test_command
from pipeline.synthesis.subjects import ApiIndex
from pipeline.verifier.pytest_log import SUMMARY_PARSER, neutral_exports, strip_ansi, summary_statuses
from sandbox.base import Sandbox

if TYPE_CHECKING:
    from pipeline.synthesis.synth_config import SynthConfig

log = logging.getLogger(__name__)

# The tasks' parser: the last short summary's ids read whole (a line a test prints is no verdict; an id keeps its
# spaces), the one the verifier grades them with
LOG_PARSER = SUMMARY_PARSER


@dataclass(frozen=True)
class Baseline:
    passed: frozenset[str]
    """Tests that passed on every pristine run."""
    total: int
    seconds: float
    flaky: frozenset[str] = frozenset()
    """Tests that passed on some pristine runs and not others."""
    callmap: CallMap | None = None
    """Which tests run which functions (None: unknown, every candidate runs the whole suite)."""
    api: ApiIndex | None = None
    """The package's functions and classes its tests exercise, named in problem statements (None: the package's
    name only)."""


def run_suite(sandbox: Sandbox, spec: PackageSpec, timeout: float) -> tuple[dict[str, str], str, bool]:
    """Status per test, the log and whether it timed out (output read from a file: never capped)."""
    text, timed_out = _logged_run(sandbox, test_command(spec), "suite.log", timeout)
    return summary_statuses(text), text, timed_out


def with_test_files(spec: PackageSpec, files: tuple[str, ...] | None) -> PackageSpec:
    """The spec running only `files` (None, or a custom test command: the whole suite)."""
    if files is None or spec.test_command:
        return spec
    return dataclasses.replace(spec, test_paths=tuple(files))


def _logged_run(sandbox: Sandbox, command: str, log_name: str, timeout: float) -> tuple[str, bool]:
    """(output, timed out) of `command` run in the workdir, its output written to a scratch file and read back;
    pytest neutralised as the verifier's runs are (colour off, every outcome in the summary),
    in a subshell: nothing of it stays in the session."""
    log_file = f"{sandbox.scratch}/{log_name}"
    result = sandbox.run(f"mkdir -p {sandbox.scratch} && cd {sandbox.workdir} && ({neutral_exports(summary=True)}; "
                         f"{command}) > {log_file} 2>&1", timeout=timeout)
    return sandbox.read_file(log_file).decode("utf-8", errors="replace"), result.timed_out


def reproduce(sandbox: Sandbox, spec: PackageSpec) -> str:
    """The command that reruns this package's suite by hand."""
    return f"docker run --rm {sandbox.environment or '<image>'} bash -c {shlex.quote(test_command(spec))}"


def baseline(sandbox: Sandbox, spec: PackageSpec, config: SynthConfig) -> Baseline:
    """Tests that pass in every one of `baseline_runs` clean runs; raises PackageError if the suite is unusable."""
    start = time.monotonic()
    runs, text = [], ""
    for i in range(config.baseline_runs):  # a run cut by the timeout reads as failing tests: say it was the time
        statuses, log, timed_out = run_suite(sandbox, spec, config.suite_timeout)
        if timed_out:
            raise PackageError(f"{spec.key}: the test suite took over {config.suite_timeout:.0f} s in clean run "
                               f"{i + 1} of {config.baseline_runs} (raise suite_timeout, or set test_paths to a part "
                               f"of it); reproduce: {reproduce(sandbox, spec)}", "baseline")
        runs.append(statuses)
        text = text or log
    first = runs[0]
    ever = {t for run in runs for t, s in run.items() if s == "PASSED"}
    passed = frozenset(t for t in ever if all(run.get(t) == "PASSED" for run in runs))
    ran = [t for t, s in first.items() if s != "SKIPPED"]
    if not ran or len(passed) / len(ran) < config.min_pass_rate:
        errors = [line for line in strip_ansi(text).splitlines() if line.startswith("E  ")][:3]
        raise PackageError(f"{spec.key}: only {len(passed)} of {len(ran)} tests pass on every one of "
                           f"{len(runs)} runs before any bug (need {config.min_pass_rate:.0%}); fix the test "
                           f"requirements or test_paths in the package entry (or lower min_pass_rate); "
                           f"reproduce: {reproduce(sandbox, spec)}; first errors: {' | '.join(errors) or '-'}; "
                           f"log tail: {text[-600:]}", "baseline")
    return Baseline(passed, len(first), (time.monotonic() - start) / len(runs), frozenset(ever - passed))


def runnable(sandbox: Sandbox, spec: PackageSpec, config: SynthConfig) -> PackageSpec:
    """The spec as its tests run reliably: `--import-mode=importlib` when they collect with fewer errors that
    way (test folders without __init__.py holding same-named modules), and a fixed PYTHONHASHSEED when two
    collections name the tests differently (parametrized over a set: ids that no task could name twice)."""
    if spec.test_command:
        return spec
    ids, errors = _collect(sandbox, spec, config.suite_timeout)
    if errors and "--import-mode" not in " ".join(spec.pytest_args or ()):
        other = dataclasses.replace(spec, pytest_args=(*(spec.pytest_args or ()), "--import-mode=importlib"))
        other_ids, other_errors = _collect(sandbox, other, config.suite_timeout)
        if other_errors < errors:
            log.info("%s: tests collect with %d errors, %d with --import-mode=importlib", spec.key, errors,
                     other_errors)
            spec, ids = other, other_ids
    if _collect(sandbox, spec, config.suite_timeout)[0] != ids:
        log.info("%s: test ids change from run to run: PYTHONHASHSEED=0", spec.key)
        spec = dataclasses.replace(spec, test_command=f"PYTHONHASHSEED=0 {test_command(spec)}")
    return spec


def _collect(sandbox: Sandbox, spec: PackageSpec, timeout: float) -> tuple[set[str], int]:
    """(test ids, collection errors) of one `--collect-only` run."""
    text = _logged_run(sandbox, f"{test_command(spec)} --collect-only -q", "collect.log", timeout)[0]
    lines = strip_ansi(text).splitlines()
    return {line for line in lines if "::" in line}, sum(line.startswith("ERROR ") for line in lines)
