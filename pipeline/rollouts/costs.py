"""What attempts and guidance cost, from what every record stores: the policy's tokens in and out (per step),
the seconds its commands ran in the sandbox, the grading's seconds and the attempt's wall seconds; the teacher's
tokens of each guidance record; in money through per-million-token and per-hour prices (zero for local models
and machines). Grouped by origin (unguided, each guidance family: its guided attempts, the action family's
prefix-search probes and the teacher calls that wrote its guidance; `combined` guidance shares the call that
wrote the three parts it holds)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline.core.layout import Layout
from pipeline.core.records import GuidancePlan, Trajectory
from pipeline.core.setting_ranges import NonNegative
from pipeline.core.store import RecordContractError
from pipeline.core.vocab import GUIDANCE_KINDS, NO_GUIDANCE_KIND


@dataclass(frozen=True)
class CostConfig:
    """Prices that turn tokens and sandbox time into money (0: free, e.g. a local model)."""

    policy_input_per_million: NonNegative = 0.0
    """Price of a million prompt tokens of the policy."""
    policy_output_per_million: NonNegative = 0.0
    """Price of a million tokens the policy generates."""
    sandbox_per_hour: NonNegative = 0.0
    """Price of an hour of sandbox time (the attempt's commands and its grading)."""
    teacher_input_per_million: NonNegative = 0.0
    """Price of a million prompt tokens of the LLM teacher (the rule teacher spends none)."""
    teacher_output_per_million: NonNegative = 0.0
    """Price of a million tokens the LLM teacher generates."""


COLUMNS = ("origin", "attempts", "tokens_in", "tokens_out", "sandbox_s", "grading_s", "wall_s", "teacher_tokens_in",
           "teacher_tokens_out", "teacher_cost", "cost", "tasks_resolved", "cost_per_resolved_task", "dpo_pairs",
           "cost_per_dpo_pair")
ATTEMPT_FIGURES = ("tokens_in", "tokens_out", "sandbox_s", "grading_s", "wall_s", "cost")
TEACHER_FIGURES = ("teacher_tokens_in", "teacher_tokens_out", "teacher_cost")


def attempt_cost(t: Trajectory, prices: CostConfig) -> dict:
    """One attempt's tokens, seconds and money."""
    tokens_in = sum(s.prompt_tokens for s in t.steps)
    tokens_out = sum(s.completion_tokens for s in t.steps)
    sandbox = sum(s.tool_time for s in t.steps)
    money = (tokens_in * prices.policy_input_per_million + tokens_out * prices.policy_output_per_million) / 1e6 \
        + (sandbox + t.grade_time) * prices.sandbox_per_hour / 3600
    return {"tokens_in": tokens_in, "tokens_out": tokens_out, "sandbox_s": sandbox, "grading_s": t.grade_time,
            "wall_s": t.wall_time, "cost": money}


def guidance_cost(p: GuidancePlan, prices: CostConfig) -> dict:
    """One guidance record's share of the teacher call that wrote it: tokens and money (0 for the rule teacher
    and the action search, whose probes are attempts). One answer writes Agent-RLVR's three parts, and the
    combined guidance is those parts: the call is split evenly among the records kept from it, combined one of
    them (each family alone would have paid the whole call, so an even split keeps them level and the rows sum
    to what was paid)."""
    share = max(1, p.teacher_call_share)
    money = (p.teacher_tokens_in * prices.teacher_input_per_million
             + p.teacher_tokens_out * prices.teacher_output_per_million) / 1e6
    return {"teacher_tokens_in": p.teacher_tokens_in / share, "teacher_tokens_out": p.teacher_tokens_out / share,
            "teacher_cost": money / share}


def pairs_by_origin(chosen_sources: Iterable[str]) -> dict[str, int]:
    """DPO pairs per origin of the chosen attempt, from the rows' `chosen_source` ('unguided', 'guided:<kind>')."""
    counts: dict[str, int] = {}
    for source in chosen_sources:
        origin = source.split(":", 1)[1] if source.startswith("guided:") else source
        counts[origin] = counts.get(origin, 0) + 1
    return counts


def cost_rows(attempts: list[Trajectory], prices: CostConfig, probes: list[Trajectory] = (),
              plans: list[GuidancePlan] = (), pairs: Mapping[str, int] | None = None) -> list[dict]:
    """Per origin (unguided, then each guidance family in GUIDANCE_KINDS order): its attempts' totals, every
    attempt counted (one lost to the infrastructure cost as much), its guidance's teacher tokens and money (every
    record, set aside or not: the call was paid for), the total cost, and that cost per task it resolved and per
    DPO pair whose chosen attempt it made (`pairs` by origin, from pairs_by_origin; None: not built yet). The
    action family's probes count with it: its prefix search is part of what it costs."""
    by_origin: dict[str, list[Trajectory]] = {}
    searched = {t.rollout_id for t in probes}
    for t in [*attempts, *probes]:
        by_origin.setdefault(t.guidance_kind, []).append(t)
    present = set(by_origin) | {p.kind for p in plans}
    rows = []
    for origin in [k for k in (NO_GUIDANCE_KIND, *GUIDANCE_KINDS) if k in present]:
        group = by_origin.get(origin, [])
        spent = [attempt_cost(t, prices) for t in group]
        total = {key: sum(c[key] for c in spent) for key in ATTEMPT_FIGURES}
        taught = [guidance_cost(p, prices) for p in plans if p.kind == origin]
        teacher = {key: sum(c[key] for c in taught) for key in TEACHER_FIGURES}
        money = total["cost"] + teacher["teacher_cost"]
        resolved = len({t.instance_id for t in group if t.resolved and t.rollout_id not in searched})
        name = "unguided" if origin == NO_GUIDANCE_KIND else origin
        made = pairs.get(name, 0) if pairs is not None else None
        rows.append({"origin": name, "attempts": len(group),
                     **{k: _round(k, v) for k, v in {**total, **teacher, "cost": money}.items()},
                     "tasks_resolved": resolved,
                     "cost_per_resolved_task": round(money / resolved, 6) if resolved else None,
                     "dpo_pairs": made, "cost_per_dpo_pair": round(money / made, 6) if made else None})
    return rows


def stored_cost_rows(layout: Layout, prices: CostConfig, pairs: Mapping[str, int] | None
                     ) -> tuple[list[dict], list[str]]:
    """cost_rows over every stored batch (unguided and guided attempts, probes, guidance records), and the
    batches whose guidance file is of an older contract (no teacher tokens stored: their teacher cost is left out)."""
    attempts, probes, plans, unread = [], [], [], []
    for batch in layout.batch_names():
        attempts += [t for origin in ("unguided", "guided") if layout.trajectory_file(origin, batch).exists()
                     for t in layout.read_trajectories(origin, batch)]
        probes += layout.read_probes(batch)
        try:
            plans += layout.read_plans(batch) if layout.guidance(batch).exists() else []
        except RecordContractError:
            unread.append(batch)
    return cost_rows(attempts, prices, probes, plans, pairs), unread


def _round(key: str, value: float) -> float | int:
    if isinstance(value, int):
        return value
    return round(value, 6) if key.endswith("cost") else round(value, 1)


def cost_totals(rows: list[dict]) -> dict:
    """The rows summed: attempts, policy and teacher tokens, sandbox and grading seconds, money, DPO pairs."""
    keys = ("attempts", "tokens_in", "tokens_out", "teacher_tokens_in", "teacher_tokens_out", "sandbox_s",
            "grading_s", "cost")
    totals = {k: _round(k, sum(r[k] for r in rows)) for k in keys}
    pairs = [r["dpo_pairs"] for r in rows if r["dpo_pairs"] is not None]
    totals["dpo_pairs"] = sum(pairs) if pairs else None
    totals["cost_per_dpo_pair"] = round(totals["cost"] / totals["dpo_pairs"], 6) if totals["dpo_pairs"] else None
    return totals


def cost_markdown(rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> str:
    """The rows as a Markdown table ('-': no value, e.g. no task resolved, pairs not built yet)."""
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join("-" if r[c] is None else str(r[c]) for c in columns) + " |\n" for r in rows)


PER = (("per resolved task", "cost_per_resolved_task"), ("per DPO pair", "cost_per_dpo_pair"))
CARD_COLUMNS = ("origin", "attempts", "policy tokens in / out", "teacher tokens in / out", "sandbox hours", "cost",
                "per resolved task", "per DPO pair")


def costs_card_section(rows: Iterable[Mapping[str, object]]) -> str:
    """The dataset card's cost totals, per origin and in all: tokens, sandbox hours, money, per resolved task and
    per DPO pair ('' without rows)."""
    rows = list(rows)
    if not rows:
        return ""
    shown = [{"origin": r["origin"], "attempts": r["attempts"],
              "policy tokens in / out": f"{r['tokens_in']} / {r['tokens_out']}",
              "teacher tokens in / out": f"{r['teacher_tokens_in']:g} / {r['teacher_tokens_out']:g}",
              "sandbox hours": f"{(r['sandbox_s'] + r['grading_s']) / 3600:.3f}", "cost": f"{r['cost']:g}",
              **{name: "n/a" if r[key] is None else r[key] for name, key in PER}} for r in rows]
    total = cost_totals(rows)
    per_pair = f", {total['cost_per_dpo_pair']:g} per DPO pair" if total["cost_per_dpo_pair"] is not None else ""
    return "\n\n".join([
        "## What it cost",
        "Every attempt (infrastructure faults and the action search's probes included) and every teacher call, in "
        "the currency of the prices set under `costs` (0: free, e.g. a local model). Per DPO pair: the origin's "
        "cost over the pairs whose chosen attempt it made.",
        cost_markdown(shown, CARD_COLUMNS).strip(),
        f"In all: {total['attempts']} attempts, {total['tokens_in'] + total['tokens_out']} policy tokens, "
        f"{total['teacher_tokens_in'] + total['teacher_tokens_out']:g} teacher tokens, "
        f"{(total['sandbox_s'] + total['grading_s']) / 3600:.3f} sandbox hours, cost {total['cost']:g}{per_pair}."])
