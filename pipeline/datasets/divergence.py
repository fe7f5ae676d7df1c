"""The DPO form cut at divergence (config `dpo_divergence`): each start pair (`pairs.dpo_rows`) cut at the
first turn where its two attempts differ, the turns both took moved into the prompt.

TRL's DPOTrainer scores a whole completion; in a start pair the turns both attempts took alike are targets on
both sides. Cut at the divergence, they are context (masked, as every prompt token is) and the preference speaks
of the first decision where the attempts parted.

The rule (`divergence_cut`):
- Two messages are the same turn when their roles, texts (`content` and `reasoning_content`, None as '') and,
  for an assistant turn, tool calls (in order: name and arguments, the arguments compared as parsed JSON, so key
  order and spacing do not count; text that is no JSON as it is) are equal. A tool observation compares its
  content. Tool-call ids are not compared: an id names a call, it is no action (the prompt keeps the chosen
  attempt's). So the prompt is one context both attempts really saw: the rejected one is unguided, so it is the
  unguided policy's own.
- The attempts share their longest common prefix of same turns. When it covers one whole completion (one is a
  prefix of the other), nothing divergent is left on that side: no row, counted as `prefix_pair`.
- The cut is at the last message, at or before the first differing one, where both hold an assistant turn (0
  when none: the start form). The prompt then ends at its start or after a tool observation, and each completion
  starts with an assistant turn. When an action's observations differ (same call, other output), both
  completions start at that action's turn.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.datasets.formats import DPO_DIVERGENCE_SCHEMA
from pipeline.datasets.pairs import drop
from pipeline.datasets.splits import Counter

COUNTED = pl.List(pl.Struct({"content": pl.String, "tool_calls": pl.String}))
"""Messages as a Counter reads them: content, tool calls as stored (JSON text)."""


def turn_key(message: dict) -> tuple:
    """What two attempts must share for a message to be the same turn (see the module docstring)."""
    calls = tuple((call["function"]["name"], _arguments(call["function"]["arguments"]))
                  for call in message.get("tool_calls") or ())
    return message["role"], message.get("content") or "", message.get("reasoning_content") or "", calls


def _arguments(text: str | None) -> str:
    """Tool-call arguments as canonical JSON (sorted keys, no spacing); text that is no JSON as it is."""
    try:
        return json.dumps(json.loads(text or "{}"), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text or ""


def divergence_cut(chosen: list[dict], rejected: list[dict]) -> int | None:
    """How many leading messages of both completions the prompt takes; None when one is a prefix of the other."""
    ends = min(len(chosen), len(rejected))
    same = 0
    while same < ends and turn_key(chosen[same]) == turn_key(rejected[same]):
        same += 1
    if same == ends:
        return None
    return max((i for i in range(same + 1) if chosen[i]["role"] == rejected[i]["role"] == "assistant"), default=0)


def divergence_cuts(chosen: pl.Series, rejected: pl.Series) -> list[int | None]:
    """`divergence_cut` of each row's two chat-form completions, found a message position at a time over the pairs
    still alike (most part at their first turn), in polars: no completion becomes Python objects (that cost more
    than writing the rows did). Python reads only messages alike in all but their tool calls (the arguments may
    differ in spelling alone)."""
    ends = pl.DataFrame({"c": chosen.list.len(), "r": rejected.list.len()}).select(
        pl.min_horizontal("c", "r").fill_null(0)).to_series().to_numpy()
    cuts: list[int | None] = [None] * len(ends)
    last = np.zeros(len(ends), dtype=np.int64)  # each pair's last alike assistant turn before the position
    rows = np.flatnonzero(ends > 0)  # the pairs `sides` hold
    sides = (chosen, rejected) if len(rows) == len(ends) else (chosen.gather(rows), rejected.gather(rows))
    alive, position = np.ones(len(rows), dtype=bool), 0  # alive: alike before the position
    while alive.any():
        alike, assistant = _alike(*(side.list.get(position, null_on_oob=True) for side in sides), alive)
        for i in np.flatnonzero(alive & ~alike):
            cuts[rows[i]] = position if assistant[i] else int(last[rows[i]])
        last[rows[alive & alike & assistant]] = position
        alive &= alike & (ends[rows] > position + 1)  # alike to the end of the shorter one: None (a prefix pair)
        if alive.sum() * 2 < len(rows):  # keep the fewer pairs left (copies only when they halve: the sum stays small)
            sides, rows, alive = tuple(side.filter(pl.Series(alive)) for side in sides), rows[alive], alive[alive]
        position += 1
    return cuts


def _alike(chosen: pl.Series, rejected: pl.Series, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the same turn by `turn_key`, both the assistant's) of each row's two messages (CHAT structs, null past the
    end); `wanted`: the rows whose answer counts."""
    c, r = pl.col("c").struct, pl.col("r").struct
    calls = [pl.when(side.field("tool_calls").list.len() > 0).then(  # none: null or empty, alike
        side.field("tool_calls").list.eval(pl.element().struct.field("function"))) for side in (c, r)]
    flags = pl.DataFrame({"c": chosen, "r": rejected}).select(
        text=(c.field("role") == r.field("role"))
        & (c.field("content").fill_null("") == r.field("content").fill_null(""))
        & (c.field("reasoning_content").fill_null("") == r.field("reasoning_content").fill_null("")),
        calls=calls[0].eq_missing(calls[1]),
        assistant=(c.field("role") == "assistant") & (r.field("role") == "assistant")).fill_null(False)
    text, same_calls = flags["text"].to_numpy(), flags["calls"].to_numpy()
    alike = text & same_calls
    for i in np.flatnonzero(wanted & text & ~same_calls):  # the same calls spelt otherwise are the same action
        alike[i] = turn_key(chosen[int(i)]) == turn_key(rejected[int(i)])
    return alike, flags["assistant"].to_numpy()


