"""The verifier: grade a candidate patch for a task, the reward of every rollout.

In a fresh sandbox from the task's image, the candidate patch is applied without its
changes to test files (and files the tests load, such as conftest.py), the test files are
restored to their pristine version (plus the task's test_patch), the tests run between
swebench's markers with their exit code recorded, and swebench grades the log.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

import docker.errors
from swebench.harness.constants import APPLY_PATCH_FAIL, END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE
from swebench.harness.grading import get_eval_report
from swebench.types import TestSpec

from pipeline.records import Task
from pipeline.tasks.environment import SandboxFactory, task_sandbox
from sandbox.base import Sandbox, SandboxError
from sandbox.docker_sandbox import DockerSandboxConfig

TEST_DIRS = {"test", "tests", "testing"}
# Files pytest reads for its configuration or loads before the tests: a change there can fake a pass.
TEST_SUPPORT = {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py",
                "sitecustomize.py", "usercustomize.py"}
CONDA = "/opt/miniconda3/bin/activate"  # SWE-bench images keep the repo's environment there
LOG_CAP = 50_000_000  # bytes of test output kept


@dataclass(frozen=True)
class Grade:
    """The verdict on one patch."""

    resolved: bool
    fault: Literal["none", "patch", "infra"]
    """Whose fault a non-resolution is: the patch's (a real failure) or the infrastructure's."""
    reason: str
    """'resolved', 'tests_failed', 'patch_does_not_apply', 'tests_timed_out', 'no_test_output', or the infra error."""
    report: str = "{}"
    """JSON: swebench's tests_status (FAIL_TO_PASS / PASS_TO_PASS success and failure lists)."""
    log: str = ""
    dropped_files: tuple[str, ...] = ()
    """Files whose changes were discarded because the tests read them."""
    duration: float = 0.0  # seconds
    enforcement: tuple[str, ...] = ()
    """Every action the grader took on the patched tree ('restored <path>', 'removed <path>: <why>')."""
    suspicious: tuple[str, ...] = ()
    """Static flags on what the patch adds ('os._exit in pkg/mod.py', ...); evidence of tampering."""

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0


def is_test_path(path: str, task: Task) -> bool:
    """True for test files and files the tests load: their changes never reach the grader."""
    p = PurePosixPath(path)
    listed = any(path == f or path.startswith(f.rstrip("/") + "/") for f in task.test_files)
    return (listed or p.name in TEST_SUPPORT or bool(TEST_DIRS & set(p.parts[:-1]))
            or p.name.startswith("test_") or p.name.endswith("_test.py"))


