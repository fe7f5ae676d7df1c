"""DockerSandbox: a container with limits and one persistent shell session inside it."""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import posixpath
import secrets
import shlex
import socket
import time

import docker
import docker.errors

from sandbox import become_builtin, session_files
from sandbox.base import CommandResult, SandboxError, SandboxSpec
from sandbox.exec_stream import StdoutFrames, exec_socket, run_in_exec
from sandbox.images import LABEL, SANDBOX_USER, docker_client
from sandbox.shell import (STATE_DIR, ShellClosed, ShellSession, interrupt_command, restart_kill_command,
                           run_or_restart, server_argv)
from sandbox.worktree import (diff_command, head_command, keep_fresh_index_command, keep_index_command,
                              reset_command)

log = logging.getLogger(__name__)

SCRATCH = "/tmp/.handhold"  # the harness's own files (patches, scripts)
PRIVATE = "/run/handhold-private"  # root's only: what the sandbox user must neither read nor write
TRUSTED_INDEX = "/run/handhold-index/index"  # root's, the user's to read: the index a reset starts from
SESSION_TMPFS = "128m"  # the session's in-memory folder: state, and the current command's full output
_USERS: dict[tuple[str, str], tuple[str, str]] = {}  # (image id, configured user) -> DockerSandbox._users()


