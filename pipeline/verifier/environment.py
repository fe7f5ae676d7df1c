"""A task's sandbox: started from its image, its bug applied, the buggy state its only history."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Mapping

import docker
import docker.errors
from unidiff import PatchSet

from pipeline.core.records import Task
from sandbox.base import Sandbox, SandboxError, SandboxSpec
from sandbox.docker_sandbox import DockerSandbox
from sandbox.history import already_pruned_command, only_reachable_command, pruned_image
from sandbox.images import LABEL, docker_client, image_exists
from sandbox.local_sandbox import LocalSandbox
from sandbox.worktree import head_command

log = logging.getLogger(__name__)

SandboxFactory = Callable[[Task, SandboxSpec | None], ContextManager[Sandbox]]
"""Makes a ready sandbox for a task (its bug applied, at its base commit): `with sandboxes(task, config) as sb`."""

# Fixed identity and dates make the single commit's hash the same in every sandbox,
# so a task's base_commit is known before any sandbox starts.
GIT_ENV = ("GIT_AUTHOR_NAME=developer GIT_AUTHOR_EMAIL=developer@localhost "
           "GIT_AUTHOR_DATE=2000-01-01T00:00:00+0000 GIT_COMMITTER_NAME=developer "
           "GIT_COMMITTER_EMAIL=developer@localhost GIT_COMMITTER_DATE=2000-01-01T00:00:00+0000")
IGNORED = "*.egg-info/\n__pycache__/\n*.pyc\n.pytest_cache/\n"
PREPARED_VERSION = "2"  # bump when `prepare` or the labels change: prepared images are then made again
_BUILDING: dict[str, threading.Lock] = {}  # prepared image tag -> the lock its one build in a process holds


def prepare(sandbox: Sandbox, task: Task) -> str:
    """Apply the task's setup patch and commit the tree as the only history, then keep what the grader
    restores before every grade (the files git ignores, .git/config); returns HEAD."""
    head = _commit(sandbox, task)
    snapshot = sandbox.run_privileged(
        f"install -d -m 0700 {pristine(sandbox)} && cd {shlex.quote(sandbox.workdir)} && "
        f"cp .git/config {pristine(sandbox)}/git-config && "
        f"git -c safe.directory='*' ls-files -z -o -i --exclude-standard > {pristine(sandbox)}/ignored && "
        f"tar -cf {pristine(sandbox)}/ignored.tar --null -T {pristine(sandbox)}/ignored", timeout=120)
    if snapshot.exit_code != 0:
        raise SandboxError(f"task {task.instance_id}: keeping the pristine tree failed: {snapshot.output[-1500:]}")
    return head


def no_bytecode(setup_patch: str) -> str:
    """Shell removing the bytecode of the files a setup patch touches: compiled before the bug was applied
    (the environment image compiles its tree), it is the original code. The rest of the tree's bytecode
    is of files the agent reads as they are, and spares every run of the tests compiling them."""
    named = {name.split("/", 1)[1] for f in PatchSet(setup_patch) for name in (f.source_file, f.target_file)
             if name and name != "/dev/null" and "/" in name}  # a/ and b/ sides: a renamed file's old name too
    sources = sorted(Path(name) for name in named if name.endswith(".py"))
    compiled = [f"{shlex.quote(str(p.parent / '__pycache__' / p.stem))}.*.pyc {shlex.quote(str(p) + 'c')}"
                for p in sources]
    return f"rm -f -- {' '.join(compiled)}" if compiled else "true"


def pristine(sandbox: Sandbox) -> str:
    """Root's copy of what `prepare` left that git does not track: ignored files and .git/config."""
    return f"{sandbox.private}/pristine"


