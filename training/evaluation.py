"""Unguided pass@1 of a policy on the held-out tasks, through the same sandboxes and grader as every rollout.

The held-out tasks are the test split of the datasets (`task_split` of each task's split group), so no
model is evaluated on a task whose trajectories, or whose combined task's, it trained on. Each model
runs `attempts` unguided attempts per task. A task's score is its share of resolved attempts (those
without an infrastructure error); pass@1 is the mean of the scores over the tasks with one graded
attempt or more, so every task weighs the same however many of its attempts were graded.

Its 95% interval is over tasks, not attempts: attempts at one task share that task's difficulty, so
they are not independent draws of the policy's skill. It is Student's t-interval of the mean of the
task scores (the clustered standard error: mean +- t(0.975, n - 1) * s / sqrt(n), s the sample standard
deviation of the scores), clipped to [0, 1]; with fewer than two tasks there is no spread to measure
and it is (0, 1). All scores equal gives a zero-width interval: read it with the task count. Each
task's own interval is Wilson's over its attempts (independent given the task). Greedy decoding
(`temperature: 0`) repeats one attempt, so more than one attempt per task is refused.

Beside it, each model runs on a sample of the tasks it trained on (`trained_tasks`: train-split tasks with a
success in the `sft` rows). This is no measure of skill: it is the memorization check. A trained model that
resolves none of the tasks whose solutions it was trained on was not reached by its training (a chat template,
tool-call format or end-of-turn token that differs between the training rows and the policy's decoding).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Callable

from pipeline.agent.identity import WEIGHT_SUFFIXES, weights_revision
from pipeline.agent.policy import Policy
from pipeline.rollouts.costs import CostConfig, attempt_cost
from pipeline.datasets.splits import split_group, task_split
from pipeline.core.records import Task, Trajectory
from pipeline.rollouts.batch import RolloutConfig, plan_jobs, run_batch
from pipeline.verifier.environment import task_sandbox
from training.config import EvaluationConfig

Z95 = 1.959964
INTERVAL = "95% t-interval over tasks (df = tasks - 1), clipped to [0, 1]; (0, 1) under two tasks"


def held_out_tasks(tasks: list[Task], test_fraction: float, limit: int = 0) -> list[Task]:
    """The tasks of the test split, in their given order, at most `limit` (0: all)."""
    held = [t for t in tasks if task_split(split_group(t), test_fraction) == "test"]
    return held[:limit] if limit else held


def trained_tasks(tasks: list[Task], test_fraction: float, trained_ids: set[str], limit: int) -> list[Task]:
    """The memorization check's sample: the first `limit` tasks, in their given order, of the train split that
    the models trained on (`trained_ids`: the instance ids of the train rows); [] when `limit` is 0."""
    if limit <= 0:
        return []
    seen = [t for t in tasks if t.instance_id in trained_ids and task_split(split_group(t), test_fraction) == "train"]
    return seen[:limit]


def task_batch(tasks: list[Task]) -> dict:
    """The tasks an evaluation used: their ids in order and one sha256 over them."""
    ids = [t.instance_id for t in tasks]
    return {"instance_ids": ids, "sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest()}


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's T with an integer `df` >= 1 (Abramowitz & Stegun 26.7.3, 26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2:
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        tail = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2 / math.pi * (theta + tail)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(level: float, df: int) -> float:
    """The t with P(|T| <= t) = `level` (two-sided), by bisection; t_quantile(0.95, 2) = 4.3027."""
    low, high = 0.0, 1.0
    while t_central(high, df) < level:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if t_central(mid, df) < level else (low, mid)
    return (low + high) / 2


def pass_at_1(scores: list[float]) -> tuple[float | None, float, float]:
    """(mean score, 95% low, 95% high) of per-task scores: the t-interval over tasks (see the module)."""
    n = len(scores)
    if n == 0:
        return None, 0.0, 1.0
    mean = sum(scores) / n
    if n < 2:
        return mean, 0.0, 1.0
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1))
    half = t_quantile(0.95, n - 1) * sd / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def task_scores(tasks: list[Task], trajectories: list[Trajectory]) -> list[dict]:
    """Per task, in task order: attempts, graded (no infra error), resolved, score and its Wilson interval."""
    rows = []
    for task in tasks:
        mine = [t for t in trajectories if t.instance_id == task.instance_id]
        graded = [t for t in mine if not t.infra_error]
        resolved = sum(t.resolved for t in graded)
        low, high = wilson_interval(resolved, len(graded))
        rows.append({"instance_id": task.instance_id, "attempts": len(mine), "graded": len(graded),
                     "resolved": resolved, "score": round(resolved / len(graded), 4) if graded else None,
                     "ci95_low": round(low, 4), "ci95_high": round(high, 4)})
    return rows


def check_sampling(config: EvaluationConfig) -> None:
    """Refuse several attempts per task under greedy decoding: they repeat one attempt, and the interval
    would count copies as evidence."""
    if config.temperature == 0 and config.attempts > 1:
        raise ValueError(f"training.evaluation.attempts is {config.attempts} with temperature 0: greedy attempts "
                         "repeat one another; set attempts: 1, or a temperature above 0 to sample several")


def evaluation_rollouts(rollout: RolloutConfig, config: EvaluationConfig) -> RolloutConfig:
    """The rollout settings with the evaluation's attempts and step limit (sampling checked first)."""
    check_sampling(config)
    return dataclasses.replace(rollout, attempts=config.attempts,
                               agent=dataclasses.replace(rollout.agent, max_steps=config.max_steps))


