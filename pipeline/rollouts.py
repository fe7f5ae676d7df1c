"""Batched rollouts: N attempts per task, concurrent up to a bound, resumable, graded.

Every finished attempt is written at once as its own shard (atomically), so a killed batch
loses at most the attempts in flight; re-running the batch skips stored `rollout_id`s and,
at the end, compacts the shards into one `trajectories.parquet` per batch partition.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import docker.errors
import pyarrow.parquet as pq

from pipeline.agent.loop import AgentConfig, Attempt, run_attempt
from pipeline.agent.policy import Policy
from pipeline.grading import Grade, grade
from pipeline.records import TRAJECTORY_SCHEMA, Task, Trajectory
from pipeline.store import write_rows
from pipeline.tasks.environment import task_sandbox
from sandbox.base import SandboxError
from sandbox.docker_sandbox import DockerSandboxConfig

log = logging.getLogger(__name__)

INFRA_EXITS = ("sandbox_error", "policy_error")  # faults of the sandbox or the model server, not the policy
LOG_TAIL = 20_000  # characters of the grading log kept per trajectory


@dataclass(frozen=True)
class RolloutConfig:
    """How a batch of attempts runs."""

    attempts: int = 4
    """Attempts per task (the group size N)."""
    seed: int = 0
    """Base seed; attempt i of a group gets seed + i."""
    workers: int = 2
    """Attempts run at once, i.e. the bound on live agent sandboxes."""
    infra_retries: int = 2
    """Retries of an attempt hit by a sandbox, grader or model-server fault."""
    test_timeout: float = 300.0
    """Seconds the grader's test run may take."""
    quote_ngram: int = 8
    """A guided response sharing a run of this many words with the guidance is flagged `quotes_guidance`."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Limits and prompt options of each attempt."""
    sandbox: DockerSandboxConfig = field(default_factory=DockerSandboxConfig)
    """Limits of every agent and grading sandbox."""


@dataclass(frozen=True)
class Guidance:
    """What an attempt is shown beyond the task: nothing, a teacher's hint, or an action prefix."""

    kind: str = "none"
    """'none', 'plan', 'environment_feedback', 'environment_interaction' or 'action'."""
    text: str = ""
    """Exactly what is added to the task prompt."""
    actions: tuple[dict, ...] = ()
    """Reference actions [{"name", "args"}] (action guidance)."""
    k: int = -1
    """Prefix length shown (action guidance); -1 otherwise."""
    teacher: str = ""

    @property
    def key(self) -> str:
        return "none" if self.kind == "none" else \
            f"{self.kind}:{hashlib.sha256((self.text + str(self.k)).encode()).hexdigest()[:12]}"


NO_GUIDANCE = Guidance()


@dataclass(frozen=True)
class Job:
    task: Task
    sample_index: int
    seed: int
    guidance: Guidance
    group_id: str
    rollout_id: str


def rollout_id(instance_id: str, policy: str, guidance_key: str, sample_index: int, seed: int) -> str:
    """Deterministic id of one attempt."""
    key = json.dumps([instance_id, policy, guidance_key, sample_index, seed])
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def plan_jobs(tasks: list[Task], policy: Policy, config: RolloutConfig, batch: str,
              guidance: dict[str, Guidance] | None = None, attempts: int | None = None) -> list[Job]:
    """N jobs per task (under its guidance, if any), in a stable order."""
    jobs = []
    for task in tasks:
        g = (guidance or {}).get(task.instance_id, NO_GUIDANCE)
        group = hashlib.sha256(f"{batch}|{task.instance_id}|{g.key}".encode()).hexdigest()[:16]
        for i in range(attempts or config.attempts):
            seed = config.seed + i
            jobs.append(Job(task, i, seed, g, group, rollout_id(task.instance_id, policy.name, g.key, i, seed)))
    return jobs


