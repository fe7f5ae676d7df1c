"""The checks a guided success passes before it is trained under the unguided prompt (pipeline.guidance.references).

`guided_checks` flags, for every guided success (probes included), whether its prose refers to its guidance,
whether it edited a file no tool output had shown (ungrounded), and whether its hint held a line of the gold
patch; with `guidance_references: rewrite` it also writes the completion a chosen row or an ActGuide member
takes, the referring prose removed and each rewrite recorded. The counts are per guidance kind.
`failed_checks` says which flagged successes every kind of row leaves out.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl

from pipeline.agent.textformat import OPEN
from pipeline.guidance.references import (REFERENCE_WORDS, TERM, guidance_references, hint_leaks_gold, hint_terms,
                                          read_turns, ungrounded, without_references)

if TYPE_CHECKING:
    from pipeline.datasets.config import DatasetConfig

FLAGS = ("refers", "ungrounded", "hint_gold")
REFERENCE_COUNT = {"drop": "references_dropped", "rewrite": "references_rewritten"}
GROUPS_LOST = "actguide_groups_lost"
"""The checks' key (no guidance kind) counting rescued ActGuide groups whose every success failed `failed_checks`."""


def _shown_actions(actions: list[dict], k: int) -> list[dict]:
    """The reference actions a k-prefix hint showed, args decoded."""
    return [{"name": a["name"], "args": json.loads(a["args"] or "{}")} for a in actions[:max(k, 0)]]


def _prompt_text(prompt: list[dict]) -> str:
    return "\n".join(m["content"] or "" for m in prompt)


def guided_checks(t: pl.DataFrame, heavy: pl.DataFrame, config: "DatasetConfig", gold: dict[str, str] | None
                  ) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, int]]:
    """(t with FLAGS columns, heavy with `chosen_completion` and `rewrites` (JSON) columns, counts per kind).
    The prose and edit checks (Python, message by message) run only on the successes `may_flag` keeps."""
    successes = t.filter((pl.col("origin") != "unguided") & (pl.col("reward") > 0))
    prompt_texts = heavy["prompt_chat"].gather(successes["row"]).list.eval(
        pl.element().struct.field("content").fill_null("")).list.join("\n")
    maybe = may_flag(heavy["completion"].gather(successes["row"]), successes["guidance_text"], prompt_texts)
    checked = successes["row"].filter(maybe).to_list()
    completions = dict(zip(checked, heavy["completion"].gather(checked).to_list()))
    prompts = dict(zip(checked, prompt_texts.filter(maybe).to_list()))
    flags: dict[str, list[bool]] = {name: [] for name in FLAGS}
    rewritten: dict[int, tuple[list[dict], list[dict]]] = {}
    counts: dict[str, int] = {}
    shown_actions = pl.col("guidance_actions").list.head(pl.col("guidance_k").clip(lower_bound=0))  # the hint's
    for row, kind, hint, actions, k, task in successes.select(
            "row", "guidance_kind", "guidance_text", shown_actions, "guidance_k", "instance_id").iter_rows():
        completion = completions.get(row)
        turns = read_turns(completion) if completion is not None else []
        refers = bool(turns) and bool(guidance_references(completion, hint, prompts[row], turns))
        row_flags = {"refers": refers, "ungrounded": bool(turns) and bool(ungrounded(completion, turns)),
                     "hint_gold": hint_leaks_gold(hint, _shown_actions(actions, k), (gold or {}).get(task, ""))}
        for name, value in row_flags.items():
            flags[name].append(value)
        if refers and config.guidance_references == "rewrite":
            rewritten[row] = without_references(completion, hint, prompts[row])
        for key, on in [(REFERENCE_COUNT[config.guidance_references], refers),
                        ("ungrounded_kept" if config.keep_ungrounded else "ungrounded_left_out",
                         row_flags["ungrounded"]), ("hint_has_gold", row_flags["hint_gold"])]:
            counts[f"{key}.{kind}"] = counts.get(f"{key}.{kind}", 0) + on
    marked = successes.select("row", *[pl.Series(name, values, dtype=pl.Boolean) for name, values in flags.items()])
    t = t.join(marked, on="row", how="left", maintain_order="left").with_columns(pl.col(FLAGS).fill_null(False))
    return t, _with_rewrites(heavy, rewritten), counts


def failed_checks(config: "DatasetConfig") -> list[tuple[str, pl.Expr]]:
    """(reason, mask) of the flagged guided successes no row trains on, DPO, SFT and ActGuide alike: prose
    referring to guidance under `guidance_references: drop`, ungrounded edits unless `keep_ungrounded`."""
    return [("refers_to_guidance", pl.col("refers") & (config.guidance_references == "drop")),
            ("ungrounded", pl.col("ungrounded") & (not config.keep_ungrounded))]