def model_identity(model: str) -> dict:
    """{'model', 'revision'} of a local folder (its weights' hash; 'base_model' too for an adapter) or of a
    Hub name (the cached snapshot's commit, '' when it is not cached here)."""
    path = Path(model)
    if path.is_dir():
        identity = {"model": str(path.resolve()), "revision": weights_revision(path)}
        if not identity["revision"]:
            raise ValueError(f"model folder {path} holds no weight files ({', '.join(WEIGHT_SUFFIXES)}); point "
                             "training.model or the checkpoint at a saved model")
        if (path / "adapter_config.json").exists():
            identity["base_model"] = json.loads((path / "adapter_config.json").read_text()).get(
                "base_model_name_or_path", "")
        return identity
    from huggingface_hub import snapshot_download  # a Hub name: which revision the cache holds
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return {"model": model, "revision": weights_revision(Path(snapshot_download(model, local_files_only=True)))}
    except (LocalEntryNotFoundError, HFValidationError):  # not cached here, or not a Hub name: unknown, said so
        return {"model": model, "revision": ""}


def score(tasks: list[Task], trajectories: list[Trajectory]) -> dict:
    """pass@1 over `tasks` and its interval over tasks, counts and per-task scores of their attempts."""
    per_task = task_scores(tasks, trajectories)
    scored = [t for t in per_task if t["graded"]]
    mean, low, high = pass_at_1([t["resolved"] / t["graded"] for t in scored])
    graded = sum(t["graded"] for t in per_task)
    return {"tasks": len(tasks), "tasks_scored": len(scored), "attempts": len(trajectories), "graded": graded,
            "resolved": sum(t["resolved"] for t in per_task), "pass@1": round(mean, 4) if mean is not None else None,
            "ci95_low": round(low, 4), "ci95_high": round(high, 4), "interval": INTERVAL,
            "infra_errors": len(trajectories) - graded, "per_task": per_task}


def evaluation_cost(tasks: list[Task], trajectories: list[Trajectory], prices: CostConfig) -> dict:
    """What the attempts spent, in all and per task: policy tokens (in + out), sandbox seconds (the commands and
    the grading) and money at `prices`."""
    spent = [attempt_cost(t, prices) for t in trajectories]
    total = {"tokens": sum(c["tokens_in"] + c["tokens_out"] for c in spent),
             "sandbox_s": round(sum(c["sandbox_s"] + c["grading_s"] for c in spent), 1),
             "cost": round(sum(c["cost"] for c in spent), 6)}
    return {**total, **{f"{k}_per_task": round(v / len(tasks), 6 if k == "cost" else 1) if tasks else None
                        for k, v in total.items()}}


def evaluate(label: str, policy: Policy, tasks: list[Task], rollout: RolloutConfig, out_dir: Path, batch: str,
             progress: Callable[[str], None], sandboxes=task_sandbox, prices: CostConfig = CostConfig()) -> dict:
    """Run and grade `policy` unguided on `tasks`: its `score`, what it cost, and where the attempts are."""
    jobs = plan_jobs(tasks, policy, rollout, f"{batch}-eval-{label}")
    summary = run_batch(jobs, policy, rollout, out_dir, f"{batch}-eval-{label}", progress=progress,
                        sandboxes=sandboxes)
    return {"model": label, "policy": policy.name, **score(tasks, summary.trajectories),
            **evaluation_cost(tasks, summary.trajectories, prices), "path": str(Path(out_dir) / "trajectories.parquet")}


def results_table(results: list[dict]) -> str:
    """One Markdown row per model: its identity, pass@1 and interval over tasks, counts, what it cost per task
    (policy tokens, sandbox seconds, money) and its pass@1 on the sample of tasks it trained on (`trained`, the
    memorization check)."""
    columns = ["model", "revision", "tasks_scored", "attempts", "resolved", "pass@1", "ci95_low", "ci95_high",
               "infra_errors", "tokens_per_task", "sandbox_s_per_task", "cost_per_task", "trained_tasks",
               "trained_pass@1"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in results:
        trained = r.get("trained") or {}
        cells = {**r, "revision": r["identity"]["revision"][:19] or "unknown", "trained_tasks": trained.get("tasks", 0),
                 "trained_pass@1": trained.get("pass@1")}
        lines.append("| " + " | ".join(str(cells.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def per_task_table(results: list[dict]) -> str:
    """One Markdown row per held-out task: each model's resolved/graded and its Wilson 95% interval."""
    lines = ["| task | " + " | ".join(r["model"] for r in results) + " |", "|" + "---|" * (len(results) + 1)]
    for i, row in enumerate(results[0]["per_task"] if results else []):
        cells = [f"{t['resolved']}/{t['graded']} [{t['ci95_low']:.2f}, {t['ci95_high']:.2f}]"
                 for t in (r["per_task"][i] for r in results)]
        lines.append(f"| {row['instance_id']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
