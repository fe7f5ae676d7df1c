"""ActGuide-RL's mixed-policy objective, offline, over the stored rollouts of the `actguide` rows.

A group is a task's attempts. A task whose unguided attempts all failed gets its action-guided
attempts: merged into the group (`guided_group: merge`, ActGuide-RL's Algorithm 1, steps 4-5: "merge
G+ into G, compute the group advantage on the merged G") or in place of it (`replace`); otherwise its
unguided group stays as it is. Advantages are GRPO's within the group: (reward - mean) / std, the std
over the group; a group of equal rewards has no signal and contributes nothing (so under `replace`, a
guided group that all succeeded teaches nothing).

Per token of the policy's own output (assistant text, tool-call text, end of turn; tool observations
are masked out), the loss is PPO's clipped ratio objective:

    ratio = pi_theta(token | unguided prompt, earlier tokens) / pi_behaviour(token | sampled-under prompt, ...)
    loss  = -mean over tokens of min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A)  [+ kl_weight * KL]

For a guided trajectory the numerator sees the unguided prompt and the denominator the guided one:
what the policy is trained to do is act without the hint. Each turn is scored in the context it was
sampled in, on the ids it sampled (`training.tokens`). With `behaviour_logprobs: stored` the behaviour
log-probs are the rollout's stored numbers on its stored ids, and every trajectory must have been sampled
by the starting model's weights under its chat template (else the stage refuses, naming the mismatch);
with `recompute` the starting model computes them once before the first step, on the prompt each attempt
was sampled under. The optional KL (k3 estimator) is to the starting model on the unguided prompt.
Plain PyTorch: the loop reads top to bottom. The examples it trains on: training/actguide_examples.py.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from pipeline.agent.identity import local_identity
from training.actguide_examples import Example, prepare_examples
from training.common import (MetricsLog, PRECISION_DTYPES, Reporter, TrainResult, finish_run, fresh_run_dir, load_model,
                             read_split, resolved_precision)
from training.config import ActGuideTrainingConfig


def response_logps(model, prefixes: list[list[int]], responses: list[list[int]], pad_id: int):
    """Log-probs of each response's tokens after its prefix (one padded forward); a list of 1-D tensors."""
    import torch

    seqs = [p + r for p, r in zip(prefixes, responses)]
    width = max(len(s) for s in seqs)
    device = next(model.parameters()).device
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs], device=device)
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    logps = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return [logps[i, len(p) - 1:len(p) - 1 + len(r)] for i, (p, r) in enumerate(zip(prefixes, responses))]


