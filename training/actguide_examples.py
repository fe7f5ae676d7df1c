"""ActGuide rows made training examples: each task's group (the guided attempts merged in or in place of
the unguided ones), GRPO's advantages within it, and each member's turns on the ids it sampled (stored)
or re-rendered, as training/actguide.py's objective takes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.agent.identity import mismatch
from pipeline.agent.policy import PolicyIdentity
from training.common import TrainingDataError
from training.config import ActGuideTrainingConfig
from training.tokens import Segment, TokenMismatch, fitting, prompt_ids, rendered_turns, segments, stored_turns

SETTING = "training.actguide.behaviour_logprobs"


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
    """GRPO's advantages: (reward - group mean) / group std; all zero when the rewards are equal."""
    r = np.asarray(rewards, float)
    std = r.std()
    return [0.0] * len(r) if std < 1e-8 else ((r - r.mean()) / std).tolist()


def training_group(members: list[dict[str, Any]], guided_group: str = "merge") -> list[dict[str, Any]]:
    """The unguided attempts; when none resolved the task, with the guided ones merged in, or replaced by them."""
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
    """Under `stored`: the member has stored ids and was sampled by the starting model; else a refusal."""
    fix = f"set {SETTING}: recompute to compute the behaviour policy with the starting model instead"
    if not has_stored_ids(member):
        raise TrainingDataError(f"trajectory {member['rollout_id']} has no stored token ids and log-probs for "
                                f"every turn (policy {member.get('policy_model') or 'unknown'}); {fix}")
    problem = mismatch(stored_identity(member), starting) if starting else "the starting model is unknown"
    if problem:
        raise TrainingDataError(f"trajectory {member['rollout_id']} was not sampled by the starting model: "
                                f"{problem}; {fix}")


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


def prepare_examples(rows, tokenizer, config: ActGuideTrainingConfig, starting: PolicyIdentity | None = None
                     ) -> tuple[list[Example], dict[str, int]]:
    """Examples of every trajectory with a non-zero advantage, and counts of what was left out and why.
    `starting` is the starting model's identity, which stored log-probs must have been sampled by."""
    from training.masking import to_template_row

    counts = {"groups": 0, "guided_groups": 0, "equal_reward_groups": 0, "too_long": 0, "stored_tokens": 0,
              "rendered_tokens": 0}
    examples = []
    for row in rows:
        chat = to_template_row({"prompt": row["prompt"], "tools": row["tools"]})
        prompts = (chat["prompt"], to_template_row({"prompt": row["guided_prompt"]})["prompt"])
        group = training_group(row["trajectories"], config.guided_group)
        counts["groups"] += 1
        counts["guided_groups"] += any(m["sampled_under"] == "guided" for m in group)
        advantages = group_advantages([m["reward"] for m in group])
        if not any(advantages):
            counts["equal_reward_groups"] += 1
            continue
        for member, advantage in zip(group, advantages):
            if advantage == 0.0:
                continue
            turns, source = member_turns(member, tokenizer, prompts, chat["tools"], config, starting)
            kept = fitting(turns, config.max_length)
            if not kept:
                counts["too_long"] += 1
                continue
            counts[f"{source}_tokens"] += 1
            recorded = [x for t in kept for x in t.logprobs] if config.behaviour_logprobs == "stored" else None
            examples.append(Example(row["group_id"], member["rollout_id"], member["sampled_under"], advantage,
                                    segments(kept), recorded))
    if not examples:
        raise TrainingDataError(f"no trajectory to train on ({counts}): ActGuide needs groups with both "
                                "resolved and failed attempts")
    return examples, counts
