"""What a training row teaches is what the policy is asked and what it parses back: on the tiny offline model,
each assistant turn of an exported SFT row is rendered in exactly the context the local HF policy builds for
that turn, its targets decode to the same message the rollout stored, and they end on a token the policy
stops at. A template that renders tools or tool calls differently for training and for the policy, a
tool-call format the policy cannot parse, or an end of turn it never stops on, fails here without training."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from pipeline.agent.heuristic import HeuristicPolicy
from pipeline.agent.hf_policy import LocalHFPolicy, LocalHFPolicyConfig, parse_tool_calls
from pipeline.agent.loop import AgentConfig, uses_text_format
from pipeline.datasets import DatasetConfig, build_rows
from tests.test_datasets_build import TASK_T1
from training.masking import training_chat_template
from training.sft import tokenize_row


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return str(tiny_model)


def spans(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s."""
    out, start = [], None
    for i, bit in enumerate(mask + [0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            out, start = out + [(start, i)], None
    return out


def calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


def test_the_tiny_model_is_prompted_in_the_tool_format_of_the_rollouts_it_learns_from(tiny):
    """The heuristic's rollouts are native tool calls (system prompt without the text format's instructions,
    observations as `tool` turns); a policy on the tiny model must be prompted the same way."""
    hf = LocalHFPolicy(LocalHFPolicyConfig(model_path=tiny, max_new_tokens=1))
    config = AgentConfig()
    assert uses_text_format(config, hf.native_tools) == uses_text_format(config, HeuristicPolicy.native_tools)


def test_each_trained_turn_is_the_policys_context_and_parses_back_to_the_stored_message(tiny):
    rows = build_rows(TASK_T1, DatasetConfig(pairs_per_task=50, test_fraction=0.0)).sft.to_dicts()
    row = max(rows, key=lambda r: len(r["messages"]))  # the one with tool calls and observations
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    out = tokenize_row(row, tokenizer, training_chat_template(tokenizer))
    ids, mask = out["input_ids"], out["assistant_masks"]
    assistant = [i for i, m in enumerate(row["messages"]) if m["role"] == "assistant"]
    targets = spans(mask)
    assert len(targets) == len(assistant) >= 2
    hf = LocalHFPolicy(LocalHFPolicyConfig(model_path=tiny, temperature=0.0, max_new_tokens=1))
    tools = json.loads(row["tools"])
    for index, (start, end) in zip(assistant, targets):
        turn = hf.act(row["messages"][:index], tools)
        assert list(turn.prompt_ids) == ids[:start], f"turn at message {index}: the policy's context differs"
        assert ids[end - 1] in hf._stop_ids()  # the last target is the end of turn the policy stops on
        parsed = parse_tool_calls(tokenizer.decode(ids[start:end], skip_special_tokens=True))
        stored = row["messages"][index]
        assert parsed["content"] == stored["content"] and calls(parsed) == calls(stored)
