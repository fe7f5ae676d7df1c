"""Stopping a batch whose attempts keep failing the same way: a model server gone, an engine out of disk.

Each attempt retries its own infrastructure faults; a batch did not stop on them, so a server that went down
mid-batch turned every remaining attempt into retries with backoff, each stored as a fault. Watching attempts in the
order they finish, a run of `limit` in a row failing with the same cause stops the batch: attempts not started are
cancelled, those in flight finish and are stored, and one error says why. Stored attempts are kept; a rerun of the
batch resumes (faults are run again).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import Executor, Future, as_completed
from typing import Callable, Iterator, TypeVar

from pipeline.core.records import Trajectory
from pipeline.core.vocab import CRASHED

J = TypeVar("J")

# What differs between two reports of one cause: container and exec ids, ports, counts, seconds.
_VARYING = re.compile(r"\b[0-9a-f]{12,64}\b|\d+(\.\d+)?")


class InfraStreakError(RuntimeError):
    """A batch stopped early: its latest attempts all failed with the same infrastructure cause. What was stored
    is kept, and a rerun resumes; not retried by the step (assets/resources.py): the cause needs a person."""


def cause_of(infra_error: str) -> str:
    """What makes two infrastructure faults the same: the text with ids and numbers masked, its start only."""
    return _VARYING.sub("#", infra_error)[:300]


class InfraStreak:
    """Counts the attempts in a row, in the order they finish, that failed with the same infrastructure cause."""

    def __init__(self, limit: int):
        self.limit, self.cause, self.count, self.last, self.stopped = limit, "", 0, "", False

    def add(self, traj: Trajectory) -> bool:
        """Count one finished attempt; True once `limit` in a row failed alike (never with limit 0)."""
        fault = traj.infra_error if traj.exit_status != CRASHED else ""  # a crash is a bug of ours, not a fault
        cause = cause_of(fault) if fault else ""
        self.count = self.count + 1 if cause and cause == self.cause else int(bool(cause))
        self.cause, self.last = cause, fault
        return bool(self.limit) and self.count >= self.limit

    def watch(self, threads: Executor, work: Callable[[J], Trajectory | Future[Trajectory]],
              jobs: list[J]) -> Iterator[Trajectory]:
        """`work` of each job on `threads`, as each finishes; once the streak is reached (`stopped`), no job starts
        any more, and those in flight still finish and come (the caller stores each). `work` may hand the end of a
        job to another executor (the grade) and return its future: it counts when that future is done."""
        lock = threading.Lock()

        def count(traj: Trajectory) -> None:
            with lock:
                self.stopped = self.stopped or self.add(traj)

        def counted(job: J) -> Trajectory | Future[Trajectory] | None:
            if self.stopped:  # a worker took it after the streak was reached: not run
                return None
            result = work(job)
            if isinstance(result, Future):
                result.add_done_callback(lambda f: f.exception() or count(f.result()))
            else:  # counted as it finishes, in the worker: the next job a worker takes sees the stop
                count(result)
            return result

        futures = [threads.submit(counted, job) for job in jobs]
        later: list[Future[Trajectory]] = []
        for future in as_completed(futures):
            if self.stopped:
                for f in futures:
                    f.cancel()  # False for one in flight or done: only those not started are dropped
            result = None if future.cancelled() else future.result()
            if isinstance(result, Future):
                later.append(result)
            elif result is not None:
                yield result
        for future in as_completed(later):
            yield future.result()

    def error(self, batch: str, stored: int, total: int) -> InfraStreakError:
        """The error that ends a batch that stopped: the cause, how many in a row, what is kept, how to go on."""
        return InfraStreakError(
            f"batch {batch} stopped: {self.count} attempts in a row failed with the same infrastructure fault "
            f"(rollout.stop_after_infra_failures: {self.limit}), the latest: {self.last[:1000]}\n"
            f"{stored} of its {total} attempts are stored and kept; fix the cause and run the step again: the batch "
            f"resumes where it stopped, running the faulted attempts again")
