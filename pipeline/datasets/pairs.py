"""Training rows from graded trajectories: DPO pairs and SFT examples (polars, no I/O).

`prepare` turns one or more batches of trajectories (TRAJECTORY_SCHEMA columns) into usable
attempts, counting what it leaves out: a light frame the rules decide on, whose `row` points into
a frame of the heavy columns (chat-form messages, log-probs). `dpo_rows`, `sft_rows` and
`actguide_rows` (pipeline/datasets/actguide_groups.py) make rows of the schemas in pipeline/datasets/formats.py
from them, taking the heavy columns only for the rows they make.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Mapping

import polars as pl

from pipeline.datasets.formats import chat, mentions
from pipeline.datasets.guided import failed_checks
from pipeline.datasets.splits import Counter, canonical, content_hashes, digest, split_column
from pipeline.core.layout import PROBE_SUFFIX
from pipeline.core.records import Action
from pipeline.core.vocab import GUIDANCE_KINDS, NO_GUIDANCE_KIND

if TYPE_CHECKING:
    from pipeline.datasets.config import DatasetConfig

ORIGIN_ORDER = ("unguided", "guided", "probe")  # chosen candidates: on-policy successes first
TASK = ["base_batch", "instance_id"]


@dataclass(frozen=True)
class LightColumns:
    """The trajectory columns the rules decide on, read for every stored attempt. Names and types are the
    Trajectory's (tests/test_trajectory_columns.py): a column renamed there fails a test, not a nightly build."""

    rollout_id: str
    group_id: str
    batch: str
    instance_id: str
    sample_index: int
    guidance_kind: str
    guidance_text: str
    guidance_actions: tuple[Action, ...]
    guidance_k: int
    tools: str
    reward: float
    resolved: bool
    infra_error: str
    quotes_guidance: bool
    policy_model: str
    policy_revision: str
    chat_template_hash: str
    temperature: float
    top_p: float
    top_k: int


@dataclass(frozen=True)
class HeavyColumns:
    """The trajectory columns taken only for the rows a builder makes (chat-form messages, log-probs, token ids)."""

    prompt: tuple[dict, ...]
    unguided_prompt: tuple[dict, ...]
    messages: tuple[dict, ...]
    logprobs: tuple[tuple[float, ...] | None, ...] | None
    prompt_token_ids: tuple[tuple[int, ...] | None, ...] | None
    token_ids: tuple[tuple[int, ...] | None, ...] | None


HEAVY = [f.name for f in fields(HeavyColumns)]
USED = [f.name for f in fields(LightColumns)] + HEAVY
"""The trajectory columns the builders read."""


def normalized_patch(patch: pl.Expr) -> pl.Expr:
    """A diff without what depends on the tool that wrote it (git `index` lines, hunk-header context)."""
    return (patch.str.replace_all(r"(?m)^index [0-9a-f]+\.\.[0-9a-f]+.*\n", "")
            .str.replace_all(r"(?m)^(@@ [^@]* @@).*$", "$1").str.strip_chars())


def with_task_keys(frame: pl.DataFrame) -> pl.DataFrame:
    """Adds the build batch (probes count under their batch), origin, source and source rank."""
    kind, batch = pl.col("guidance_kind"), pl.col("batch")
    origin = (pl.when(batch.str.ends_with(PROBE_SUFFIX)).then(pl.lit("probe"))
              .when(kind == NO_GUIDANCE_KIND).then(pl.lit("unguided")).otherwise(pl.lit("guided")))
    kind_rank = kind.replace_strict(list(GUIDANCE_KINDS), list(range(len(GUIDANCE_KINDS))), default=len(GUIDANCE_KINDS),
                                    return_dtype=pl.Int64)
    return frame.with_columns(
        base_batch=batch.str.strip_suffix(PROBE_SUFFIX), origin=origin,
        source=pl.when(kind == NO_GUIDANCE_KIND).then(pl.lit("unguided")).otherwise("guided:" + kind),
    ).with_columns(source_rank=pl.col("origin").replace_strict(list(ORIGIN_ORDER), [0, 1, 2],
                                                               return_dtype=pl.Int64) * 10 + kind_rank)


