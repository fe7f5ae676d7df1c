"""A task's sandbox: started from its image, its bug applied, the buggy state its only history."""

from __future__ import annotations

import contextlib
import shlex
from typing import Iterator

from pipeline.records import Task
from sandbox.base import Sandbox, SandboxError
from sandbox.docker_sandbox import DockerSandbox, DockerSandboxConfig

SCRATCH = "/tmp/.handhold"
# Fixed identity and dates make the single commit's hash the same in every sandbox,
# so a task's base_commit is known before any sandbox starts.
GIT_ENV = ("GIT_AUTHOR_NAME=developer GIT_AUTHOR_EMAIL=developer@localhost "
           "GIT_AUTHOR_DATE=2000-01-01T00:00:00+0000 GIT_COMMITTER_NAME=developer "
           "GIT_COMMITTER_EMAIL=developer@localhost GIT_COMMITTER_DATE=2000-01-01T00:00:00+0000")
IGNORED = "*.egg-info/\n__pycache__/\n*.pyc\n.pytest_cache/\n"


def prepare(sandbox: Sandbox, task: Task) -> str:
    """Apply the task's setup patch and commit the tree as the only history; returns HEAD."""
    if not task.setup_patch:
        sandbox.base_commit = task.base_commit or sandbox.base_commit
        return sandbox.base_commit or ""
    sandbox.write_file(f"{SCRATCH}/setup.patch", task.setup_patch)
    script = (
        f"cd {shlex.quote(task.workdir)} && git apply --whitespace=nowarn {SCRATCH}/setup.patch && rm -f {SCRATCH}/setup.patch"
        f" && rm -rf .git && git init -q && printf '{IGNORED}' >> .git/info/exclude"
        f" && git add -A && env {GIT_ENV} git commit -q -m 'Initial commit' && git rev-parse HEAD"
    )
    result = sandbox.run(script, timeout=120)
    if result.exit_code != 0:
        raise SandboxError(f"task {task.instance_id}: setting up the repository failed "
                           f"(exit {result.exit_code}): {result.output[-1500:]}")
    head = result.output.strip().splitlines()[-1]
    if task.base_commit and head != task.base_commit:
        raise SandboxError(f"task {task.instance_id}: the repository came out at {head}, not the recorded "
                           f"base_commit {task.base_commit}; the image changed since the task was made: "
                           "rebuild the tasks")
    sandbox.base_commit = head
    return head


@contextlib.contextmanager
def task_sandbox(task: Task, config: DockerSandboxConfig | None = None) -> Iterator[DockerSandbox]:
    """A ready DockerSandbox for `task`, removed on exit whatever happens."""
    with DockerSandbox(task.image, workdir=task.workdir, config=config,
                       base_commit=task.base_commit or None) as sandbox:
        prepare(sandbox, task)
        sandbox.run(f"cd {shlex.quote(task.workdir)}")
        yield sandbox
