"""LocalHFPolicy on the offline tiny model, and the tiny model builder itself."""

from __future__ import annotations

import json

import pytest

from pipeline.agent.hf_policy import LocalHFPolicy, LocalHFPolicyConfig, parse_tool_calls, template_messages
from pipeline.agent.policy import Policy
from training.tiny_model import CHAT_TEMPLATE, MODEL_FILES, build_tiny_model

CHAT = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "Looking.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
]
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command.",
                                         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}


def policy(path, **overrides) -> LocalHFPolicy:
    return LocalHFPolicy(LocalHFPolicyConfig(model_path=str(path), **{"max_new_tokens": 12, **overrides}))


def test_build_is_idempotent(tiny_model):
    stamps = {name: (tiny_model / name).stat().st_mtime_ns for name in MODEL_FILES}
    assert build_tiny_model(tiny_model) == tiny_model
    assert {name: (tiny_model / name).stat().st_mtime_ns for name in MODEL_FILES} == stamps
    assert not [p for p in tiny_model.parent.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_a_tiny_model_built_with_another_template_is_built_again(tiny_model, tmp_path):
    import shutil

    old = tmp_path / "model"
    shutil.copytree(tiny_model, old)
    (old / "chat_template.jinja").write_text(CHAT_TEMPLATE.replace("<tools>", "<functions>"))
    assert build_tiny_model(old) == old and (old / "chat_template.jinja").read_text() == CHAT_TEMPLATE


def test_a_tiny_model_of_another_depth_is_built_again(tiny_model, tmp_path):
    import json
    import shutil

    from training.tiny_model import LAYERS

    old = tmp_path / "model"
    shutil.copytree(tiny_model, old)
    config = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**config, "num_hidden_layers": LAYERS + 1}))
    assert build_tiny_model(old) == old
    assert json.loads((old / "config.json").read_text())["num_hidden_layers"] == LAYERS


def test_build_refuses_a_directory_holding_something_else(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="no complete tiny model"):
        build_tiny_model(tmp_path)


