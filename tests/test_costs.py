"""What attempts cost (pipeline/costs.py), on a batch worked out by hand: each price and each stored figure
changes the answer."""

from __future__ import annotations

import dataclasses

from pipeline.costs import CostConfig, cost_markdown, cost_rows
from pipeline.record_parts import Step
from tests.test_datasets_build import traj

PRICES = CostConfig(policy_input_per_million=2.0, policy_output_per_million=10.0, sandbox_per_hour=36.0)


def step(tokens_in: int, tokens_out: int, tool_seconds: float) -> Step:
    return Step(policy_latency=0.1, tool_time=tool_seconds, prompt_tokens=tokens_in, completion_tokens=tokens_out,
                tool="bash", error=False)


def attempt(rid: str, iid: str, kind: str = "none", reward: float = 0.0, steps: tuple[Step, ...] = (), **fields):
    """A stored trajectory (tests/test_datasets_build.py's) with these per-step records."""
    return dataclasses.replace(traj(rid, iid, kind, reward, **fields), steps=steps)


ATTEMPTS = [
    attempt("u1", "t1", steps=(step(100, 10, 2.0), step(200, 20, 1.0)), grade_time=1.5, wall_time=10.0),
    attempt("u2", "t2", reward=1.0, steps=(step(50, 5, 0.5),), grade_time=1.0, wall_time=4.0),
    attempt("a1", "t1", "action", 1.0, steps=(step(1000, 100, 1.0),), grade_time=2.0, wall_time=6.0),
    attempt("g1", "t1", "plan", steps=(), grade_time=0.0, wall_time=2.0, infra_error="container died"),
]
PROBES = [attempt("p1", "t3", "action", 1.0, steps=(step(400, 40, 0.5),), grade_time=1.0, wall_time=3.0)]


def test_costs_per_origin_count_tokens_seconds_and_money():
    rows = {r["origin"]: r for r in cost_rows(ATTEMPTS, PRICES, PROBES)}
    assert list(rows) == ["unguided", "plan", "action"]
    # u1: (300 x 2 + 30 x 10) / 1e6 + (3.0 + 1.5) s x 0.01 = 0.0459; u2: (100 + 50) / 1e6 + 1.5 x 0.01 = 0.01515
    assert rows["unguided"] == {"origin": "unguided", "attempts": 2, "tokens_in": 350, "tokens_out": 35,
                                "sandbox_s": 3.5, "grading_s": 2.5, "wall_s": 14.0, "cost": 0.06105,
                                "tasks_resolved": 1, "cost_per_resolved_task": 0.06105}
    # a1: 0.003 + 0.03; the probe: 0.0012 + 0.015, its success no task the family resolved
    assert rows["action"] == {"origin": "action", "attempts": 2, "tokens_in": 1400, "tokens_out": 140,
                              "sandbox_s": 1.5, "grading_s": 3.0, "wall_s": 9.0, "cost": 0.0492,
                              "tasks_resolved": 1, "cost_per_resolved_task": 0.0492}
    assert rows["plan"]["attempts"] == 1 and rows["plan"]["cost"] == 0 and rows["plan"]["cost_per_resolved_task"] is None


def test_free_prices_cost_nothing_and_the_table_lists_every_origin():
    rows = cost_rows(ATTEMPTS, CostConfig(), PROBES)
    assert [r["cost"] for r in rows] == [0, 0, 0] and [r["tokens_in"] for r in rows] == [350, 0, 1400]
    lines = cost_markdown(rows).splitlines()
    assert lines[0].startswith("| origin | attempts | tokens_in |") and len(lines) == 5
    assert lines[2] == "| unguided | 2 | 350 | 35 | 3.5 | 2.5 | 14.0 | 0.0 | 1 | 0.0 |"