def order_pairs() -> pl.Expr:
    """Pair order within a task: first every candidate at least once (chosen and rejected zipped, the
    shorter list cycled), then the remaining combinations by (chosen rank, rejected rank)."""
    ci, rj, n_c, n_r = pl.col("ci"), pl.col("rj"), pl.col("n_chosen"), pl.col("n_rejected")
    zipped = pl.when(n_c >= n_r).then(ci % n_r == rj).otherwise(rj % n_c == ci)
    position = pl.when(n_c >= n_r).then(ci).otherwise(rj)
    return pl.when(zipped).then(position).otherwise(pl.max_horizontal(n_c, n_r) + ci * n_r + rj)


class GuidanceLeakError(AssertionError):
    """A stored unguided prompt holds its attempt's guidance text: a fault upstream, never a training row."""


def drop(frame: pl.DataFrame, mask: pl.Expr, reason: str, dropped: dict[str, int]) -> pl.DataFrame:
    kept = frame.filter(~mask)
    dropped[reason] = dropped.get(reason, 0) + frame.height - kept.height
    return kept


def gathered(rows: pl.DataFrame, heavy: pl.DataFrame, **columns: tuple[str, str]) -> pl.DataFrame:
    """`rows` with heavy columns taken at their row indexes: name=(heavy column, index column)."""
    return rows.with_columns(**{name: heavy[column].gather(rows[index]) for name, (column, index) in columns.items()})


def prepare(frame: pl.DataFrame, config: "DatasetConfig", count: Counter, gold: dict[str, str] | None = None,
            task_groups: Mapping[str, str] | None = None) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
    """(t, heavy, dropped): the usable attempts' light columns with token counts, gold-leak flag and
    completion hashes (null for guided failures: no rule compares them), whose `row` indexes `heavy`
    (chat-form completion and unguided prompt, stored prompt, log-probs); the rest counted by reason.
    `count` maps a stored-messages Series to token counts; `task_groups` maps an instance id to its split group
    (`splits.split_groups`), which gives every row its `split`."""
    dropped: dict[str, int] = {}
    light = frame.select([c for c in USED if c not in HEAVY]).with_row_index("row")
    t = with_task_keys(light.unique("rollout_id", keep="last", maintain_order=True))
    t = t.with_columns(split=split_column("instance_id", config.test_fraction, task_groups))
    dropped["duplicate_rollout"] = frame.height - t.height
    t = drop(t, pl.col("infra_error") != "", "infra_error", dropped)  # not an attempt: never a failure
    t = drop(t, pl.col("quotes_guidance"), "quotes_guidance", dropped)
    stored = frame.select(HEAVY).with_columns(completion=pl.col("messages").list.slice(pl.col("prompt").list.len()))
    t = t.with_columns(**{name: count(stored[source]).gather(t["row"]) for name, source in [
        ("prompt_tokens", "unguided_prompt"), ("guided_prompt_tokens", "prompt"), ("completion_tokens", "completion")]})
    heavy = stored.select(chat(pl.col("completion")), prompt_chat=chat(pl.col("unguided_prompt")), prompt="prompt",
                          logprobs="logprobs", prompt_token_ids="prompt_token_ids",
                          token_ids="token_ids")  # every row: cheaper than gathering the usable ones first
    needled = t.filter(pl.col("guidance_text") != "")  # only guided rows have a text to look for
    leaked = needled.filter(mentions(needled["guidance_text"], heavy["prompt_chat"].gather(needled["row"])))
    if leaked.height:
        row = leaked.row(0, named=True)
        raise GuidanceLeakError(f"trajectory {row['rollout_id']} ({row['instance_id']}, batch {row['batch']}): its "
                                "unguided_prompt holds its guidance text; fix what stored it and rerun the batch")
    echoes = (mentions(needled["guidance_text"], heavy["completion"].gather(needled["row"]))
              | needled.select(pl.col("tools").str.contains(pl.col("guidance_text"), literal=True)).to_series())
    t = drop(t, pl.col("row").is_in(needled["row"].filter(echoes).implode()), "echoes_guidance", dropped)
    too_long = ((pl.lit(config.max_prompt_tokens > 0) & (pl.col("prompt_tokens") > config.max_prompt_tokens))
                | (pl.lit(config.max_completion_tokens > 0)
                   & (pl.col("completion_tokens") > config.max_completion_tokens)))
    t = drop(t, too_long, "too_long", dropped)
    prompts = stored.select(canonical(pl.col("unguided_prompt"))).to_series().gather(t["row"])
    t = t.with_columns(gold_leak=_gold_leaks(t, heavy, gold),
                       prompt_key=digest(pl.lit(prompts) + "\x1d" + pl.col("tools")))
    paired = t.filter((pl.col("reward") > 0) | (pl.col("origin") == "unguided"))["row"]  # what candidates pick from
    first = stored.select(pl.when(pl.int_range(pl.len(), dtype=pl.UInt32).is_in(paired.implode()))
                          .then(pl.col("prompt").list.len())).to_series()
    hashes = content_hashes(stored["messages"], first)
    return t.with_columns(completion_hash=hashes.gather(t["row"])), heavy, dropped


