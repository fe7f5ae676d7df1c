"""Build a policy from a name and a few settings (what the Dagster layer and the CLI pass)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.agent.policy import Policy
from pipeline.core.setting_ranges import Count, NonNegative

PolicyKind = Literal["heuristic", "openai", "anthropic", "hf"]
Stage = Literal["", "sft", "dpo", "actguide"]


@dataclass(frozen=True)
class PolicySpec:
    """Which policy to run."""

    kind: PolicyKind = "heuristic"
    """'heuristic' (offline baseline), 'openai' (any OpenAI-compatible server), 'anthropic', 'hf' (local model)."""
    model: str = ""
    """Model name on the server, or the model directory for 'hf'."""
    base_url: str = ""
    """Server URL ('openai': e.g. http://127.0.0.1:8000/v1 for vLLM); empty: the client's default."""
    temperature: NonNegative = 1.0
    """Sampling temperature (N attempts per task need diversity)."""
    max_tokens: Count = 4096
    """Most tokens per model turn."""
    api_key_env: str = ""
    """Environment variable holding the API key; empty: the client's usual one."""
    from_stage: Stage = ""
    """Roll each batch out with the latest checkpoint this training stage made in an earlier batch (in process for
    heuristic and hf, served for openai: README, Rounds); '' or none yet: the policy above (round 0)."""

    def __post_init__(self) -> None:
        if self.from_stage and self.kind == "anthropic":
            raise ValueError(f"policy.from_stage is {self.from_stage!r} but policy.kind is anthropic, which cannot "
                             "run a checkpoint: set kind hf (in process) or openai (a vLLM server serving it)")


def make_policy(spec: PolicySpec, api_key: str | None = None) -> Policy:
    """The policy a spec names, with a clear error for missing settings; `api_key` (never stored) wins over
    the environment variable `spec.api_key_env` names. `from_stage` is not read here: pipeline/rollouts/rounds.py turns a
    spec into the one a batch rolls out with."""
    if spec.kind == "heuristic":
        from pipeline.agent.heuristic import HeuristicPolicy

        return HeuristicPolicy()
    if not spec.model:
        raise ValueError(f"policy kind {spec.kind!r} needs `model` (a model name, or a directory for 'hf')")
    if spec.kind == "openai":
        from pipeline.agent.openai_policy import OpenAIPolicy, OpenAIPolicyConfig

        extra = {"base_url": spec.base_url} if spec.base_url else {}
        extra |= {"api_key_env": spec.api_key_env} if spec.api_key_env else {}
        # log-probs and (vLLM) token ids asked for: training scores exactly what was sampled; a server that
        # refuses them is asked once, and the batch metadata says turns were stored without them
        return OpenAIPolicy(OpenAIPolicyConfig(model=spec.model, temperature=spec.temperature,
                                               max_tokens=spec.max_tokens, request_logprobs=True, **extra),
                            api_key=api_key)
    if spec.kind == "anthropic":
        from pipeline.agent.anthropic_policy import AnthropicPolicy, AnthropicPolicyConfig

        extra = {"api_key_env": spec.api_key_env} if spec.api_key_env else {}
        return AnthropicPolicy(AnthropicPolicyConfig(model=spec.model, base_url=spec.base_url or None,
                                                     temperature=spec.temperature, max_tokens=spec.max_tokens,
                                                     **extra), api_key=api_key)
    if spec.kind == "hf":
        from pipeline.agent.hf_policy import LocalHFPolicy, LocalHFPolicyConfig

        return LocalHFPolicy(LocalHFPolicyConfig(model_path=spec.model, temperature=spec.temperature,
                                                 max_new_tokens=min(spec.max_tokens, 2048)))
    raise ValueError(f"unknown policy kind {spec.kind!r}; choose heuristic, openai, anthropic or hf")
