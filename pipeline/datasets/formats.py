"""The rows' formats: chat messages in TRL's conversational form, the DPO, SFT and ActGuide schemas, and the
text of chat columns (what the leak and reference checks search).

Messages leave in TRL's conversational form: OpenAI chat dicts whose tool calls are structured
`{"id", "type": "function", "function": {"name", "arguments"}}` with `arguments` kept a JSON string, as
OpenAI sends it (why: `arguments_as_objects`).
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl
import pyarrow as pa

from pipeline.core.schema import BOOL, FLOAT, INT, STR, TURN_IDS, columns, record_schema

CALL_TYPE = pa.struct([pa.field("id", STR), pa.field("type", STR),
                       pa.field("function", pa.struct([pa.field("name", STR), pa.field("arguments", STR)]))])
CHAT_MESSAGE_TYPE = pa.struct([pa.field("role", STR, nullable=False), pa.field("content", STR),
                               pa.field("tool_calls", pa.list_(CALL_TYPE)), pa.field("tool_call_id", STR),
                               pa.field("reasoning_content", STR)])
"""A chat message as TRL and chat templates take it; `reasoning_content` is the model's returned reasoning
(null when it gave none), which templates that show reasoning render."""
CHAT = pa.list_(CHAT_MESSAGE_TYPE)
CALLS = pl.List(pl.Struct({"id": pl.String, "type": pl.String,
                           "function": pl.Struct({"name": pl.String, "arguments": pl.String})}))

DPO_SCHEMA = record_schema(columns(
    ("prompt", CHAT), ("chosen", CHAT), ("rejected", CHAT), ("tools", STR), ("instance_id", STR), ("split", STR),
    ("batch", STR), ("chosen_source", STR), ("chosen_rollout_id", STR), ("rejected_rollout_id", STR),
    ("prompt_tokens", INT), ("chosen_tokens", INT), ("rejected_tokens", INT), ("chosen_hash", STR),
    ("rejected_hash", STR), ("chosen_rewrites", STR), ("chosen_hint_has_gold", BOOL)), "3", "PreferencePair")
"""`chosen_rewrites`: JSON list of the chosen completion's prose rewrites ({"message", "reason", "removed"}),
'[]' when it is as sampled; `chosen_hint_has_gold`: the chosen attempt's hint held a line of the gold patch."""
DPO_DIVERGENCE_SCHEMA = record_schema(list(DPO_SCHEMA) + columns(("shared_turns", INT), ("shared_messages", INT)),
                                      "1", "DivergencePreferencePair")
"""A start pair (DPO_SCHEMA) cut where its attempts first differ (pipeline/datasets/divergence.py): `prompt` is the
unguided prompt and the `shared_messages` messages both completions began with (`shared_turns` of them assistant
turns), `chosen` and `rejected` the rest; the token counts move with the messages; the hashes are still those of the
whole completions, the pair's key."""
SFT_SCHEMA = record_schema(columns(
    ("messages", CHAT), ("tools", STR), ("instance_id", STR), ("split", STR), ("batch", STR), ("source", STR),
    ("rollout_id", STR), ("reward", FLOAT), ("prompt_tokens", INT), ("completion_tokens", INT),
    ("completion_hash", STR), ("rewrites", STR), ("hint_has_gold", BOOL)), "3", "SFTExample")
MEMBER_TYPE = pa.struct([pa.field("rollout_id", STR), pa.field("sampled_under", STR), pa.field("sample_index", INT),
                         pa.field("reward", FLOAT), pa.field("resolved", BOOL), pa.field("completion", CHAT),
                         pa.field("completion_tokens", INT), pa.field("logprobs", pa.list_(pa.list_(pa.float32()))),
                         pa.field("prompt_token_ids", TURN_IDS), pa.field("token_ids", TURN_IDS),
                         pa.field("policy_model", STR), pa.field("policy_revision", STR),
                         pa.field("chat_template_hash", STR), pa.field("temperature", FLOAT),
                         pa.field("top_p", FLOAT), pa.field("top_k", INT), pa.field("rewrites", STR)])
