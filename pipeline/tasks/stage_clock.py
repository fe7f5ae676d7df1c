"""Where synthesis spends its time: wall seconds per stage that add up to the run's total.

Serial stages (an image build, a baseline run) count their wall seconds. Inside a parallel phase
(candidates tried on `n` sandboxes at once, tasks verified by `n` workers) each stage counts its
seconds divided by `n`, and the phase's wall time the workers left unused is `waiting` (one worker
done while another still runs, or threads queued behind each other). Whatever no stage claims
(writing parquet, reading the cache) is `other`, so the breakdown always sums to the total.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from typing import Iterator

_LOCK = threading.Lock()  # module-wide, so a clock pickles (a report is shared between test workers)
STAGES = {
    "image": "environment image built or found, source fetched and unpacked",
    "candidates": "bug candidates generated from the source (and the teacher's rewrites)",
    "sandbox_start": "containers started for synthesis (and stopped: `sandbox_close`)",
    "collect": "test collection, to settle how the suite runs reliably",
    "baseline": "the pristine suite's runs",
    "callmap": "one traced run of the pristine suite: which tests run which functions",
    "bug_runs": "runs, with a candidate bug in place, of the test files that run its function",
    "probe": "the weak-test probe: FAIL_TO_PASS tests with the function returning None",
    "restore": "the original file written back after a candidate",
    "verify_setup": "verifier: a fresh container per task, its bug applied and committed",
    "certify_setup": "verifier: the certificate's further fresh containers per task (pipeline/tasks/certificate.py)",
    "gold_grades": "verifier: grades of the gold patch",
    "empty_grade": "verifier: grade of the empty patch",
    "sandbox_close": "containers stopped and removed",
    "waiting": "parallel workers idle while another finished its share",
    "other": "statement writing, parquet, cache look-ups: the rest",
}


class StageClock:
    """Wall seconds and counts per stage; thread-safe, so workers of a parallel phase can report."""

    def __init__(self):
        self.seconds: Counter = Counter()
        self.runs: Counter = Counter()
        self._share = 1  # workers of the current parallel phase

    @contextlib.contextmanager
    def stage(self, name: str, runs: int = 1) -> Iterator[None]:
        """Time the block as `name` (one of STAGES); `runs`: how many suite runs or operations it holds."""
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; add it to STAGES in pipeline/tasks/stage_clock.py")
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - start, runs)

    def add(self, name: str, seconds: float, runs: int = 1) -> None:
        with _LOCK:
            self.seconds[name] += seconds / self._share
            self.runs[name] += runs

    @contextlib.contextmanager
    def parallel(self, workers: int) -> Iterator[None]:
        """A phase where `workers` threads run stages at once; their unused wall time becomes `waiting`."""
        start, before = time.monotonic(), sum(self.seconds.values())
        self._share = max(workers, 1)
        try:
            yield
        finally:
            self._share = 1
            used = sum(self.seconds.values()) - before
            self.seconds["waiting"] += max(time.monotonic() - start - used, 0.0)

    def breakdown(self, total: float) -> dict[str, float]:
        """Seconds per stage (in STAGES order, zeros left out), `other` being what no stage claimed."""
        out = {name: round(self.seconds[name], 2) for name in STAGES if self.seconds[name] and name != "other"}
        out["other"] = round(max(total - sum(self.seconds[n] for n in STAGES if n != "other"), 0.0), 2)
        return out