class DockerSandbox:
    """A container started from `image`, a shell session in `workdir`, removed on close."""

    def __init__(self, image: str, workdir: str = "/testbed", config: SandboxSpec | None = None,
                 base_commit: str | None = None, client: docker.DockerClient | None = None):
        self.image, self.workdir = image, workdir
        self.environment = image
        self.scratch, self.private = SCRATCH, PRIVATE
        self.config = config or SandboxSpec()
        self._own_client = client is None  # closed with the sandbox: its pooled connections are file descriptors
        self.client = client or docker_client()
        self.container, self.run_as = None, ""
        self._trusted: tuple[str, str | None] | None = None  # (workdir, base) TRUSTED_INDEX was kept for
        self._shell: ShellSession | None = None
        self._sock = None
        self._gone = ""  # why the container is no longer there to run in ('' while it is)
        try:
            self.container = self._start_container()
            self.user, self.run_as = self._users()
            self._start_shell()
        except Exception:
            self.close()
            raise
        self.base_commit = base_commit or self._head()

    # -- container -----------------------------------------------------------------
    def _start_container(self):
        self._ensure_image()
        c = self.config
        try:
            # PID 1 is root's whatever the image's user: nothing the sandbox user does can end the container.
            # Offline, the network is disabled rather than "none": the container's own namespace holds only the
            # loopback either way, but the engine skips its network set-up and hook (a start and stop: 0.29 -> 0.16 s).
            network = {"network_mode": "bridge"} if c.network else {"network_disabled": True}
            return self.client.containers.run(
                self.image, command=["sleep", "infinity"], detach=True, init=True, user="root", **network,
                mem_limit=c.memory, memswap_limit=c.memory, nano_cpus=int(c.cpus * 1e9),
                pids_limit=c.pids, working_dir=self.workdir if self.workdir else None,
                # The session's state and each command's output live in memory: a new file per
                # command on the overlay costs milliseconds. Output past the cap is cut (ENOSPC). exec: the
                # loop loads its builtin from there (sandbox/become_builtin.py).
                tmpfs={STATE_DIR: f"size={SESSION_TMPFS},mode=0700,exec"},
                labels={LABEL: "sandbox", f"{LABEL}.pid": str(os.getpid()),
                        f"{LABEL}.host": socket.gethostname(), f"{LABEL}.started": str(int(time.time()))},
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot start a container from {self.image}: {exc.explanation or exc}") from exc

    def _ensure_image(self) -> None:
        """Pull the image once if the engine lacks it (SWE-bench images are pulled, not built)."""
        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            try:
                self.client.images.pull(self.image)
            except docker.errors.APIError as exc:
                raise SandboxError(f"image {self.image} is not on the engine and cannot be pulled "
                                   f"({exc.explanation or exc}): build or pull it first") from exc

    def _users(self) -> tuple[str, str]:
        """(the user commands run as, `_run_as`), probed once per image and configured user in a process: each
        probe is an exec (~100 ms) that the image's id answers for, or the id its label `users-of` names (a
        prepared image: its source's users)."""
        labels = (self.container.attrs.get("Config") or {}).get("Labels") or {}
        key = (labels.get(f"{LABEL}.users-of") or self.container.attrs.get("Image") or self.image, self.config.user)
        if key not in _USERS:
            user = self.config.user if self.config.user != "auto" else self._default_user()
            _USERS[key] = user, self._run_as(user)
        return _USERS[key]

    def _default_user(self) -> str:
        probe = self.container.exec_run(["id", "-u", SANDBOX_USER], user="root")
        return SANDBOX_USER if probe.exit_code == 0 else ""

    def _run_as(self, user: str) -> str:
        """"uid gid home name" of the user commands drop to from the root loop; "" to run the loop as it."""
        if not user or user in ("root", "0"):
            return ""
        probe = self.run_privileged(f"command -v setpriv >/dev/null && id -u {shlex.quote(user)} && "
                                    f"id -g {shlex.quote(user)} && getent passwd {shlex.quote(user)} | cut -d: -f6", 60)
        fields = probe.output.split()
        if probe.exit_code != 0 or len(fields) != 3:
            log.warning("sandbox %s: no setpriv or no user %s in %s; the shell runs as that user, "
                        "where it can harm its own session", self.short_id, user, self.image)
            return ""
        return f"{fields[0]} {fields[1]} {fields[2]} {user}"

    # -- shell -----------------------------------------------------------------------
    def _start_shell(self) -> None:
        argv = server_argv(STATE_DIR, self.config.output_cap, self.workdir, self.run_as)
        loop_user = "root" if self.run_as else (self.user or "")
        exec_id = self.client.api.exec_create(self.container.id, argv, stdin=True, stdout=True, stderr=True,
                                              tty=False, user=loop_user)["Id"]
        self._sock = exec_socket(self.client, exec_id)
        self._shell = ShellSession(self._send, StdoutFrames(self._sock).recv, self._interrupt,
                                   cap=self.config.output_cap, become=become_builtin.encoded())

    def _interrupt(self) -> None:
        """Kill the running command's process group (the shell loop survives)."""
        self.container.exec_run(["sh", "-c", interrupt_command(STATE_DIR)], user="root")

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise ShellClosed(str(exc)) from exc

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run in the session; a hung or exited shell is restarted and the result says so."""
        if self._gone:
            raise SandboxError(self._gone)
        timeout = self.config.timeout if timeout is None else timeout
        return run_or_restart(self._shell, self._restart_shell, command, timeout, self.short_id)

    def _restart_shell(self) -> None:
        self._check_running()
        try:
            self._sock.close()
        except OSError:
            pass
        kill = restart_kill_command(STATE_DIR)  # what the lost session left (shell.py: why this is enough)
        for attempt in range(10):
            try:
                if self.run_as:
                    self.container.exec_run(["sh", "-c", "kill -KILL -1"], user=self.run_as.split()[0])
                self.container.exec_run(["sh", "-c", kill], user="root")
                self._start_shell()
                self._shell.run("true", 30)  # the new loop answers
                return
            except docker.errors.APIError as exc:
                # A container that stopped answers 409 (or 500 "is not running" to an exec made just before it
                # stopped), which no retry changes: retrying held a killed sandbox's worker for 27 s.
                if exc.status_code == 409 or "is not running" in str(exc):
                    self._check_running(f" ({exc.explanation or exc})", settle=2.0)
                log.warning("sandbox %s: restart failed (%s), retrying", self.short_id, exc)
            except (ShellClosed, OSError) as exc:
                # A container being stopped may still take an exec, whose stream then ends at once: the engine
                # records the stop a moment after the session's stream ended (seconds, on a loaded machine).
                self._check_running(" (a new shell exited at once)", settle=2.0)
                log.warning("sandbox %s: the restarted shell did not answer (%s), retrying", self.short_id, exc)
            time.sleep(0.5 * (attempt + 1))
        raise SandboxError(f"sandbox {self.short_id}: the shell cannot be restarted")

    def _check_running(self, why: str = "", settle: float = 0.0) -> None:
        """Raise SandboxError, and fail every later command at once, unless the engine says the container runs;
        `settle`: seconds to wait for the engine to record a stop it has not yet (it lags the exec streams)."""
        deadline = time.monotonic() + settle
        while True:
            try:
                self.container.reload()
                status = self.container.status
            except docker.errors.NotFound:
                status = "removed"
            if status != "running":
                self._gone = f"container {self.short_id} is {status}{why}; the sandbox is gone"
                raise SandboxError(self._gone)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def run_privileged(self, command: str, timeout: float, stdin: bytes = b"") -> CommandResult:
        """Run `command` as root apart from the session's state, `stdin` on its standard input; stdout and
        stderr together, decoded with surrogateescape (so encoding it back gives the bytes). Through the
        session's root loop once it runs (a fork: a few milliseconds), else in an exec of its own (~65 ms)."""
        if self.run_as and self._shell is not None:
            return self._privileged_in_session(command, timeout, stdin)
        return self._privileged_exec(command, timeout, stdin)

    def _privileged_in_session(self, command: str, timeout: float, stdin: bytes) -> CommandResult:
        """`stdin` travels in a here-document of the loop's own shell, read by no command line (`ps` shows
        the sandbox user every command line, and a grade's inputs hold its guard's key)."""
        shell = f"timeout -k 5 {max(int(timeout), 1)} bash --noprofile --norc -c {shlex.quote(command)}"
        if stdin:
            tag = f"__HANDHOLD_IN_{secrets.token_hex(8)}__"
            text = f"base64 -d <<'{tag}' | {shell}\n{base64.encodebytes(stdin).decode()}{tag}\n"
        else:
            text = f"{shell} < /dev/null"
        try:
            done = self._shell.run(text, timeout + 30, privileged=True)  # `timeout` ends it first: exit 124
        except (ShellClosed, OSError) as exc:
            self._restart_shell()
            raise SandboxError(f"sandbox {self.short_id}: the session was lost during a privileged command "
                               f"({exc}); it was restarted") from exc
        return dataclasses.replace(done, timed_out=done.timed_out or done.exit_code == 124)

    def _privileged_exec(self, command: str, timeout: float, stdin: bytes) -> CommandResult:
        try:
            return run_in_exec(self.client, self.container.id, command, timeout, stdin)
        except (docker.errors.APIError, OSError) as exc:
            raise SandboxError(f"sandbox {self.short_id}: a privileged command failed to run: {exc}") from exc

    def _checked(self, command: str, what: str) -> str:
        result = self.run(command, timeout=max(self.config.timeout, 120))
        if result.exit_code != 0:
            raise SandboxError(f"{what} failed in {self.short_id} (exit {result.exit_code}): {result.output[-2000:]}")
        return result.output

    def _head(self) -> str | None:
        result = self.run(head_command(self.workdir), timeout=30)
        return result.output.strip() if result.exit_code == 0 else None

    # -- files -------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.workdir, path)

    def read_file(self, path: str) -> bytes:
        return session_files.read(self, self._abs(path), path)

    def write_file(self, path: str, data: bytes | str) -> None:
        session_files.write(self, self._abs(path), path, data)

    # -- work tree -----------------------------------------------------------------------
    def _kept_index(self) -> str | None:
        """TRUSTED_INDEX when it was kept for this work tree and base, else None."""
        return TRUSTED_INDEX if self._trusted == (self.workdir, self.base_commit) else None

    def diff(self) -> str:
        return self._checked(diff_command(self.workdir, self.base_commit, self._kept_index()), "git diff")

    def keep_index(self) -> None:
        """Keep the index of a tree nothing ran in since it was made (a task's sandbox, just prepared) where the
        sandbox user cannot write, when it holds exactly the base tree: diffs and resets start from its stat data
        (sandbox/worktree.py). Nothing is kept where commands run as root, or when the command fails."""
        if self.run_as and self.base_commit and self.run_privileged(
                keep_fresh_index_command(self.workdir, TRUSTED_INDEX, self.base_commit), 60).exit_code == 0:
            self._trusted = (self.workdir, self.base_commit)

    def reset(self) -> None:
        """The work tree back to base: the first reset compares every file and, where commands run as a user
        other than root, keeps its index where they cannot write, for later resets to start from."""
        kept = self._kept_index()
        self._checked(reset_command(self.workdir, self.base_commit, kept), "resetting the work tree")
        keep = keep_index_command(self.workdir, TRUSTED_INDEX, self.run_as) if self.run_as and not kept else ""
        if keep and self.run_privileged(keep, 60).exit_code == 0:
            self._trusted = (self.workdir, self.base_commit)

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def short_id(self) -> str:
        return self.container.short_id if self.container is not None else "(not started)"

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                log.warning("could not remove container %s: %s", self.short_id, exc)
            self.container = None
        if self._own_client:  # else a closed sandbox's ~8 descriptors stayed open until garbage collection
            self.client.close()

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
