"""Assistant-only DPO masking and turn-boundary truncation, on a real Qwen2.5 template and real TRL steps."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset, Features, Json, List
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, SFTConfig, SFTTrainer
from trl.chat_template_utils import qwen2_5_chat_template, qwen2_5_training_chat_template
from trl.trainer.dpo_trainer import DataCollatorForPreference

from pipeline.datasets.divergence import divergence_cut
from training.edits import last_edit_turn
from training.masking import (
    AssistantOnlyDPOTrainer,
    AssistantOnlyPreferenceCollator,
    TruncationPolicy,
    assistant_token_mask,
    to_template_row,
    tokenize_preference_row,
    training_chat_template,
)

TOOLS = json.dumps([
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "submit", "description": "Submit the patch.",
                                      "parameters": {"type": "object", "properties": {}}}},
])


def call(call_id: str, name: str, **arguments) -> dict:
    """A tool call as stored: arguments a JSON string."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def turn(content: str, *calls: dict) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def observation(call_id: str, output: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def row(task: str, fix: str, wrong: str, system: str = "You fix bugs in the repository at /repo.") -> dict:
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    chosen = [turn("Let me look first.", call("c1", "bash", command="ls")),
              observation("c1", "exit code: 0\nsetup.py\ntoolz/"),
              turn("", call("c2", "bash", command=fix)),
              observation("c2", "exit code: 0\n3 passed"),
              turn("Fixed.", call("c3", "submit"))]
    rejected = [turn("", call("c1", "bash", command=wrong)),
                observation("c1", "exit code: 1\nTraceback (most recent call last):\nSyntaxError"),
                turn("Done.", call("c2", "submit"))]
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "tools": TOOLS}


