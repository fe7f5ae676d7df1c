"""The verifier: grade a candidate patch for a task, the reward of every rollout.

In a fresh sandbox from the task's image, as root and out of the sandbox user's reach:
1. git alone applies the patch (a patch git cannot apply is the patch's failure), and the paths
   it touches are the ones git reports; every protected path (tests, what the test run loads,
   package metadata, modules that shadow installed ones, anything under .git) is put back as
   it was, and each such action is recorded;
2. the test files are restored (plus the task's test_patch) with git hooks disabled;
3. the tests run as the sandbox user, with pytest's plugin autoloading off (the environment's
   own plugins named explicitly) and a JUnit report; their output and exit code are captured by
   root, and every process the tests left is killed before anything is read back;
4. swebench grades a log built from that output, between markers the tests cannot forge, with
   the real exit code (pytest's colour, xdist and report plugins neutralised, escapes stripped, the
   summary's ids read whole for synthesized tasks: pipeline/verifier/pytest_log.py); the JUnit report must agree with
   every test counted as passing;
5. a plugin of the grader's (pipeline/verifier/pytest_guard.py) signs each test's real outcome, taken before any
   report is made, with a key the code under test never sees; it too must agree;
6. static flags on what the patch adds (pytest internals, exit hooks, forged verdicts) are
   recorded and, by default, void the reward.
Steps 1-3 are two privileged round trips into the sandbox (one, plus a command in the session, in a fresh
sandbox of an image already probed); their shell is in pipeline/verifier/steps.py.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import secrets
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import docker.errors
from swebench.types import TestSpec

from pipeline.core.records import Task
from pipeline.verifier.empty_patch import graded_once
from pipeline.verifier.environment import SandboxFactory, task_sandbox
from pipeline.verifier.guard import flag_kinds, numstat_paths, protected_reason, suspicious_flags
from pipeline.verifier.junit import guard_disagreements, junit_disagreements
from pipeline.verifier.rules import GradeRules
from pipeline.verifier.pytest_log import SUMMARY_PARSER, register, strip_ansi
from pipeline.verifier.steps import (GIT, GUARD, apply_script, guard_dir, list_script, private_folders, report_folder,
                                     test_script)
from sandbox.base import Sandbox, SandboxError
from sandbox.privileged import exchange
from sandbox.session_files import WRITE_CHUNK

log = logging.getLogger(__name__)
GRADER_VERSION = "4"  # bump when a verdict may change: tasks validated by an older grader are validated again
PYTEST_PARSERS = ("parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2", SUMMARY_PARSER)
GUARD_SOURCE = Path(__file__).with_name("pytest_guard.py")
_PROBED: dict[tuple[str, str], tuple[list[str], frozenset[str]]] = {}  # (image, python) -> probe, per process
_TOPS: dict[tuple[str, str, str], set[str]] = {}  # (image, base, work tree) -> a fresh tree's top-level names


@dataclass(frozen=True)
class Grade:
    """The verdict on one patch."""

    resolved: bool
    fault: Literal["none", "patch", "infra"]
    """Whose fault a non-resolution is: the patch's (a real failure) or the infrastructure's."""
    reason: str
    """'resolved', 'tests_failed', 'patch_does_not_apply', 'tests_timed_out', 'no_test_output',
    'report_mismatch', 'suspicious', or the infra error."""
    report: str = "{}"
    """JSON: swebench's tests_status (FAIL_TO_PASS / PASS_TO_PASS success and failure lists)."""
    log: str = ""
    dropped_files: tuple[str, ...] = ()
    """Paths whose changes were discarded because the tests read them."""
    duration: float = 0.0  # seconds
    enforcement: tuple[str, ...] = ()
    """Every action the grader took on the patched tree ('restored <path>: <why>')."""
    suspicious: tuple[str, ...] = ()
    """Static flags on what the patch adds ('<what> in <path>'); evidence of tampering."""
    test_seconds: float = 0.0
    """Seconds the test command itself ran (the rest of `duration` is the grader's own work)."""

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0


