"""The verifier: grade a candidate patch for a task, the reward of every rollout.

In a fresh sandbox from the task's image, the candidate patch is applied without its
changes to test files (and files the tests load, such as conftest.py), the test files are
restored to their pristine version (plus the task's test_patch), the tests run between
swebench's markers with their exit code recorded, and swebench grades the log.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

import docker.errors
from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE
from swebench.harness.grading import get_eval_report
from swebench.types import TestSpec

from pipeline.records import Task
from pipeline.tasks.environment import SCRATCH, task_sandbox
from sandbox.base import Sandbox, SandboxError
from sandbox.docker_sandbox import DockerSandboxConfig

TEST_DIRS = {"test", "tests", "testing"}
TEST_SUPPORT = {"conftest.py", "pytest.ini", "tox.ini", "noxfile.py", "sitecustomize.py", "usercustomize.py"}


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

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0


def is_test_path(path: str, task: Task) -> bool:
    """True for test files and files the tests load: their changes never reach the grader."""
    p = PurePosixPath(path)
    listed = any(path == f or path.startswith(f.rstrip("/") + "/") for f in task.test_files)
    return (listed or p.name in TEST_SUPPORT or bool(TEST_DIRS & set(p.parts[:-1]))
            or p.name.startswith("test_") or p.name.endswith("_test.py"))


def split_patch(patch: str) -> list[tuple[str, str]]:
    """(path, text) of each file section of a git diff."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    out = []
    for section in sections:
        match = re.match(r"diff --git a/(\S+) b/(\S+)", section)
        if match:
            out.append((match.group(2) if match.group(2) != "/dev/null" else match.group(1), section))
    return out


def without_test_changes(patch: str, task: Task) -> tuple[str, tuple[str, ...]]:
    """The patch minus its sections on test paths, and the paths dropped."""
    kept, dropped = [], []
    for path, text in split_patch(patch):
        (dropped if is_test_path(path, task) else kept).append((path, text))
    return "".join(text for _, text in kept), tuple(path for path, _ in dropped)


def eval_script(task: Task, base: str) -> str:
    """Restore test files, apply the test patch, run the tests between swebench's markers."""
    restore = ""
    if task.test_files:
        files = " ".join(f"'{f}'" for f in task.test_files)
        restore = f"git checkout -q {base} -- {files} 2>/dev/null || true\n"
    test_patch = f"git apply --whitespace=nowarn {SCRATCH}/test.patch\n" if task.test_patch else ""
    return (f"cd {task.workdir}\n{restore}{test_patch}"
            f"echo '{START_TEST_OUTPUT}'\n{task.test_cmd}\nrc=$?\necho '{END_TEST_OUTPUT}'\n"
            f"echo '{TEST_EXIT_CODE}: '$rc\n")


def test_spec(task: Task, script: str) -> TestSpec:
    return TestSpec(instance_id=task.instance_id, image=task.image, eval_script_list=script.splitlines(),
                    repo=task.repo, version=task.version, FAIL_TO_PASS=list(task.FAIL_TO_PASS),
                    PASS_TO_PASS=list(task.PASS_TO_PASS), log_parser=task.log_parser,
                    eval_type="pass_and_fail")


def apply_patch(sandbox: Sandbox, task: Task, patch: str) -> bool:
    sandbox.write_file(f"{SCRATCH}/candidate.patch", patch)
    result = sandbox.run(
        f"cd {task.workdir} && (git apply --whitespace=nowarn {SCRATCH}/candidate.patch || "
        f"patch --batch --fuzz=5 -p1 -i {SCRATCH}/candidate.patch)", timeout=60)
    return result.exit_code == 0


def grade_in(sandbox: Sandbox, task: Task, patch: str, test_timeout: float = 300) -> Grade:
    """Grade `patch` in a prepared sandbox at the task's base (it is left modified)."""
    start = time.monotonic()
    source_patch, dropped = without_test_changes(patch, task)
    if source_patch.strip() and not apply_patch(sandbox, task, source_patch):
        return Grade(False, "patch", "patch_does_not_apply", dropped_files=dropped,
                     duration=time.monotonic() - start)
    if task.test_patch:
        sandbox.write_file(f"{SCRATCH}/test.patch", task.test_patch)
    script = eval_script(task, sandbox.base_commit or "HEAD")
    sandbox.write_file(f"{SCRATCH}/eval.sh", script)
    result = sandbox.run(f"bash {SCRATCH}/eval.sh > {SCRATCH}/eval.log 2>&1", timeout=test_timeout)
    log = sandbox.read_file(f"{SCRATCH}/eval.log").decode("utf-8", errors="replace")
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


def grade(task: Task, patch: str, config: DockerSandboxConfig | None = None, test_timeout: float = 300) -> Grade:
    """Grade `patch` in a fresh sandbox; a sandbox or engine fault is an infra grade, never a failure."""
    start = time.monotonic()
    try:
        with task_sandbox(task, config) as sandbox:
            return grade_in(sandbox, task, patch, test_timeout)
    except (SandboxError, OSError, docker.errors.DockerException) as exc:
        return Grade(False, "infra", f"sandbox_error: {exc}", duration=time.monotonic() - start)
