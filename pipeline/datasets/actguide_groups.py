"""ActGuide rows from usable attempts (`pairs.prepare`, flagged by `guided.guided_checks`): one row per group with a
learning signal, its members' completions, log-probs, token ids, identity and sampling settings (polars, no I/O).

A rescued group's guided successes pass the checks DPO and SFT rows pass (`guided.failed_checks`): one that fails
them is no member, one whose prose was rewritten is a member with the rewritten completion (and without stored
token ids and log-probs, which are the sampled text's). A rescued group left without its success is no row.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl

from pipeline.datasets.formats import chat
from pipeline.datasets.guided import failed_checks
from pipeline.datasets.pairs import TASK, drop, gathered

if TYPE_CHECKING:
    from pipeline.datasets.config import DatasetConfig

MEMBER = ["rollout_id", "sample_index", "reward", "resolved", "row", "completion_tokens", "policy_model",
          "policy_revision", "chat_template_hash", "temperature", "top_p", "top_k"]
"""The light columns a member takes from its attempt."""
LOST = "rescued_lost_to_guidance_checks"
"""The `dropped` key counting rescued groups whose successes all failed the guidance checks."""


def _actions_json(actions: pl.Series) -> pl.Series:
    """Reference actions as ActGuide's JSON `[{"name", "args"}]` (args parsed back from their JSON text)."""
    return pl.Series([json.dumps([{"name": a["name"], "args": json.loads(a["args"])} for a in row], ensure_ascii=False)
                      for row in actions.to_list()], dtype=pl.String)


def _signal_heads(t: pl.DataFrame) -> pl.DataFrame:
    """The first attempt of each group with a learning signal, with its `group_kind`: a task's unguided group
    when its rewards differ ('mixed', plain GRPO), or an action-guided group of a task no unguided attempt
    resolved whose rewards, merged with the unguided ones, differ ('rescued'; probes excluded: their hints have
    other k). A task gets a rescued group only when its unguided group is not mixed."""
    reward, first = pl.col("reward"), TASK + ["group_id", "sample_index", "rollout_id"]
    unguided = t.filter(pl.col("origin") == "unguided")
    guided = t.filter((pl.col("origin") == "guided") & (pl.col("guidance_kind") == "action"))
    outcome = unguided.group_by(TASK).agg(lo=reward.min(), hi=reward.max(), solved=pl.col("resolved").any())
    mixed = (unguided.sort(first).unique(TASK, keep="first", maintain_order=True)
             .join(outcome.filter(pl.col("lo") != pl.col("hi")), on=TASK, how="semi")
             .with_columns(group_kind=pl.lit("mixed")))
    spread = guided.group_by("group_id").agg(g_lo=reward.min(), g_hi=reward.max())
    rescued = (guided.sort(first).unique("group_id", keep="first", maintain_order=True)
               .join(outcome, on=TASK, how="left").join(spread, on="group_id")
               .filter(~pl.col("solved").fill_null(False) & (pl.col("lo") == pl.col("hi")).fill_null(True)
                       & (pl.min_horizontal("lo", "g_lo") != pl.max_horizontal("hi", "g_hi")))
               .select(t.columns).with_columns(group_kind=pl.lit("rescued")))
    return pl.concat([mixed, rescued]).sort(TASK + ["group_id"])


def group_counts(t: pl.DataFrame, heads: pl.DataFrame) -> dict[str, int]:
    """Groups by learning signal: 'mixed' and 'rescued' (rows), 'zero_advantage' (tasks whose unguided and
    action-guided attempts give none: all resolved, or all failed and not rescued)."""
    grouped = t.filter((pl.col("origin") == "unguided")
                       | ((pl.col("origin") == "guided") & (pl.col("guidance_kind") == "action")))
    tasks, signal = grouped.select(TASK).unique().height, heads.select(TASK).unique().height
    kinds = heads["group_kind"].to_list()
    return {"mixed": kinds.count("mixed"), "rescued": kinds.count("rescued"), "zero_advantage": tasks - signal}


