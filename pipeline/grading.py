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
   the real exit code; the JUnit report must agree with every test counted as passing;
5. a plugin of the grader's (pipeline/pytest_guard.py) signs each test's real outcome, taken before any
   report is made, with a key the code under test never sees; it too must agree;
6. static flags on what the patch adds (pytest internals, exit hooks, forged verdicts) are
   recorded and, by default, void the reward.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import docker.errors
from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE
from swebench.harness.grading import get_eval_report
from swebench.types import TestSpec

from pipeline.guard import flag_kinds, is_test_path, numstat_paths, protected_reason, suspicious_flags
from pipeline.junit import guard_disagreements, junit_disagreements
from pipeline.records import Task
from pipeline.tasks.environment import SandboxFactory, pristine, task_sandbox
from sandbox.base import Sandbox, SandboxError
from sandbox.docker_sandbox import DockerSandboxConfig

__all__ = ["Grade", "grade", "grade_in", "is_test_path"]

CONDA = "/opt/miniconda3/bin/activate"  # SWE-bench images keep the repo's environment there
LOG_CAP = 50_000_000  # bytes of test output kept
GIT = "git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.quotepath=off"
PYTEST_PARSERS = ("parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2")
APPLY_FAILED = 3  # exit code of the apply step when git refuses the patch
GUARD = "handhold_guard"  # the pytest plugin (pipeline/pytest_guard.py) that signs each test's real outcome
GUARD_SOURCE = Path(__file__).with_name("pytest_guard.py")
# Descriptors the test run inherits: a pipe holding the guard's key (drained when the plugin loads, so no
# process that still holds it can read the key again), and the guard's record file.
GUARD_FDS = "7 8"
# Run from / so that nothing in the work tree counts: the environment's pytest plugins (by module)
# and every importable top-level module name. Python 3.6 and later (SWE-bench images run old ones).
PROBE = r"""
import sys, pkgutil
try:
    from importlib.metadata import entry_points
    eps = entry_points()
    eps = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    plugins = {e.value.split(":")[0].strip() for e in eps}
except Exception:
    try:
        import pkg_resources
        plugins = {e.module_name for e in pkg_resources.iter_entry_points("pytest11")}
    except Exception:
        plugins = set()
print(" ".join(sorted(plugins)))
print(" ".join(sorted(set(sys.builtin_module_names) | {m[1] for m in pkgutil.iter_modules()})))
"""


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


def grade_in(sandbox: Sandbox, task: Task, patch: str, test_timeout: float = 300,
             zero_suspicious: bool = True) -> Grade:
    """Grade `patch` in a prepared sandbox at the task's base (it is left modified)."""
    start = time.monotonic()
    private = f"{sandbox.private}/grade-{secrets.token_hex(6)}"
    plugins, installed = _probe(sandbox, task, private)
    installed |= {GUARD}
    kept = _apply(sandbox, task, patch, private, installed) if patch.strip() else ((), ())
    if kept is None:
        return Grade(False, "patch", "patch_does_not_apply", duration=time.monotonic() - start)
    dropped, enforcement = kept
    run = _run_tests(sandbox, task, private, plugins, test_timeout)
    flags = suspicious_flags(run.effective_patch, flag_kinds(task.patch))
    common = dict(dropped_files=dropped, enforcement=enforcement, suspicious=flags)
    log = _swebench_log(run)
    if run.timed_out:
        return Grade(False, "patch", "tests_timed_out", log=log, duration=time.monotonic() - start, **common)
    verdict = _graded(task, patch, log, run)
    if verdict.resolved and flags and zero_suspicious:
        verdict = Grade(False, "patch", "suspicious", report=verdict.report, log=log)
    return Grade(verdict.resolved, verdict.fault, verdict.reason, verdict.report, log,
                 duration=time.monotonic() - start, **common)