@dataclass
class BatchSummary:
    """What a batch did; `trajectories` holds every stored attempt of the batch, resumed ones included."""

    trajectories: list[Trajectory]
    ran: int
    skipped: int
    seconds: float

    def metrics(self) -> dict:
        done = [t for t in self.trajectories if not t.infra_error]
        statuses: dict[str, int] = {}
        for t in self.trajectories:
            statuses[t.exit_status] = statuses.get(t.exit_status, 0) + 1
        wall = sum(t.wall_time + t.grade_time for t in self.trajectories) or 1.0
        tool = sum(s["tool_time"] for t in self.trajectories for s in t.steps)
        return {
            "attempts": len(self.trajectories), "ran": self.ran, "resumed": self.skipped,
            "resolved": sum(t.resolved for t in done), "pass_rate": round(_rate(done), 4),
            "infra_errors": len(self.trajectories) - len(done), "exit_status": statuses,
            "attempts_per_minute": round(self.ran / self.seconds * 60, 2) if self.seconds else 0.0,
            "share_grading": round(sum(t.grade_time for t in self.trajectories) / wall, 3),
            "share_agent_tools": round(tool / wall, 3),
        }


def _rate(trajectories: list[Trajectory]) -> float:
    return sum(t.resolved for t in trajectories) / len(trajectories) if trajectories else 0.0


def run_batch(jobs: list[Job], policy: Policy, config: RolloutConfig, out_dir: Path, batch: str,
              progress: Callable[[str], None] = log.info) -> BatchSummary:
    """Run the jobs not yet stored under `out_dir`; return every trajectory of the batch."""
    start = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one writer per batch folder, across processes too
        return _run_locked(jobs, policy, config, out_dir, batch, progress, start)


def _run_locked(jobs, policy, config, out_dir, batch, progress, start) -> BatchSummary:
    # Attempts stored with an infrastructure error are run again: the fault may be gone.
    stored = {t.rollout_id: t for t in read_batch(out_dir) if not t.infra_error}
    todo = [j for j in jobs if j.rollout_id not in stored]
    counter = _Progress(len(jobs), len(jobs) - len(todo), progress)

    def work(job: Job) -> Trajectory:
        traj = run_job(job, policy, config, batch)
        write_rows(out_dir / "shards" / f"{job.rollout_id}.parquet", [traj.to_row()], TRAJECTORY_SCHEMA)
        counter.done(traj)
        return traj

    with ThreadPoolExecutor(max(1, config.workers)) as pool:
        for traj in pool.map(work, todo):
            stored[traj.rollout_id] = traj
    compact(out_dir)
    wanted = [stored[j.rollout_id] for j in jobs]
    return BatchSummary(wanted, len(todo), len(jobs) - len(todo), time.monotonic() - start)


class _Progress:
    """done / total, successes, rate and time left, on the terminal and in whatever log is given."""

    def __init__(self, total: int, already: int, emit: Callable[[str], None]):
        self.total, self.count, self.ok, self.emit = total, already, 0, emit
        self.start, self.lock, self.ran = time.monotonic(), threading.Lock(), 0

    def done(self, traj: Trajectory) -> None:
        with self.lock:
            self.count, self.ran, self.ok = self.count + 1, self.ran + 1, self.ok + traj.resolved
            rate = self.ran / max(time.monotonic() - self.start, 1e-9) * 60
            left = (self.total - self.count) / rate if rate else 0.0
            self.emit(f"rollouts {self.count}/{self.total}: {self.ok} resolved this run, {rate:.1f} attempts/min, "
                      f"~{left:.1f} min left ({traj.instance_id} #{traj.sample_index}: {traj.exit_status}, "
                      f"reward {traj.reward:.0f}{', INFRA ' + traj.infra_error[:80] if traj.infra_error else ''})")


def run_job(job: Job, policy: Policy, config: RolloutConfig, batch: str) -> Trajectory:
    """One attempt, then its grade, each retried on infrastructure faults; never raises for the
    model's or the sandbox's sake. A grader fault re-grades the same patch, it does not re-run the agent."""
    attempt, verdict, infra, retries = None, None, "", 0
    for retries in range(max(config.infra_retries, 0) + 1):
        attempt, infra = _attempt_once(job, policy, config)
        if not infra:
            break
        _warn(job, retries, infra)
    while attempt is not None and not infra:
        verdict = grade(job.task, attempt.patch, config.sandbox, config.test_timeout)
        infra = f"grader: {verdict.reason}" if verdict.fault == "infra" else ""
        if not infra or retries >= config.infra_retries:
            break
        retries += 1
        _warn(job, retries, infra)
    return to_trajectory(job, policy, batch, attempt, verdict, infra, retries, config.quote_ngram)