ROWS = [row("Fix the off-by-one in toolz.take.", "sed -i 's/n - 1/n/' toolz/itertoolz.py",
            "rm -rf toolz"),
        row("Make curry keep the docstring.", "python -m pytest -q toolz/tests", "echo done")]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    """The tiny tokenizer wearing Qwen2.5's own (unmarked) chat template, as shipped in TRL."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def render(tokenizer, messages, tools, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


def assistant_pieces(tokenizer, messages, tools) -> list[str]:
    """Each assistant turn's text as the policy samples it: after the generation prompt, through `<|im_end|>`
    (not the newline the template writes after it), rendered message by message."""
    pieces = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            before = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
            after = render(tokenizer, messages[: i + 1], tools)
            assert after.startswith(before)  # the template renders earlier messages the same
            pieces.append(after[len(before):].split("<|im_end|>")[0] + "<|im_end|>")
    return pieces


def masked_text(tokenizer, ids, mask) -> str:
    return tokenizer.decode([token for token, bit in zip(ids, mask, strict=True) if bit])


def test_to_template_row_decodes_what_the_template_iterates_and_tojsons(tokenizer):
    stored = dict(ROWS[0], prompt=[dict(m, tool_calls=None) for m in ROWS[0]["prompt"]])  # Arrow's fillers
    template_row = to_template_row(stored)
    assert template_row["tools"] == json.loads(TOOLS)
    assert template_row["chosen"][0]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert "tool_calls" not in template_row["prompt"][0]
    text = render(tokenizer, template_row["prompt"] + template_row["chosen"], template_row["tools"])
    assert '{"name": "bash", "arguments": {"command": "ls"}}' in text
    assert '"name": "submit", "description": "Submit the patch."' in text
    # The stored form would be double-encoded by Qwen2.5's `arguments | tojson`
    raw = render(tokenizer, ROWS[0]["prompt"] + ROWS[0]["chosen"], json.loads(TOOLS))
    assert '"arguments": "{\\"command\\": \\"ls\\"}"' in raw


def test_mask_is_one_exactly_on_the_assistant_turns(tokenizer):
    template_row = to_template_row(ROWS[0])
    messages, tools = template_row["prompt"] + template_row["chosen"], template_row["tools"]
    template = training_chat_template(tokenizer)
    assert template == qwen2_5_training_chat_template  # TRL's marked twin of Qwen2.5

    ids, mask = assistant_token_mask(tokenizer, messages, tools, template)

    expected = "".join(assistant_pieces(tokenizer, messages, tools))
    assert masked_text(tokenizer, ids, mask) == expected
    assert expected.count("<|im_end|>") == 3 and expected.count("<tool_call>") == 3
    # Same tokens as the original template; every tool observation and the task lie outside the mask
    assert ids == tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)["input_ids"]
    unmasked = masked_text(tokenizer, ids, [1 - bit for bit in mask])
    for message in template_row["prompt"] + template_row["chosen"][1::2]:
        assert message["content"] in unmasked


def test_preference_row_scores_only_the_assistant_turns_of_each_completion(tokenizer):
    template = training_chat_template(tokenizer)
    out = tokenize_preference_row(ROWS[0], tokenizer, TruncationPolicy(max_length=None), template)
    template_row = to_template_row(ROWS[0])
    prompt, tools = template_row["prompt"], template_row["tools"]

    assert tokenizer.decode(out["prompt_ids"]) == render(tokenizer, prompt, tools, add_generation_prompt=True)
    for side in ("chosen", "rejected"):
        messages = prompt + template_row[side]
        assert tokenizer.decode(out["prompt_ids"] + out[f"{side}_ids"]) == render(tokenizer, messages, tools)
        expected = "".join(assistant_pieces(tokenizer, messages, tools))
        assert masked_text(tokenizer, out[f"{side}_ids"], out[f"{side}_mask"]) == expected
    assert not out["dropped"] and out["chosen_cut_tokens"] == out["rejected_cut_tokens"] == 0


def rendered_length(tokenizer, template_row, side, end) -> int:
    messages = template_row["prompt"] + template_row[side][:end]
    return len(tokenizer.apply_chat_template(messages, tools=template_row["tools"], tokenize=True,
                                             return_dict=True)["input_ids"])


def expected_end(tokenizer, template_row, side, budget) -> int | None:
    """Messages kept by a linear scan: all when they fit, else up to the last fitting assistant turn."""
    completion = template_row[side]
    if budget is None or rendered_length(tokenizer, template_row, side, len(completion)) <= budget:
        return len(completion)
    ends = [i + 1 for i, m in enumerate(completion) if m["role"] == "assistant"]
    fitting = [end for end in ends if rendered_length(tokenizer, template_row, side, end) <= budget]
    return fitting[-1] if fitting else None


@pytest.mark.parametrize(("budget_end", "kept_chosen"), [
    (None, 5),  # no budget: nothing cut
    (5, 5),  # a budget of exactly the whole chosen side
    (4, 3),  # room up to the second observation: it goes, with nothing after it to score
    (3, 3),  # room up to the second assistant turn: the cut falls right after it
    (0, None),  # room for the prompt alone: no turn fits, the row is dropped
])
def test_truncation_keeps_the_prompt_and_cuts_whole_turns(tokenizer, budget_end, kept_chosen):
    template_row = to_template_row(ROWS[0])
    # A budget that fits exactly the prompt and the chosen side's first `budget_end` messages
    budget = None if budget_end is None else rendered_length(tokenizer, template_row, "chosen", budget_end)
    out = tokenize_preference_row(ROWS[0], tokenizer, TruncationPolicy(max_length=budget),
                                  training_chat_template(tokenizer))

    kept = {side: expected_end(tokenizer, template_row, side, budget) for side in ("chosen", "rejected")}
    assert kept["chosen"] == kept_chosen
    assert out["dropped"] == (None in kept.values())
    if out["dropped"]:
        return
    for side, end in kept.items():
        full = rendered_length(tokenizer, template_row, side, len(template_row[side]))
        kept_length = rendered_length(tokenizer, template_row, side, end)
        assert len(out["prompt_ids"]) + len(out[f"{side}_ids"]) == kept_length
        assert out[f"{side}_cut_tokens"] == full - kept_length
        # the completion ends with an assistant turn: its sampled end of turn, then the template's newline
        assert out[f"{side}_mask"][-2:] == [1, 0] and tokenizer.decode(out[f"{side}_ids"][-2:]) == "<|im_end|>\n"


@pytest.mark.parametrize(("swap", "budget_end", "dropped"), [
    (False, 1, True),  # chosen keeps turn 1 (`ls`); its edit (`sed -i`, turn 2) is cut: the kept part fixed nothing
    (False, 3, False),  # chosen keeps turns 1-2, the edit among them
    (True, 2, False),  # chosen (the `rm -rf` side) keeps its edit, turn 1; the rejected side loses its edit: allowed
])
def test_a_row_whose_chosen_side_is_cut_before_its_last_edit_is_dropped(tokenizer, swap, budget_end, dropped):
    assert (last_edit_turn(ROWS[0]["chosen"]), last_edit_turn(ROWS[0]["rejected"])) == (2, 1)
    stored = dict(ROWS[0], chosen=ROWS[0]["rejected"], rejected=ROWS[0]["chosen"]) if swap else ROWS[0]
    template_row = to_template_row(stored)
    budget = rendered_length(tokenizer, template_row, "rejected" if swap else "chosen", budget_end)
    out = tokenize_preference_row(stored, tokenizer, TruncationPolicy(max_length=budget),
                                  training_chat_template(tokenizer))
    kept = {side: expected_end(tokenizer, template_row, side, budget) for side in ("chosen", "rejected")}
    # The chosen side is cut, and both keep a whole turn: the last-edit rule alone decides
    assert None not in kept.values() and kept["chosen"] < len(template_row["chosen"])
    assert out["dropped"] == out["chosen_cut_before_last_edit"] == dropped
    assert (out["chosen_ids"] == []) == dropped


def divergence_row(start: dict) -> dict:
    """`start` cut where its sides part (the pipeline's rule), the shared turns in the prompt (the chosen's copy)."""
    cut = divergence_cut(start["chosen"], start["rejected"])
    return dict(start, prompt=start["prompt"] + start["chosen"][:cut], chosen=start["chosen"][cut:],
                rejected=start["rejected"][cut:])


# ROWS[0] whose failure first ran the same `ls` (its own call id) and saw the same listing
SHARING = dict(ROWS[0], rejected=[turn("Let me look first.", call("r1", "bash", command="ls")),
                                  observation("r1", "exit code: 0\nsetup.py\ntoolz/"), *ROWS[0]["rejected"]])


def test_a_divergence_row_scores_exactly_the_start_rows_tokens_less_the_shared_turn(tokenizer):
    template = training_chat_template(tokenizer)
    start, cut = (tokenize_preference_row(r, tokenizer, TruncationPolicy(max_length=None), template)
                  for r in (SHARING, divergence_row(SHARING)))
    assert len(divergence_row(SHARING)["prompt"]) == 4 and "Let me look first." in tokenizer.decode(cut["prompt_ids"])
    messages = to_template_row(SHARING)
    for side in ("chosen", "rejected"):
        ids = start["prompt_ids"] + start[f"{side}_ids"]
        assert cut["prompt_ids"] + cut[f"{side}_ids"] == ids  # one conversation, only the prompt's end moved
        scored = {"start": [0] * len(start["prompt_ids"]) + start[f"{side}_mask"],
                  "cut": [0] * len(cut["prompt_ids"]) + cut[f"{side}_mask"]}
        unscored = [int(a and not b) for a, b in zip(scored["start"], scored["cut"])]
        assert not any(b and not a for a, b in zip(scored["start"], scored["cut"]))
        assert masked_text(tokenizer, ids, unscored) == assistant_pieces(
            tokenizer, messages["prompt"] + messages[side], messages["tools"])[0]  # the shared turn, no more
    batch = collate(tokenizer, [divergence_row(SHARING)], AssistantOnlyPreferenceCollator(tokenizer.pad_token_id))
    assert batch["completion_mask"][:, :len(cut["prompt_ids"])].sum() == 0


@pytest.mark.parametrize(("budget_end", "kept_chosen"), [(1, 1), (0, None)])
def test_truncation_keeps_a_prompt_holding_turns_whole_and_cuts_the_completion_at_turns(tokenizer, budget_end,
                                                                                        kept_chosen):
    row = divergence_row(SHARING)
    template_row = to_template_row(row)
    budget = rendered_length(tokenizer, template_row, "chosen", budget_end)
    out = tokenize_preference_row(row, tokenizer, TruncationPolicy(max_length=budget), training_chat_template(tokenizer))
    assert expected_end(tokenizer, template_row, "chosen", budget) == kept_chosen
    assert out["dropped"] == (kept_chosen is None)  # the prompt alone fits: no turn does, the row goes
    if out["dropped"]:
        return
    prompt = render(tokenizer, template_row["prompt"], template_row["tools"], add_generation_prompt=True)
    assert tokenizer.decode(out["prompt_ids"]) == prompt  # its shared turns never cut
    assert len(out["prompt_ids"]) + len(out["chosen_ids"]) == budget and out["chosen_cut_tokens"] > 0
    assert masked_text(tokenizer, out["chosen_ids"], out["chosen_mask"]) == assistant_pieces(
        tokenizer, template_row["prompt"] + template_row["chosen"][:1], template_row["tools"])[1]


def collate(tokenizer, rows, collator):
    template = training_chat_template(tokenizer)
    examples = [tokenize_preference_row(r, tokenizer, TruncationPolicy(max_length=None), template) for r in rows]
    return collator(examples)


def completion_logps(model, batch) -> torch.Tensor:
    """Sum of log p over completion_mask tokens, (batch,), as DPOTrainer._compute_loss sums them."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    logps = logits.log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    return (logps * batch["completion_mask"][:, 1:]).sum(dim=1)