def _gold_leaks(t: pl.DataFrame, heavy: pl.DataFrame, gold: dict[str, str] | None) -> pl.Series:
    """Successes whose text hands over the gold diff itself: in the task prompt, or written out by the
    assistant. A correct fix often IS the gold patch (a one-line bug has one fix): that is no leak."""
    ids = t["instance_id"].unique().to_list()  # the run's tasks: `gold` maps every task of the datasets
    golds = pl.DataFrame({"instance_id": ids, "gold": [(gold or {}).get(i) for i in ids]},
                         schema={"instance_id": pl.String, "gold": pl.String}).drop_nulls()
    hunks = golds.select("instance_id", hunks=normalized_patch(pl.col("gold")).str.extract(r"(?s)(@@ .*)", 1))
    shown = (t.filter(pl.col("reward") > 0).select("row", "instance_id")
             .join(hunks.filter(pl.col("hunks") != ""), on="instance_id", maintain_order="left"))
    said = heavy.select(pl.col("completion").gather(shown["row"]).list.filter(
        pl.element().struct.field("role") == "assistant")).to_series()
    leaks = mentions(shown["hunks"], heavy["prompt_chat"].gather(shown["row"]), said)
    return t["row"].is_in(shown["row"].filter(leaks).implode())


def _ranked(pool: pl.DataFrame) -> pl.DataFrame:
    return pool.with_columns(rank=pl.int_range(pl.len()).over(TASK), n=pl.len().over(TASK))


def _unique_completions(pool: pl.DataFrame, dropped: dict[str, int]) -> pl.DataFrame:
    """First of each distinct completion of a task, in the pool's order."""
    return drop(pool, ~pl.struct(TASK + ["completion_hash"]).is_first_distinct(), "duplicate_completion", dropped)


def candidates(t: pl.DataFrame, config: "DatasetConfig") -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
    """(chosen, rejected, dropped): successes allowed by `chosen_sources`, without prose referring to guidance
    (under `guidance_references: drop`), ungrounded edits (unless kept) or gold patches, and unguided failures
    picked by `rejected`; each deduplicated by completion within its task. `t` has `guided_checks`' flags."""
    dropped: dict[str, int] = {}
    origin = pl.col("origin")
    allowed = {"guided_and_unguided": pl.lit(True), "guided_only": origin != "unguided",
               "unguided_only": origin == "unguided"}[config.chosen_sources]
    chosen = t.filter((pl.col("reward") > 0) & allowed)
    for reason, flagged in failed_checks(config):
        chosen = drop(chosen, flagged, reason, dropped)
    chosen = drop(chosen, pl.col("gold_leak"), "gold_patch", dropped)
    chosen = _unique_completions(chosen.sort(TASK + ["source_rank", "sample_index", "rollout_id"]), dropped)
    rejected = t.filter((origin == "unguided") & (pl.col("reward") <= 0))
    rejected = _unique_completions(rejected.sort(TASK + ["sample_index", "rollout_id"]), dropped)
    if config.rejected == "shortest":
        rejected = rejected.sort(TASK + ["completion_tokens", "sample_index", "rollout_id"])
    elif config.rejected == "random":  # a seeded draw that does not depend on the row order
        draw = digest(pl.lit(f"{config.seed}:") + pl.col("rollout_id"))
        rejected = rejected.with_columns(draw=draw).sort(TASK + ["draw"]).drop("draw")
    if config.rejected != "all":
        rejected = rejected.unique(TASK, keep="first", maintain_order=True)
    return _ranked(chosen), _ranked(rejected), dropped


