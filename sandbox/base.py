"""The Sandbox protocol: one persistent shell and a work tree, in a container or a temp dir."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Protocol, runtime_checkable

from annotated_types import Ge, Gt

OUTPUT_CAP = 100_000  # bytes of a command's output that come back (head and tail halves)
DEFAULT_TIMEOUT = 120.0  # seconds


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox is made with, whatever runs it; each backend applies what it can (a LocalSandbox has no
    network, memory, CPU or process isolation to give, only the timeout and the output cap)."""

    network: bool = False
    """Give the container a network (off by default: the agent works offline)."""
    memory: str = "2g"
    """Memory limit (swap included), docker's notation."""
    cpus: Annotated[float, Gt(0)] = 1.0
    """CPU limit, in cores."""
    pids: Annotated[int, Ge(1)] = 512
    """Most processes the container may hold (contains fork bombs)."""
    user: str = "auto"
    """User the agent's commands run as; 'auto': the image's `agent` user if it has one, else the image's default."""
    timeout: Annotated[float, Gt(0)] = DEFAULT_TIMEOUT
    """Default per-command timeout, seconds."""
    output_cap: Annotated[int, Ge(1)] = OUTPUT_CAP
    """Bytes of each command's output returned (head and tail kept)."""


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
    environment: str
    """What the sandbox was made from (a container image), the same for sandboxes whose software is the same;
    "" when that cannot be told (a host folder), so nothing is cached across sandboxes."""

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run a command in the persistent session (cwd and exports persist)."""
        ...

    def run_privileged(self, command: str, timeout: float, stdin: bytes = b"") -> CommandResult:
        """Run apart from the agent's session state, as the sandbox's administrator (root in a container),
        `stdin` on its standard input; its output is decoded with surrogateescape, so `.encode("utf-8",
        "surrogateescape")` gives back the exact bytes."""
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
