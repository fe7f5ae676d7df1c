"""Assistant-only DPO on multi-turn SWE trajectories: tool observations score nothing, long rows cut at turns.

TRL 1.16's DPOTrainer puts every completion token in the DPO log-ratio. In an agent trajectory the
completion interleaves the assistant's turns with tool observations (command outputs the policy never
wrote), so those would dominate the preference signal. Here a token counts only when the chat template's
own `{% generation %}` span covers it (the same rule as SFTConfig(assistant_only_loss=True)): the
assistant's text, its tool-call text and its end-of-turn token. Tool observations still sit in the
context of later turns; they are never targets.

Truncation policy (TruncationPolicy): the prompt (system + task, and in a `dpo_divergence` row the turns both
attempts took, masked like any prompt token) is kept whole; each completion is cut
from its end at an assistant-turn boundary, to the longest prefix that fits `max_length` with the prompt
(`fit_turns`, which the SFT stage cuts its conversations with too); a row is dropped when fewer than
`min_assistant_turns` whole assistant turns of its chosen or of its rejected side fit (this covers a prompt
that alone fills the budget), or when its chosen side is cut before its last edit
(`training.edits.keeps_last_edit`: the kept part never made the fix, so it is no success to prefer). The
rejected side may be cut anywhere: a failure cut short is still a failure. Cut tokens, truncated and dropped
rows, and the longest row, are counted per dataset in `AssistantOnlyDPOTrainer.truncation_counts`.
"""

from __future__ import annotations

import bisect
import json
import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from datasets import Dataset
from trl import DPOConfig, DPOTrainer
from trl.chat_template_utils import get_training_chat_template, has_generation_markers
from trl.data_utils import common_prefix_length
from trl.trainer.dpo_trainer import DataCollatorForPreference
from trl.trainer.utils import global_then_local_main_first, pad

from training.common import without_right_padding_mask
from training.edits import keeps_last_edit
from training.tokens import end_of_turn_ids

logger = logging.getLogger(__name__)

SIDES = ("chosen", "rejected")


@dataclass(frozen=True)
class TruncationPolicy:
    """How trajectories longer than the token budget are cut (see the module docstring)."""

    max_length: int | None = 32768
    """Tokens allowed for the prompt plus one completion (chosen or rejected, each on its own); None: no cut."""
    min_assistant_turns: int = 1
    """Drop a row when fewer whole assistant turns than this fit, on its chosen or its rejected side."""

    def __post_init__(self):
        if self.min_assistant_turns < 1:
            raise ValueError(f"min_assistant_turns={self.min_assistant_turns}: set it to 1 or more, "
                             "a completion with no assistant turn has nothing to score")


