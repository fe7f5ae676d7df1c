"""Which split a task is in, and how many tokens a list of messages counts.

A task's split depends on its instance id alone (sha256, never Python's salted `hash()`), so it
never moves between rebuilds, batches or machines, and every row of a task lands in one split.
Token counts decide which rows fit the length limits: with a tokenizer they count its tokens of
each message's text; without one, a deterministic character heuristic that says so.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import polars as pl

SPLIT_SALT = "handhold-split:"  # changing it moves every task: never change it
HEURISTIC = "heuristic: ceil(characters / 4) + 4 per message (no tokenizer set)"


def task_split(instance_id: str, test_fraction: float) -> str:
    """'test' when the task's hash point in [0, 1) falls below `test_fraction`, else 'train'."""
    digest = hashlib.sha256((SPLIT_SALT + instance_id).encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"


def split_column(instance_ids: pl.Expr | str, test_fraction: float) -> pl.Expr:
    """The split of each row's task, as an expression (one hash per distinct id)."""
    expr = pl.col(instance_ids) if isinstance(instance_ids, str) else instance_ids
    return expr.map_batches(lambda ids: _splits(ids, test_fraction), return_dtype=pl.String)


def _splits(ids: pl.Series, test_fraction: float) -> pl.Series:
    unique = ids.unique().to_list()
    return ids.replace_strict(unique, [task_split(i, test_fraction) for i in unique], return_dtype=pl.String)


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
