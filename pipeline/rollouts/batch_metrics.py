"""What a batch of attempts did, as the Dagster metadata of its asset (attempts, pass rate, exit statuses,
throughput, where the time went, token-id coverage, the sandbox pool's takes), and its progress line while
it runs."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from pipeline.core.records import Trajectory
from pipeline.core.vocab import CRASHED


@dataclass
class BatchSummary:
    """What a batch did; `trajectories` holds every stored attempt of the batch, resumed ones included."""

    trajectories: list[Trajectory]
    ran: int
    skipped: int
    seconds: float
    pool: dict = field(default_factory=dict)
    """What the warm sandbox pool did (PoolStats.as_metadata)."""

    def metrics(self) -> dict:
        done = [t for t in self.trajectories if not t.infra_error]
        crashed = sum(t.exit_status == CRASHED for t in self.trajectories)
        statuses: dict[str, int] = {}
        for t in self.trajectories:
            statuses[t.exit_status] = statuses.get(t.exit_status, 0) + 1
        wall = sum(t.wall_time + t.grade_time for t in self.trajectories) or 1.0
        tool = sum(s.tool_time for t in self.trajectories for s in t.steps)
        return {
            "attempts": len(self.trajectories), "ran": self.ran, "resumed": self.skipped,
            "resolved": sum(t.resolved for t in done), "pass_rate": round(_rate(done), 4),
            "infra_errors": len(self.trajectories) - len(done) - crashed, "crashed": crashed,
            "exit_status": statuses,
            "attempts_per_minute": round(self.ran / self.seconds * 60, 2) if self.seconds else 0.0,
            "share_grading": round(sum(t.grade_time for t in self.trajectories) / wall, 3),
            "share_agent_tools": round(tool / wall, 3),
            **token_id_coverage(self.trajectories), **self.pool,
        }


def token_id_coverage(trajectories: list[Trajectory]) -> dict:
    """Model turns stored with and without token ids, and once, why some have none."""
    with_ids = without = 0
    reasons: dict[str, int] = {}
    for t in trajectories:
        turns = sum(m["role"] == "assistant" for m in t.messages)
        stored = sum(ids is not None for ids in t.token_ids or ())
        with_ids, without = with_ids + stored, without + turns - stored
        if turns > stored:
            why = json.loads(t.policy_settings or "{}").get("token_ids_missing") or "it records no token ids"
            reasons[f"{t.policy}: {why}"] = reasons.get(f"{t.policy}: {why}", 0) + turns - stored
    out = {"turns_with_token_ids": with_ids, "turns_without_token_ids": without}
    if reasons:
        out["token_ids_missing"] = "; ".join(f"{why} ({n} turns)" for why, n in reasons.items())
    return out


def _rate(trajectories: list[Trajectory]) -> float:
    return sum(t.resolved for t in trajectories) / len(trajectories) if trajectories else 0.0


class Progress:
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
