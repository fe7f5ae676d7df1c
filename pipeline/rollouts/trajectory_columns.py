"""The columns of a stored trajectory that come from the attempt and from its grade, as typed records: each
is built once from what the agent loop and the grader return, and its defaults are the columns of a trajectory
that had no attempt (the sandbox failed first) or no grade. `pipeline.rollouts.batch.to_trajectory` adds the
job's columns; every name and type here is the Trajectory's (tests/test_trajectory_columns.py)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from pipeline.agent.loop import Attempt
from pipeline.agent.policy import PolicyIdentity
from pipeline.core.records import Step
from pipeline.guidance.references import quotes_guidance
from pipeline.verifier.grading import Grade

LOG_TAIL = 20_000  # characters of the grading log kept per trajectory


@dataclass(frozen=True)
class AttemptColumns:
    """What the agent loop's attempt puts in its trajectory."""

    prompt: tuple[dict, ...] = ()
    unguided_prompt: tuple[dict, ...] = ()
    messages: tuple[dict, ...] = ()
    tools: str = "[]"
    steps: tuple[Step, ...] = ()
    logprobs: tuple[tuple[float, ...] | None, ...] | None = None
    patch: str = ""
    format_errors: int = 0
    total_tokens: int = 0
    wall_time: float = 0.0
    quotes_guidance: bool = False
    prompt_token_ids: tuple[tuple[int, ...] | None, ...] | None = None
    token_ids: tuple[tuple[int, ...] | None, ...] | None = None
    policy_model: str = ""
    policy_revision: str = ""
    chat_template_hash: str = ""
    temperature: float = -1.0
    top_p: float = -1.0
    top_k: int = -1

    @classmethod
    def of(cls, a: Attempt, hint: str, quote_ngram: int) -> AttemptColumns:
        """`hint`: the guidance text shown, which the response is checked for quoting."""
        identity = a.identity or PolicyIdentity("")  # a policy that cannot say: every field unknown
        return cls(prompt=a.prompt, unguided_prompt=a.unguided_prompt, messages=a.messages,
                   tools=json.dumps(list(a.tools)), steps=a.steps, logprobs=_per_turn(a.logprobs), patch=a.patch,
                   format_errors=a.format_errors, total_tokens=a.total_tokens, wall_time=a.wall_time,
                   quotes_guidance=bool(hint and quotes_guidance(a.messages, hint, quote_ngram)),
                   prompt_token_ids=_per_turn(a.prompt_token_ids), token_ids=_per_turn(a.token_ids),
                   policy_model=identity.model, policy_revision=identity.revision,
                   chat_template_hash=identity.chat_template_hash, temperature=identity.temperature,
                   top_p=identity.top_p, top_k=identity.top_k)


@dataclass(frozen=True)
class GradeColumns:
    """What the grade of an attempt's patch puts in its trajectory."""

    reward: float = 0.0
    resolved: bool = False
    grade_reason: str = ""
    report: str = "{}"
    test_log: str = ""
    dropped_files: tuple[str, ...] = ()
    enforcement: tuple[str, ...] = ()
    suspicious: tuple[str, ...] = ()
    grade_time: float = 0.0

    @classmethod
    def of(cls, v: Grade, infra: str) -> GradeColumns:
        """An infrastructure fault (`infra` not empty) pays nothing, whatever the grade said."""
        return cls(reward=0.0 if infra else v.reward, resolved=v.resolved and not infra, grade_reason=v.reason,
                   report=v.report, test_log=v.log[-LOG_TAIL:], dropped_files=v.dropped_files,
                   enforcement=v.enforcement, suspicious=v.suspicious, grade_time=v.duration)


def columns(part: AttemptColumns | GradeColumns) -> dict[str, Any]:
    """The part's columns by name, values as they are (not copied, not turned into dicts)."""
    return {f.name: getattr(part, f.name) for f in dataclasses.fields(part)}


def _per_turn(values):
    """A per-turn token column (log-probs, prompt or sampled ids) as tuples; None without."""
    if values is None:
        return None
    return tuple(tuple(turn) if turn is not None else None for turn in values)