def may_flag(completions: pl.Series, hints: pl.Series | list[str], prompt_texts: pl.Series | list[str]) -> pl.Series:
    """Whether `guidance_references` or `ungrounded` could find anything in each chat-form completion (a superset
    of those they flag, found in polars): no, when no assistant turn holds a text-format call, a non-ASCII
    character, a word of REFERENCE_WORDS (so no phrase matches) or a term of its hint (`hint_terms`), and no call
    could edit a file (none of the `edit` tool, no arguments holding "sed" or a JSON escape that could spell it)."""
    frame = pl.DataFrame({"m": completions}).with_row_index("i").explode("m", keep_nulls=False)
    m, content = pl.col("m").struct, pl.col("content")
    said = frame.filter(m.field("role") == "assistant").select("i", content=m.field("content").fill_null(""),
                                                               call=m.field("tool_calls"))
    odd = said.filter(content.str.contains(OPEN, literal=True) | content.str.contains(r"[^\x00-\x7f]")
                      | content.str.contains_any(list(REFERENCE_WORDS), ascii_case_insensitive=True))["i"]
    call = pl.col("call").struct.field("function").struct
    arguments = call.field("arguments").fill_null("")
    edits = said.select("i", "call").explode("call", keep_nulls=False).filter(
        (call.field("name") == "edit") | arguments.str.contains("sed", literal=True)
        | arguments.str.contains("\\u", literal=True))["i"]
    prose = said.group_by("i").agg(content.str.join("\n").str.to_lowercase())  # ASCII here, or already in `odd`
    rows = pl.Series("i", range(len(completions)), dtype=pl.UInt32)
    return rows.is_in(pl.concat([odd, edits, _naming_hint_terms(prose, hints, prompt_texts)]).implode())


def _naming_hint_terms(prose: pl.DataFrame, hints: pl.Series | list[str], prompt_texts: pl.Series | list[str]
                       ) -> pl.Series:
    """The rows (`i`) whose prose (lower case) holds a term of its hint (`hint_terms`). Polars finds the few rows
    that might (a term of the hint in the prose, not in an ASCII prompt: Rust's regex and lower case agree with
    Python's on ASCII text), `hint_terms` decides on those and on the rows whose hint is not ASCII."""
    rows = pl.DataFrame({"hint": hints, "prompt": prompt_texts}, schema={"hint": pl.String, "prompt": pl.String}
                        ).with_row_index("i").join(prose, on="i").filter(pl.col("hint") != "")
    plain, term = ~pl.col("hint").str.contains(r"[^\x00-\x7f]"), pl.col("term")
    terms = rows.filter(plain).select(
        "i", "content", prompt=pl.when(pl.col("prompt").str.contains(r"[^\x00-\x7f]")).then(pl.lit(None))
        .otherwise(pl.col("prompt").str.to_lowercase()), term=pl.col("hint").str.extract_all(TERM.pattern)
    ).explode("term", keep_nulls=False).with_columns(term=pl.when(term.str.starts_with("`")).then(
        term.str.slice(1, term.str.len_chars() - 2)).otherwise(term).str.to_lowercase())
    seen = terms.filter(pl.col("content").str.contains(term, literal=True)).filter(
        ~pl.col("prompt").str.contains(term, literal=True).fill_null(False))
    maybe = rows.join(seen.select("i").unique(), on="i", how="semi").vstack(rows.filter(~plain))
    return pl.Series([i for i, hint, prompt, text in maybe.select("i", "hint", "prompt", "content").iter_rows()
                      if any(t.lower() in text for t in hint_terms(hint, prompt))], dtype=pl.UInt32)


def _with_rewrites(heavy: pl.DataFrame, rewritten: dict[int, tuple[list[dict], list[dict]]]) -> pl.DataFrame:
    """heavy plus `chosen_completion` (the completion, or its rewrite) and `rewrites` (JSON, '[]' when none)."""
    completion, notes = heavy["completion"], pl.Series("rewrites", ["[]"] * heavy.height, dtype=pl.String)
    parts, start = [], 0
    for row in sorted(rewritten):  # slices around each rewritten row: polars cannot scatter nested values
        parts += [completion[start:row], pl.Series([rewritten[row][0]], dtype=completion.dtype)]
        start = row + 1
    chosen = pl.concat(parts + [completion[start:]]) if parts else completion
    if rewritten:
        rows = pl.Series(list(rewritten), dtype=pl.UInt32)
        notes = notes.scatter(rows, pl.Series([json.dumps(r) for _, r in rewritten.values()], dtype=pl.String))
    return heavy.with_columns(chosen_completion=chosen, rewrites=notes)


def _split_prompt(messages: list[dict]) -> tuple[str, list[dict]]:
    """(prompt text, completion) of an SFT row's messages: the completion starts at the first assistant turn."""
    start = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return _prompt_text(messages[:start]), messages[start:]


def rows_referring_to_guidance(rows: pl.DataFrame, trajectories: pl.DataFrame) -> list[str]:
    """Rollout ids of DPO (`chosen`) or SFT (`messages`) rows from guided attempts whose completion still
    refers to the guidance of the attempt it came from; what the blocking dataset check fails on."""
    dpo = "chosen" in rows.columns
    rollout, source = ("chosen_rollout_id", "chosen_source") if dpo else ("rollout_id", "source")
    hints = dict(zip(trajectories["rollout_id"].to_list(), trajectories["guidance_text"].to_list())) \
        if trajectories.height else {}
    guided = rows.filter(pl.col(source) != "unguided")
    found = []
    for rid, *chats in guided.select(rollout, *(["prompt", "chosen"] if dpo else ["messages"])).rows():
        text, completion = (_prompt_text(chats[0]), chats[1]) if dpo else _split_prompt(chats[0])
        if guidance_references(completion, hints.get(rid) or "", text):
            found.append(rid)
    return found


def manifest_checks(manifest: dict) -> dict[str, int]:
    """The build's `checks` summed over the batches of a datasets manifest (`manifest.read_manifest`)."""
    total: dict[str, int] = {}
    for entry in manifest.get("batches", {}).values():
        for key, value in entry.get("checks", {}).items():
            total[key] = total.get(key, 0) + value
    return total
