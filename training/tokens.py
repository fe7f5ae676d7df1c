"""The tokens a trajectory is scored on: each assistant turn in the context it was sampled in.

A turn is (the context the policy was given, the same context under the unguided prompt, the ids it
sampled, their log-probs). From a rollout's stored ids nothing is re-tokenized but the guided prompt
swapped for the unguided one at the front of a context. Without stored ids, a turn's context is the
starting model's own template rendered over the messages before it (with the generation prompt), and its
ids are what rendering the turn adds, up to and including the end-of-turn token: template tokens the
policy never sampled (the newline after `<|im_end|>`, the next role header) are context, not targets.
Where the turn's first token would fuse with the end of its context (a Qwen2-style pre-tokenizer joins the
header's newline and a turn that starts with one), the turn's text is tokenized after the context as given;
a template that renders the context's text differently once the turn is added raises `TokenMismatch`.

Consecutive turns whose contexts extend each other token for token share one `Segment` (one forward);
where a template re-renders earlier turns (Qwen3 drops earlier reasoning after a new user message), a
new segment starts, so no turn is scored in a context it was not sampled in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


class TokenMismatch(ValueError):
    """Stored ids that do not fit the prompt they are said to continue."""


@dataclass
class Turn:
    """One assistant turn's ids."""

    sampled_context: list[int]  # what the policy was given (the guided prompt for a guided attempt)
    unguided_context: list[int]  # the same context under the unguided prompt
    ids: list[int]  # what it sampled, end-of-turn included
    logprobs: list[float] | None  # behaviour log-probs of `ids`, when stored


@dataclass
class Segment:
    """Turns scored in one forward: the first turn's context, then every later token, sampled ones marked."""

    prompt_ids: list[int]  # unguided context (the numerator and the KL reference)
    sampled_prompt_ids: list[int]  # the context as sampled (the behaviour policy when it is recomputed)
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 on tokens the policy sampled


def segments(turns: list[Turn]) -> list[Segment]:
    """Turns merged where a context extends the previous segment token for token under both prompts."""
    out: list[Segment] = []
    for turn in turns:
        last = out[-1] if out else None
        if last is not None:
            seen = last.sampled_prompt_ids + last.response_ids
            gap = turn.sampled_context[len(seen):]
            if turn.sampled_context[:len(seen)] == seen and \
                    turn.unguided_context == last.prompt_ids + last.response_ids + gap:
                last.response_ids += gap + turn.ids
                last.mask += [0] * len(gap) + [1] * len(turn.ids)
                continue
        out.append(Segment(list(turn.unguided_context), list(turn.sampled_context), list(turn.ids),
                           [1] * len(turn.ids)))
    return out


def fitting(turns: list[Turn], max_length: int) -> list[Turn]:
    """The turns before the first whose context (under either prompt) plus its ids exceed `max_length`."""
    kept = []
    for turn in turns:
        if max(len(turn.sampled_context), len(turn.unguided_context)) + len(turn.ids) > max_length:
            break
        kept.append(turn)
    return kept


def prompt_ids(tokenizer, messages: list[dict], tools) -> list[int]:
    """The prompt messages rendered by the tokenizer's own template, without a generation prompt."""
    return list(tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)["input_ids"])


def stored_turns(member: dict, sampled_prompt: list[int], unguided_prompt: list[int]) -> list[Turn]:
    """Turns from a member's stored ids; each context must start with `sampled_prompt` (rendered ids of the
    prompt it was sampled under), which is swapped for `unguided_prompt`."""
    turns = []
    for index, (context, ids, logprobs) in enumerate(zip(member["prompt_token_ids"], member["token_ids"],
                                                         member["logprobs"])):
        context = list(context)
        if context[:len(sampled_prompt)] != sampled_prompt:
            raise TokenMismatch(f"trajectory {member['rollout_id']} turn {index}: its stored context does not "
                                "start with its prompt as this tokenizer renders it")
        turns.append(Turn(context, unguided_prompt + context[len(sampled_prompt):], list(ids),
                          [float(x) for x in logprobs]))
    return turns


def rendered_turns(tokenizer, sampled_prompt: list[dict], unguided_prompt: list[dict], completion: list[dict],
                   tools) -> list[Turn]:
    """Turns rendered from the messages with the tokenizer's own template (no stored ids)."""
    ends = end_of_turn_ids(tokenizer)
    turns = []
    for index, message in enumerate(completion):
        if message["role"] != "assistant":
            continue
        before = completion[:index]
        context = _render(tokenizer, sampled_prompt + before, tools, generation=True)
        ids = _through_end(_turn_ids(tokenizer, sampled_prompt + before, message, context, tools, index), ends)
        turns.append(Turn(context, _render(tokenizer, unguided_prompt + before, tools, generation=True), ids, None))
    return turns


def _turn_ids(tokenizer, messages: list[dict], message: dict, context: list[int], tools, index: int) -> list[int]:
    """What rendering `message` after `messages` adds to `context` (their rendering with the generation prompt).

    Tokenized whole, a turn can fuse with the end of its context: a Qwen2-style pre-tokenizer makes the header's
    newline and a turn that starts with one a single token, so the whole is no extension of the context. The
    policy sampled after the context as it was given, so the added text is tokenized on its own."""
    whole = _render(tokenizer, messages + [message], tools, generation=False)
    if whole[:len(context)] == context:
        return whole[len(context):]
    before = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    text = tokenizer.apply_chat_template(messages + [message], tools=tools, tokenize=False)
    if not text.startswith(before):
        raise TokenMismatch(f"assistant turn {index}: the template renders the turn's context differently "
                            "once the turn is added; it cannot say which tokens the policy sampled")
    return list(tokenizer.encode(text[len(before):], add_special_tokens=False))


def _render(tokenizer, messages: list[dict], tools, generation: bool) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                              add_generation_prompt=generation)["input_ids"])


def _through_end(ids: list[int], ends: set[int]) -> list[int]:
    """`ids` up to and including the first end-of-turn token (all of them without one)."""
    for position, token in enumerate(ids):
        if token in ends:
            return ids[:position + 1]
    return ids


def end_of_turn_ids(tokenizer) -> set[int]:
    """The tokenizer's end-of-sequence id and the end-of-turn tokens of the common chat formats it has."""
    vocabulary = tokenizer.get_vocab()
    ends = {vocabulary[t] for t in END_OF_TURN_TOKENS if t in vocabulary}
    return ends | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
