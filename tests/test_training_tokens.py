"""Which tokens ActGuide scores, on the real Qwen2.5 and Qwen3 chat templates shipped with TRL and the tiny
tokenizer: each turn in the context it was sampled in, its sampled tokens through the end of turn only."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer
from trl.chat_template_utils import qwen2_5_chat_template, qwen3_chat_template

from training.tokens import Turn, rendered_turns, segments
from training.tiny_model import CHAT_TEMPLATE

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


def tokenizer_with(tiny_model, template: str):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = template
    return tokenizer


def test_qwen2_5_turns_are_what_the_policy_sampled_and_share_one_forward(tiny_model):
    tokenizer = tokenizer_with(tiny_model, qwen2_5_chat_template)
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


def test_qwen3_scores_each_turn_with_the_reasoning_it_was_sampled_after(tiny_model):
    """A plain user message (a format error) makes Qwen3 drop earlier reasoning from later contexts: the turns
    before it keep theirs in their own forward, the turn after it is scored in the context without it."""
    tokenizer = tokenizer_with(tiny_model, qwen3_chat_template)
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


# Qwen2's pre-tokenizer: a run of newlines (after optional spaces) is one piece, so `\n\n` can be one token
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
NEWLINE_FIRST = [{"role": "assistant", "content": "\nLooking.", "tool_calls": [call("c1", "ls")]},
                 {"role": "tool", "tool_call_id": "c1", "content": "calc.py"},
                 {"role": "assistant", "content": "\nFixed."}]


def qwen2_style_tokenizer(template: str = CHAT_TEMPLATE):
    """A byte-level BPE with Qwen2's pre-tokenizer (split, then bytes), trained offline on text where `\n\n`
    is frequent, so that `assistant\n` followed by a turn starting with `\n` tokenizes as `assistant`, `\n\n`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["assistant\n\nLooking.\n\n", "user\nFix add.\n\n"] * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], chat_template=template)


