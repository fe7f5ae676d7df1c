"""A warm pool of task sandboxes: containers started and prepared in the background, before an attempt,
a probe or a grade asks for one.

The pool wraps any SandboxFactory. A batch tells it, in order, which (task, limits) it will ask for
(`expect`); background workers keep the next `size` of those ready. Asking (`pool(task, config)`, a
SandboxFactory itself) takes the ready one, or makes one on the spot when none is; a request that will not
come after all (a grade known without running it) is taken off the queue (`forgo`). A sandbox is used
once: handed back, it is removed (in the background), so a grade always gets a container no agent has used
and no attempt inherits another's tree, /tmp, processes or environment. Ready sandboxes idle longer than `idle`
seconds are closed; `close()` (or leaving the `with`) drains the pool, so none outlives its step.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ContextManager, Hashable, Iterator

from pipeline.core.records import Task
from pipeline.core.setting_ranges import CountOrZero, Seconds
from pipeline.verifier.environment import SandboxFactory, task_sandbox
from sandbox.base import Sandbox, SandboxError, SandboxSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolConfig:
    """The warm sandbox pool of a step that runs attempts."""

    size: CountOrZero = 2
    """Sandboxes kept started and prepared ahead of need (0: none; each attempt starts its own)."""
    idle: Seconds = 300.0
    """Seconds a ready sandbox may wait for its taker before it is closed."""


@dataclass
class _Ready:
    """One expected request and the sandbox being made or made for it."""

    key: Hashable
    task: Task
    config: SandboxSpec | None
    future: Future | None = None
    since: float = 0.0
    late: bool = False
    """Its sandbox idled out: the request is made on the spot when it comes."""


@dataclass
class PoolStats:
    """What the pool did: takes served warm and cold, and the seconds each take waited."""

    warm: int = 0
    cold: int = 0
    wasted: int = 0
    """Sandboxes made ahead that nobody took (idle, failed or drained)."""
    take_seconds: list[float] = field(default_factory=list)

    def as_metadata(self) -> dict:
        takes = self.warm + self.cold
        median = statistics.median(self.take_seconds) * 1000 if self.take_seconds else 0.0
        return {"pool_takes": takes, "pool_warm_takes": self.warm, "pool_cold_takes": self.cold,
                "pool_wasted": self.wasted, "pool_take_median_ms": round(median, 1),
                "pool_take_p99_ms": round(percentile(self.take_seconds, 99) * 1000, 1)}


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile of `values` (nearest rank); 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def batch_order(requests: list[tuple[Task, SandboxSpec | None]], workers: int
                ) -> list[tuple[Task, SandboxSpec | None]]:
    """Each job's agent and grading requests (`requests`: one per job) in the order `workers` threads make them:
    the first `workers` jobs' agents at once, then, as each attempt is graded, the grade and its worker's next job.
    In job order (agent, grade, agent, ...) the pool's `size` ready sandboxes were for grades many seconds away
    while the next jobs' agents started cold: at 16 at once, 34 of 64 takes."""
    workers = max(1, workers)
    order = list(requests[:workers])
    for i, request in enumerate(requests):
        order.append(request)
        if i + workers < len(requests):
            order.append(requests[i + workers])
    return order


def _key(task: Task, config: SandboxSpec | None) -> Hashable:
    return task.instance_id, task.image, task.base_commit, config