def test_a_change_in_a_tool_message_alone_leaves_the_dpo_logps_unchanged(tiny_model, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    # A trajectory that ends on an observation, so nothing is conditioned on the changed tool message
    base = dict(ROWS[0], chosen=ROWS[0]["chosen"][:4])
    changed = dict(base, chosen=[*base["chosen"][:3], observation("c2", "exit code: 2\nERROR: 5 failed")])
    pad = tokenizer.pad_token_id

    ours = [completion_logps(model, collate(tokenizer, [r], AssistantOnlyPreferenceCollator(pad)))[0]
            for r in (base, changed)]
    trl_default = [completion_logps(model, collate(tokenizer, [r], DataCollatorForPreference(pad)))[0]
                   for r in (base, changed)]

    assert torch.allclose(ours[0], ours[1], atol=1e-5)
    assert abs(trl_default[0] - trl_default[1]) > 1e-2  # TRL alone scores the observation


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def changed_parameters(before, model) -> int:
    return sum(not torch.equal(before[name], p.detach()) for name, p in model.named_parameters())


def losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def train(trainer) -> list[float]:
    """Train; the logged losses, checked finite, with at least one parameter changed."""
    before = snapshot(trainer.model)
    trainer.train()
    history = losses(trainer)
    assert all(torch.isfinite(torch.tensor(history)))
    assert changed_parameters(before, trainer.model) > 0
    return history


def test_dpo_training_step_with_assistant_only_masks(tiny_model, tokenizer, tmp_path):
    too_long = row("Fix it.", "true", "false", system="You fix bugs. " * 400)  # prompt alone over budget
    verbose = dict(ROWS[1], chosen=[*ROWS[1]["chosen"][:3],
                                    observation("c2", "exit code: 1\n" + "E   AssertionError\n" * 400),
                                    ROWS[1]["chosen"][4]])  # a long last observation: its turn is cut
    before_edit = dict(ROWS[0], chosen=[ROWS[0]["chosen"][0], observation("c1", "setup.py\n" * 600),
                                        *ROWS[0]["chosen"][2:]])  # only turn 1 fits: its edit, turn 2, is cut
    dataset = Dataset.from_list([*ROWS, too_long, verbose, before_edit])  # stored form: JSON strings
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    args = DPOConfig(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=3, learning_rate=5e-3,
                     max_length=None, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                     seed=0)
    trainer = AssistantOnlyDPOTrainer(model, args=args, processing_class=tokenizer, train_dataset=dataset,
                                      truncation=TruncationPolicy(max_length=1024))
    counts = trainer.truncation_counts["train"]
    assert (counts["rows"], counts["dropped"], counts["chosen_cut_before_last_edit"], counts["truncated"]) == \
        (5, 2, 1, 1) and counts["cut_tokens"] > 800
    assert len(trainer.train_dataset) == 3
    batch = next(iter(trainer.get_train_dataloader()))
    scored = tokenizer.decode(batch["input_ids"][batch["completion_mask"].bool()])
    assert "<tool_response>" not in scored and "<tool_call>" in scored  # what the real loss sums over
    history = train(trainer)
    assert len(history) == 3 and history[-1] < history[0]


def test_dpo_trainer_refuses_trls_token_cut(tiny_model, tokenizer, tmp_path):
    args = DPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True)  # max_length defaults to 1024
    with pytest.raises(ValueError, match="max_length=1024: set it to None"):
        AssistantOnlyDPOTrainer(str(tiny_model), args=args, processing_class=tokenizer,
                                train_dataset=Dataset.from_list(ROWS))


