"""Unguided pass@1 of a policy on the held-out tasks, through the same sandboxes and grader as every rollout.

The held-out tasks are the test split of the datasets (`task_split`, by a hash of the instance id), so
no model is evaluated on a task whose trajectories it trained on. Each model runs `attempts` unguided
attempts per task; pass@1 is the share of resolved attempts (the unbiased estimate of pass@1 from n
samples), with a Wilson 95% interval over the attempts.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable

from pipeline.agent.policy import Policy
from pipeline.datasets.splits import task_split
from pipeline.records import Task
from pipeline.rollouts import RolloutConfig, plan_jobs, run_batch, task_sandbox
from training.config import EvaluationConfig

Z95 = 1.959964


def held_out_tasks(tasks: list[Task], test_fraction: float, limit: int = 0) -> list[Task]:
    """The tasks of the test split, in their given order, at most `limit` (0: all)."""
    held = [t for t in tasks if task_split(t.instance_id, test_fraction) == "test"]
    return held[:limit] if limit else held


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def evaluation_rollouts(rollout: RolloutConfig, config: EvaluationConfig) -> RolloutConfig:
    """The rollout settings with the evaluation's attempts and step limit."""
    return dataclasses.replace(rollout, attempts=config.attempts,
                               agent=dataclasses.replace(rollout.agent, max_steps=config.max_steps))


def evaluate(label: str, policy: Policy, tasks: list[Task], rollout: RolloutConfig, out_dir: Path, batch: str,
             progress: Callable[[str], None], sandboxes=task_sandbox) -> dict:
    """Run and grade `policy` unguided on `tasks`; its pass@1, interval, counts and where the attempts are."""
    jobs = plan_jobs(tasks, policy, rollout, f"{batch}-eval-{label}")
    summary = run_batch(jobs, policy, rollout, out_dir, f"{batch}-eval-{label}", progress=progress,
                        sandboxes=sandboxes)
    graded = [t for t in summary.trajectories if not t.infra_error]
    resolved = sum(t.resolved for t in graded)
    low, high = wilson_interval(resolved, len(graded))
    return {"model": label, "policy": policy.name, "tasks": len(tasks), "attempts": len(summary.trajectories),
            "graded": len(graded), "resolved": resolved,
            "pass@1": round(resolved / len(graded), 4) if graded else None,
            "ci95_low": round(low, 4), "ci95_high": round(high, 4),
            "infra_errors": len(summary.trajectories) - len(graded),
            "path": str(Path(out_dir) / "trajectories.parquet")}
