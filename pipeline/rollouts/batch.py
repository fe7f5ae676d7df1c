"""Batched rollouts: N attempts per task, concurrent up to a bound, resumable, graded.

Every finished attempt is written at once as its own shard (atomically), so a killed batch
loses at most the attempts in flight; re-running the batch skips stored `rollout_id`s and,
at the end, compacts the shards into one `trajectories.parquet` per batch partition.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import docker
import docker.errors
import pyarrow as pa

from pipeline.agent.loop import AgentConfig, Attempt, run_attempt
from pipeline.agent.policy import Policy
from pipeline.rollouts.batch_metrics import BatchSummary, Progress
from pipeline.rollouts.infra_streak import InfraStreak
from pipeline.core.records import TRAJECTORY_SCHEMA, Guidance, Task, Trajectory
from pipeline.rollouts.sandbox_pool import PoolConfig, SandboxPool, batch_order
from pipeline.rollouts.trajectory_columns import AttemptColumns, GradeColumns, columns
from pipeline.core.setting_ranges import Count, CountOrZero, Fraction, Seconds, Seed
from pipeline.core.store import RecordContractError, compact, read_batch, set_aside, write_rows
from pipeline.verifier.environment import SandboxFactory, task_sandbox
from pipeline.verifier.grading import Grade, grade
from pipeline.verifier.rules import GradeRules
from pipeline.core.vocab import CRASHED
from sandbox.base import SandboxError, SandboxSpec
from sandbox.reaper import reap_orphans

log = logging.getLogger(__name__)

INFRA_EXITS = ("sandbox_error", "policy_error")  # faults of the sandbox or the model server, not the policy
NO_GUIDANCE = Guidance()


@dataclass(frozen=True)
class RolloutConfig:
    """How a batch of attempts runs."""

    attempts: Count = 4
    """Attempts per task (the group size N)."""
    seed: Seed = 0
    """Base seed; attempt i of a group gets seed + i."""
    workers: Count = 2
    """Attempts run at once, i.e. the bound on live agent sandboxes (and on conversations with the model server)."""
    grade_workers: CountOrZero = 0
    """Grades run at once, each in its own sandbox, beside the attempts: a worker goes on to its next attempt while
    the last one's patch is graded (the grade waits its turn), so the model server keeps `workers` conversations
    whatever the tests take; 0: one per core this process may run on (tests are CPU work: more at once only share
    the cores, and slow the attempts' own commands); with a remote Docker engine, its cores. Live sandboxes: up to
    `workers` + this + `pool.size`. Attempts waiting for their grade are at most `workers`: past that a worker waits
    too (they are in memory, not yet stored: what a crash would lose)."""
    infra_retries: CountOrZero = 2
    """Retries of an attempt hit by a sandbox, grader or model-server fault."""
    stop_after_infra_failures: CountOrZero = 8
    """Stop the batch when this many attempts in a row (as they finish) failed with the same infrastructure fault,
    keeping what is stored (a rerun resumes) and saying why; 0: never stop."""
    test_timeout: Seconds = GradeRules.test_timeout  # the defaults of a grade are declared once, in GradeRules
    """Seconds the grader's test run may take."""
    max_infra_error_rate: Fraction = 0.2
    """The blocking infra_error_rate check fails a batch whose share of attempts lost to infrastructure is above this."""
    zero_suspicious: bool = GradeRules.zero_suspicious
    """A patch the grader flags as suspicious (pytest internals, exit hooks, forged verdicts) gets reward 0;
    its flags are stored on the trajectory either way."""
    quote_ngram: Count = 8
    """A guided response sharing a run of this many words with the guidance is flagged `quotes_guidance`."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Limits and prompt options of each attempt."""
    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    """Limits of every agent and grading sandbox."""
    pool: PoolConfig = field(default_factory=PoolConfig)
    """Sandboxes started and prepared ahead of the attempts and grades that take them (within the step's
    `sandboxes` slot: `size` containers besides those of the attempts and grades in flight)."""

    def grade_rules(self) -> GradeRules:
        """The one value every grade, re-grade, validation and replay of a run is made under."""
        return GradeRules(self.sandbox, self.test_timeout, self.zero_suspicious)

    def graders(self) -> int:
        """Grades at once: `grade_workers`, else the cores this process may run on."""
        return self.grade_workers or usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or a job's cpuset), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Job:
    task: Task
    sample_index: int
    seed: int
    guidance: Guidance
    group_id: str
    rollout_id: str


def rollout_id(batch: str, instance_id: str, policy: str, guidance_key: str, sample_index: int, seed: int) -> str:
    """Deterministic id of one stored attempt: the same on a rerun of its batch, distinct across batches."""
    key = json.dumps([batch, instance_id, policy, guidance_key, sample_index, seed])
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
            jobs.append(Job(task, i, seed, g, group, rollout_id(batch, task.instance_id, policy.name, g.key, i, seed)))
    return jobs


def run_batch(jobs: list[Job], policy: Policy, config: RolloutConfig, out_dir: Path, batch: str,
              progress: Callable[[str], None] = log.info, sandboxes: SandboxFactory = task_sandbox) -> BatchSummary:
    """Run the jobs not yet stored under `out_dir` (in sandboxes `sandboxes` makes); return the whole batch. Raises
    InfraStreakError, what finished stored, once `stop_after_infra_failures` attempts in a row failed alike."""
    start = time.monotonic()
    reap_orphans(progress)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one writer per batch folder, across processes too
        stored = _stored(out_dir, progress)
        todo = [j for j in jobs if j.rollout_id not in stored]
        counter = Progress(len(jobs), len(jobs) - len(todo), progress)
        streak = InfraStreak(config.stop_after_infra_failures)
        ungraded = threading.BoundedSemaphore(config.workers)  # attempts handed to the graders and not yet stored
        with SandboxPool(sandboxes, config.pool) as pool, ThreadPoolExecutor(config.workers) as agents, \
                ThreadPoolExecutor(config.graders()) as graders:
            pool.expect(batch_order([(j.task, config.sandbox) for j in todo], config.workers))

            def finish(job: Job, out: _Outcome) -> Trajectory:
                traj = _store(out_dir, finish_job(job, out, policy, config, batch, pool))
                counter.done(traj)
                return traj

            def work(job: Job) -> Trajectory | Future[Trajectory]:
                out = attempt_job(job, policy, config, pool)
                if not out.gradable:
                    return finish(job, out)
                ungraded.acquire()  # where the grades fall behind, the workers wait for them
                graded = graders.submit(finish, job, out)
                graded.add_done_callback(lambda _: ungraded.release())
                return graded

            for traj in streak.watch(agents, work, todo):
                stored[traj.rollout_id] = traj
        compact(out_dir)
        if streak.stopped:
            raise streak.error(batch, sum(j.rollout_id in stored for j in jobs), len(jobs))
    wanted = [stored[j.rollout_id] for j in jobs]
    return BatchSummary(wanted, len(todo), len(jobs) - len(todo), time.monotonic() - start, pool.stats.as_metadata())


def _stored(out_dir: Path, progress: Callable[[str], None]) -> dict[str, Trajectory]:
    """Attempts stored under `out_dir` that count as done; infra faults and crashes run again (the fault
    may be gone). Files of an older contract cannot be resumed: they are moved aside and the batch reruns."""
    try:
        return {t.rollout_id: t for t in read_batch(out_dir) if not t.infra_error}
    except RecordContractError as exc:
        progress(f"{exc}; moved its stored attempts to {set_aside(out_dir)} and running the whole batch")
        return {}


def _store(out_dir: Path, traj: Trajectory) -> Trajectory:
    """Write one attempt's shard; an attempt whose record cannot be written is stored as a crash without it."""
    path = out_dir / "shards" / f"{traj.rollout_id}.parquet"
    try:
        write_rows(path, [traj.to_row()], TRAJECTORY_SCHEMA)
        return traj
    except (pa.ArrowException, TypeError, ValueError) as exc:  # e.g. a malformed message from a server
        log.exception("%s #%d: the attempt cannot be stored", traj.instance_id, traj.sample_index)
        bare = dataclasses.replace(traj, prompt=(), unguided_prompt=(), messages=(), steps=(), logprobs=None,
                                   prompt_token_ids=None, token_ids=None,
                                   tools="[]", reward=0.0, resolved=False, exit_status=CRASHED,
                                   infra_error=crash_text(exc), error="".join(traceback.format_exception(exc)))
        write_rows(path, [bare.to_row()], TRAJECTORY_SCHEMA)
        return bare


@dataclass
class _Outcome:
    """How far one job got: its attempt, its grade, the fault left, the retries spent, and the exception that
    ended it (a crash)."""

    attempt: Attempt | None = None
    verdict: Grade | None = None
    infra: str = ""
    retries: int = 0
    crash: BaseException | None = None

    @property
    def gradable(self) -> bool:
        """An attempt ran to its end: its patch is to be graded."""
        return self.attempt is not None and not self.infra and self.crash is None


def run_job(job: Job, policy: Policy, config: RolloutConfig, batch: str,
            sandboxes: SandboxFactory = task_sandbox) -> Trajectory:
    """One attempt, then its grade, each retried on infrastructure faults; never raises for one attempt's sake.

    A grader fault re-grades the same patch, it does not re-run the agent. Any other exception (a bug
    of the policy, the grader or the harness) is deterministic: the attempt is stored 'crashed', not retried.
    `run_batch` runs the two halves on different threads (`attempt_job`, `finish_job`).
    """
    return finish_job(job, attempt_job(job, policy, config, sandboxes), policy, config, batch, sandboxes)


def attempt_job(job: Job, policy: Policy, config: RolloutConfig, sandboxes: SandboxFactory = task_sandbox) -> _Outcome:
    """The agent's half of a job: its attempt, retried on infrastructure faults; a crash is kept, not raised."""
    out = _Outcome()
    try:
        _run_agent(job, policy, config, sandboxes, out)
    except Exception as exc:  # the per-attempt boundary: one bad attempt must not fail the batch
        log.exception("%s #%d crashed", job.task.instance_id, job.sample_index)
        out.crash = exc
    return out


def finish_job(job: Job, out: _Outcome, policy: Policy, config: RolloutConfig, batch: str,
               sandboxes: SandboxFactory = task_sandbox) -> Trajectory:
    """The grader's half: the attempt's grade (when it has one to get) and its stored record."""
    try:
        if out.crash is None:
            _grade(job, config, sandboxes, out)
            return to_trajectory(job, policy, batch, out.attempt, out.verdict, out.infra, out.retries,
                                 config.quote_ngram)
    except Exception as exc:  # as in attempt_job
        log.exception("%s #%d crashed", job.task.instance_id, job.sample_index)
        out.crash = exc
    return to_trajectory(job, policy, batch, out.attempt, None, crash_text(out.crash), out.retries, config.quote_ngram,
                         crash="".join(traceback.format_exception(out.crash)))


def crash_text(exc: BaseException) -> str:
    """The infra_error of a crashed attempt: 'crashed: <ExcType>: <message>'."""
    return f"{CRASHED}: {type(exc).__name__}: {str(exc)[:2000]}"


def _run_agent(job: Job, policy: Policy, config: RolloutConfig, sandboxes: SandboxFactory, out: _Outcome) -> None:
    while True:
        out.attempt = None  # a crash on a retry must not pass off the previous try's attempt as its own
        out.attempt, out.infra = _attempt_once(job, policy, config, sandboxes)
        if not out.infra or out.retries >= config.infra_retries:
            return
        _warn(job, out.retries, out.infra)
        out.retries += 1


def _grade(job: Job, config: RolloutConfig, sandboxes: SandboxFactory, out: _Outcome) -> None:
    if out.attempt is None or out.infra:
        return
    while True:
        out.verdict = grade(job.task, out.attempt.patch, config.grade_rules(), sandboxes=sandboxes)
        out.infra = f"grader: {out.verdict.reason}" if out.verdict.fault == "infra" else ""
        if not out.infra or out.retries >= config.infra_retries:
            return
        out.retries += 1
        _warn(job, out.retries, out.infra)


def _warn(job: Job, retry: int, infra: str) -> None:
    log.warning("%s #%d: infrastructure fault (try %d): %s", job.task.instance_id, job.sample_index, retry + 1,
                infra[:300])


def _attempt_once(job: Job, policy: Policy, config: RolloutConfig,
                  sandboxes: SandboxFactory) -> tuple[Attempt | None, str]:
    try:
        with sandboxes(job.task, config.sandbox) as sandbox:
            attempt = run_attempt(job.task, policy, sandbox, config.agent, guidance_text=job.guidance.text,
                                  seed=job.seed)
    except (SandboxError, docker.errors.DockerException, OSError) as exc:
        return None, f"sandbox: {exc}"
    if attempt.exit_status in INFRA_EXITS:
        return attempt, f"{attempt.exit_status}: {attempt.error}"
    return attempt, ""


def to_trajectory(job: Job, policy: Policy, batch: str, attempt: Attempt | None, verdict: Grade | None,
                  infra: str, retries: int, quote_ngram: int = 8, crash: str = "") -> Trajectory:
    """The stored record of one attempt: the job's columns, the attempt's and the grade's (pipeline/rollouts/
    trajectory_columns.py; their defaults when there is none); `crash` (a traceback) marks it 'crashed'."""
    g = job.guidance
    status = CRASHED if crash else attempt.exit_status if attempt else "sandbox_error"
    return Trajectory(
        rollout_id=job.rollout_id, group_id=job.group_id, batch=batch, instance_id=job.task.instance_id,
        sample_index=job.sample_index, seed=job.seed, policy=policy.name,
        policy_settings=json.dumps(policy.settings(), sort_keys=True, default=str),
        guidance_kind=g.kind, guidance_text=g.text, guidance_actions=g.actions, guidance_k=g.k, teacher=g.teacher,
        **columns(AttemptColumns.of(attempt, g.text, quote_ngram) if attempt else AttemptColumns()),
        **columns(GradeColumns.of(verdict, infra) if verdict else GradeColumns()),
        exit_status=status, infra_error=infra, error=crash or (attempt.error if attempt else ""),
        infra_retries=retries, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