"""One attempt of an ActGuide group. `temperature`, `top_p`, `top_k`: the settings it was sampled at (Trajectory's:
-1 unknown, top_k 0 off; `pipeline.agent.identity.sampling_refusal` reads them); `rewrites`: JSON list of its
prose rewrites ('[]' as sampled), a rewritten member's `logprobs`, `prompt_token_ids` and `token_ids` null."""
ACTGUIDE_SCHEMA = record_schema(columns(
    ("prompt", CHAT), ("guided_prompt", CHAT), ("tools", STR), ("actions", STR), ("K", INT), ("k_star", INT),
    ("group_kind", STR), ("trajectories", pa.list_(MEMBER_TYPE)), ("instance_id", STR), ("split", STR),
    ("batch", STR), ("group_id", STR), ("prompt_tokens", INT), ("guided_prompt_tokens", INT)), "4",
    "ActionGuidanceGroup")  # 4: members' sampling settings and rewrites
"""One row per group with a learning signal (ActGuide-RL's Algorithm 1). `group_kind` 'mixed': a task's unguided
group whose rewards differ, as it is (plain GRPO; `guided_prompt` is the prompt it was sampled under, the
unguided one; `actions` '[]', K 0, k_star -1). 'rescued': a task no unguided attempt resolved, with an
action-guided group that did; `trajectories` holds the unguided and the guided attempts, `sampled_under`
'unguided' or 'guided'; a guided success failing the DPO and SFT rows' guidance checks is none of them, and a group
left without a success is no row. `logprobs` (assistant turns, tokens) of the behaviour policy, or null."""


def chat(messages: pl.Expr) -> pl.Expr:
    """Stored messages (tool calls as JSON text) as chat messages with structured tool calls."""
    return messages.list.eval(pl.element().struct.with_fields(pl.field("tool_calls").str.json_decode(CALLS)))


def arguments_as_objects(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose tool-call `arguments` are parsed objects, for templates that `tojson` them.

    Rows keep `arguments` a JSON string: a dict column would be widened by Arrow into one struct of
    every tool's argument names, null-filled, which templates then render. Qwen2.5's template does
    `tool_call.arguments | tojson` and would double-encode a string, so a training script calls this
    in its own tokenization step (not in a `Dataset.map`, whose output is Arrow again).
    """
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [{**c, "function": {**c["function"],
                                                        "arguments": json.loads(c["function"]["arguments"] or "{}")}}
                                     for c in calls]}
        out.append(m)
    return out


def row_text(chat_messages: pl.Expr) -> pl.Expr:
    """Every string a chat-message list puts in a row: contents, tool names, tool arguments."""
    m, call = pl.element().struct, pl.element().struct.field("function").struct
    calls = m.field("tool_calls").list.eval(pl.concat_str([call.field("name"), call.field("arguments")],
                                                          separator="\x1f")).list.join("\x1e")
    return chat_messages.list.eval(pl.concat_str([m.field("content").fill_null(""), calls.fill_null("")],
                                                 separator="\x1f")).list.join("\x1e").fill_null("")


def mentions(needles: pl.Series, *chats: pl.Series) -> pl.Series:
    """Whether each row's needle (a non-empty text) is in the `row_text`s of its chat-message lists joined
    by \\x1e. Searched field by field: a needle without \\x1e or \\x1f cannot straddle two fields."""
    frame = pl.DataFrame({"needle": needles, **{f"m{i}": c for i, c in enumerate(chats)}})
    if needles.str.contains("[\x1e\x1f]").any():
        text = pl.concat_str([row_text(pl.col(f"m{i}")) for i in range(len(chats))], separator="\x1e")
        return frame.select(text.str.contains(pl.col("needle"), literal=True)).to_series()
    m, call = pl.col("m").struct, pl.col("call").struct.field("function").struct
    hits = []
    for i in range(len(chats)):
        messages = frame.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("i"), "needle",
                                m=f"m{i}").explode("m", keep_nulls=False)
        calls = messages.select("i", "needle", call=m.field("tool_calls")).explode("call", keep_nulls=False)
        whole = call.field("name").is_not_null() & call.field("arguments").is_not_null()  # else row_text skips it
        hits += [messages.filter(_holds(m.field("content")))["i"],
                 calls.filter(whole & (_holds(call.field("name")) | _holds(call.field("arguments"))))["i"]]
    return pl.Series(range(frame.height), dtype=pl.UInt32).is_in(pl.concat(hits).implode())


def _holds(text: pl.Expr) -> pl.Expr:
    return text.fill_null("").str.contains(pl.col("needle"), literal=True)
