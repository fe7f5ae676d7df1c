"""LocalSandbox: the Sandbox protocol on a temporary copy of a directory.

No isolation at all: commands run as this user, on this machine, with its network.
It exists for development without Docker and for fast unit tests.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sandbox import become_builtin
from sandbox.base import DEFAULT_TIMEOUT, OUTPUT_CAP, CommandResult, SandboxError
from sandbox.shell import ShellSession, interrupt_command, kill_all_command, run_or_restart, server_argv
from sandbox.worktree import diff_command, head_command, reset_command


class LocalSandbox:
    """A copy of `source` (or an empty dir) in a temp dir, and a local persistent shell."""

    def __init__(self, source: str | os.PathLike | None = None, timeout: float = DEFAULT_TIMEOUT,
                 output_cap: int = OUTPUT_CAP, base_commit: str | None = None):
        self._root = tempfile.mkdtemp(prefix="handhold-local-")
        self.workdir = os.path.join(self._root, "work")
        if source is not None:
            shutil.copytree(source, self.workdir, symlinks=True)
        else:
            os.makedirs(self.workdir)
        self._state = os.path.join(self._root, "shell")
        self.scratch = os.path.join(self._root, "scratch")
        self.private = os.path.join(self._root, "private")
        self.run_as = ""  # commands run as this user: nobody to drop to
        self.environment = ""  # the host's software, which may change between sandboxes
        self.timeout, self.output_cap = timeout, output_cap
        self._proc: subprocess.Popen | None = None
        self._start_shell()
        self.base_commit = base_commit or self._head()

    def _start_shell(self) -> None:
        session = ShellSession(self._send, self._recv, self._interrupt, cap=self.output_cap,
                               become=become_builtin.encoded())
        argv = server_argv(self._state, self.output_cap, self.workdir)
        # As in a Docker sandbox, Python writes no bytecode into the tree, whatever the host's setting: an edit of
        # the same size in the second its module was compiled would run the stale code
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      start_new_session=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        self._shell = session

    def _send(self, data: bytes) -> None:
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def _recv(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        return os.read(self._proc.stdout.fileno(), 1 << 16) if ready else None

    def _interrupt(self) -> None:
        subprocess.run(["sh", "-c", interrupt_command(self._state)], check=False)

    def _restart_shell(self) -> None:
        self._stop_shell()
        subprocess.run(["sh", "-c", kill_all_command(self._state)], check=False)
        self._start_shell()

    def _stop_shell(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
            self._proc = None

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        timeout = self.timeout if timeout is None else timeout
        return run_or_restart(self._shell, self._restart_shell, command, timeout, self._root)

    def run_privileged(self, command: str, timeout: float, stdin: bytes = b"") -> CommandResult:
        """A separate bash as this same user (a LocalSandbox has no one else to be); output decoded with
        surrogateescape, as DockerSandbox's."""
        start = time.monotonic()
        try:
            done = subprocess.run(["bash", "--noprofile", "--norc", "-c", command], cwd=self.workdir, input=stdin,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                                  start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode("utf-8", errors="surrogateescape")
            return CommandResult(-1, out, time.monotonic() - start, timed_out=True)
        return CommandResult(done.returncode, done.stdout.decode("utf-8", errors="surrogateescape"),
                             time.monotonic() - start)

    def _head(self) -> str | None:
        result = self.run(head_command(self.workdir), timeout=30)
        return result.output.strip() if result.exit_code == 0 else None

    def _path(self, path: str) -> Path:
        return Path(path if os.path.isabs(path) else os.path.join(self.workdir, path))

    def read_file(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def write_file(self, path: str, data: bytes | str) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    def diff(self) -> str:
        result = self.run(diff_command(self.workdir, self.base_commit), timeout=120)
        if result.exit_code != 0:
            raise SandboxError(f"git diff failed in {self.workdir}: {result.output[-2000:]}")
        return result.output

    def reset(self) -> None:
        result = self.run(reset_command(self.workdir, self.base_commit), timeout=120)
        if result.exit_code != 0:
            raise SandboxError(f"resetting {self.workdir} failed: {result.output[-2000:]}")

    def close(self) -> None:
        self._stop_shell()
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> "LocalSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
