"""Which split a task is in, how many tokens a list of messages counts, and what a completion's hash is.

A task's split is drawn from its split group (sha256, never Python's salted `hash()`), so it never
moves between rebuilds, batches or machines, and every row of a task lands in one split. The group of
a synthesized task is its module (repo and file): a combined task is 2-3 bugs of one module and every
bug it was combined from is a task of that module too, so they share a split whatever other tasks
exist (a key drawn from the combined tasks present would move when a new one links two groups); and a
trajectory of a training task in that file shows the pristine code around every other bug of it. Any
other task is its own group (its instance id). Token counts decide which rows fit the length limits:
with a tokenizer they count its tokens of each message's text; without one, a deterministic character
heuristic that says so. A content hash (sha256 of `canonical` text) is what tells two completions
apart, in a batch and across them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Iterable, Mapping

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.core.records import Task

SPLIT_SALT = "handhold-split:"  # changing it moves every task: never change it
HEURISTIC = "heuristic: ceil(characters / 4) + 4 per message (no tokenizer set)"


def task_split(group: str, test_fraction: float) -> str:
    """'test' when the group's hash point in [0, 1) falls below `test_fraction`, else 'train'."""
    digest = hashlib.sha256((SPLIT_SALT + group).encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"


def split_group(task: Task) -> str:
    """The key a task's split is drawn from: 'repo:file' for a synthesized task, else its instance id."""
    provenance = json.loads(task.provenance or "{}")
    if task.source == "synth":
        if not provenance.get("file"):
            raise ValueError(f"task {task.instance_id}: synthesized, but its provenance names no 'file' (the "
                             "module its bug is in, which decides its split); synthesize it again")
        return f"{task.repo}:{provenance['file']}"
    return task.instance_id


def split_groups(tasks: Iterable[Task]) -> dict[str, str]:
    """{instance id: split group} of `tasks`."""
    return {t.instance_id: split_group(t) for t in tasks}


def combined_split_conflicts(tasks: Iterable[Task], test_fraction: float) -> list[str]:
    """Each combined task whose split differs from a part's (provenance 'parts' are the parts'
    'candidate_id'), as 'combined (split) vs part (split)'; a part not among `tasks` is not compared."""
    tasks = list(tasks)
    split = {t.instance_id: task_split(split_group(t), test_fraction) for t in tasks}
    by_candidate = {p["candidate_id"]: t.instance_id for t, p in _provenances(tasks) if p.get("candidate_id")}
    return [f"{t.instance_id} ({split[t.instance_id]}) vs {by_candidate[c]} ({split[by_candidate[c]]})"
            for t, p in _provenances(tasks) for c in p.get("parts", ())
            if c in by_candidate and split[by_candidate[c]] != split[t.instance_id]]


def _provenances(tasks: list[Task]) -> list[tuple[Task, dict]]:
    return [(t, json.loads(t.provenance or "{}")) for t in tasks]


def split_column(instance_ids: pl.Expr | str, test_fraction: float,
                 groups: Mapping[str, str] | None = None) -> pl.Expr:
    """The split of each row's task, as an expression (one hash per distinct id); `groups` maps an
    instance id to its split group (`split_groups`), an id it lacks is its own group."""
    expr = pl.col(instance_ids) if isinstance(instance_ids, str) else instance_ids
    return expr.map_batches(lambda ids: _splits(ids, test_fraction, groups or {}), return_dtype=pl.String)


def _splits(ids: pl.Series, test_fraction: float, groups: Mapping[str, str]) -> pl.Series:
    unique = ids.unique().to_list()
    splits = [task_split(groups.get(i, i), test_fraction) for i in unique]
    return ids.replace_strict(unique, splits, return_dtype=pl.String)


def canonical(messages: pl.Expr) -> pl.Expr:
    """Stored messages as one text: fields joined by \\x1f, messages by \\x1e (what the hashes cover)."""
    m = pl.element().struct
    return messages.list.eval(pl.concat_str(
        [m.field("role"), m.field("content").fill_null(""), m.field("tool_calls").fill_null(""),
         m.field("tool_call_id").fill_null("")], separator="\x1f")).list.join("\x1e").fill_null("")


def _sha256(texts: pl.Series) -> pl.Series:
    """sha256 hex of each string, hashed from the Arrow buffer in place (no Python string per row)."""
    offsets, data = _buffers(texts.fill_null(""))
    return pl.Series([hashlib.sha256(data[a:b]).hexdigest() for a, b in zip(offsets[:-1], offsets[1:])],
                     dtype=pl.String)


def _buffers(texts: pl.Series) -> tuple[np.ndarray, memoryview]:
    """(offsets, data): the strings as one Arrow buffer and where each starts and ends in it."""
    array = texts.rechunk().to_arrow(compat_level=pl.CompatLevel.oldest()).cast(pa.large_string())
    _, offsets, data = array.buffers()
    return np.frombuffer(offsets, dtype=np.int64)[array.offset:array.offset + len(array) + 1], memoryview(data or b"")


def digest(text: pl.Expr) -> pl.Expr:
    return text.map_batches(_sha256, return_dtype=pl.String)


def content_hashes(messages: pl.Series, first: pl.Series, rows_at_once: int = 1000) -> pl.Series:
    """sha256 hex of `canonical(messages[first:])` per row, null where `first` is null (rows no rule compares).

    Every hashed message is written once into one buffer, each ended by \\x1e: a row's canonical text
    is then one slice of it (less its last \\x1e), hashed in place. A few rows at a time keep that
    buffer small enough for the allocator to reuse (a large one costs fresh pages every time)."""
    parts = [_content_hashes(messages[a:a + rows_at_once], first[a:a + rows_at_once])
             for a in range(0, len(messages), rows_at_once)]
    return pl.concat(parts) if parts else pl.Series([], dtype=pl.String)


def _content_hashes(messages: pl.Series, first: pl.Series) -> pl.Series:
    lengths = messages.list.len().fill_null(0).cast(pl.Int64).to_numpy()
    wanted = first.is_not_null().to_numpy()
    skip = np.minimum(first.fill_null(0).cast(pl.Int64).to_numpy(), lengths)
    counts = np.where(wanted, lengths - skip, 0)  # messages hashed per row
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(row_of)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    keep = wanted[row_of] & (position >= skip[row_of])
    m = pl.col("m").struct
    text = (messages.explode(empty_as_null=False, keep_nulls=False).rename("m").to_frame().filter(pl.Series(keep))
            .select(pl.concat_str([m.field("role"), pl.lit("\x1f"), m.field("content").fill_null(""), pl.lit("\x1f"),
                                   m.field("tool_calls").fill_null(""), pl.lit("\x1f"),
                                   m.field("tool_call_id").fill_null(""), pl.lit("\x1e")])).to_series())
    offsets, data = _buffers(text)
    bounds = offsets[np.concatenate([[0], np.cumsum(counts)])].tolist()
    hashes = iter([hashlib.sha256(data[a:max(b - 1, a)]).hexdigest()  # less the last \x1e; no message: ''
                   for a, b, w in zip(bounds[:-1], bounds[1:], wanted) if w])
    return pl.Series([next(hashes) if w else None for w in wanted], dtype=pl.String)


Counter = Callable[[pl.Series], pl.Series]
"""Token count of each row of a list-of-messages column (stored Message form: tool calls as JSON text)."""


def _text(message: pl.Expr) -> pl.Expr:
    """A message's text as counted: its content, a line break, its tool calls (stored JSON)."""
    return pl.concat_str([message.struct.field("content").fill_null(""),
                          message.struct.field("tool_calls").fill_null("")], separator="\n")


def heuristic_tokens(messages: pl.Series) -> pl.Series:
    """ceil(characters / 4) over contents and tool calls, plus 4 per message for the role markers."""
    m = pl.element().struct
    length = m.field("content").str.len_chars().fill_null(0) + m.field("tool_calls").str.len_chars().fill_null(0)
    chars = messages.list.eval(length).list.sum().cast(pl.Int64)
    return ((chars + 3) // 4 + 4 * messages.list.len().cast(pl.Int64)).fill_null(0)


def tokenizer_counter(name_or_path: str, chunk: int = 4096) -> Counter:
    """Counts with a Hugging Face tokenizer: its tokens of every message's content and tool calls.

    Chat-template tokens (role markers, the tool schemas in the system turn) are not counted: set
    the limits with a margin for them.
    """
    from transformers import AutoTokenizer  # heavy: imported only when a tokenizer is configured

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)

    def count(messages: pl.Series) -> pl.Series:
        texts = (messages.rename("m").to_frame().with_row_index("row").explode("m")
                 .select("row", text=_text(pl.col("m")).fill_null("")))
        lengths: list[int] = []
        for start in range(0, texts.height, chunk):  # bounded memory on long batches
            batch = texts["text"][start:start + chunk].to_list()
            lengths += [len(ids) for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]]
        per_row = texts.with_columns(n=pl.Series(lengths, dtype=pl.Int64)).group_by("row").agg(pl.col("n").sum())
        full = pl.DataFrame({"row": pl.Series(range(messages.len()), dtype=pl.UInt32)})
        return full.join(per_row, on="row", how="left")["n"].fill_null(0)

    return count


def token_counter(tokenizer: str) -> tuple[Counter, str]:
    """(count, description): the tokenizer's counts, or the heuristic when `tokenizer` is ''."""
    if not tokenizer:
        return heuristic_tokens, HEURISTIC
    return tokenizer_counter(tokenizer), (f"tokenizer {tokenizer}: message contents and tool calls, "
                                          "template tokens not counted")
