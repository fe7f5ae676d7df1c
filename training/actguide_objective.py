"""ActGuide-RL's per-token loss terms, as its reference (VeRL's `compute_policy_loss` and `kl_penalty`) computes them.

    log ratio = clamp(logp - behaviour logp, -20, 20)           # before exp: a stale token cannot overflow
    ratio     = exp(log ratio)
    policy    = max(-A * ratio, -A * clamp(ratio, 1 - clip, 1 + clip))
    policy    = min(policy, -A * dual_clip)   where A < 0       # dual clip: at most dual_clip * |A|
    kl        = clamp(exp(d) - d - 1, -10, 10), d = clamp(reference logp - logp, -20, 20)   # low_var_kl (k3)

The loss is the token mean of policy + kl_weight * kl over every policy token of the batch (training/actguide.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOG_RATIO_BOUND = 20.0  # VeRL clamps log-ratios (and the KL's log-ratio) to [-20, 20]
KL_BOUND = 10.0  # and the k3 value to [-10, 10]


@dataclass
class PolicyTerms:
    """Per token of one example: the policy loss and what a person watches of it."""

    loss: Any  # (tokens,) -A * ratio, clipped, dual-clipped
    ratio: Any  # (tokens,) exp of the clamped log-ratio
    clipped: Any  # (tokens,) bool: the clipped ratio set the loss (VeRL's pg_clipfrac)
    dual_clipped: Any  # (tokens,) bool: the dual clip's bound set it (VeRL's pg_clipfrac_lower)


def policy_terms(logp, behaviour, advantage: float, clip: float, dual_clip: float) -> PolicyTerms:
    """VeRL's clipped policy loss for tokens sharing one advantage; `dual_clip` 0: no bound on negative ones."""
    import torch

    ratio = torch.exp((logp - behaviour).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    unclipped = -advantage * ratio
    clipped = -advantage * ratio.clamp(1 - clip, 1 + clip)
    loss = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(ratio, dtype=torch.bool)
    if dual_clip and advantage < 0:
        bound = -advantage * dual_clip
        dual = loss > bound
        loss = loss.clamp(max=bound)
    return PolicyTerms(loss, ratio.detach(), (clipped > unclipped).detach(), dual.detach())


def low_var_kl(logp, reference):
    """VeRL's low_var_kl: the k3 estimator of KL(pi_theta || pi_reference), log-ratio and value clamped."""
    import torch

    delta = (reference - logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return (torch.exp(delta) - delta - 1).clamp(-KL_BOUND, KL_BOUND)


def check_dual_clip(dual_clip: float) -> None:
    """Refuse a dual clip in (0, 1]: its bound would hold a negative-advantage token's loss even at ratio 1, leaving
    such tokens no gradient."""
    if dual_clip and dual_clip <= 1.0:
        raise ValueError(f"training.actguide.dual_clip is {dual_clip}; set it above 1 (VeRL's clip_ratio_c, "
                         "ActGuide-RL: 3.0), or 0 for no bound")