def _unseen(rows: pl.DataFrame, seen: pl.DataFrame | None, on: list[str], dropped: dict[str, int],
            reason: str) -> pl.DataFrame:
    """Rows whose key is not among `seen` (the keys of rows already in the dataset)."""
    if seen is None or seen.is_empty():
        dropped[reason] = 0
        return rows
    kept = rows.join(seen.select(on), on=on, how="anti", maintain_order="left")  # no copy: a repeated key changes
    # nothing in an anti join, and a build's `seen` grows with every batch before it
    dropped[reason] = rows.height - kept.height
    return kept


def dpo_rows(chosen: pl.DataFrame, rejected: pl.DataFrame, heavy: pl.DataFrame, config: "DatasetConfig",
             seen: pl.DataFrame | None = None) -> tuple[pl.DataFrame, dict[str, int]]:
    """DPO_SCHEMA rows: up to `pairs_per_task` (chosen, rejected) pairs per task and batch, in
    `order_pairs` order; never identical completions, pairs across prompts, or keys in `seen`."""
    dropped: dict[str, int] = {}
    c = chosen.select(TASK + ["split", "tools", "source", "prompt_tokens", pl.col("rank").alias("ci"),
                              pl.col("hint_gold").alias("chosen_hint_has_gold"),
                              pl.col("n").alias("n_chosen"), pl.col("rollout_id").alias("chosen_rollout_id"),
                              pl.col("completion_hash").alias("chosen_hash"), pl.col("prompt_key").alias("c_key"),
                              pl.col("completion_tokens").alias("chosen_tokens"), pl.col("row").alias("c_row")])
    r = rejected.select(TASK + [pl.col("rank").alias("rj"), pl.col("n").alias("n_rejected"),
                                pl.col("rollout_id").alias("rejected_rollout_id"),
                                pl.col("completion_hash").alias("rejected_hash"), pl.col("prompt_key").alias("r_key"),
                                pl.col("completion_tokens").alias("rejected_tokens"), pl.col("row").alias("r_row")])
    pairs = c.join(r, on=TASK, how="inner").with_columns(order=order_pairs())
    pairs = drop(pairs, pl.col("chosen_hash") == pl.col("rejected_hash"), "identical_pair", dropped)
    pairs = drop(pairs, pl.col("c_key") != pl.col("r_key"), "prompt_mismatch", dropped)
    pairs = _unseen(pairs, seen, ["instance_id", "chosen_hash", "rejected_hash"], dropped, "seen_before")
    pairs = pairs.sort(TASK + ["order"]).with_columns(slot=pl.int_range(pl.len()).over(TASK))
    pairs = drop(pairs, pl.col("slot") >= config.pairs_per_task, "over_pairs_per_task", dropped)
    rows = gathered(pairs, heavy, prompt=("prompt_chat", "c_row"), chosen=("chosen_completion", "c_row"),
                    rejected=("completion", "r_row"), chosen_rewrites=("rewrites", "c_row"))
    return rows.select(
        "prompt", "chosen", "rejected", "tools", "instance_id",
        "split", pl.col("base_batch").alias("batch"),
        pl.col("source").alias("chosen_source"), "chosen_rollout_id", "rejected_rollout_id", "prompt_tokens",
        "chosen_tokens", "rejected_tokens", "chosen_hash", "rejected_hash", "chosen_rewrites",
        "chosen_hint_has_gold"), dropped


def sft_rows(chosen: pl.DataFrame, heavy: pl.DataFrame, config: "DatasetConfig", seen: pl.DataFrame | None = None
             ) -> tuple[pl.DataFrame, dict[str, int]]:
    """SFT_SCHEMA rows: every chosen candidate as unguided prompt + completion, in candidate order."""
    dropped: dict[str, int] = {}
    rows = _unseen(chosen, seen, ["instance_id", "completion_hash"], dropped, "seen_before")
    rows = gathered(rows, heavy, prompt_chat=("prompt_chat", "row"), completion=("chosen_completion", "row"),
                    rewrites=("rewrites", "row"))
    return rows.select(
        pl.concat_list("prompt_chat", "completion").alias("messages"), "tools", "instance_id",
        "split", pl.col("base_batch").alias("batch"),
        "source", "rollout_id", "reward", "prompt_tokens", "completion_tokens", "completion_hash", "rewrites",
        pl.col("hint_gold").alias("hint_has_gold")), dropped