def test_sft_step_with_assistant_only_loss_matches_the_dpo_mask(tiny_model, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = qwen2_5_training_chat_template
    template_rows = [to_template_row({"messages": r["prompt"] + r["chosen"], "tools": r["tools"]}) for r in ROWS]
    # Json() keeps each message as it is; plain Arrow structs would fill `{}` arguments with the keys of others
    features = Features({"messages": List(Json()), "tools": List(Json())})
    dataset = Dataset.from_list(template_rows, features=features)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    args = SFTConfig(output_dir=str(tmp_path), assistant_only_loss=True, max_steps=3, learning_rate=5e-3,
                     per_device_train_batch_size=2, logging_steps=1, save_strategy="no", report_to=[],
                     use_cpu=True, seed=0)
    trainer = SFTTrainer(model, args=args, processing_class=tokenizer, train_dataset=dataset)
    newline = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("\n"))
    for prepared, template_row in zip(trainer.train_dataset, template_rows, strict=True):
        ids, mask = assistant_token_mask(tokenizer, template_row["messages"], template_row["tools"])
        trl = [int(label != -100) for label in prepared["labels"]]
        # TRL scores the whole generation span; the policy sampled it less the newline before and after each turn
        extra = [token for token, ours, theirs in zip(ids, mask, trl, strict=True) if theirs and not ours]
        assert extra == newline * 2 * 3 and all(theirs for ours, theirs in zip(mask, trl) if ours)
    history = train(trainer)
    assert len(history) == 3 and history[-1] < history[0]