def _probe(sandbox: Sandbox, task: Task, private: str) -> tuple[list[str], frozenset[str]]:
    """Put the tree back to the task's base exactly, then read the environment's pytest plugin modules
    and importable top-level names, before any patch."""
    python = _interpreter(task.test_cmd)
    script = (f"install -d -m 0700 {private} && install -d -m 0755 {guard_dir(sandbox)} && "
              f"{{ {_pristine_tree(sandbox)}; }} && cd / && {{ [ -f {CONDA} ] && . {CONDA} testbed; "
              f"{python} -c {shlex.quote(PROBE)} || python3 -c {shlex.quote(PROBE)}; }}")
    result = sandbox.run_privileged(script, timeout=120)
    lines = result.output.splitlines()
    if result.exit_code != 0 or len(lines) < 2:
        raise SandboxError(f"probing the environment failed (exit {result.exit_code}): {result.output[-1500:]}")
    return lines[-2].split(), frozenset(lines[-1].split())


def _pristine_tree(sandbox: Sandbox) -> str:
    """Shell that makes a sandbox used before (an agent's leftovers, a grade) what `prepare` left: no process
    of the sandbox user, the base commit, no untracked file, ignored files and .git/config as they were."""
    keep, base = pristine(sandbox), shlex.quote(sandbox.base_commit or "HEAD")
    kill = f"pkill -KILL -U {sandbox.run_as.split()[0]}; " if sandbox.run_as else ""
    return (f"if [ -f {keep}/ignored.tar ]; then {kill}cd {shlex.quote(sandbox.workdir)} && "
            f"cp {keep}/git-config .git/config && rm -f .git/index && {GIT} reset -q --hard {base} && "
            f"{GIT} clean -fdq && {GIT} ls-files -z -o -i --exclude-standard | sort -z | "
            f"comm -z -23 - <(sort -z {keep}/ignored) | xargs -0r rm -rf -- && tar -xpf {keep}/ignored.tar; fi")


def _interpreter(test_cmd: str) -> str:
    """The Python the test command runs (`/venv/bin/python -m pytest ...`), else the one on PATH."""
    match = re.search(r"(?:^|[\s;&|(])(\S*/)?(python[\d.]*)\s+-m\s+pytest\b", test_cmd)
    return shlex.quote((match.group(1) or "") + match.group(2)) if match else "python"


