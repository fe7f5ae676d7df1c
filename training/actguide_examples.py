"""ActGuide rows made training examples: each task's group (the guided attempts in place of the unguided ones,
as ActGuide-RL's reference code does, or merged in), GRPO's advantages within it as VeRL computes them, and
each member's turns on the ids it sampled (stored) or re-rendered, as training/actguide.py's objective takes
them.

A group whose rewards are all equal teaches nothing and is skipped. In a group with a signal, members of
advantage 0 are kept (their tokens count in the token mean and the KL, as in the reference) unless
`zero_advantage_tokens: skip`. A member is left out, and counted, when the template cannot say which
tokens it sampled (`rerender_mismatch`, under `recompute`), when its first turn alone is too long
(`too_long`), or when a resolved attempt's cut for length drops its last edit (`cut_before_last_edit`: the
kept part never made the fix its reward is for). Under `stored`, a trajectory the starting model did not
sample, or sampled at other settings than temperature 1, top-p 1, top-k off, or whose stored ids do not fit
its prompt, is a refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.agent.identity import mismatch, sampling_refusal
from pipeline.agent.policy import PolicyIdentity
from training.common import TrainingDataError
from training.config import ActGuideTrainingConfig
from training.edits import keeps_last_edit
from training.tokens import Segment, TokenMismatch, fitting, prompt_ids, rendered_turns, segments, stored_turns

SETTING = "training.actguide.behaviour_logprobs"
EPSILON = 1e-6  # VeRL's, added to the group's std
LEFT_OUT = ("rerender_mismatch", "too_long", "cut_before_last_edit")  # reasons a member with a signal is not trained


@dataclass
class Example:
    """One trajectory, tokenized: its segments (each turn in its own context) and its group advantage."""

    group_id: str
    rollout_id: str
    sampled_under: str  # 'unguided' or 'guided'
    advantage: float
    segments: list[Segment]
    recorded: list[float] | None  # behaviour log-probs of every sampled token in segment order, as stored

    @property
    def policy_tokens(self) -> int:
        return sum(sum(s.mask) for s in self.segments)


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO's advantages as VeRL computes them: (reward - mean) / (std + 1e-6), std the sample std (ddof 1);
    a group of one has mean 0 and std 1 (VeRL's convention); all zero when two or more rewards are all equal."""
    r = np.asarray(rewards, float)
    if len(r) > 1 and r.min() == r.max():
        return [0.0] * len(r)  # exactly: float noise in the mean must not make a signal
    mean, std = (r.mean(), r.std(ddof=1)) if len(r) > 1 else (0.0, 1.0)
    return ((r - mean) / (std + EPSILON)).tolist()


def training_group(members: list[dict[str, Any]], guided_group: str = "replace") -> list[dict[str, Any]]:
    """The unguided attempts; when none resolved the task, replaced by the guided ones, or with them merged in."""
    unguided = [m for m in members if m["sampled_under"] == "unguided"]
    guided = [m for m in members if m["sampled_under"] == "guided"]
    if not guided or any(m["resolved"] for m in unguided):
        return unguided
    return unguided + guided if guided_group == "merge" else guided


def has_stored_ids(member: dict[str, Any]) -> bool:
    """Whether every assistant turn of the member has stored prompt ids, sampled ids and log-probs."""
    turns = sum(m["role"] == "assistant" for m in member["completion"])
    columns = [member.get(name) for name in ("prompt_token_ids", "token_ids", "logprobs")]
    return turns > 0 and all(c is not None and len(c) == turns and all(t is not None for t in c) for c in columns)


def stored_identity(member: dict[str, Any]) -> PolicyIdentity:
    return PolicyIdentity(member.get("policy_model") or "", member.get("policy_revision") or "",
                          member.get("chat_template_hash") or "")


def check_stored(member: dict[str, Any], starting: PolicyIdentity | None) -> None:
    """Under `stored`: the member has stored ids, sampled by the starting model at temperature 1, top-p 1, top-k
    off (the only settings whose distribution its stored log-probs are); else a refusal."""
    fix = f"set {SETTING}: recompute to compute the behaviour policy with the starting model instead"
    if not has_stored_ids(member):
        raise TrainingDataError(f"trajectory {member['rollout_id']} has no stored token ids and log-probs for "
                                f"every turn (policy {member.get('policy_model') or 'unknown'}); {fix}")
    problem = mismatch(stored_identity(member), starting) if starting else "the starting model is unknown"
    if problem:
        raise TrainingDataError(f"trajectory {member['rollout_id']} was not sampled by the starting model: "
                                f"{problem}; {fix}")
    refusal = sampling_refusal(member)
    if refusal:
        raise TrainingDataError(refusal)