def test_template_renders_tool_calls_and_tool_turns(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = tokenizer.apply_chat_template(template_messages(CHAT), tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou fix bugs.<|im_end|>\n<|im_start|>user\nFix it.<|im_end|>\n"
        '<|im_start|>assistant\nLooking.\n<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}'
        "</tool_call><|im_end|>\n<|im_start|>tool\na.py b.py<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 5
    assert tokenizer.decode(ids) == text
    with_tools = tokenizer.apply_chat_template(template_messages(CHAT[:2]), tools=[BASH, BASH], tokenize=False)
    schema = json.dumps(BASH)
    assert with_tools == (f"<|im_start|>system\nYou fix bugs.\n\n# Tools\n\n<tools>\n{schema}\n{schema}\n</tools>"
                          "<|im_end|>\n<|im_start|>user\nFix it.<|im_end|>\n")
    assert tokenizer.apply_chat_template(CHAT[1:2], tools=[BASH], tokenize=False) == (
        f"<|im_start|>system\n# Tools\n\n<tools>\n{schema}\n</tools><|im_end|>\n<|im_start|>user\nFix it.<|im_end|>\n")


def test_act_returns_text_usage_and_one_logprob_per_generated_token(tiny_model):
    hf = policy(tiny_model)
    turn = hf.act(CHAT, [BASH], seed=1)
    assert isinstance(hf, Policy) and hf.name == f"hf:{tiny_model}" and hf.native_tools is True
    assert turn.message["role"] == "assistant" and isinstance(turn.message["content"], str)
    assert "tool_calls" not in turn.message
    assert 1 <= turn.usage.completion_tokens <= 12 and turn.usage.prompt_tokens > 20
    assert len(turn.logprobs) == turn.usage.completion_tokens
    assert all(lp <= 0.0 for lp in turn.logprobs)
    assert turn.finish_reason == ("length" if turn.usage.completion_tokens == 12 else "stop") and turn.latency > 0
    assert hf.settings()["max_new_tokens"] == 12


def test_same_seed_same_reply_and_global_rng_untouched(tiny_model):
    import torch

    hf = policy(tiny_model)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first, second = hf.act(CHAT, [], seed=5), hf.act(CHAT, [], seed=5)
    assert torch.rand(1) == expected_next
    assert first.message == second.message and first.logprobs == second.logprobs


def test_greedy_logprobs_are_the_model_maxima(tiny_model):
    import torch

    hf = policy(tiny_model, temperature=0.0, max_new_tokens=4)
    turn = hf.act(CHAT, [])
    prompt = hf.tokenizer.apply_chat_template(template_messages(CHAT), tokenize=False, add_generation_prompt=True)
    ids = hf.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        best = torch.log_softmax(hf.model(ids).logits[0, -1], dim=-1).max().item()
    assert turn.logprobs[0] == pytest.approx(best, abs=1e-5)


def test_a_template_that_takes_no_tools_makes_the_policy_use_the_text_format(tiny_model):
    template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    hf = policy(tiny_model, chat_template=template)
    turn = hf.act(CHAT, [BASH], seed=0)
    assert not hf.native_tools and not hf.settings()["native_tools"]
    assert turn.message["role"] == "assistant" and len(turn.logprobs) == turn.usage.completion_tokens
    native = policy(tiny_model)  # the tiny template takes tools
    assert native.native_tools and native.settings()["native_tools"]


def test_hermes_tool_calls_are_parsed_from_text():
    text = ('I will look.\n<tool_call>{"name": "bash", "arguments": {"cmd": "ls -la"}}</tool_call>\n'
            "<tool_call>{not json}</tool_call>")
    message = parse_tool_calls(text)
    assert message["content"] == "I will look.\n\n<tool_call>{not json}</tool_call>"
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {"cmd": "ls -la"}
    assert parse_tool_calls("plain") == {"role": "assistant", "content": "plain"}


def test_act_stores_the_ids_it_was_given_and_sampled_and_their_logprobs_are_the_models(tiny_model):
    import torch

    from pipeline.agent.identity import template_hash, weights_revision

    hf = policy(tiny_model, max_new_tokens=6)
    turn = hf.act(CHAT, [], seed=3)
    rendered = hf.tokenizer.apply_chat_template(template_messages(CHAT), tokenize=False, add_generation_prompt=True)
    assert turn.prompt_ids == tuple(hf.tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert len(turn.token_ids) == len(turn.logprobs) == turn.usage.completion_tokens
    ids = torch.tensor([turn.prompt_ids + turn.token_ids])
    with torch.no_grad():
        logps = torch.log_softmax(hf.model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    assert logps[len(turn.prompt_ids) - 1:].tolist() == pytest.approx(list(turn.logprobs), abs=1e-5)
    assert turn.identity.revision == weights_revision(tiny_model) and turn.identity.revision.startswith("sha256:")
    assert turn.identity.chat_template_hash == template_hash(CHAT_TEMPLATE) and turn.identity.model == str(tiny_model)


def test_reasoning_is_split_off_as_qwen3_templates_split_it():
    from pipeline.agent.hf_policy import split_reasoning

    assert split_reasoning("<think>\nadd subtracts\n</think>\n\nFixing.") == ("add subtracts", "Fixing.")
    assert split_reasoning("Fixing.") == (None, "Fixing.")


@pytest.mark.parametrize("settings,stored", [
    ({}, (1.0, 1.0, 0)),  # sampled at temperature 1 with top-p and top-k off: what the raw log-probs describe
    ({"temperature": 0.7, "top_p": 0.9}, (0.7, 0.9, 0)),
    ({"temperature": 0.0}, (0.0, 1.0, 0)),  # greedy
])
def test_the_identity_holds_the_sampling_settings_generate_uses(tiny_model, settings, stored):
    identity = policy(tiny_model, **settings).act(CHAT, [], seed=1).identity
    assert (identity.temperature, identity.top_p, identity.top_k) == stored
