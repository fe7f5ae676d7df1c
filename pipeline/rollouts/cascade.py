"""The guidance families as a cascade: one after another, the cheapest first, each only on the groups the ones
before it left failed; and what that saved against running every family on every failed group (head to head).

What is counted: guided attempts (their policy tokens, sandbox and grading seconds, money). A family the
cascade skipped on a group is charged, as saved, its mean cost per group over the groups where it did run in
this batch; a family that ran on none has no measure and saves an unknown amount (reported as such). The
guidance itself (teacher calls, the action family's prefix search) is written for every failed group before the
guided rollouts, so the cascade does not save it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.agent.policy import Policy
from pipeline.rollouts.batch_metrics import BatchSummary
from pipeline.rollouts.costs import CostConfig, attempt_cost
from pipeline.core.records import Guidance, GuidancePlan, Task, Trajectory
from pipeline.rollouts.rescue import GuidanceConfig, guided_guidance, guided_jobs
from pipeline.rollouts.batch import RolloutConfig, run_batch
from pipeline.verifier.environment import SandboxFactory, task_sandbox

SAVING_COLUMNS = ("family", "groups_run", "groups_skipped", "attempts_saved", "tokens_saved", "sandbox_s_saved",
                  "cost_saved")


@dataclass
class CascadeRun:
    """Which family ran on which groups, and which groups it was spared because an earlier one rescued them."""

    trajectories: list[Trajectory] = field(default_factory=list)
    ran: dict[str, list[str]] = field(default_factory=dict)
    """Per family, in cascade order: the groups (instance ids) it ran on."""
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """Per family: the groups it had guidance for but did not run on (rescued before its turn)."""


def run_cascade(guidance: dict[str, list[Guidance]], order: Sequence[str],
                run: Callable[[dict[str, list[Guidance]]], list[Trajectory]]) -> CascadeRun:
    """Run `order`'s families one at a time through `run` (guided groups of the given guidance), each on the
    groups no earlier family rescued (a resolved attempt without an infrastructure error)."""
    out, failed = CascadeRun(), set(guidance)
    for kind in order:
        mine = {iid: [g for g in items if g.kind == kind] for iid, items in guidance.items()}
        mine = {iid: items for iid, items in mine.items() if items}
        if not mine:
            continue
        todo = {iid: items for iid, items in mine.items() if iid in failed}
        out.ran[kind], out.skipped[kind] = sorted(todo), sorted(set(mine) - set(todo))
        got = run(todo) if todo else []
        out.trajectories += got
        failed -= {t.instance_id for t in got if t.resolved and not t.infra_error}
    return out


def guided_batch(tasks: dict[str, Task], plans: list[GuidancePlan], policy: Policy, rollout: RolloutConfig,
                 config: GuidanceConfig, out: Path, batch: str, progress: Callable[[str], None],
                 sandboxes: SandboxFactory = task_sandbox) -> tuple[BatchSummary, CascadeRun | None]:
    """The guided groups of the accepted plans, stored under `out`: every family on every group, or with
    `config.cascade` one family at a time in `config.kinds` order (then the CascadeRun says what ran where)."""
    summaries: list[BatchSummary] = []

    def run(guidance: dict[str, list[Guidance]]) -> list[Trajectory]:
        summaries.append(run_batch(guided_jobs(tasks, guidance, policy, rollout, batch), policy, rollout, out, batch,
                                   progress=progress, sandboxes=sandboxes))
        return summaries[-1].trajectories

    if not config.cascade:
        run(guided_guidance(plans))
        return summaries[0], None
    cascade = run_cascade(guided_guidance(plans), config.kinds, run)
    return BatchSummary(cascade.trajectories, sum(s.ran for s in summaries), sum(s.skipped for s in summaries),
                        sum(s.seconds for s in summaries), summaries[-1].pool if summaries else {}), cascade


def cascade_savings(run: CascadeRun, prices: CostConfig) -> list[dict]:
    """Per family: groups run and skipped, and the attempts, policy tokens, sandbox seconds and money the
    skipped groups would have cost at the family's mean per group where it ran (None: it ran nowhere)."""
    rows = []
    for kind, ran in run.ran.items():
        spent = [attempt_cost(t, prices) for t in run.trajectories if t.guidance_kind == kind]
        measured = {"attempts_saved": len(spent), "tokens_saved": sum(c["tokens_in"] + c["tokens_out"] for c in spent),
                    "sandbox_s_saved": sum(c["sandbox_s"] + c["grading_s"] for c in spent),
                    "cost_saved": sum(c["cost"] for c in spent)}
        skipped = len(run.skipped[kind])
        rows.append({"family": kind, "groups_run": len(ran), "groups_skipped": skipped,
                     **{k: round(v / len(ran) * skipped, 6 if k == "cost_saved" else 1) if ran else None
                        for k, v in measured.items()}})
    return rows


def savings_markdown(rows: list[dict]) -> str:
    """The savings as a Markdown table, a total line under it ('-': no measure)."""
    head = "| " + " | ".join(SAVING_COLUMNS) + " |\n|" + "---|" * len(SAVING_COLUMNS) + "\n"
    body = "".join("| " + " | ".join("-" if r[c] is None else str(r[c]) for c in SAVING_COLUMNS) + " |\n"
                   for r in rows)
    known = [r for r in rows if r["cost_saved"] is not None]
    unknown = [r["family"] for r in rows if r["cost_saved"] is None and r["groups_skipped"]]
    total = (f"\nSaved against every family on every failed group: {sum(r['attempts_saved'] for r in known):g} "
             f"guided attempts, {sum(r['tokens_saved'] for r in known):g} policy tokens, "
             f"{sum(r['cost_saved'] for r in known):.6g} in money (guided attempts only; guidance was written for "
             "every group)" + (f"; unmeasured: {', '.join(unknown)} ran on no group" if unknown else "") + ".\n")
    return head + body + total