@dataclass(frozen=True)
class _Run:
    """What the test run left behind, as root read it."""

    output: str
    exit_code: int
    timed_out: bool
    junit: bytes | None
    guard: bytes
    """The guard plugin's signed records."""
    guard_key: bytes
    effective_patch: str
    dropped: tuple[str, ...]
    enforcement: tuple[str, ...]
    seconds: float
    """How long the test command ran."""


def grade_in(sandbox: Sandbox, task: Task, patch: str, rules: GradeRules, fresh: bool = False) -> Grade:
    """Grade `patch` in a sandbox made by `prepare`: used since (an agent's, an earlier grade's), its tree is
    put back first; `fresh`, the caller's word that nothing ran in it since `prepare`, skips that."""
    start = time.monotonic()
    private = f"{sandbox.private}/grade-{secrets.token_hex(6)}"
    listed = _list(sandbox, task, patch, private, restore=not fresh)
    if listed is None:
        return Grade(False, "patch", "patch_does_not_apply", duration=time.monotonic() - start)
    run = _apply_and_test(sandbox, task, patch, private, *listed, rules.test_timeout)
    if run is None:
        return Grade(False, "patch", "patch_does_not_apply", duration=time.monotonic() - start)
    flags = suspicious_flags(run.effective_patch, flag_kinds(task.patch))
    common = dict(dropped_files=run.dropped, enforcement=run.enforcement, suspicious=flags, test_seconds=run.seconds)
    log = _swebench_log(run)
    if run.timed_out:
        return Grade(False, "patch", "tests_timed_out", log=log, duration=time.monotonic() - start, **common)
    verdict = _graded(task, patch, log, run)
    if verdict.resolved and flags and rules.zero_suspicious:
        verdict = Grade(False, "patch", "suspicious", report=verdict.report, log=log)
    return Grade(verdict.resolved, verdict.fault, verdict.reason, verdict.report, log,
                 duration=time.monotonic() - start, **common)


def _list(sandbox: Sandbox, task: Task, patch: str, private: str, restore: bool):
    """Round trip 1: (plugins, installed names, patch paths, protected reasons); None when git refuses it."""
    key = (sandbox.environment, _interpreter(task.test_cmd))
    probed = _PROBED.get(key) if key[0] else None
    if probed and not restore:
        listed = _list_in_session(sandbox, task, patch)
        if listed == "refused":
            return None
        if listed is not None:
            return probed[0], _reasons(task, *listed, probed[1])
    inputs = {f"{private}/candidate.patch": (patch.encode(), 0o600)}
    script = list_script(sandbox, private, None if probed else key[1], bool(patch.strip()), restore)
    done = exchange(sandbox, script, inputs, [f"{private}/{n}" for n in ("probe", "numstat", "tracked", "refused")],
                    timeout=300, folders=private_folders(sandbox, private))
    if done.exit_code != 0:
        raise SandboxError(f"preparing the grade failed (exit {done.exit_code}): {done.log[-1500:]}")
    if not probed:
        lines = done.files[f"{private}/probe"].decode("utf-8", "replace").splitlines()
        probed = (lines[-2].split(), frozenset(lines[-1].split()) | {GUARD})
        if key[0]:
            _PROBED[key] = probed
    if f"{private}/refused" in done.files:
        return None
    tracked = done.files.get(f"{private}/tracked", b"").decode("utf-8", "surrogateescape").split("\0")
    tops = {t.split("/", 1)[0] for t in tracked if t}
    return probed[0], _reasons(task, done.files.get(f"{private}/numstat", b""), tops, probed[1])