def member_turns(member, tokenizer, prompts, tools, config: ActGuideTrainingConfig, starting) -> tuple[list, str]:
    """The member's turns and where their ids came from: 'stored' (the rollout's own) or 'rendered'."""
    unguided, guided = prompts
    sampled = guided if member["sampled_under"] == "guided" else unguided
    if config.behaviour_logprobs == "stored":
        check_stored(member, starting)
    usable = has_stored_ids(member) and (config.behaviour_logprobs == "stored" or (
        starting is not None and stored_identity(member).chat_template_hash == starting.chat_template_hash))
    if usable:
        try:
            return stored_turns(member, prompt_ids(tokenizer, sampled, tools),
                                prompt_ids(tokenizer, unguided, tools)), "stored"
        except TokenMismatch as error:
            if config.behaviour_logprobs == "stored":
                raise TrainingDataError(f"{error}; set {SETTING}: recompute to re-render it") from error
    from training.masking import to_template_row

    chat = to_template_row({"messages": member["completion"]})["messages"]
    return rendered_turns(tokenizer, sampled, unguided, chat, tools), "rendered"


def member_example(member, advantage: float, group_id: str, tokenizer, prompts, tools, config, starting
                   ) -> tuple[Example | None, str]:
    """The member's Example and the count it goes to ('stored_tokens', 'rendered_tokens'), or None and why not."""
    try:
        turns, source = member_turns(member, tokenizer, prompts, tools, config, starting)
    except TokenMismatch:  # under `stored` member_turns refuses instead
        return None, "rerender_mismatch"
    kept = fitting(turns, config.max_length)
    if not kept:
        return None, "too_long"
    if member["reward"] > 0 and not keeps_last_edit(member["completion"], len(kept)):
        return None, "cut_before_last_edit"  # its reward is for a fix the kept turns never made
    recorded = [x for t in kept for x in t.logprobs] if config.behaviour_logprobs == "stored" else None
    example = Example(group_id, member["rollout_id"], member["sampled_under"], advantage, segments(kept),
                      recorded)
    return example, f"{source}_tokens"


def row_examples(row, tokenizer, config: ActGuideTrainingConfig, starting, counts: dict[str, int]) -> list[Example]:
    """The Examples of one row's training group; `counts` says what was left out and why."""
    from training.masking import to_template_row

    chat = to_template_row({"prompt": row["prompt"], "tools": row["tools"]})
    prompts = (chat["prompt"], to_template_row({"prompt": row["guided_prompt"]})["prompt"])
    group = training_group(row["trajectories"], config.guided_group)
    counts["groups"] += 1
    counts["guided_groups"] += any(m["sampled_under"] == "guided" for m in group)
    advantages = group_advantages([m["reward"] for m in group])
    if not any(advantages):
        counts["equal_reward_groups"] += 1
        return []
    examples = []
    for member, advantage in zip(group, advantages):
        if advantage == 0.0:
            counts["zero_advantage_members"] += 1
            if config.zero_advantage_tokens == "skip":
                continue
        example, count = member_example(member, advantage, row["group_id"], tokenizer, prompts, chat["tools"],
                                        config, starting)
        counts[count] += 1
        examples += [example] if example else []
    return examples


def prepare_examples(rows, tokenizer, config: ActGuideTrainingConfig, starting: PolicyIdentity | None = None
                     ) -> tuple[list[Example], dict[str, int]]:
    """Examples of every trajectory of a group with a signal, and counts of what was left out and why.
    `starting` is the starting model's identity, which stored log-probs must have been sampled by."""
    counts = dict.fromkeys(("groups", "guided_groups", "equal_reward_groups", "zero_advantage_members",
                            *LEFT_OUT, "stored_tokens", "rendered_tokens"), 0)
    examples = [e for row in rows for e in row_examples(row, tokenizer, config, starting, counts)]
    if not examples:
        raise TrainingDataError(f"no trajectory to train on ({counts}): ActGuide needs groups with both "
                                "resolved and failed attempts")
    return examples, counts
