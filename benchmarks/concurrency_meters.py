"""Meters for benchmarks/concurrency.py: sandboxes' start times and CPU, memory of the live ones, and this
process's threads and file descriptors, read from the containers' cgroups (v1 or v2) and /proc."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

CGROUP_V1 = Path("/sys/fs/cgroup")
CGROUP_V2_SCOPES = ("system.slice/docker-{id}.scope", "docker/{id}")


def _cgroup_file(container: str, v1_controller: str, v1_name: str, v2_name: str) -> Path | None:
    v1 = CGROUP_V1 / v1_controller / "docker" / container / v1_name
    if v1.exists():
        return v1
    for scope in CGROUP_V2_SCOPES:
        v2 = CGROUP_V1 / scope.format(id=container) / v2_name
        if v2.exists():
            return v2
    return None


def container_cpu(container: str) -> float | None:
    """CPU seconds the container's processes used so far; None where its cgroup cannot be read."""
    path = _cgroup_file(container, "cpuacct", "cpuacct.usage", "cpu.stat")
    if path is None:
        return None
    text = path.read_text()
    if path.name == "cpuacct.usage":
        return int(text) / 1e9
    return next(int(v) for k, v in (line.split() for line in text.splitlines()) if k == "usage_usec") / 1e6


def container_memory(container: str) -> int | None:
    """Bytes the container's cgroup holds now (page cache included, as its limit counts it)."""
    path = _cgroup_file(container, "memory", "memory.usage_in_bytes", "memory.current")
    try:
        return int(path.read_text()) if path else None
    except (OSError, ValueError):  # removed meanwhile
        return None


ENGINE = ("dockerd", "containerd")


def engine_cpu() -> float:
    """CPU seconds the Docker engine's daemons (dockerd, containerd) used so far, whoever asked them."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name, seconds = _stat(pid)
        except OSError:
            continue
        total += seconds if name in ENGINE else 0.0
    return total


def process_cpu(pid: int) -> float:
    """CPU seconds process `pid` (all its threads) used so far."""
    return _stat(pid)[1]


def _stat(pid: int | str) -> tuple[str, float]:
    """(name, CPU seconds so far) of a process, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> float:
    """CPU seconds every core of the machine was busy so far (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


class Metered:
    """A SandboxFactory over another: each sandbox's start time (its factory's enter: start and prepare), and
    its container's CPU when handed back; which sandboxes are live."""

    def __init__(self, factory):
        self.factory = factory
        self.starts: list[float] = []
        self.cpu: list[float | None] = []
        self.live: set[str] = set()
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, task, config=None):
        start = time.perf_counter()
        with self.factory(task, config) as sandbox:
            container = sandbox.container.id
            with self.lock:
                self.starts.append(time.perf_counter() - start)
                self.live.add(container)
            try:
                yield sandbox
            finally:
                with self.lock:
                    self.cpu.append(container_cpu(container))
                    self.live.discard(container)

    def cpu_total(self) -> float | None:
        """CPU seconds of every container handed back; None when one could not be read."""
        return None if not self.cpu or any(c is None for c in self.cpu) else sum(self.cpu)


class Sampler(threading.Thread):
    """Every `every` seconds: the live sandboxes' memory, this process's threads and file descriptors. Its own
    CPU time is kept (`cpu`), to be taken off this process's."""

    def __init__(self, metered: Metered, every: float = 1.0):
        super().__init__(daemon=True)
        self.metered, self.every = metered, every
        self.stop, self.cpu = threading.Event(), 0.0
        self.memory: list[float] = []
        self.live_peak = self.threads_peak = self.fds_peak = 0

    def run(self) -> None:
        while not self.stop.wait(self.every):
            with self.metered.lock:
                live = list(self.metered.live)
            sizes = [m for m in map(container_memory, live) if m is not None]
            if sizes:
                self.memory.append(sum(sizes) / len(sizes))
            self.live_peak = max(self.live_peak, len(live))
            self.threads_peak = max(self.threads_peak, threading.active_count())
            self.fds_peak = max(self.fds_peak, len(os.listdir("/proc/self/fd")))
            self.cpu = time.thread_time()

    @property
    def memory_per_sandbox(self) -> float:
        """Mean bytes a live sandbox's cgroup held, over the samples."""
        return sum(self.memory) / len(self.memory) if self.memory else 0.0

    def __enter__(self) -> "Sampler":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()