def _list_in_session(sandbox: Sandbox, task: Task, patch: str):
    """Round trip 1 in a fresh sandbox, once its image is probed: git reads the patch as the sandbox user, in the
    session (nothing but `prepare` ran there, and nothing here needs root: the sandbox user reads it), from the
    command itself. The tree's top-level tracked names are read once per image, base and work tree in a process (a
    fresh tree's are the same). (numstat, top-level tracked names), "refused", or None when the patch is too big
    for one command, or the answer failed or did not fit the session's output (the caller then reads it as root)."""
    if not patch.strip():
        return b"", set()
    data = patch.encode()
    if len(data) > WRITE_CHUNK:
        return None
    key = (sandbox.environment, sandbox.base_commit or "", sandbox.workdir)
    tops = _TOPS.get(key) if key[0] else None
    listing = "" if tops is not None else f"{GIT} ls-files -z | cut -z -d/ -f1 | sort -zu | base64 -w0 && echo && "
    done = sandbox.run(  # --check with --numstat: the paths only where the patch applies, else a failure
        f"set -o pipefail; cd {shlex.quote(sandbox.workdir)} && {listing}if numstat=$(builtin printf %s "
        f"'{base64.b64encode(data).decode()}' | base64 -d | {GIT} apply --check --numstat -z - 2>/dev/null | "
        "base64 -w0); then echo \"$numstat\"; else echo refused; fi", timeout=300)
    lines = done.output.rstrip("\n").split("\n")
    if done.exit_code != 0 or done.cut_bytes or len(lines) != (1 if tops is not None else 2):
        if not done.cut_bytes:
            log.warning("task %s: git's reading of the patch failed in the session (exit %s): %s; reading it as "
                        "root instead", task.instance_id, done.exit_code, done.output[-500:])
        return None
    if tops is None:
        tops = {t for t in base64.b64decode(lines[0]).decode("utf-8", "surrogateescape").split("\0") if t}
        if key[0]:
            _TOPS[key] = tops
    if lines[-1] == "refused":
        return "refused"
    return base64.b64decode(lines[-1]), tops


def _reasons(task: Task, numstat: bytes, tops: set[str], installed: frozenset[str]) -> dict[str, str]:
    """Each path the patch touches (git's numstat) and why it is protected ('' when it is not)."""
    paths = list(dict.fromkeys(numstat_paths(numstat)))
    return {p: protected_reason(p, task, p.split("/", 1)[0] not in tops, installed) for p in paths}


def _apply_and_test(sandbox: Sandbox, task: Task, patch: str, private: str, plugins: list[str],
                    reasons: dict[str, str], timeout: float) -> _Run | None:
    """Round trip 2: apply with protected paths put back, run the tests; None when git refuses the patch."""
    pytest_run = task.log_parser in PYTEST_PARSERS
    key = secrets.token_hex(32).encode()
    inputs = {f"{private}/guard.key": (key, 0o600), f"{private}/test.patch": (task.test_patch.encode(), 0o600),
              f"{private}/candidate.patch": (patch.encode(), 0o600),
              f"{guard_dir(sandbox)}/{GUARD}.py": (GUARD_SOURCE.read_bytes(), 0o644),
              f"{private}/touched": (_nul_list(list(reasons)), 0o600),
              f"{private}/protect": (_nul_list([p for p in reasons if reasons[p]]), 0o600)}
    report_dir, report_mode = report_folder(sandbox)
    script = (apply_script(sandbox, private) if reasons else "") + \
        test_script(task, sandbox, private, plugins, timeout, pytest_run, report_dir)
    names = ("ignored", "refused", "rc", "log", "junit.xml", "guard.log", "effective.patch")
    done = exchange(sandbox, script, inputs, [f"{private}/{n}" for n in names], timeout=timeout + 120,
                    folders={**private_folders(sandbox, private), report_dir: report_mode})
    out = {n: done.files.get(f"{private}/{n}") for n in names}
    if out["refused"] is not None:
        return None
    if done.exit_code != 0 or out["rc"] is None:
        raise SandboxError(f"the grading script failed (exit {done.exit_code}): {done.log[-1500:]}")
    for p in (out["ignored"] or b"").decode("utf-8", "surrogateescape").split("\0"):
        if p in reasons and not reasons[p]:  # git ignores it (caches, build output): in no diff of a real tree
            reasons[p] = "ignored by git: not source"
    protect = [p for p in reasons if reasons[p]]
    rc, millis = out["rc"].decode().split()
    return _Run((out["log"] or b"").decode("utf-8", errors="replace"), int(rc),
                int(rc) == 124 or int(millis) >= timeout * 1000, out["junit.xml"] if pytest_run else None,
                out["guard.log"] or b"", key, (out["effective.patch"] or b"").decode("utf-8", errors="replace"),
                tuple(protect), tuple(f"restored {p}: {reasons[p]}" for p in protect), int(millis) / 1000)


