"""What the loop achieved, per round: of a batch's tasks that needed guidance in an earlier batch (an unguided group
none of whose graded attempts succeeded), those the batch's policy now solves without guidance; and the lineage of
every round, as the rollouts' metadata, the dataset card and `handhold status` show it (pipeline/rollouts/rounds.py)."""

from __future__ import annotations

import polars as pl

from pipeline.core.layout import Layout
from pipeline.core.records import Trajectory
from pipeline.rollouts.rescue import failed_groups
from pipeline.rollouts.rounds import RoundOutcome, RoundRecord, read_round


def needed_guidance_before(layout: Layout, batch: str, delta: float) -> set[str]:
    """Tasks with an unguided group in a batch named before `batch` none of whose graded attempts succeeded."""
    files = [f for f in layout.trajectory_files("unguided") if f.parent.name < batch]
    if not files:
        return set()
    attempts = pl.concat([pl.read_parquet(f, columns=["batch", "instance_id", "reward", "infra_error"])
                          for f in files]).filter(pl.col("infra_error") == "")
    best = attempts.group_by("batch", "instance_id").agg(pl.col("reward").max())
    return set(best.filter(pl.col("reward") <= delta)["instance_id"].to_list())


def round_outcome(layout: Layout, batch: str, trajectories: list[Trajectory], delta: float) -> RoundOutcome:
    """Of the batch's tasks that needed guidance in an earlier batch, those its unguided attempts now solve."""
    before = needed_guidance_before(layout, batch, delta)
    graded = {t.instance_id for t in trajectories if not t.infra_error}
    failed = failed_groups(trajectories, delta)
    needed = sorted(before & graded)
    return RoundOutcome(True, tuple(needed), tuple(i for i in needed if i not in failed))


def lineage(layout: Layout) -> list[RoundRecord]:
    """Every batch's round record, in batch order."""
    return [r for b in layout.round_batches() if (r := read_round(layout, b)) is not None]


def lineage_rows(records: list[RoundRecord]) -> list[dict[str, str]]:
    """Each batch's round as a table row: its policy, the run and data that made it, and of its tasks that needed
    guidance in an earlier round those it solved without ('-': none needed any, or its rollouts did not finish)."""
    rows = []
    for r in records:
        made, outcome = r.trained_by, r.outcome
        rows.append({"batch": r.batch, "round": str(r.round), "policy": f"{r.kind} {r.model}".strip(),
                     "weights": r.revision[:19] or "-",
                     "trained by": f"{made.stage} in {made.batch} (round {made.round})" if made.stage else "-",
                     "on dataset": (f"{made.dataset_release or 'local export'} ({made.dataset_sha256[:12]})"
                                    if made.stage else "-"),
                     "solved without guidance": (f"{len(outcome.solved)}/{len(outcome.needed_guidance)} "
                                                 f"({outcome.share:.0%})" if outcome.needed_guidance else "-")})
    return rows


def lineage_markdown(records: list[RoundRecord]) -> str:
    """`lineage_rows` as a Markdown table; a line saying so when no batch has a round record."""
    rows = lineage_rows(records)
    if not rows:
        return "(no batch has a round record yet)"
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return "\n".join(lines + ["| " + " | ".join(row.values()) + " |" for row in rows])
