"""Where action guidance's reference trajectories come from, and how each source did.

ActGuide-RL draws a failed task's reference from successes of the same task in other rounds, and this
pipeline falls back to an imported action log and then to a script written from the gold patch
(pipeline/guidance/expert.py), whose str_replace IS the fix: a k* found there says little about the policy.
`stored_references` reads every other batch's resolved attempts of the failed tasks (unguided, guided and
probes, any policy), only the columns it needs; `capped_references` keeps the gold-patch script to a share of
a batch's plans; `source_table` reports, per source, the plans, the rescue rate, k*/K, and how often the hint
shown held a line of the gold patch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Collection, Iterable

import polars as pl
import pyarrow as pa

from pipeline.guidance.actions import REFERENCE_SOURCES, Reference, call_actions
from pipeline.core.layout import Layout
from pipeline.core.records import GUIDANCE_PLAN_SCHEMA, GuidancePlan

ACTION_CHOSEN = "guided:action"
"""The `chosen_source` of a DPO row whose chosen attempt had action guidance (a guided attempt or a probe)."""
CHOSEN_COLUMNS = ("batch", "instance_id", "chosen_source", "chosen_hint_has_gold")
"""What `source_table` reads of the DPO rows."""


def stored_references(layout: Layout, instance_ids: Collection[str], batch: str) -> list[Reference]:
    """The resolved attempts of these tasks in every stored batch but `batch` (whose own attempts of a failed
    task are failures, or guided by the plans being made), as references: their own tool calls."""
    files = [f for name in layout.batch_names() if name != batch for f in layout.batch_files(name)]
    return references_in(files, instance_ids)


def references_in(files: Iterable[Path], instance_ids: Collection[str]) -> list[Reference]:
    """Resolved attempts (no infra fault) of the tasks in these trajectory files, one per rollout id (a later
    file wins: shards come after their compacted file)."""
    wanted, found = sorted(set(instance_ids)), {}
    for path in files if wanted else ():
        for row in _resolved_calls(path, wanted).iter_rows(named=True):
            calls = [call for text in row["calls"][row["start"]:] if text for call in json.loads(text)]
            found[row["rollout_id"]] = Reference(row["instance_id"], tuple(call_actions(calls)), "trajectory",
                                                 row["rollout_id"])
    return list(found.values())


def _resolved_calls(path: Path, wanted: list[str]) -> pl.DataFrame:
    """rollout_id, instance_id, start (the prompt's length) and calls (each message's tool calls as stored,
    JSON or null) of the file's resolved attempts of `wanted`; the other columns are never read."""
    ok = pl.col("resolved") & (pl.col("infra_error").fill_null("") == "") & pl.col("instance_id").is_in(wanted)
    return (pl.scan_parquet(path).filter(ok)
            .select("rollout_id", "instance_id", start=pl.col("prompt").list.len(),
                    calls=pl.col("messages").list.eval(pl.element().struct.field("tool_calls")))
            .collect())


def capped_references(references: list[Reference], max_expert_share: float) -> list[Reference]:
    """The references with at most ⌊max_expert_share × plans⌋ using the gold-patch script (the first tasks by
    instance id keep it); the others left without a reference, saying why and naming the setting."""
    allowed = math.floor(max_expert_share * len(references) + 1e-9)
    kept = set(sorted(r.instance_id for r in references if r.source == "expert")[:allowed])
    reason = (f"no reference actions: no stored success or action file row, and the gold-patch script is capped by "
              f"guidance.max_expert_share={max_expert_share:g} ({allowed} of {len(references)} action plans may "
              "use it); raise it, or give an action_file")
    return [Reference(r.instance_id, (), "", reason=reason) if r.source == "expert" and r.instance_id not in kept
            else r for r in references]


PLAN_COLUMNS = {"kind", "action_source", "found", "k_star", "K", "leaked", "accepted", "instance_id"}


