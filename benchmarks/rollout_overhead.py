"""The pipeline's own time per attempt, with and without the warm sandbox pool, in the same run.

Per attempt of the heuristic policy: taking a sandbox (start and prepare, or the pool's ready one),
handing it back, the agent loop's own time (its wall time less the policy's and the tools' time:
the diff, the bookkeeping), and the grader's own time (its duration less the test command's), next
to the test command's time and the attempt's wall time (from asking for the agent's sandbox to
handing back the grader's).

    python benchmarks/rollout_overhead.py [--tasks data/tasks/tasks.parquet] [--count 4] [--attempts 2]
Needs synthesized tasks and their images: `make demo` (or `handhold materialize tasks`) first.
Targets: taking a sandbox <= 50 ms median with the pool; the pipeline's own time <= 10% of an attempt's
wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.agent.heuristic import HeuristicPolicy  # noqa: E402
from pipeline.agent.loop import run_attempt  # noqa: E402
from pipeline.core.records import TASK_SCHEMA, Task  # noqa: E402
from pipeline.rollouts.batch import RolloutConfig, plan_jobs  # noqa: E402
from pipeline.rollouts.sandbox_pool import PoolConfig, SandboxPool  # noqa: E402
from pipeline.core.store import read_records  # noqa: E402
from pipeline.verifier.environment import task_sandbox  # noqa: E402
from pipeline.verifier.grading import grade  # noqa: E402


class Timed:
    """A SandboxFactory over another that times each take and hand-back, by thread (one attempt per thread)."""

    def __init__(self, factory):
        self.factory, self.takes, self.backs, self.lock = factory, {}, {}, threading.Lock()

    @contextlib.contextmanager
    def __call__(self, task, config=None):
        start = time.perf_counter()
        with self.factory(task, config) as sandbox:
            self._add(self.takes, time.perf_counter() - start)
            try:
                yield sandbox
            finally:
                back = time.perf_counter()
        self._add(self.backs, time.perf_counter() - back)

    def _add(self, where: dict, seconds: float) -> None:
        with self.lock:
            where.setdefault(threading.get_ident(), []).append(seconds)

    def pop(self) -> tuple[list[float], list[float]]:
        me = threading.get_ident()
        with self.lock:
            return self.takes.pop(me, []), self.backs.pop(me, [])


def run(tasks: list[Task], attempts: int, size: int) -> list[dict]:
    """Every attempt's figures, in seconds, with a pool of `size` (0: every sandbox started on demand)."""
    config = RolloutConfig(attempts=attempts, workers=2, pool=PoolConfig(size=size))
    policy = HeuristicPolicy()
    jobs = plan_jobs(tasks, policy, config, f"bench-{size}")
    with SandboxPool(task_sandbox, config.pool) as pool:
        pool.expect([(j.task, config.sandbox) for j in jobs for _ in ("agent", "grade")])
        timed = Timed(pool if size else task_sandbox)  # without: started, prepared and removed in line

        def attempt(job) -> dict:
            start = time.perf_counter()
            with timed(job.task, config.sandbox) as sandbox:
                done = run_attempt(job.task, policy, sandbox, config.agent, seed=job.seed)
            verdict = grade(job.task, done.patch, config.grade_rules(), sandboxes=timed,
                            reuse_empty=False)  # every attempt graded, an empty patch too: the grader is measured
            wall = time.perf_counter() - start
            takes, backs = timed.pop()
            model = sum(s.policy_latency for s in done.steps)
            tools = sum(s.tool_time for s in done.steps)
            return {"wall": wall, "take": takes, "back": sum(backs), "loop": done.wall_time - model - tools,
                    "grader": verdict.duration - verdict.test_seconds, "tests": verdict.test_seconds,
                    "tools": tools, "infra": verdict.fault == "infra"}

        with ThreadPoolExecutor(config.workers) as threads:
            rows = list(threads.map(attempt, jobs))
    return rows


def summary(rows: list[dict]) -> dict:
    takes = [t for r in rows for t in r["take"]]
    own = [sum(r["take"]) + r["back"] + r["loop"] + r["grader"] for r in rows]
    med = statistics.median
    return {"take_ms": med(takes) * 1000, "back_ms": med(r["back"] for r in rows) * 1000,
            "loop_ms": med(r["loop"] for r in rows) * 1000, "grader_ms": med(r["grader"] for r in rows) * 1000,
            "own_s": med(own), "tests_s": med(r["tests"] for r in rows), "tools_s": med(r["tools"] for r in rows),
            "wall_s": med(r["wall"] for r in rows), "share": sum(own) / sum(r["wall"] for r in rows),
            "infra": sum(bool(r["infra"]) for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="data/tasks/tasks.parquet")
    parser.add_argument("--count", type=int, default=4, help="tasks, repositories interleaved")
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--size", type=int, default=2, help="the pool's size in the pooled run")
    args = parser.parse_args()
    tasks = [Task.from_row(r) for r in read_records(Path(args.tasks), TASK_SCHEMA, produced_by="tasks")]
    by_repo: dict[str, list[Task]] = {}
    for t in tasks:
        by_repo.setdefault(t.repo, []).append(t)
    picked = [t for group in zip(*by_repo.values()) for t in group][:args.count]
    results = {"no pool": summary(run(picked, args.attempts, 0)),
               f"pool of {args.size}": summary(run(picked, args.attempts, args.size))}
    print(f"{len(picked)} tasks x {args.attempts} attempts of the heuristic policy, 2 at once; medians per attempt")
    header = ("take ms", "hand back ms", "loop ms", "grader ms", "own s", "tests s", "tools s", "wall s", "own/wall")
    print(f"{'':12}" + "".join(f"{h:>13}" for h in header))
    for name, s in results.items():
        values = (s["take_ms"], s["back_ms"], s["loop_ms"], s["grader_ms"], s["own_s"], s["tests_s"], s["tools_s"],
                  s["wall_s"], s["share"])
        print(f"{name:12}" + "".join(f"{v:13.3f}" for v in values) + (f"   ({s['infra']} infra faults)"
                                                                       if s["infra"] else ""))
    pooled, bare = results[f"pool of {args.size}"], results["no pool"]
    print(f"take with pool / without: {pooled['take_ms'] / bare['take_ms']:.3f}   "
          f"(target: take <= 50 ms median with the pool: {pooled['take_ms']:.1f} ms)")
    print(f"own time / attempt wall with pool: {pooled['share']:.3f}   (target <= 0.10)")


if __name__ == "__main__":
    main()