def section_paths(section: str) -> set[str]:
    """Every path a file section of a git diff names (old and new, renames and copies included)."""
    paths = set()
    for line in section.splitlines():
        for prefix in ("--- ", "+++ ", "rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(prefix):
                name = line[len(prefix):].split("\t")[0].strip().strip('"')
                if name != "/dev/null":
                    paths.add(name[2:] if prefix in ("--- ", "+++ ") and name[:2] in ("a/", "b/") else name)
    return paths


def split_patch(patch: str) -> list[tuple[set[str], str]]:
    """(paths, text) of each file section of a git diff."""
    return [(section_paths(s), s) for s in re.split(r"(?m)^(?=diff --git )", patch) if s.startswith("diff --git ")]


def without_test_changes(patch: str, task: Task) -> tuple[str, tuple[str, ...]]:
    """The patch minus its sections touching test paths (or naming no path), and the paths dropped."""
    kept, dropped = [], []
    for paths, text in split_patch(patch):
        if not paths or any(is_test_path(p, task) for p in paths):
            dropped += sorted(paths) or ["(unreadable section)"]
        else:
            kept.append(text)
    return "".join(kept), tuple(dropped)


def eval_script(task: Task, base: str, scratch: str) -> str:
    """Restore test files, apply the test patch, run the tests between swebench's markers."""
    workdir = shlex.quote(task.workdir)
    restore = ""
    if task.test_files:
        files = " ".join(shlex.quote(f) for f in task.test_files)
        # Only what exists at base can be restored; a path missing there must not void the rest.
        restore = (f"for f in {files}; do git cat-file -e {base}:\"$f\" 2>/dev/null && "
                   f"git checkout -q {base} -- \"$f\"; done\n")
    test_patch = (f"git apply --whitespace=nowarn {scratch}/test.patch || "
                  f"{{ echo '{APPLY_PATCH_FAIL}'; exit 1; }}\n") if task.test_patch else ""
    # The log is capped: a patch that prints without end must not fill the disk or memory.
    return (f"cd {workdir}\n[ -f {CONDA} ] && . {CONDA} testbed\n{restore}{test_patch}"
            f"echo '{START_TEST_OUTPUT}'\n{{ {task.test_cmd} ; }} 2>&1 | head -c {LOG_CAP}\n"
            f"rc=${{PIPESTATUS[0]}}\necho '{END_TEST_OUTPUT}'\necho '{TEST_EXIT_CODE}: '$rc\n")


def test_spec(task: Task, script: str) -> TestSpec:
    return TestSpec(instance_id=task.instance_id, image=task.image, eval_script_list=script.splitlines(),
                    repo=task.repo, version=task.version, FAIL_TO_PASS=list(task.FAIL_TO_PASS),
                    PASS_TO_PASS=list(task.PASS_TO_PASS), log_parser=task.log_parser,
                    eval_type="pass_and_fail")


def apply_patch(sandbox: Sandbox, task: Task, patch: str) -> bool:
    sandbox.write_file(f"{sandbox.scratch}/candidate.patch", patch)
    result = sandbox.run(
        f"cd {shlex.quote(task.workdir)} && (git apply --whitespace=nowarn {sandbox.scratch}/candidate.patch || "
        f"patch --batch --fuzz=5 -p1 -i {sandbox.scratch}/candidate.patch)", timeout=60)
    return result.exit_code == 0


def grade_in(sandbox: Sandbox, task: Task, patch: str, test_timeout: float = 300) -> Grade:
    """Grade `patch` in a prepared sandbox at the task's base (it is left modified)."""
    start = time.monotonic()
    source_patch, dropped = without_test_changes(patch, task)
    if source_patch.strip() and not apply_patch(sandbox, task, source_patch):
        return Grade(False, "patch", "patch_does_not_apply", dropped_files=dropped,
                     duration=time.monotonic() - start)
    if task.test_patch:
        sandbox.write_file(f"{sandbox.scratch}/test.patch", task.test_patch)
    script = eval_script(task, sandbox.base_commit or "HEAD", sandbox.scratch)
    sandbox.write_file(f"{sandbox.scratch}/eval.sh", script)
    result = sandbox.run(f"bash {sandbox.scratch}/eval.sh > {sandbox.scratch}/eval.log 2>&1", timeout=test_timeout)
    if result.shell_restarted:
        return Grade(False, "infra", "sandbox_error: the shell was lost while the tests ran",
                     dropped_files=dropped, duration=time.monotonic() - start)
    log = sandbox.read_file(f"{sandbox.scratch}/eval.log").decode("utf-8", errors="replace")
    if APPLY_PATCH_FAIL in log:
        return Grade(False, "infra", "task_error: the task's test_patch does not apply", log=log,
                     dropped_files=dropped, duration=time.monotonic() - start)
    if result.timed_out:
        return Grade(False, "patch", "tests_timed_out", log=log, dropped_files=dropped,
                     duration=time.monotonic() - start)
    return _graded(task, script, patch, log, dropped, time.monotonic() - start)


def _graded(task: Task, script: str, patch: str, log: str, dropped: tuple[str, ...], duration: float) -> Grade:
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        report = get_eval_report(test_spec(task, script), {"instance_id": task.instance_id,
                                 "model_name_or_path": "handhold", "model_patch": patch}, f.name, True)
    entry = report[task.instance_id]
    status = entry.get("tests_status", {})
    if entry["resolved"]:
        reason = "resolved"
    elif not entry["patch_successfully_applied"]:
        reason = "no_test_output"  # swebench found no valid test output (or the log contradicts the exit code)
    else:
        reason = "tests_failed"
    return Grade(entry["resolved"], "none" if entry["resolved"] else "patch", reason,
                 report=json.dumps(status), log=log, dropped_files=dropped, duration=duration)


def grade(task: Task, patch: str, config: DockerSandboxConfig | None = None, test_timeout: float = 300,
          sandboxes: SandboxFactory = task_sandbox) -> Grade:
    """Grade `patch` in a fresh sandbox; a sandbox or engine fault is an infra grade, never a failure."""
    start = time.monotonic()
    try:
        with sandboxes(task, config) as sandbox:
            return grade_in(sandbox, task, patch, test_timeout)
    except (SandboxError, OSError, docker.errors.DockerException) as exc:
        return Grade(False, "infra", f"sandbox_error: {exc}", duration=time.monotonic() - start)
