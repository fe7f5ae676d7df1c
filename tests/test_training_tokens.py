"""Which tokens ActGuide scores, on the real Qwen2.5 and Qwen3 chat templates shipped with TRL and the tiny
tokenizer: each turn in the context it was sampled in, its sampled tokens through the end of turn only."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer
from trl.chat_template_utils import qwen2_5_chat_template, qwen3_chat_template

from training.tiny_model import build_tiny_model
from training.tokens import Turn, rendered_turns, segments

PROMPT = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix add."}]
GUIDED = [PROMPT[0], {"role": "user", "content": "Fix add. Hint: look at calc.py."}]


def call(call_id: str, command: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": {"command": command}}}


THREE_TURNS = [
    {"role": "assistant", "content": "Looking.", "reasoning_content": "Where is add?", "tool_calls": [call("c1", "ls")]},
    {"role": "tool", "tool_call_id": "c1", "content": "calc.py"},
    {"role": "assistant", "content": "Reading.", "reasoning_content": "Open it.",
     "tool_calls": [call("c2", "cat calc.py")]},
    {"role": "tool", "tool_call_id": "c2", "content": "def add(a, b): return a - b"},
    {"role": "assistant", "content": "Fixed.", "reasoning_content": "Minus should be plus."},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def tokenizer_with(tiny_dir, template: str):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.chat_template = template
    return tokenizer


def test_qwen2_5_turns_are_what_the_policy_sampled_and_share_one_forward(tiny_dir):
    tokenizer = tokenizer_with(tiny_dir, qwen2_5_chat_template)
    turns = rendered_turns(tokenizer, GUIDED, PROMPT, THREE_TURNS, None)
    assert [tokenizer.decode(t.ids) for t in turns] == [
        'Looking.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>',
        'Reading.\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat calc.py"}}\n</tool_call><|im_end|>',
        "Fixed.<|im_end|>"]  # no header, no newline after the end of turn; the end of turn is scored
    assert all(tokenizer.decode(t.sampled_context).endswith("<|im_start|>assistant\n") for t in turns)
    assert all("Hint" in tokenizer.decode(t.sampled_context) and "Hint" not in tokenizer.decode(t.unguided_context)
               for t in turns)
    (segment,) = segments(turns)  # Qwen2.5 renders earlier turns as sampled: one forward scores all three
    scored = [tok for tok, bit in zip(segment.response_ids, segment.mask) if bit]
    assert scored == [tok for t in turns for tok in t.ids]
    between = tokenizer.decode([tok for tok, bit in zip(segment.response_ids, segment.mask) if not bit])
    assert between == ("\n<|im_start|>user\n<tool_response>\ncalc.py\n</tool_response><|im_end|>\n"
                       "<|im_start|>assistant\n"
                       "\n<|im_start|>user\n<tool_response>\ndef add(a, b): return a - b\n</tool_response><|im_end|>\n"
                       "<|im_start|>assistant\n")


def test_qwen3_scores_each_turn_with_the_reasoning_it_was_sampled_after(tiny_dir):
    """A plain user message (a format error) makes Qwen3 drop earlier reasoning from later contexts: the turns
    before it keep theirs in their own forward, the turn after it is scored in the context without it."""
    tokenizer = tokenizer_with(tiny_dir, qwen3_chat_template)
    trajectory = THREE_TURNS[:3] + [{"role": "user", "content": "Format error: call one tool."}, THREE_TURNS[4]]
    turns = rendered_turns(tokenizer, PROMPT, PROMPT, trajectory, None)
    texts = [tokenizer.decode(t.ids) for t in turns]
    assert texts[0].startswith("<think>\nWhere is add?\n</think>\n\nLooking.") and texts[0].endswith("<|im_end|>")
    assert texts[2] == "<think>\nMinus should be plus.\n</think>\n\nFixed.<|im_end|>"
    last_context = tokenizer.decode(turns[2].sampled_context)
    assert "Where is add?" not in last_context and "Looking." in last_context  # reasoning dropped, answer kept
    assert "Where is add?" in tokenizer.decode(turns[1].sampled_context)
    first, second = segments(turns)
    assert sum(first.mask) == len(turns[0].ids) + len(turns[1].ids) and second.mask == [1] * len(turns[2].ids)


def test_a_turn_whose_context_is_not_an_extension_starts_a_new_segment():
    turns = [Turn([1, 2], [1, 2], [3, 4], None), Turn([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [6], None),
             Turn([1, 2, 9], [1, 2, 9], [7], None)]
    first, second = segments(turns)
    assert (first.prompt_ids, first.response_ids, first.mask) == ([1, 2], [3, 4, 5, 6], [1, 1, 0, 1])
    assert (second.prompt_ids, second.response_ids, second.mask) == ([1, 2, 9], [7], [1])
    guided = [Turn([8, 1, 2], [1, 2], [3], None), Turn([8, 1, 2, 3, 5], [1, 2, 3, 5], [6], None)]
    (merged,) = segments(guided)  # the hint swapped out of both contexts alike: still one segment
    assert (merged.sampled_prompt_ids, merged.prompt_ids, merged.response_ids) == ([8, 1, 2], [1, 2], [3, 5, 6])