def _warn(job: Job, retry: int, infra: str) -> None:
    log.warning("%s #%d: infrastructure fault (try %d): %s", job.task.instance_id, job.sample_index, retry + 1,
                infra[:300])


def _attempt_once(job: Job, policy: Policy, config: RolloutConfig) -> tuple[Attempt | None, str]:
    try:
        with task_sandbox(job.task, config.sandbox) as sandbox:
            attempt = run_attempt(job.task, policy, sandbox, config.agent, guidance_text=job.guidance.text,
                                  seed=job.seed)
    except (SandboxError, docker.errors.DockerException, OSError) as exc:
        return None, f"sandbox: {exc}"
    if attempt.exit_status in INFRA_EXITS:
        return attempt, f"{attempt.exit_status}: {attempt.error}"
    return attempt, ""


def to_trajectory(job: Job, policy: Policy, batch: str, attempt: Attempt | None, verdict: Grade | None,
                  infra: str, retries: int, quote_ngram: int = 8) -> Trajectory:
    g = job.guidance
    return Trajectory(
        rollout_id=job.rollout_id, group_id=job.group_id, batch=batch, instance_id=job.task.instance_id,
        sample_index=job.sample_index, seed=job.seed, policy=policy.name,
        policy_settings=json.dumps(policy.settings(), sort_keys=True, default=str),
        guidance_kind=g.kind, guidance_text=g.text, guidance_actions=json.dumps(list(g.actions)),
        guidance_k=g.k, teacher=g.teacher,
        prompt=attempt.prompt if attempt else (), unguided_prompt=attempt.unguided_prompt if attempt else (),
        messages=attempt.messages if attempt else (), tools=json.dumps(list(attempt.tools) if attempt else []),
        steps=tuple(vars(s) for s in attempt.steps) if attempt else (),
        logprobs=_logprobs(attempt), patch=attempt.patch if attempt else "",
        reward=verdict.reward if verdict and not infra else 0.0,
        resolved=bool(verdict and verdict.resolved and not infra),
        grade_reason=verdict.reason if verdict else "", report=verdict.report if verdict else "{}",
        test_log=verdict.log[-LOG_TAIL:] if verdict else "", exit_status=attempt.exit_status if attempt else "sandbox_error",
        infra_error=infra, infra_retries=retries, format_errors=attempt.format_errors if attempt else 0,
        total_tokens=attempt.total_tokens if attempt else 0, wall_time=attempt.wall_time if attempt else 0.0,
        grade_time=verdict.duration if verdict else 0.0,
        quotes_guidance=bool(attempt and g.text and quotes_guidance(attempt.messages, g.text, quote_ngram)),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def _logprobs(attempt: Attempt | None):
    if attempt is None or attempt.logprobs is None:
        return None
    return tuple(tuple(lp) if lp is not None else None for lp in attempt.logprobs)


def quotes_guidance(messages: tuple[dict, ...], hint: str, n: int = 8) -> bool:
    """True when the assistant's own text shares a run of n words with the hint."""
    grams = _ngrams(hint, n)
    said = " ".join(m.get("content") or "" for m in messages if m["role"] == "assistant")
    return bool(grams & _ngrams(said, n))


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def read_batch(out_dir: Path) -> list[Trajectory]:
    """Every trajectory stored under a batch folder: the compacted file and any shards."""
    files = [out_dir / "trajectories.parquet"] + sorted((out_dir / "shards").glob("*.parquet"))
    seen: dict[str, Trajectory] = {}
    for path in files:  # shards are newer than the compacted file: they win
        if path.exists():
            for row in pq.read_table(path).to_pylist():
                seen[row["rollout_id"]] = Trajectory.from_row(row)
    return list(seen.values())


def compact(out_dir: Path) -> Path:
    """Fold the shards into trajectories.parquet (atomically), then remove them."""
    shards = sorted((out_dir / "shards").glob("*.parquet"))
    target = out_dir / "trajectories.parquet"
    if shards or not target.exists():
        rows = [t.to_row() for t in read_batch(out_dir)]
        write_rows(target, rows, TRAJECTORY_SCHEMA)
        for shard in shards:
            shard.unlink(missing_ok=True)
    return target