class SandboxPool:
    """A SandboxFactory over `factory` that makes the expected sandboxes ahead of need."""

    def __init__(self, factory: SandboxFactory = task_sandbox, config: PoolConfig | None = None):
        self.factory, self.config = factory, config or PoolConfig()
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._queue: deque[_Ready] = deque()
        self._workers = ThreadPoolExecutor(max(1, self.config.size), thread_name_prefix="sandbox-pool")
        self._closer = ThreadPoolExecutor(1, thread_name_prefix="sandbox-close")
        self._closed = False

    def expect(self, requests: list[tuple[Task, SandboxSpec | None]]) -> None:
        """Queue requests that will come, in the order they will come."""
        with self._lock:
            self._queue.extend(_Ready(_key(t, c), t, c) for t, c in requests)
            self._fill()

    @contextlib.contextmanager
    def __call__(self, task: Task, config: SandboxSpec | None = None) -> Iterator[Sandbox]:
        start = time.monotonic()
        made = self._take(_key(task, config))
        try:
            context, sandbox = made or _enter(self.factory(task, config))
        finally:
            self._count("cold" if made is None else "warm", time.monotonic() - start)
        try:
            yield sandbox
        finally:  # handed back at once: the container is removed in the background, before close() returns
            self._closer.submit(_exit_quietly, context)

    def forgo(self, task: Task, config: SandboxSpec | None = None) -> None:
        """An expected request that will not come (a grade known without a sandbox): the last queued entry for it
        is dropped, so one made earlier serves the next request alike; a sandbox made for the dropped one is closed."""
        key = _key(task, config)
        with self._lock:
            entry = next((e for e in reversed(self._queue) if e.key == key), None)
            if entry is None:
                return
            self._queue.remove(entry)
            if entry.future is not None:
                self._discard(entry.future)
            self._fill()

    def _count(self, kind: str, seconds: float) -> None:
        with self._lock:
            setattr(self.stats, kind, getattr(self.stats, kind) + 1)
            if kind != "wasted":
                self.stats.take_seconds.append(seconds)

    def _take(self, key: Hashable) -> tuple[ContextManager, Sandbox] | None:
        """The first expected entry for `key` taken out of the queue, once its sandbox is ready; None
        when it was not expected, not started, or failed to start (the caller then makes its own)."""
        with self._lock:
            self._expire()
            entry = next((e for e in self._queue if e.key == key), None)
            if entry is not None:
                self._queue.remove(entry)
            self._fill()
        if entry is None or entry.future is None:
            return None
        try:
            made = entry.future.result()
            _check_alive(made[1])
            return made
        except Exception as exc:  # the taker makes one of its own, which reports its own fault
            log.info("a sandbox made ahead for %s failed or died (%s); making one on the spot",
                     entry.task.instance_id, exc)
            self._count("wasted", 0.0)
            if entry.future.exception() is None:
                self._closer.submit(_exit_quietly, entry.future.result()[0])
            return None

    def _fill(self) -> None:
        """Start making the first `size` expected sandboxes (the lock is held)."""
        if self._closed:
            return
        for entry in list(self._queue)[:self.config.size]:
            if entry.future is None and not entry.late:
                entry.future = self._workers.submit(self._make, entry)

    def _make(self, entry: _Ready) -> tuple[ContextManager, Sandbox]:
        made = _enter(self.factory(entry.task, entry.config))
        entry.since = time.monotonic()  # ready from now: its idle time counts from here
        return made

    def _expire(self) -> None:
        """Close ready sandboxes that waited longer than `idle` (the lock is held); their requests stay
        queued, to be made on the spot."""
        now = time.monotonic()
        for entry in self._queue:
            if entry.future is not None and entry.future.done() and now - entry.since > self.config.idle:
                self._discard(entry.future)
                entry.future, entry.late = None, True

    def _discard(self, future: Future) -> None:
        """Close a sandbox made ahead that nobody will take, once it is made (the lock is held)."""
        self.stats.wasted += 1
        future.add_done_callback(_close_made)

    def close(self) -> None:
        """Stop making sandboxes and close every one made: those handed back and those nobody took."""
        with self._lock:
            self._closed = True
            for entry in self._queue:
                if entry.future is not None:
                    self._discard(entry.future)
            self._queue.clear()
        self._workers.shutdown(wait=True)
        self._closer.shutdown(wait=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_alive(sandbox: Sandbox) -> None:
    """Raise when a ready sandbox died while it waited (its container killed or gone)."""
    result = sandbox.run("true", timeout=30)
    if result.exit_code != 0 or result.shell_restarted:
        raise SandboxError(f"its shell answered exit {result.exit_code}: {result.output[-200:]}")


def _enter(context: ContextManager[Sandbox]) -> tuple[ContextManager[Sandbox], Sandbox]:
    return context, context.__enter__()


def _exit_quietly(context: ContextManager) -> None:
    try:
        context.__exit__(None, None, None)
    except Exception as exc:  # removing a container must not fail the step (the reaper cleans after a crash)
        log.warning("closing a pooled sandbox failed: %s", exc)


def _close_made(future: Future) -> None:
    if future.exception() is None:
        _exit_quietly(future.result()[0])