def _commit(sandbox: Sandbox, task: Task) -> str:
    if not task.setup_patch:
        _only_reachable(sandbox, task)
        sandbox.base_commit = task.base_commit or sandbox.base_commit
        return sandbox.base_commit or ""
    scratch = sandbox.scratch
    sandbox.write_file(f"{scratch}/setup.patch", task.setup_patch)
    script = (
        f"cd {shlex.quote(sandbox.workdir)} && git apply --whitespace=nowarn {scratch}/setup.patch && rm -f {scratch}/setup.patch"
        f" && {no_bytecode(task.setup_patch)} && rm -rf .git && git init -q && printf '{IGNORED}' >> .git/info/exclude"
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


def _only_reachable(sandbox: Sandbox, task: Task) -> None:
    """Drop every git ref, reflog, stash and object the task's commit does not reach (a repository the
    image brought, such as a dataset's clone whose later commits hold the fix); an image `pruned_image`
    made has it done already, and the attempt only reads its marker."""
    base = task.base_commit or "HEAD"
    workdir = shlex.quote(sandbox.workdir)
    script = (f"if test -d {workdir}/.git; then {already_pruned_command(sandbox.workdir, base)} || "
              f"{{ {only_reachable_command(sandbox.workdir, base)}; }}; fi")
    result = sandbox.run(script, timeout=600)
    if result.exit_code != 0:
        raise SandboxError(f"task {task.instance_id}: removing git history the task's commit does not reach "
                           f"failed (exit {result.exit_code}): {result.output[-1500:]}")


def environment_sandbox(image: str, workdir: str, config: SandboxSpec | None = None, base_commit: str | None = None,
                        client: docker.DockerClient | None = None) -> DockerSandbox:
    """A started Docker sandbox of an environment image, prepared for no task yet: the one place the pipeline
    makes a DockerSandbox (task sandboxes, prepared images, synthesis's working sandboxes), so every sandbox gets
    the same limits (`config`: a run's are GradeRules.sandbox) and backend. A context manager: removed on exit."""
    return DockerSandbox(image, workdir=workdir, config=config, base_commit=base_commit, client=client)


@contextlib.contextmanager
def task_sandbox(task: Task, config: SandboxSpec | None = None) -> Iterator[DockerSandbox]:
    """A ready DockerSandbox for `task`, removed on exit whatever happens."""
    image, prepared = task.image, None
    if task.base_commit and not task.setup_patch:  # a repository the image brought: pruned once per image
        image = pruned_image(docker_client(), task.image, task.workdir, task.base_commit)
    elif task.base_commit:  # a synthesized task: its bug applied and committed once per task
        prepared = prepared_image(task)
        image = prepared or image
    with environment_sandbox(image, task.workdir, config, base_commit=task.base_commit or None) as sandbox:
        sandbox.environment = task.image
        if prepared:
            _check_head(sandbox, task)
        else:
            prepare(sandbox, task)
        sandbox.keep_index()  # the agent's diff starts from it: git hashes only what the agent changed
        sandbox.run(f"cd {shlex.quote(task.workdir)}")
        yield sandbox


def prepared_image(task: Task) -> str | None:
    """The tag of an image holding what `prepare` makes of `task` in a sandbox of its image (the bug applied and
    committed as the only history, the pristine snapshot), made once from such a sandbox and kept: a task's
    sandbox then starts ready instead of applying, committing (git hashes the whole tree) and snapshotting
    again (0.13-0.29 CPU s a sandbox, quiet; more when loaded). The container's own layer is what is kept, so neither
    the tree before the bug nor the patch that made it is in any layer a sandbox can see. None, with a warning,
    when it cannot be made: the caller prepares the sandbox itself."""
    client = docker_client()
    try:
        source = client.images.get(task.image)
    except docker.errors.ImageNotFound:
        return None  # DockerSandbox says what is missing
    key = hashlib.sha256(f"{PREPARED_VERSION}\n{source.id}\n{task.workdir}\n{task.setup_patch}".encode())
    tag = f"handhold/prepared:{key.hexdigest()[:16]}"
    with _BUILDING.setdefault(tag, threading.Lock()):  # one build per tag in a process; the pool's workers wait
        if image_exists(client, tag):
            return tag
        try:
            with environment_sandbox(task.image, task.workdir, client=client) as sandbox:
                prepare(sandbox, task)
                config = source.attrs.get("Config") or {}
                labels = {**(config.get("Labels") or {}), LABEL: "prepared", f"{LABEL}.task": task.instance_id,
                          f"{LABEL}.users-of": source.id,  # its users are its source's: probed once for all
                          **{f"{LABEL}.{k}": "" for k in ("pid", "host", "started")}}  # not a sandbox's
                client.api.commit(sandbox.container.id, *tag.split(":"), conf={
                    "User": config.get("User") or "", "Cmd": config.get("Cmd"), "Entrypoint": config.get("Entrypoint"),
                    "WorkingDir": config.get("WorkingDir") or "", "Labels": labels})
        except (SandboxError, docker.errors.APIError) as exc:
            log.warning("task %s: its prepared image could not be made (%s); each of its sandboxes is prepared "
                        "on its own", task.instance_id, exc)
            return None
    return tag


def _check_head(sandbox: Sandbox, task: Task) -> None:
    head = sandbox.run(head_command(sandbox.workdir), timeout=60).output.strip()
    if head != task.base_commit:
        raise SandboxError(f"task {task.instance_id}: its prepared image is at {head or 'no commit'}, not the "
                           f"recorded base_commit {task.base_commit}: remove the image and run again")
    sandbox.base_commit = head


@dataclass(frozen=True)
class LocalTaskSandboxes:
    """A SandboxFactory over host copies of the tasks' repositories: no Docker, and no isolation.

    `repos` maps a task's `image` to a host folder holding the same pristine tree the image
    has at its workdir; the tests run with whatever Python this host has on PATH.
    """

    repos: Mapping[str, str]

    @contextlib.contextmanager
    def __call__(self, task: Task, config: SandboxSpec | None = None) -> Iterator[LocalSandbox]:
        if task.image not in self.repos:
            raise SandboxError(f"task {task.instance_id}: no local repository for image {task.image}; "
                               f"add it to LocalTaskSandboxes.repos (known: {sorted(self.repos)})")
        timeout = config.timeout if config else None
        with LocalSandbox(self.repos[task.image], **({"timeout": timeout} if timeout else {})) as sandbox:
            prepare(sandbox, task)
            yield sandbox