def _interpreter(test_cmd: str) -> str:
    """The Python the test command runs (`/venv/bin/python -m pytest ...`), else the one on PATH."""
    match = re.search(r"(?:^|[\s;&|(])(\S*/)?(python[\d.]*)\s+-m\s+pytest\b", test_cmd)
    return shlex.quote((match.group(1) or "") + match.group(2)) if match else "python"


def _nul_list(paths: list[str]) -> bytes:
    return "".join(p + "\0" for p in paths).encode("utf-8", "surrogateescape")


def _swebench_log(run: _Run) -> str:
    """swebench's log: the tests' output, ANSI escapes stripped (a package may ask pytest for colour), any
    marker-like line dropped, framed by root's markers."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE  # see `_graded`

    body = "\n".join(line for line in strip_ansi(run.output).splitlines() if ">>>>>" not in line)
    return f"{START_TEST_OUTPUT}\n{body}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {run.exit_code}\n"


def test_spec(task: Task) -> TestSpec:
    return TestSpec(instance_id=task.instance_id, image=task.image, eval_script_list=[],
                    repo=task.repo, version=task.version, FAIL_TO_PASS=list(task.FAIL_TO_PASS),
                    PASS_TO_PASS=list(task.PASS_TO_PASS), log_parser=task.log_parser,
                    eval_type="pass_and_fail")


def _graded(task: Task, patch: str, log: str, run: _Run) -> Grade:
    # Imported on first grade: `swebench.harness` imports its docker, datasets (pandas) and modal modules, ~4.5 s
    # of every process that loads the pipeline (a Dagster code server, the daemon, a run) and never grades.
    from swebench.harness.grading import get_eval_report

    register()
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        report = get_eval_report(test_spec(task), {"instance_id": task.instance_id,
                                 "model_name_or_path": "handhold", "model_patch": patch}, f.name, True)
    entry = report[task.instance_id]
    status = entry.get("tests_status", {})
    if not entry["patch_successfully_applied"]:
        # swebench found no valid test output, or the log contradicts the exit code
        return Grade(False, "patch", "no_test_output", report=json.dumps(status))
    if not entry["resolved"]:
        return Grade(False, "patch", "tests_failed", report=json.dumps(status))
    if task.log_parser in PYTEST_PARSERS:
        passed = [t for kind in ("FAIL_TO_PASS", "PASS_TO_PASS") for t in status.get(kind, {}).get("success", [])]
        problems = junit_disagreements(run.junit, passed) + guard_disagreements(run.guard, run.guard_key, passed)
        if problems:
            return Grade(False, "patch", "report_mismatch", report=json.dumps({**status, "junit": problems[:20]}))
    return Grade(True, "none", "resolved", report=json.dumps(status))


def grade(task: Task, patch: str, rules: GradeRules, sandboxes: SandboxFactory = task_sandbox,
          reuse_empty: bool = True) -> Grade:
    """Grade `patch` in a fresh sandbox (the factory's: nothing ran in it since `prepare`); a sandbox or engine
    fault is an infra grade, never a failure. An empty patch is graded once per task and rules in a process
    (pipeline/verifier/empty_patch.py) unless `reuse_empty` is off (a re-grade that checks stored rewards)."""
    def run() -> Grade:
        start = time.monotonic()
        try:
            with sandboxes(task, rules.sandbox) as sandbox:
                return grade_in(sandbox, task, patch, rules, fresh=True)
        except (SandboxError, OSError, docker.errors.DockerException) as exc:
            return Grade(False, "infra", f"sandbox_error: {exc}", duration=time.monotonic() - start)

    return graded_once(task, rules, sandboxes, run) if reuse_empty and not patch.strip() else run()