def plan_frame(plans: Iterable[GuidancePlan]) -> pl.DataFrame:
    """Plans as the table guidance.parquet stores (no `batch` column: the batch is the file's folder)."""
    return pl.from_arrow(pa.Table.from_pylist([p.to_row() for p in plans], schema=GUIDANCE_PLAN_SCHEMA))


def source_table(plans: pl.DataFrame, chosen: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per reference source of the action plans ('none': no reference): plans, found (some prefix solved the
    task), rescue_rate (found / plans), mean_k_star_over_K and hint_gold (the share whose shown hint held a gold
    line), both over found plans; with DPO rows, chosen_rows (chosen under action guidance, joined to their
    plan on batch and instance id, or instance id alone when the plans name no batch) and chosen_hint_gold."""
    acts = plans.filter(pl.col("kind") == "action").with_columns(
        source=pl.col("action_source").replace("", "none"))
    found = pl.col("found")
    table = acts.group_by("source").agg(
        pl.len().cast(pl.Int64).alias("plans"), found.sum().cast(pl.Int64).alias("found"),
        found.mean().alias("rescue_rate"),
        (pl.col("k_star") / pl.col("K")).filter(found & (pl.col("K") > 0)).mean().alias("mean_k_star_over_K"),
        pl.col("leaked").filter(found).mean().alias("hint_gold"))
    if chosen is not None:
        table = table.join(_chosen_by_source(acts, chosen), on="source", how="full", coalesce=True).with_columns(
            pl.col("plans", "found", "chosen_rows").fill_null(0))
    order = list(REFERENCE_SOURCES) + ["none"]
    return table.sort(pl.col("source").replace_strict(order, list(range(len(order))), default=len(order),
                                                      return_dtype=pl.Int64), "source")


def _chosen_by_source(acts: pl.DataFrame, chosen: pl.DataFrame) -> pl.DataFrame:
    """source, chosen_rows, chosen_hint_gold of the DPO rows chosen under action guidance."""
    keys = [k for k in ("batch", "instance_id") if k in acts.columns and k in chosen.columns]
    plan = acts.filter(pl.col("accepted")).unique(keys, keep="last").select(*keys, "source")
    rows = chosen.filter(pl.col("chosen_source") == ACTION_CHOSEN).select(*keys, "chosen_hint_has_gold")
    return rows.join(plan, on=keys, how="left").with_columns(pl.col("source").fill_null("unknown")).group_by(
        "source").agg(pl.len().cast(pl.Int64).alias("chosen_rows"),
                      pl.col("chosen_hint_has_gold").fill_null(False).mean().alias("chosen_hint_gold"))


def reference_sources_section(plans: pl.DataFrame | None, chosen: pl.DataFrame | None) -> str:
    """The dataset card's section on where action guidance's references came from ('' without action plans)."""
    if plans is None or not PLAN_COLUMNS <= set(plans.columns) or not plans.filter(pl.col("kind") == "action").height:
        return ""  # no plans, or a table of plans that is not guidance.parquet's (the k*/K histogram's alone)
    return ("## Reference sources of action guidance\n\nWhere each action plan's reference trajectory came from: "
            "a stored success of the task (`trajectory`), the imported action file (`file`), or the script written "
            "from the gold patch (`expert`, whose edit is the fix); `none`: no reference. Rescue rate: plans "
            "where some prefix solved the task; k*/K and `hint_gold` (the hint shown held a gold line) over those; "
            "`chosen_hint_gold`: of the DPO rows chosen under action guidance, those whose hint held a gold line."
            "\n\n" + source_markdown(source_table(plans, chosen)))


def source_markdown(table: pl.DataFrame) -> str:
    """The per-source table in Markdown: counts as they are, shares as percentages, '–' where none."""
    def cell(value: object) -> str:
        return "–" if value is None else f"{value:.1%}" if isinstance(value, float) else str(value)
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.rows()])