def to_template_row(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row in the form chat templates read: `tools` a list of dicts, tool-call `arguments` dicts.

    Stored rows keep `tools` and each call's `arguments` as JSON strings, because Arrow widens dicts with
    different keys into null-filled structs (`{"command": null}` would then be rendered). Qwen2.5's
    template renders `arguments | tojson`, so a string would come out double-encoded, and iterates
    `tools`, so a string would be read character by character. Fields that are None (Arrow's filler for
    a key other messages have) are dropped.
    """
    out = dict(row)
    if isinstance(row.get("tools"), str):
        out["tools"] = json.loads(row["tools"])
    for key in ("prompt", "chosen", "rejected", "messages"):
        if row.get(key) is not None:
            out[key] = [_template_message(message) for message in row[key]]
    return out


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    message = {k: v for k, v in message.items() if v is not None}
    if message.get("tool_calls"):
        message["tool_calls"] = [_template_call(call) for call in message["tool_calls"]]
    return message


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    call = {k: v for k, v in call.items() if v is not None}
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        function["arguments"] = json.loads(function["arguments"])
    return {**call, "function": function}


def training_chat_template(tokenizer) -> str:
    """The tokenizer's chat template when it has `{% generation %}` markers, else TRL's marked twin of it."""
    if has_generation_markers(tokenizer.chat_template):
        return tokenizer.chat_template
    return get_training_chat_template(tokenizer)  # raises, naming the fix, for a template TRL does not know


def assistant_token_mask(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                         chat_template: str | None = None) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation, and 1 on each token the policy sampled: a `{% generation %}`
    span without the generation prompt's tokens it starts with and the template tokens after its end of turn
    (TRL's Qwen2.5 and Qwen3 spans hold the newline after `assistant` and the one after `<|im_end|>`)."""
    out = tokenizer.apply_chat_template(messages, tools=tools, chat_template=chat_template, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
    ids = list(out["input_ids"])
    return ids, sampled_spans(ids, list(out["assistant_masks"]), generation_prompt_ids(tokenizer, chat_template),
                              end_of_turn_ids(tokenizer))


def generation_prompt_ids(tokenizer, chat_template: str | None) -> list[int]:
    """What the template appends to a chat to ask for an assistant turn (`<|im_start|>assistant\n`)."""
    probe = [{"role": "user", "content": "x"}]

    def render(generation: bool) -> list[int]:
        return list(tokenizer.apply_chat_template(probe, chat_template=chat_template, tokenize=True,
                                                  return_dict=True, add_generation_prompt=generation)["input_ids"])

    plain, asking = render(False), render(True)
    return asking[len(plain):] if asking[:len(plain)] == plain else []


def sampled_spans(ids: list[int], mask: list[int], generation: list[int], ends: set[int]) -> list[int]:
    """`mask` with each span trimmed: leading tokens that complete the generation prompt, and every token
    after the span's first end-of-turn token."""
    out = list(mask)
    position = 0
    while position < len(out):
        if not out[position]:
            position += 1
            continue
        stop = position
        while stop < len(out) and out[stop]:
            stop += 1
        lead = next((k for k in range(len(generation) + 1) if k <= stop - position and position + k >= len(generation)
                     and ids[position + k - len(generation):position + k] == generation), 0)
        end = next((j + 1 for j in range(position, stop) if ids[j] in ends), stop)
        for j in list(range(position, position + lead)) + list(range(end, stop)):
            out[j] = 0
        position = stop
    return out


def tokenize_preference_row(row: dict[str, Any], tokenizer, policy: TruncationPolicy,
                            chat_template: str) -> dict[str, Any]:
    """A stored row as prompt_ids, {side}_ids, {side}_mask (1: assistant), {side}_cut_tokens, {side}_tokens
    (uncut), dropped, and chosen_cut_before_last_edit (dropped for that alone)."""
    row = to_template_row(row)
    prompt, tools = row["prompt"], row.get("tools")
    prompt_ids = tokenizer.apply_chat_template(prompt, tools=tools, chat_template=chat_template, tokenize=True,
                                               return_dict=True, add_generation_prompt=True)["input_ids"]
    sides = {side: fit_turns(tokenizer, prompt, row[side], tools, chat_template, policy.max_length) for side in SIDES}
    too_short = any(fit.turns < policy.min_assistant_turns for fit in sides.values())
    cut_before_edit = not too_short and not keeps_last_edit(row["chosen"], sides["chosen"].turns)
    dropped = too_short or cut_before_edit
    # As TRL does: the completion starts where prompt and prompt+completion tokenizations diverge
    prompt_len = min(common_prefix_length(prompt_ids, fit.ids) for fit in sides.values())
    out = {"prompt_ids": [] if dropped else list(prompt_ids[:prompt_len]), "dropped": dropped,
           "chosen_cut_before_last_edit": cut_before_edit}
    for side, fit in sides.items():
        out[f"{side}_ids"] = [] if dropped else fit.ids[prompt_len:]
        out[f"{side}_mask"] = [] if dropped else fit.mask[prompt_len:]
        out[f"{side}_cut_tokens"] = fit.cut
        out[f"{side}_tokens"] = fit.tokens
    return out


class Fit(NamedTuple):
    """A conversation cut at an assistant-turn end (`fit_turns`)."""

    ids: list[int]
    mask: list[int]
    turns: int
    """Whole assistant turns of the completion kept."""
    cut: int
    """Tokens cut off its end."""
    tokens: int
    """Tokens of the whole conversation, uncut."""


def fit_turns(tokenizer, prompt: list[dict], completion: list[dict], tools, chat_template: str | None,
              max_length: int | None) -> Fit:
    """`prompt` + `completion` rendered and masked, the completion cut after its last assistant turn that fits
    `max_length` (None: no cut); no turn fitting: empty ids, 0 turns."""
    def render(end: int) -> tuple[list[int], list[int]]:
        return assistant_token_mask(tokenizer, prompt + completion[:end], tools, chat_template)

    ends = [i + 1 for i, message in enumerate(completion) if message["role"] == "assistant"]
    ids, mask = render(len(completion))
    if max_length is None or len(ids) <= max_length:
        return Fit(ids, mask, len(ends), 0, len(ids))
    # Rendered length grows with the cut point, so bisect the assistant-turn ends for the last that fits
    fits = bisect.bisect_right(ends, max_length, key=lambda end: len(render(end)[0]))
    if fits == 0:
        return Fit([], [], 0, len(ids), len(ids))
    kept_ids, kept_mask = render(ends[fits - 1])
    return Fit(kept_ids, kept_mask, fits, len(ids) - len(kept_ids), len(ids))


@dataclass
class AssistantOnlyPreferenceCollator(DataCollatorForPreference):
    """TRL's preference collator, `completion_mask` 1 only where the row's `{side}_mask` marks assistant tokens.

    Rows are already cut at turn boundaries (TruncationPolicy), so this collator cuts nothing: `max_length`
    must stay None (a token cut could end a completion mid-turn, and would misalign the masks).
    """

    def __post_init__(self):
        if self.max_length is not None:
            raise ValueError("AssistantOnlyPreferenceCollator cuts nothing: leave max_length=None and set "
                             "TruncationPolicy.max_length instead")

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        # Same row order as the parent: every chosen sequence, then every rejected one
        masks = [torch.tensor([0] * len(e["prompt_ids"]) + e[f"{side}_mask"], dtype=torch.long)
                 for side in SIDES for e in examples]
        batch["completion_mask"] = pad(masks, padding_value=0, padding_side="right",
                                       pad_to_multiple_of=self.pad_to_multiple_of)
        return batch


class AssistantOnlyDPOTrainer(DPOTrainer):
    """DPOTrainer whose log-ratios sum over assistant tokens only, on rows cut by a TruncationPolicy.

    Takes stored conversational preference rows (`prompt`, `chosen`, `rejected`, optional `tools`) in a
    `datasets.Dataset`; `DPOConfig.max_length` must be None, the budget being `truncation.max_length`.
    """

    def __init__(self, model, args: DPOConfig, processing_class, *,
                 truncation: TruncationPolicy = TruncationPolicy(), **kwargs):
        if args.max_length is not None:
            raise ValueError(f"DPOConfig.max_length={args.max_length}: set it to None; this trainer cuts whole "
                             f"turns to truncation.max_length={truncation.max_length} instead")
        # Set before super().__init__, which calls _prepare_dataset
        self.truncation = truncation
        self.truncation_counts: dict[str, dict[str, int]] = {}
        self.assistant_chat_template = training_chat_template(processing_class)
        pad_id = processing_class.pad_token_id
        collator = AssistantOnlyPreferenceCollator(
            pad_token_id=pad_id if pad_id is not None else processing_class.eos_token_id,
            pad_to_multiple_of=args.pad_to_multiple_of)
        super().__init__(model, args=args, processing_class=processing_class, data_collator=collator, **kwargs)
        if self.ref_model is not None:  # TRL loads the reference itself
            without_right_padding_mask(self.accelerator.unwrap_model(self.ref_model))

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        if not isinstance(dataset, Dataset):
            raise TypeError(f"{dataset_name}: AssistantOnlyDPOTrainer takes a datasets.Dataset, "
                            f"got {type(dataset).__name__}")
        with global_then_local_main_first():
            tokenized = dataset.map(
                tokenize_preference_row, num_proc=args.dataset_num_proc, desc=f"Tokenizing {dataset_name}",
                fn_kwargs={"tokenizer": processing_class, "policy": self.truncation,
                           "chat_template": self.assistant_chat_template})
            self.truncation_counts[dataset_name] = counts = truncation_counts(tokenized)
            logger.info("%s: %s", dataset_name, counts)
            return tokenized.filter(lambda row: not row["dropped"], num_proc=args.dataset_num_proc)

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:  # keep the per-token masks the collator reads
            super()._set_signature_columns_if_needed()
            self._signature_columns += ["chosen_mask", "rejected_mask"]


def truncation_counts(tokenized: Dataset) -> dict[str, int]:
    """Rows, dropped rows (and of those, chosen sides cut before their last edit), kept rows that lost tokens,
    tokens cut from kept rows, and the longest row (its index and tokens, prompt with its longer side uncut)."""
    dropped = tokenized["dropped"]
    cuts = [c + r for c, r in zip(tokenized["chosen_cut_tokens"], tokenized["rejected_cut_tokens"])]
    kept_cuts = [cut for cut, gone in zip(cuts, dropped) if not gone]
    lengths = [max(c, r) for c, r in zip(tokenized["chosen_tokens"], tokenized["rejected_tokens"])]
    longest = max(range(len(lengths)), key=lengths.__getitem__, default=-1)
    return {"rows": len(dropped), "dropped": sum(dropped),
            "chosen_cut_before_last_edit": sum(tokenized["chosen_cut_before_last_edit"]),
            "truncated": sum(cut > 0 for cut in kept_cuts), "cut_tokens": sum(kept_cuts),
            "longest_row": longest, "longest_tokens": lengths[longest] if lengths else 0}