def _apply(sandbox: Sandbox, task: Task, patch: str, private: str,
           installed: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Apply with git, then put every protected path back; (dropped paths, actions), None if git refuses."""
    wd = shlex.quote(sandbox.workdir)
    sandbox.write_file(f"{private}/candidate.patch", patch)
    listed = sandbox.run_privileged(
        f"cd {wd} && {GIT} apply --check {private}/candidate.patch >/dev/null 2>&1 || exit {APPLY_FAILED}; "
        f"{GIT} apply --numstat -z {private}/candidate.patch > {private}/numstat && "
        f"{GIT} ls-files -z > {private}/tracked", timeout=120)
    if listed.exit_code == APPLY_FAILED:
        return None
    if listed.exit_code != 0:
        raise SandboxError(f"reading the patch's paths failed (exit {listed.exit_code}): {listed.output[-1500:]}")
    paths = list(dict.fromkeys(numstat_paths(sandbox.read_file(f"{private}/numstat"))))
    tracked = sandbox.read_file(f"{private}/tracked").decode("utf-8", "surrogateescape").split("\0")
    tops = {t.split("/", 1)[0] for t in tracked if t}
    reasons = {p: protected_reason(p, task, p.split("/", 1)[0] not in tops, installed) for p in paths}
    sandbox.write_file(f"{private}/touched", _nul_list(paths))
    sandbox.write_file(f"{private}/protect", _nul_list([p for p in paths if reasons[p]]))
    done = sandbox.run_privileged(_apply_script(wd, private), timeout=300)
    if done.exit_code == APPLY_FAILED:
        return None
    if done.exit_code != 0:
        raise SandboxError(f"applying the patch failed (exit {done.exit_code}): {done.output[-1500:]}")
    for p in sandbox.read_file(f"{private}/ignored").decode("utf-8", "surrogateescape").split("\0"):
        if p in reasons and not reasons[p]:  # git ignores it (caches, build output): in no diff of a real tree
            reasons[p] = "ignored by git: not source"
    protect = [p for p in paths if reasons[p]]
    return tuple(protect), tuple(f"restored {p}: {reasons[p]}" for p in protect)


def _nul_list(paths: list[str]) -> bytes:
    return "".join(p + "\0" for p in paths).encode("utf-8", "surrogateescape")


def guard_dir(sandbox: Sandbox) -> str:
    """Where the guard plugin lives in a sandbox: root's, readable by the sandbox user."""
    return sandbox.private.rstrip("/") + "-guard"


def _apply_script(wd: str, private: str) -> str:
    """Add the touched paths git ignores to the protected ones, back up those that exist, apply, remove every
    protected path, restore the backup."""
    return f"""cd {wd} || exit 1
{GIT} check-ignore -z --stdin < {private}/touched > {private}/ignored
cat {private}/ignored >> {private}/protect
: > {private}/existing
while IFS= read -r -d '' f; do
  if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\\0' "$f" >> {private}/existing; fi
done < {private}/protect
tar -cf {private}/backup.tar --null -T {private}/existing || exit 1
{GIT} apply --whitespace=nowarn {private}/candidate.patch || exit {APPLY_FAILED}
while IFS= read -r -d '' f; do
  rm -f -- "$f"; d=$(dirname -- "$f"); [ "$d" = . ] || rmdir -p --ignore-fail-on-non-empty -- "$d" 2>/dev/null
done < {private}/protect
tar -xpf {private}/backup.tar
"""


def _run_tests(sandbox: Sandbox, task: Task, private: str, plugins: list[str], timeout: float) -> _Run:
    """Restore the tests, run them as the sandbox user, and read back what root captured."""
    pytest_run = task.log_parser in PYTEST_PARSERS
    key = secrets.token_hex(32).encode()
    sandbox.write_file(f"{private}/guard.key", key)
    sandbox.write_file(f"{guard_dir(sandbox)}/{GUARD}.py", GUARD_SOURCE.read_bytes())
    sandbox.write_file(f"{private}/eval.sh", _eval_script(task, sandbox, private, plugins, timeout, pytest_run))
    if task.test_patch:
        sandbox.write_file(f"{private}/test.patch", task.test_patch)
    result = sandbox.run_privileged(f"bash {private}/eval.sh", timeout=timeout + 120)
    if result.exit_code != 0:
        raise SandboxError(f"the grading script failed (exit {result.exit_code}): {result.output[-1500:]}")
    read = lambda name: sandbox.read_file(f"{private}/{name}")  # noqa: E731
    rc, millis = read("rc").decode().split()
    junit = read("junit.xml") if pytest_run else None
    return _Run(read("log").decode("utf-8", errors="replace"), int(rc), int(rc) == 124 or int(millis) >= timeout * 1000,
                junit or None, read("guard.log"), key, read("effective.patch").decode("utf-8", errors="replace"))


def _eval_script(task: Task, sandbox: Sandbox, private: str, plugins: list[str], timeout: float,
                 pytest_run: bool) -> str:
    base = shlex.quote(sandbox.base_commit or "HEAD")
    files = " ".join(shlex.quote(f) for f in task.test_files)
    uid, gid, home, name = (sandbox.run_as.split() + ["", "", "", ""])[:4]
    drop = (f"env HOME={shlex.quote(home)} USER={name} LOGNAME={name} setpriv --reuid={uid} --regid={gid} "
            "--init-groups --") if uid else ""
    report_dir = f"/tmp/.handhold-report-{secrets.token_hex(8)}"
    addopts = " ".join([*(f"-p {p}" for p in [*plugins, GUARD]), f"--junitxml={report_dir}/junit.xml"])
    guard = guard_dir(sandbox)
    test_patch = (f"{GIT} apply --whitespace=nowarn {private}/test.patch || "
                  "{ echo 'the task test_patch does not apply'; exit 9; }") if task.test_patch else ""
    return f"""cd {shlex.quote(sandbox.workdir)} || exit 1
[ -f {CONDA} ] && . {CONDA} testbed
for f in {files}; do {GIT} cat-file -e {base}:"$f" 2>/dev/null && {GIT} checkout -q {base} -- "$f"; done
{test_patch}
{f"chown -R {uid}:{gid} ." if uid else ""}
idx=$(mktemp -u); GIT_INDEX_FILE=$idx {GIT} read-tree {base} && GIT_INDEX_FILE=$idx {GIT} add -A . >/dev/null 2>&1
GIT_INDEX_FILE=$idx {GIT} diff --cached --no-ext-diff --no-textconv {base} > {private}/effective.patch; rm -f $idx
mkdir -m 0700 {report_dir} && {f"chown {uid}:{gid} {report_dir}" if uid else "true"}
unset PYTEST_PLUGINS
{f"chown -R 0:0 {guard} {private}" if uid else "true"}; chmod -R go-w {guard}; chmod 0600 {private}/guard.key
{"export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS=" + shlex.quote(addopts) if pytest_run else ""}
export HANDHOLD_GUARD_FDS={shlex.quote(GUARD_FDS)} PYTHONPATH={guard}${{PYTHONPATH:+:$PYTHONPATH}}
: > {private}/guard.log
start=$(date +%s%N)
timeout -k 5 {max(int(timeout), 1)} {drop} bash -c {shlex.quote(task.test_cmd)} < /dev/null 7< <(cat {private}/guard.key) 8>> {private}/guard.log 2>&1 | head -c {LOG_CAP} > {private}/log
rc=${{PIPESTATUS[0]}}
{f"pkill -KILL -U {uid}; sleep 0.1; pkill -KILL -U {uid}" if uid else "true"}
echo "$rc $(( ($(date +%s%N) - start) / 1000000 ))" > {private}/rc
: > {private}/junit.xml
f={report_dir}/junit.xml
[ -f "$f" ] && [ ! -L "$f" ] && head -c {LOG_CAP} "$f" > {private}/junit.xml
rm -rf {report_dir}
exit 0
"""


def _swebench_log(run: _Run) -> str:
    """swebench's log: the tests' output with any marker-like line dropped, framed by root's markers."""
    body = "\n".join(line for line in run.output.splitlines() if ">>>>>" not in line)
    return f"{START_TEST_OUTPUT}\n{body}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {run.exit_code}\n"


def test_spec(task: Task) -> TestSpec:
    return TestSpec(instance_id=task.instance_id, image=task.image, eval_script_list=[],
                    repo=task.repo, version=task.version, FAIL_TO_PASS=list(task.FAIL_TO_PASS),
                    PASS_TO_PASS=list(task.PASS_TO_PASS), log_parser=task.log_parser,
                    eval_type="pass_and_fail")


def _graded(task: Task, patch: str, log: str, run: _Run) -> Grade:
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


def grade(task: Task, patch: str, config: DockerSandboxConfig | None = None, test_timeout: float = 300,
          sandboxes: SandboxFactory = task_sandbox, zero_suspicious: bool = True) -> Grade:
    """Grade `patch` in a fresh sandbox; a sandbox or engine fault is an infra grade, never a failure."""
    start = time.monotonic()
    try:
        with sandboxes(task, config) as sandbox:
            return grade_in(sandbox, task, patch, test_timeout, zero_suspicious)
    except (SandboxError, OSError, docker.errors.DockerException) as exc:
        return Grade(False, "infra", f"sandbox_error: {exc}", duration=time.monotonic() - start)