def _counted(side: pl.Series, cuts: np.ndarray) -> pl.Series:
    """The first `cuts` messages of each completion in the form a Counter reads (COUNTED: tool calls back to JSON
    text, as `record_parts` stores them); only the shared messages are read, into Python."""
    sharing = np.flatnonzero(cuts)
    shared = pl.DataFrame({"m": side.gather(sharing), "cut": cuts[sharing]}).select(
        pl.col("m").list.head(pl.col("cut"))).to_series().explode(empty_as_null=False, keep_nulls=False)
    calls = [json.dumps(c) if c else None for c in shared.struct.field("tool_calls").to_list()]
    messages = pl.DataFrame({"content": shared.struct.field("content"),
                             "tool_calls": pl.Series(calls, dtype=pl.String)})
    offsets = pl.Series(np.concatenate([[0], np.cumsum(cuts)]).astype(np.int64))  # polars: pa.array imports pandas
    return pl.from_arrow(pa.LargeListArray.from_arrays(offsets.to_arrow(), messages.to_struct().to_arrow()))


def divergence_rows(dpo: pl.DataFrame, count: Counter) -> tuple[pl.DataFrame, dict[str, int]]:
    """DPO_DIVERGENCE_SCHEMA rows of start pairs (DPO_SCHEMA rows), in their order, and the pairs left out by
    reason. `count` counts the shared messages, moved from each completion's tokens to the prompt's."""
    cuts = divergence_cuts(dpo["chosen"], dpo["rejected"])
    shared = np.array([cut or 0 for cut in cuts], dtype=np.int64)
    moved = {side: count(_counted(dpo[side], shared)) for side in ("chosen", "rejected")}
    rows = dpo.with_columns(cut=pl.Series(cuts, dtype=pl.Int64), chosen_moved=moved["chosen"],
                            rejected_moved=moved["rejected"])
    dropped: dict[str, int] = {}
    rows = drop(rows, pl.col("cut").is_null(), "prefix_pair", dropped)
    cut, head = pl.col("cut"), pl.col("chosen").list.head(pl.col("cut"))
    rows = rows.with_columns(  # every expression reads the start pair's columns
        prompt=pl.concat_list("prompt", head), chosen=pl.col("chosen").list.slice(cut),
        rejected=pl.col("rejected").list.slice(cut), shared_messages=cut,
        shared_turns=head.list.eval(pl.element().struct.field("role") == "assistant").list.sum().cast(pl.Int64),
        prompt_tokens=pl.col("prompt_tokens") + pl.col("chosen_moved"),
        chosen_tokens=pl.col("chosen_tokens") - pl.col("chosen_moved"),
        rejected_tokens=pl.col("rejected_tokens") - pl.col("rejected_moved"))
    return rows.select(DPO_DIVERGENCE_SCHEMA.names), dropped


PAIR_KEY = ("instance_id", "chosen_hash", "rejected_hash")
SUMMARY_COLUMNS = PAIR_KEY + ("shared_turns", "shared_messages")
"""The columns of the `dpo_divergence` rows `divergence_summary` reads (of the `dpo` rows: PAIR_KEY)."""


def divergence_summary(start: pl.DataFrame | None, cut: pl.DataFrame) -> dict[str, float | int]:
    """The divergence form's pairs, those sharing a prefix, their mean shared turns and messages, and the start
    pairs (`dpo` rows, `start`) it left out; `cut`: the `dpo_divergence` rows."""
    sharing = cut.filter(pl.col("shared_messages") > 0)
    left_out = start.join(cut, on=list(PAIR_KEY), how="anti").height if start is not None else 0
    return {"pairs": cut.height, "sharing": sharing.height,
            "mean_shared_turns": float(sharing["shared_turns"].mean() or 0.0),
            "mean_shared_messages": float(sharing["shared_messages"].mean() or 0.0), "left_out": left_out}


def _rows(by_split: dict[str, pa.Table] | None, columns: tuple[str, ...]) -> pl.DataFrame | None:
    """`columns` of a config's rows, every split; None when it has none."""
    tables = [t.select(list(columns)) for t in (by_split or {}).values() if t.num_rows]
    return pl.from_arrow(pa.concat_tables(tables, promote_options="permissive")) if tables else None


def divergence_card_section(splits: dict[str, dict[str, pa.Table]]) -> str:
    """The card's section on the exported `dpo_divergence` rows (`divergence_summary`); '' without them."""
    cut = _rows(splits.get("dpo_divergence"), SUMMARY_COLUMNS)
    if cut is None:
        return ""
    s = divergence_summary(_rows(splits.get("dpo"), PAIR_KEY), cut)
    return ("## DPO pairs cut at the divergence\n\n"
            "Config `dpo_divergence`: each `dpo` pair cut at the first turn where its two attempts differ (same "
            "text, same tool calls with the same arguments, same observations before it); the turns both took "
            "are in the prompt (context, never a target), and each completion starts with the first assistant "
            "turn after them.\n\n"
            f"Pairs: {s['pairs']}; sharing a prefix: {s['sharing']}; mean shared length of those: "
            f"{s['mean_shared_turns']:.2f} turns ({s['mean_shared_messages']:.2f} messages). "
            f"Pairs of `dpo` left out, one completion a prefix of the other: {s['left_out']}.")