def checked_heads(t: pl.DataFrame, config: "DatasetConfig", dropped: dict[str, int]
                  ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(t without the guided members of rescued groups that fail the guidance checks, the heads of its groups);
    each member left out counted by reason, and the rescued groups that lost every success under LOST."""
    heads = _signal_heads(t)
    rescued = heads.filter(pl.col("group_kind") == "rescued")
    members = t.filter(pl.col("origin") == "guided").join(rescued, on="group_id", how="semi")
    kept = members
    for reason, flagged in failed_checks(config):
        kept = drop(kept, flagged, reason, dropped)
    dropped[LOST] = 0
    if kept.height == members.height:
        return t, heads
    gone = members.join(kept, on="row", how="anti")["row"]
    t = t.filter(~pl.col("row").is_in(gone.implode()))
    after = _signal_heads(t)
    dropped[LOST] = rescued.height - after.filter(pl.col("group_kind") == "rescued").height
    return t, after


def _members(t: pl.DataFrame, heads: pl.DataFrame, heavy: pl.DataFrame) -> pl.DataFrame:
    """Per group, its members as ACTGUIDE_SCHEMA's `trajectories`: the task's unguided attempts, then (rescued) the
    guided ones; a rewritten completion (`guided_checks`) carries no stored ids or log-probs: they were not its."""
    unguided = (t.filter(pl.col("origin") == "unguided").drop("group_id")  # members take the row's group id
                .join(heads.select(TASK + ["group_id"]), on=TASK, maintain_order="left")
                .select(["group_id"] + MEMBER).with_columns(sampled_under=pl.lit("unguided"), order=0))
    guided = t.filter(pl.col("origin") == "guided").join(heads.filter(pl.col("group_kind") == "rescued"),
                                                         on="group_id", how="semi")
    members = pl.concat([unguided, guided.select(["group_id"] + MEMBER).with_columns(
        sampled_under=pl.lit("guided"), order=1)], how="vertical_relaxed")
    members = gathered(members.sort("group_id", "order", "sample_index", "rollout_id"), heavy,
                       completion=("chosen_completion", "row"), rewrites=("rewrites", "row"),
                       logprobs=("logprobs", "row"), prompt_token_ids=("prompt_token_ids", "row"),
                       token_ids=("token_ids", "row"))
    sampled = pl.col("rewrites") == "[]"
    members = members.with_columns(**{name: pl.when(sampled).then(pl.col(name))
                                      for name in ("logprobs", "prompt_token_ids", "token_ids")})
    return members.group_by("group_id", maintain_order=True).agg(trajectories=pl.struct(
        "rollout_id", "sampled_under", "sample_index", "reward", "resolved", "completion", "completion_tokens",
        "logprobs", "prompt_token_ids", "token_ids", "policy_model", "policy_revision", "chat_template_hash",
        "temperature", "top_p", "top_k", "rewrites"))


def actguide_rows(t: pl.DataFrame, heavy: pl.DataFrame, config: "DatasetConfig"
                  ) -> tuple[pl.DataFrame, dict[str, int], dict[str, int]]:
    """(ACTGUIDE_SCHEMA rows, dropped, `group_counts`): one row per group with a learning signal
    (`_signal_heads`, after `checked_heads`), holding the task's unguided attempts and, for a rescued group, its
    guided attempts; the trainer's `training_group` merges them or keeps the guided ones."""
    dropped: dict[str, int] = {}
    checked, heads = checked_heads(t, config, dropped)
    groups = group_counts(t, heads)
    heads = drop(heads, pl.lit(config.max_prompt_tokens > 0)
                 & (pl.col("guided_prompt_tokens") > config.max_prompt_tokens), "too_long", dropped)
    rows = heads.join(_members(checked, heads, heavy), on="group_id", maintain_order="left")
    rows = gathered(rows, heavy, guided_prompt=("prompt", "row"), prompt=("prompt_chat", "row"))
    return rows.select(
        "prompt", chat(pl.col("guided_prompt")).alias("guided_prompt"), "tools",
        pl.col("guidance_actions").map_batches(_actions_json, return_dtype=pl.String).alias("actions"),
        pl.col("guidance_actions").list.len().cast(pl.Int64).alias("K"), pl.col("guidance_k").alias("k_star"),
        "group_kind", "trajectories", "instance_id", "split",
        pl.col("base_batch").alias("batch"), "group_id", "prompt_tokens", "guided_prompt_tokens"), dropped, groups
