"""What attempts cost, from what every trajectory stores: the policy's tokens in and out (per step), the
seconds its commands ran in the sandbox, the grading's seconds and the attempt's wall seconds; in money
through per-million-token and per-hour prices (zero for local models and machines). Grouped by origin
(unguided, each guidance family, the action family's prefix-search probes counted with it)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.records import Trajectory
from pipeline.vocab import GUIDANCE_KINDS, NO_GUIDANCE_KIND


@dataclass(frozen=True)
class CostConfig:
    """Prices that turn tokens and sandbox time into money (0: free, e.g. a local model)."""

    policy_input_per_million: float = 0.0
    """Price of a million prompt tokens of the policy."""
    policy_output_per_million: float = 0.0
    """Price of a million tokens the policy generates."""
    sandbox_per_hour: float = 0.0
    """Price of an hour of sandbox time (the attempt's commands and its grading)."""


COLUMNS = ("origin", "attempts", "tokens_in", "tokens_out", "sandbox_s", "grading_s", "wall_s", "cost",
           "tasks_resolved", "cost_per_resolved_task")


def attempt_cost(t: Trajectory, prices: CostConfig) -> dict:
    """One attempt's tokens, seconds and money."""
    tokens_in = sum(s.prompt_tokens for s in t.steps)
    tokens_out = sum(s.completion_tokens for s in t.steps)
    sandbox = sum(s.tool_time for s in t.steps)
    money = (tokens_in * prices.policy_input_per_million + tokens_out * prices.policy_output_per_million) / 1e6 \
        + (sandbox + t.grade_time) * prices.sandbox_per_hour / 3600
    return {"tokens_in": tokens_in, "tokens_out": tokens_out, "sandbox_s": sandbox, "grading_s": t.grade_time,
            "wall_s": t.wall_time, "cost": money}


def cost_rows(attempts: list[Trajectory], prices: CostConfig, probes: list[Trajectory] = ()) -> list[dict]:
    """Per origin (unguided, then each guidance family in GUIDANCE_KINDS order): its attempts' totals, every
    attempt counted (one lost to the infrastructure cost as much), and the cost per task it resolved. The
    action family's probes count with it: its prefix search is part of what it costs."""
    by_origin: dict[str, list[Trajectory]] = {}
    searched = {t.rollout_id for t in probes}
    for t in [*attempts, *probes]:
        by_origin.setdefault(t.guidance_kind, []).append(t)
    rows = []
    for origin in [k for k in (NO_GUIDANCE_KIND, *GUIDANCE_KINDS) if k in by_origin]:
        group = by_origin[origin]
        costs = [attempt_cost(t, prices) for t in group]
        total = {key: sum(c[key] for c in costs) for key in costs[0]}
        resolved = len({t.instance_id for t in group if t.resolved and t.rollout_id not in searched})
        rows.append({"origin": "unguided" if origin == NO_GUIDANCE_KIND else origin, "attempts": len(group),
                     **{k: round(v, 6 if k == "cost" else 1) if isinstance(v, float) else v for k, v in total.items()},
                     "tasks_resolved": resolved,
                     "cost_per_resolved_task": round(total["cost"] / resolved, 6) if resolved else None})
    return rows


def cost_markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join("-" if r[c] is None else str(r[c]) for c in COLUMNS) + " |\n" for r in rows)
