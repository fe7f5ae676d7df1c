"""Is the answer in the task's container? Search it, as the agent's user and as root, for the original code.

The needles are the regions of the original source the gold patch restores (`windows`) and the original's
compiled functions; pipeline/tasks/answer_probe.py looks for them in every file, git object, archive member
and .pyc of the container the agent gets. Matches that do not count, and why:
- the task's own tracked files at its commit (and their git blobs), unless they are a build output or backup
  by name (pipeline/tasks/copies.py): the task is that tree, and a window found there is code the task
  legitimately holds twice;
- the grader's root-only folder (`sandbox.private`, where `prepare` keeps the ignored files, bytecode and
  egg-info included, that the grader restores): it could hold the original only if ignored copies of it
  (bytecode) were in the work tree when `prepare` ran, which `prepare` rules out by deleting the bytecode
  of every file the bug touches first; it is
  skipped in the root pass only when the agent's pass could read no file in it: a folder the agent can read
  is searched like any other.
"""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from unidiff import PatchSet

from pipeline.core.records import Task
from pipeline.tasks.copies import copy_by_name
from pipeline.verifier.environment import SandboxFactory, task_sandbox
from sandbox.base import Sandbox, SandboxError

PROBE = Path(__file__).with_name("answer_probe.py")
NEVER = ("/proc", "/sys", "/dev")  # the kernel's views: the search's own process and stdin are there
CONTEXT = 2  # lines of context kept each side of a change: enough to make a window unique to the file


@dataclass(frozen=True)
class Found:
    """One place the original code was found."""

    task: str
    user: str
    """Who could read it: the agent's user name, or root."""
    path: str
    """A file; `archive!member` for an archive's member; `git-dir:sha` for an object git reads from a pack."""
    how: str


def windows(gold_patch: str, buggy: dict[str, str]) -> list[list[str]]:
    """Per hunk, the original's lines around the change (stripped, blanks dropped); one the buggy file also
    holds is left out, since finding it proves nothing."""
    out = []
    for patched in PatchSet(gold_patch):
        held = _stripped(buggy.get(patched.path, ""))
        for hunk in patched:
            new_side, changed = [], []
            for line in hunk:
                if line.is_added:
                    changed.append(len(new_side))
                elif line.is_removed:  # a removal sits between two original lines
                    changed += [len(new_side) - 1, len(new_side)]
                if not line.is_removed:
                    new_side.append(line.value.rstrip("\n"))
            lo, hi = max(min(changed) - CONTEXT, 0), max(changed) + CONTEXT + 1
            window = _stripped("\n".join(new_side[lo:hi]))
            if window and not _contains(held, window):
                out.append(window)
    return out


def _stripped(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if s]


def _contains(lines: list[str], window: list[str]) -> bool:
    return any(lines[i:i + len(window)] == window for i in range(len(lines) - len(window) + 1))


def originals(gold_patch: str, buggy: dict[str, str]) -> dict[str, str]:
    """The files the gold patch touches as they were before the bug: the buggy files with it applied."""
    with tempfile.TemporaryDirectory(prefix="handhold-original-") as tmp:
        for path, text in buggy.items():
            (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / path).write_text(text)
        done = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=gold_patch, text=True, cwd=tmp,
                              capture_output=True)
        if done.returncode != 0:
            raise ValueError(f"the gold patch does not apply to the sandbox's files: {done.stderr[-500:]}")
        return {path: (Path(tmp) / path).read_text() for path in buggy if (Path(tmp) / path).exists()}


def search_sandbox(sandbox: Sandbox, task: Task) -> tuple[list[Found], dict]:
    """Every place the agent's user, then root, can read the code `task`'s bug replaced; and the search's
    figures (files read, unreadable, legitimate matches skipped, seconds)."""
    paths = [p.path for p in PatchSet(task.patch) if not p.is_added_file]
    buggy = {p: sandbox.read_file(p).decode("utf-8", "replace") for p in paths}
    owned, blobs = _owned(sandbox)
    job = {"windows": windows(task.patch, buggy), "originals": originals(task.patch, buggy), "buggy": buggy,
           "owned": owned, "owned_blobs": blobs, "workdir": sandbox.workdir, "private": sandbox.private}
    if not job["windows"]:
        raise ValueError(f"task {task.instance_id}: its gold patch restores no lines the buggy files lack; "
                         "nothing to search for")
    found, stats = [], {}
    user = sandbox.run_as.split()[3] if sandbox.run_as else ""
    if user:
        agent = _probe(sandbox, {**job, "skip": list(NEVER)}, sandbox.run_as)
        found += [Found(task.instance_id, user, f["path"], f["how"]) for f in agent["found"]]
        stats["agent"] = agent
    private_open = not user or stats["agent"]["private_files_read"] > 0
    root = _probe(sandbox, {**job, "skip": [*NEVER, *([] if private_open else [sandbox.private])]}, "")
    found += [Found(task.instance_id, "root", f["path"], f["how"]) for f in root["found"]]
    stats["root"] = root
    return found, {k: {n: v for n, v in s.items() if n != "found"} for k, s in stats.items()}


def _owned(sandbox: Sandbox) -> tuple[list[str], list[str]]:
    """(paths, blob ids) of the files tracked at the task's commit that are not build outputs or backups."""
    listed = sandbox.run_privileged(f"cd {shlex.quote(sandbox.workdir)} && git -c safe.directory='*' "
                                    f"ls-tree -r -z HEAD", timeout=120)
    if listed.exit_code != 0:
        return [], []
    rows = [entry.split("\t", 1) for entry in listed.output.split("\0") if "\t" in entry]
    kept = [(head.split()[2], path) for head, path in rows if not copy_by_name(path)]
    return [p for _, p in kept], [sha for sha, _ in kept]


def _probe(sandbox: Sandbox, job: dict, run_as: str) -> dict:
    payload = json.dumps(job).encode()
    drop = ""
    if run_as:
        uid, gid, home, _ = run_as.split()
        drop = f"setpriv --reuid={uid} --regid={gid} --init-groups env HOME={shlex.quote(home)} "
    command = f"cd / && {drop}python3 -c {shlex.quote(PROBE.read_text())} {len(payload)}"
    result = sandbox.run_privileged(command, timeout=900, stdin=payload)
    last = result.output.strip().splitlines()[-1:] or [""]
    if result.exit_code != 0 or not last[0].startswith("{"):
        raise SandboxError(f"the answer search did not run in {getattr(sandbox, 'short_id', 'the sandbox')} "
                           f"(exit {result.exit_code}): {result.output[-1500:]}")
    return json.loads(last[0])


def search_tasks(tasks: list[Task], sample: int, seed: int = 0, sandboxes: SandboxFactory = task_sandbox
                 ) -> tuple[list[Found], dict[str, dict]]:
    """Search the sandboxes of up to `sample` tasks (seeded pick), each started exactly as an agent gets it."""
    found, stats = [], {}
    for task in random.Random(seed).sample(tasks, min(sample, len(tasks))):
        with sandboxes(task, None) as sandbox:
            here, stats[task.instance_id] = search_sandbox(sandbox, task)
        found += here
    return found, stats