class ActGuideTrainer:
    """The loop: behaviour (and reference) log-probs once, then clipped-ratio steps over shuffled batches."""

    def __init__(self, model, tokenizer, examples: list[Example], config: ActGuideTrainingConfig):
        import torch

        self.model, self.examples, self.config = model, examples, config
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        rng = random.Random(config.seed)
        epochs = []
        for _ in range(max(config.epochs, 1)):
            order = list(range(len(examples)))
            rng.shuffle(order)
            epochs += [order[i:i + config.batch_size] for i in range(0, len(order), config.batch_size)]
        self.first_epoch = epochs[:-(-len(examples) // config.batch_size)]
        self.batches = epochs if config.max_steps < 0 else (epochs * config.max_steps)[:config.max_steps]
        self.timings = {"behaviour_forward": 0.0, "policy_forward": 0.0, "backward_and_update": 0.0}
        start = time.monotonic()
        self.behaviour, self.reference = self._starting_logps()
        self.timings["behaviour_forward"] = time.monotonic() - start
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        from transformers import get_scheduler

        self.scheduler = get_scheduler(config.lr_scheduler, self.optimizer, num_warmup_steps=0,
                                       num_training_steps=len(self.batches))

    def _starting_logps(self) -> tuple[dict[int, Any], dict[int, Any]]:
        """Per example: the behaviour policy's log-probs (recorded, or the starting model's on the prompt it
        was sampled under) and the starting model's on the unguided prompt (the KL reference).

        The unguided-prompt pass runs over the first epoch's batches, so an unguided trajectory's ratio
        at step 0 is exactly 1 (same model, same padded batch, same arithmetic)."""
        import torch

        behaviour, reference = {}, {}
        self.model.eval()
        with torch.no_grad():
            for batch in self.first_epoch:
                logps = self._logps(batch, guided=False)
                reference.update({i: lp.detach() for i, lp in zip(batch, logps)})
            guided = [i for i, e in enumerate(self.examples) if e.sampled_under == "guided"]
            for start in range(0, len(guided), self.config.batch_size):
                batch = guided[start:start + self.config.batch_size]
                behaviour.update({i: lp.detach() for i, lp in zip(batch, self._logps(batch, guided=True))})
        for i, e in enumerate(self.examples):
            if e.recorded is not None:  # the rollout's own numbers on its own ids
                behaviour[i] = torch.tensor(e.recorded)
            elif e.sampled_under == "unguided":
                behaviour[i] = reference[i]
        self.model.train()
        return behaviour, reference

    def _logps(self, batch: list[int], guided: bool):
        """Per example: log-probs of its sampled tokens, every segment after its unguided context (or the
        context it was sampled in, `guided`), from one padded forward of all the batch's segments."""
        import torch

        parts = [s for i in batch for s in self.examples[i].segments]
        prefixes = [s.sampled_prompt_ids if guided else s.prompt_ids for s in parts]
        logps = response_logps(self.model, prefixes, [s.response_ids for s in parts], self.pad_id)
        sampled = [lp[torch.tensor(s.mask, dtype=torch.bool, device=lp.device)] for lp, s in zip(logps, parts)]
        out, start = [], 0
        for i in batch:
            count = len(self.examples[i].segments)
            out.append(torch.cat(sampled[start:start + count]))
            start += count
        return out

    def log_ratios(self, batch: list[int], current) -> list:
        """Per example of the batch: log pi_theta - log pi_behaviour on its sampled tokens, from the current
        log-probs (a forward of the batch on the unguided prompt)."""
        return [logp - self.behaviour[i].to(logp.device) for i, logp in zip(batch, current)]

    def loss(self, batch: list[int]) -> tuple[Any, dict[str, float]]:
        """The batch's loss (token mean over the policy's tokens) and what a person watches of it."""
        import torch

        clip, weight = self.config.clip, self.config.kl_weight
        current = self._logps(batch, guided=False)
        ratios = [torch.exp(r) for r in self.log_ratios(batch, current)]
        advantages = [self.examples[i].advantage for i in batch]
        objective = torch.cat([torch.minimum(r * a, r.clamp(1 - clip, 1 + clip) * a)
                               for r, a in zip(ratios, advantages)])
        tokens = objective.numel()
        loss = -objective.sum() / tokens
        kl = torch.zeros(())
        if weight:  # k3 estimator of KL(pi_theta || pi_start) on the unguided prompt
            delta = torch.cat([self.reference[i].to(logp.device) - logp for i, logp in zip(batch, current)])
            kl = (torch.exp(delta) - delta - 1).sum() / tokens
            loss = loss + weight * kl
        every = torch.cat(ratios).detach()
        return loss, {"loss": loss.item(), "kl": kl.item(), "ratio_mean": every.mean().item(),
                      "ratio_max": every.max().item(), "clip_fraction": ((every - 1).abs() > clip).float().mean().item(),
                      "policy_tokens": tokens}

    def train(self, metrics: MetricsLog) -> None:
        import torch

        for step, batch in enumerate(self.batches, start=1):
            start = time.monotonic()
            loss, row = self.loss(batch)
            forward = time.monotonic()
            self.optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            done = time.monotonic()
            self.timings["policy_forward"] += forward - start
            self.timings["backward_and_update"] += done - forward
            seen = sum(len(s.prompt_ids) + len(s.response_ids) for i in batch for s in self.examples[i].segments)
            metrics.add({"step": step, **row, "grad_norm": float(grad_norm),
                         "learning_rate": self.scheduler.get_last_lr()[0], "tokens": seen,
                         "seconds": done - start})


def train_actguide(config: ActGuideTrainingConfig, model_path: str, dataset_folder: str | Path,
                   out_dir: str | Path, report: Reporter | None = None) -> TrainResult:
    """Train on the folder's `actguide` train split; write the run folder `out_dir` (emptied first)."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    starting = local_identity(model_path, model_path, tokenizer.chat_template)
    examples, counts = prepare_examples(read_split(dataset_folder, "actguide"), tokenizer, config, starting)
    out = fresh_run_dir(out_dir)
    metrics = MetricsLog(out, report)
    torch.manual_seed(config.seed)
    model = load_model(model_path, config.precision)
    if torch.cuda.is_available():
        model = model.cuda()
    trainer = ActGuideTrainer(model, tokenizer, examples, config)
    trainer.train(metrics)
    model.save_pretrained(out / "checkpoint")
    tokenizer.save_pretrained(out / "checkpoint")
    history, timings = metrics.rows, trainer.timings
    total = sum(timings.values())
    tokens = sum(m["tokens"] for m in history)
    train_seconds = timings["policy_forward"] + timings["backward_and_update"]
    summary = {
        "stage": "actguide", "starting_model": model_path, "dataset": str(dataset_folder), **counts,
        "behaviour_logprobs": config.behaviour_logprobs, "starting_revision": starting.revision,
        "starting_chat_template_hash": starting.chat_template_hash,
        "dtype": PRECISION_DTYPES[resolved_precision(config.precision)],
        "trajectories": len(examples), "guided_trajectories": sum(e.sampled_under == "guided" for e in examples),
        "steps": len(history), "first_loss": history[0]["loss"], "final_loss": history[-1]["loss"],
        "seconds": round(total, 2), "tokens": tokens,
        "tokens_per_second": round(tokens / train_seconds, 1) if train_seconds else None,
        "seconds_by_phase": {k: round(v, 3) for k, v in timings.items()},
        "forward_share": round((timings["behaviour_forward"] + timings["policy_forward"]) / total, 3) if total else None}
    used = {"stage": "actguide", "starting_model": model_path, "starting_identity": starting, "settings": config,
            "behaviour_logprobs": config.behaviour_logprobs}
    return finish_run(out, used, summary, history)