@pytest.mark.parametrize("kind, fuses", [("tiny", False), ("qwen2-style", True)])
def test_a_turn_starting_with_a_newline_is_the_tokens_sampled_after_its_header(tiny_model, kind, fuses):
    """Rendered whole, a Qwen2-style tokenizer joins the header's newline and the turn's first one into one
    token, so the whole is no extension of the context the policy was given: the turn is the tokens of its
    own text after that context, not a crash."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model) if kind == "tiny" else qwen2_style_tokenizer()
    context = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=True)["input_ids"]
    whole = tokenizer.apply_chat_template(PROMPT + NEWLINE_FIRST[:1], return_dict=True)["input_ids"]
    assert (whole[:len(context)] != context) == fuses
    turns = rendered_turns(tokenizer, PROMPT, PROMPT, NEWLINE_FIRST, None)
    assert [tokenizer.decode(t.ids) for t in turns] == [
        '\nLooking.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call><|im_end|>',
        "\nFixed.<|im_end|>"]
    assert turns[0].sampled_context == context and [tokenizer.decode(t.ids[:1]) for t in turns] == ["\n", "\n"]


def newline_rows() -> list[dict]:
    """A mixed group built by the dataset builder: both attempts' turns start with a newline."""
    import dataclasses

    from pipeline.datasets import DatasetConfig, build_rows
    from tests.test_datasets_build import traj

    attempts = [traj(f"n{i}", sample=i, reward=float(i)) for i in range(2)]
    turns = tuple({**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(  # stored: JSON
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in NEWLINE_FIRST)
    attempts = [dataclasses.replace(t, messages=t.prompt + turns) for t in attempts]
    return build_rows(attempts, DatasetConfig(test_fraction=0.0)).actguide.to_dicts()


def test_under_recompute_a_turn_the_template_cannot_place_is_left_out_and_counted_not_a_crash():
    from training.actguide_examples import prepare_examples
    from training.common import TrainingDataError
    from training.config import ActGuideTrainingConfig

    examples, counts = prepare_examples(newline_rows(), qwen2_style_tokenizer(), ActGuideTrainingConfig())
    assert [e.rollout_id for e in examples] == ["n0", "n1"]
    assert (counts["rendered_tokens"], counts["rerender_mismatch"]) == (2, 0)
    # a generation prompt the rendered turn does not begin with (an empty think block prefilled): no tokens to score
    prefilled = CHAT_TEMPLATE.replace("'<|im_start|>assistant\n' }}{% endif %}",
                                      "'<|im_start|>assistant\n<think>\n\n</think>\n\n' }}{% endif %}")
    assert prefilled != CHAT_TEMPLATE
    with pytest.raises(TrainingDataError, match="'rerender_mismatch': 2, 'too_long': 0"):
        prepare_examples(newline_rows(), qwen2_style_tokenizer(prefilled), ActGuideTrainingConfig())


@pytest.mark.slow
def test_hf_rollouts_reach_the_trainer_with_their_own_ids_and_logprobs(tiny_model, tmp_path):
    """Attempts of the tiny model (a mixed group: one paid), through to_trajectory, Parquet, the dataset build
    and the trainer: the behaviour log-probs are the stored numbers on the stored ids."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.agent.hf_policy import LocalHFPolicy, LocalHFPolicyConfig
    from pipeline.agent.identity import local_identity
    from pipeline.agent.loop import AgentConfig, run_attempt
    from pipeline.datasets import DatasetConfig, build_rows
    from pipeline.core.records import TRAJECTORY_SCHEMA, Task, Trajectory
    from pipeline.rollouts.batch import NO_GUIDANCE, Job, to_trajectory
    from pipeline.core.store import read_records, write_rows
    from sandbox.local_sandbox import LocalSandbox
    from tests.test_agent_loop import make_repo
    from training.actguide import ActGuideTrainer
    from training.actguide_examples import prepare_examples
    from training.config import ActGuideTrainingConfig

    policy = LocalHFPolicy(LocalHFPolicyConfig(model_path=str(tiny_model), max_new_tokens=8))
    stored = []
    with LocalSandbox(make_repo(tmp_path / "repo"), timeout=60) as sandbox:
        task = Task(instance_id="calc-1", repo="demo/calc", base_commit=sandbox.base_commit, patch="", test_patch="",
                    problem_statement="add subtracts", FAIL_TO_PASS=(), PASS_TO_PASS=(), image="",
                    workdir=sandbox.workdir, test_cmd="pytest", log_parser="pytest", source="synth")
        for i in range(2):
            attempt = run_attempt(task, policy, sandbox, AgentConfig(max_steps=2, max_format_errors=5), seed=i)
            traj = to_trajectory(Job(task, i, i, NO_GUIDANCE, "g", f"r{i}"), policy, "b1", attempt, None, "", 0)
            stored.append(dataclasses.replace(traj, reward=float(i), resolved=bool(i)))  # the grade, given
    path = write_rows(tmp_path / "t.parquet", [t.to_row() for t in stored], TRAJECTORY_SCHEMA)
    stored = [Trajectory.from_row(r) for r in read_records(path, TRAJECTORY_SCHEMA)]
    rows = build_rows(stored, DatasetConfig(test_fraction=0.0)).actguide.to_dicts()
    config = ActGuideTrainingConfig(batch_size=4, behaviour_logprobs="stored")
    starting = local_identity(str(tiny_model), str(tiny_model), policy.tokenizer.chat_template)
    examples, counts = prepare_examples(rows, policy.tokenizer, config, starting)
    assert (counts["stored_tokens"], counts["rendered_tokens"]) == (2, 0)
    for example in examples:
        traj = next(t for t in stored if t.rollout_id == example.rollout_id)
        assert example.recorded == [x for turn in traj.logprobs for x in turn]
        sampled = [tok for s in example.segments for tok, bit in zip(s.response_ids, s.mask) if bit]
        assert sampled == [tok for turn in traj.token_ids for tok in turn]  # the ids it sampled, no re-tokenizing
        assert example.segments[0].prompt_ids == list(traj.prompt_token_ids[0])
    trainer = ActGuideTrainer(AutoModelForCausalLM.from_pretrained(tiny_model), policy.tokenizer, examples, config)
    for i, example in enumerate(examples):
        assert torch.equal(trainer.behaviour[i], torch.tensor(example.recorded))
        with torch.no_grad():  # the starting model on the stored ids gives back the stored numbers
            assert torch.allclose(trainer._logps([i], guided=True)[0], trainer.behaviour[i], atol=1e-4)
