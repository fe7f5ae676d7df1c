"""The Sandbox protocol: one persistent shell and a work tree, in a container or a temp dir."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class CommandResult:
    """What one command did."""

    exit_code: int
    output: str
    """stdout and stderr interleaved, decoded with replacement, capped (head and tail kept)."""
    duration: float  # seconds, as seen by the caller
    timed_out: bool = False
    cut_bytes: int = 0
    """How many bytes of output the cap removed (0 when nothing was cut)."""
    shell_restarted: bool = False
    """The shell had hung or exited and was restarted; cwd and exported variables were lost."""


@runtime_checkable
class Sandbox(Protocol):
    """A work tree plus a shell session; `pipeline/` only ever talks to this."""

    workdir: str
    scratch: str
    """A folder for the harness's own files (patches, scripts), outside the work tree."""
    private: str
    """A folder only the harness can write or read (root's in a container): the grader's log and exit code."""
    run_as: str
    """"uid gid home name" of the user commands drop to from a privileged shell; "" when there is none."""
    base_commit: str | None
    """Commit `diff` and `reset` compare against (None: HEAD when the sandbox started)."""

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run a command in the persistent session (cwd and exports persist)."""
        ...

    def run_privileged(self, command: str, timeout: float, stdin: bytes = b"") -> CommandResult:
        """Run outside the agent's session, as the sandbox's administrator (root in a container), `stdin` on
        its standard input; its output is decoded with surrogateescape, so `.encode("utf-8", "surrogateescape")`
        gives back the exact bytes."""
        ...

    def read_file(self, path: str) -> bytes:
        """Bytes of a file; relative paths are under `workdir`."""
        ...

    def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file (parents created); relative paths are under `workdir`."""
        ...

    def diff(self) -> str:
        """`git diff` of the work tree (new files included) against `base_commit`."""
        ...

    def reset(self) -> None:
        """Put the work tree back to `base_commit` exactly, untracked files removed."""
        ...

    def close(self) -> None:
        """Release everything; safe to call twice."""
        ...

    def __enter__(self) -> "Sandbox": ...

    def __exit__(self, *exc: object) -> None: ...


class SandboxError(RuntimeError):
    """The sandbox itself failed (engine, container, shell): an infrastructure fault."""
