"""The guidance families (pipeline/core/vocab.py GUIDANCE_KINDS: Agent-RLVR's three parts, them combined in one prompt,
hindsight, action prefixes) head to head on the same failed groups: per family, the groups it was tried on,
those it rescued, the guided pass rate, k*/K for action guidance, and the guidance set aside (leaking the
gold patch, or the teacher's failure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pipeline.core.pictures import bar_chart_png, markdown_image
from pipeline.core.records import GuidancePlan, Trajectory
from pipeline.core.vocab import GUIDANCE_KINDS

HEAD_TO_HEAD = ("origin", "groups_tried", "groups_rescued", "attempts", "pass_rate", "policy_tokens", "teacher_tokens",
                "cost", "cost_per_resolved_task")
COLUMNS = ("family", "groups_failed", "groups_tried", "groups_rescued", "guided_attempts", "guided_pass_rate",
           "k_star_over_K", "set_aside_leaking", "set_aside_other")


def family_rows(plans: list[GuidancePlan], guided: list[Trajectory],
                ran: Mapping[str, Iterable[str]] | None = None) -> list[dict]:
    """One row per guidance family that had plans, in GUIDANCE_KINDS order; attempts with an infrastructure
    error count for nothing. A group is rescued when one of its guided attempts resolved it. `ran`: the groups
    each family ran on in a cascade (CascadeRun.ran); None: every group with accepted guidance."""
    rows = []
    for kind in [k for k in GUIDANCE_KINDS if any(p.kind == k for p in plans)]:
        mine = [p for p in plans if p.kind == kind]
        tried = {p.instance_id for p in mine if p.accepted}
        if ran is not None:  # a cascade: only where the family's turn came
            tried &= set(ran.get(kind, ()))
        attempts = [t for t in guided if t.guidance_kind == kind and t.instance_id in tried and not t.infra_error]
        rescued = {t.instance_id for t in attempts if t.resolved}
        searched = [p.k_star / p.K for p in mine if p.accepted and p.K > 0]
        rows.append({
            "family": kind, "groups_failed": len({p.instance_id for p in mine}), "groups_tried": len(tried),
            "groups_rescued": len(rescued), "guided_attempts": len(attempts),
            "guided_pass_rate": round(sum(t.resolved for t in attempts) / len(attempts), 3) if attempts else 0.0,
            "k_star_over_K": round(sum(searched) / len(searched), 3) if searched else None,
            "set_aside_leaking": sum(p.leaked and not p.accepted for p in mine),
            "set_aside_other": sum(not p.leaked and not p.accepted for p in mine),
        })
    return rows


def family_markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join("-" if r[c] is None else str(r[c]) for c in COLUMNS) + " |\n" for r in rows)


def family_chart(rows: list[dict]) -> str:
    """The share of tried groups each family rescued, one bar per row in the table's order (Markdown image)."""
    shares = [r["groups_rescued"] / r["groups_tried"] if r["groups_tried"] else 0.0 for r in rows]
    return markdown_image(bar_chart_png(shares), "share of tried groups rescued, per family in table order")


def head_to_head(families: list[dict], costs: list[dict]) -> list[dict]:
    """The families' rows joined with their cost rows (pipeline/rollouts/costs.py cost_rows), unguided attempts first:
    what each origin rescued and what that cost (tokens, money, per task resolved)."""
    by_family = {r["family"]: r for r in families}
    rows = []
    for c in costs:
        f = by_family.get(c["origin"], {})
        rows.append({"origin": c["origin"], "groups_tried": f.get("groups_tried"),
                     "groups_rescued": f.get("groups_rescued"),
                     "attempts": c["attempts"], "pass_rate": f.get("guided_pass_rate"),
                     "policy_tokens": c["tokens_in"] + c["tokens_out"],
                     "teacher_tokens": round(c["teacher_tokens_in"] + c["teacher_tokens_out"], 1), "cost": c["cost"],
                     "cost_per_resolved_task": c["cost_per_resolved_task"]})
    return rows


def head_to_head_markdown(rows: list[dict]) -> str:
    """The joined rows as a Markdown table ('-': no value)."""
    head = "| " + " | ".join(HEAD_TO_HEAD) + " |\n|" + "---|" * len(HEAD_TO_HEAD) + "\n"
    return head + "".join("| " + " | ".join("-" if r[c] is None else str(r[c]) for c in HEAD_TO_HEAD) + " |\n"
                          for r in rows)
