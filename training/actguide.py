"""ActGuide-RL's mixed-policy objective, offline, over the stored rollouts of the `actguide` rows.

A group is a task's attempts. A task whose unguided attempts all failed gets its action-guided attempts in place
of them (`guided_group: replace`, the default, as ActGuide-RL's reference code does) or merged into them
(`merge`, its Algorithm 1's wording); otherwise its unguided group stays as it is. Advantages are GRPO's within the
group: (reward - mean) / std. Members at the group mean (advantage 0) still count in the token mean and the KL
(`zero_advantage_tokens: count`, the reference's) or are left out (`skip`); a group of equal rewards has no signal.

Per token of the policy's own output (assistant text, tool-call text, end of turn; tool observations are masked
out), the loss is VeRL's (ActGuide-RL's reference), training/actguide_objective.py:

    ratio = pi_theta(token | unguided prompt, earlier tokens) / pi_behaviour(token | sampled-under prompt, ...)
    loss  = token mean of max(-A * ratio, -A * clip(ratio, 1 - clip, 1 + clip)), bounded by dual_clip * |A|
            where A < 0 (dual clip), + kl_weight * low_var_kl to the starting model on the unguided prompt

the log-ratios clamped to [-20, 20] before exp, the KL to [-10, 10]; the mean is over every policy token of the
batch. For a guided trajectory the numerator sees the unguided prompt and the denominator the guided one: what
the policy is trained to do is act without the hint. Each turn is scored in the context it was sampled in, on the
ids it sampled (`training.tokens`). With `behaviour_logprobs: recompute` (the default) the starting model
computes the behaviour log-probs once before the first step, on the prompt each attempt was sampled under; with
`stored` they are the rollout's own numbers, refused unless the starting model sampled them.

At scale: a batch is scored in micro-batches of at most `micro_batch_tokens` padded tokens (by default as many as
its longest segment: shorter ones packed up to it, so a step's peak is that of its longest segment's forward, as one
row a forward in SFT) with segments packed longest first, gradients accumulated, each micro-batch's sum divided by
the whole batch's token count; log-probs come from the backbone's hidden states through the output head
`logprob_chunk_tokens` positions at a time, the head's gradient added into `.grad` in place (training/logprobs.py),
so no row's full-vocabulary logits exist at once. Under `accelerate launch` with N
processes each takes every N-th trajectory of the same shuffled batch and the gradients are summed across them:
one step is the same as one process's over the whole batch. Only rank 0 writes the run folder.
The examples it trains on: training/actguide_examples.py.
"""

from __future__ import annotations

import dataclasses
import random
from itertools import accumulate
from pathlib import Path
from typing import Any, Callable

from pipeline.agent.identity import local_identity
from training.actguide_examples import Example, prepare_examples
from training.actguide_objective import check_dual_clip, low_var_kl, policy_terms
from training.common import (MetricsLog, PRECISION_DTYPES, Reporter, TrainResult, TrainingDataError, autocast,
                             checkpointing_on, enable_checkpointing, finish_run, fresh_run_dir, load_model, read_split,
                             resolved_precision)
from training.config import ActGuideTrainingConfig
from training.logprobs import micro_batches, sampled_logps
from training.processes import process_group, summed_across_processes
from training.throughput import clock, run_numbers

STATS = ("policy", "kl", "ratio", "clipped", "dual_clipped")  # per-token sums a step reports, over all processes


def check_lengths(examples: list[Example], config: ActGuideTrainingConfig) -> None:
    """Refuse, before any forward, a segment (its longer prompt plus response) that no micro-batch can hold."""
    if not config.micro_batch_tokens:  # each batch's budget is its longest segment: every segment fits
        return
    for e in examples:
        for s in e.segments:
            length = max(len(s.prompt_ids), len(s.sampled_prompt_ids)) + len(s.response_ids)
            if length > config.micro_batch_tokens:
                raise TrainingDataError(
                    f"trajectory {e.rollout_id}: a segment of {length} tokens (prompt and response) does not fit "
                    f"training.actguide.micro_batch_tokens ({config.micro_batch_tokens}); raise "
                    f"training.actguide.micro_batch_tokens to {length} or more, or set training.actguide.max_length "
                    f"(now {config.max_length}) to at most {config.micro_batch_tokens} to cut such trajectories at "
                    "a turn boundary")


def schedule(count: int, config: ActGuideTrainingConfig) -> tuple[list[list[int]], list[list[int]]]:
    """The optimizer steps' batches of example indices (each epoch shuffled, seeded) and the first epoch's."""
    rng = random.Random(config.seed)
    epochs = []
    for _ in range(max(config.epochs, 1)):
        order = list(range(count))
        rng.shuffle(order)
        epochs += [order[i:i + config.batch_size] for i in range(0, count, config.batch_size)]
    first_epoch = epochs[:-(-count // config.batch_size)]
    return (epochs if config.max_steps < 0 else (epochs * config.max_steps)[:config.max_steps]), first_epoch


class ActGuideTrainer:
    """The loop: behaviour (and reference) log-probs once, then clipped-ratio steps over shuffled batches."""

    def __init__(self, model, tokenizer, examples: list[Example], config: ActGuideTrainingConfig):
        import torch
        from transformers import get_scheduler

        check_dual_clip(config.dual_clip)
        check_lengths(examples, config)
        self.model, self.examples, self.config = model, examples, config
        self.rank, self.world = process_group()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # per example, per segment: where the segment's sampled tokens sit among the example's log-probs
        self.spans = [list(zip([0, *ends], ends)) for ends in
                      (list(accumulate(sum(s.mask) for s in e.segments)) for e in examples)]
        self.batches, self.first_epoch = schedule(len(examples), config)
        self.timings = {"behaviour_forward": 0.0, "policy_forward": 0.0, "backward_and_update": 0.0}
        start = clock(model)
        self.behaviour, self.reference = self._starting_logps()
        self.timings["behaviour_forward"] = clock(model) - start
        # fused: one kernel over all parameters, no per-step temporaries of their size (what the TRL stages use)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, fused=True)
        self.scheduler = get_scheduler(config.lr_scheduler, self.optimizer, num_warmup_steps=0,
                                       num_training_steps=len(self.batches))

    def share(self, batch: list[int]) -> list[int]:
        """This process's trajectories of `batch`: every world-th, from its rank."""
        return batch[self.rank::self.world]

    def _starting_logps(self) -> tuple[dict[int, Any], dict[int, Any]]:
        """Per example this process trains on: the behaviour policy's log-probs (recorded, or the starting model's
        on the prompt it was sampled under) and the starting model's on the unguided prompt (the KL reference).

        The unguided pass scores the first epoch's shares in the micro-batches its steps will, so an unguided
        trajectory's ratio at its first step is exactly 1 (same model, same padded rows, same arithmetic)."""
        import torch

        mine = sorted({i for batch in self.batches for i in self.share(batch)})
        reference: dict[int, Any] = {}
        self.model.eval()
        with torch.no_grad():
            for batch in self.batches[:len(self.first_epoch)]:
                reference.update(zip(self.share(batch), self._logps(self.share(batch), guided=False)))
            rest = [i for i in mine if i not in reference]  # several processes: later epochs deal trajectories anew
            reference.update(zip(rest, self._logps(rest, guided=False)))
            guided = [i for i in mine if self.examples[i].sampled_under == "guided"
                      and self.examples[i].recorded is None]
            behaviour = dict(zip(guided, self._logps(guided, guided=True)))
        device = next(self.model.parameters()).device
        for i in mine:
            if self.examples[i].recorded is not None:  # the rollout's own numbers on its own ids
                behaviour[i] = torch.tensor(self.examples[i].recorded, device=device)
            elif self.examples[i].sampled_under == "unguided":
                behaviour[i] = reference[i]
        self.model.train()
        return behaviour, reference

    def _micro_batches(self, batch: list[int], guided: bool) -> list[list[tuple[tuple[int, int], tuple]]]:
        """The batch's segments, (example, segment) with the row to score, packed into micro-batches."""
        pieces = [(i, j) for i in batch for j in range(len(self.examples[i].segments))]
        rows = []
        for i, j in pieces:
            s = self.examples[i].segments[j]
            rows.append((s.sampled_prompt_ids if guided else s.prompt_ids, s.response_ids, s.mask))
        lengths = [len(p) + len(r) for p, r, _ in rows]
        groups = micro_batches(lengths, self.config.micro_batch_tokens or max(lengths, default=0))
        return [[(pieces[k], rows[k]) for k in group] for group in groups]

    def _score(self, group) -> list:
        with autocast(self.model, self.config.precision):
            return sampled_logps(self.model, [row for _, row in group], self.pad_id, self.config.logprob_chunk_tokens)

    def _logps(self, batch: list[int], guided: bool) -> list:
        """Per example: log-probs of its sampled tokens, every segment after its unguided context (or the
        context it was sampled in, `guided`), scored in micro-batches."""
        import torch

        found = {}
        for group in self._micro_batches(batch, guided):
            found.update(zip([piece for piece, _ in group], self._score(group)))
        return [torch.cat([found[i, j] for j in range(len(self.examples[i].segments))]) for i in batch]

    def log_ratios(self, batch: list[int], current) -> list:
        """Per example of the batch: log pi_theta - log pi_behaviour on its sampled tokens, from the current
        log-probs (a forward of the batch on the unguided prompt)."""
        return [logp - self.behaviour[i] for i, logp in zip(batch, current)]

    def _micro_batch_sums(self, group, logps) -> tuple[Any, Any, Any]:
        """The micro-batch's summed policy loss and KL (with grad), and its STATS sums and ratio max (without)."""
        import torch

        terms, kls = [], []
        for ((i, j), _), logp in zip(group, logps):
            start, end = self.spans[i][j]
            terms.append(policy_terms(logp, self.behaviour[i][start:end], self.examples[i].advantage,
                                      self.config.clip, self.config.dual_clip))
            kls.append(low_var_kl(logp, self.reference[i][start:end]))
        policy, kl = torch.cat([t.loss for t in terms]).sum(), torch.cat(kls).sum()
        ratio = torch.cat([t.ratio for t in terms])
        stats = torch.stack([x.double() for x in (policy.detach(), kl.detach(), ratio.sum(),
                                                  torch.cat([t.clipped for t in terms]).sum(),
                                                  torch.cat([t.dual_clipped for t in terms]).sum())])
        return policy, kl, (stats, ratio.max().double())

    def gradients(self, batch: list[int]) -> dict[str, float]:
        """Add to each parameter's .grad this batch's loss gradient (a token mean over the whole batch, whichever
        process holds a token), scoring this process's share micro-batch by micro-batch; the batch's metrics."""
        import torch

        tokens = sum(self.examples[i].policy_tokens for i in batch)  # every process knows every example
        device = next(self.model.parameters()).device
        sums = torch.zeros(len(STATS), dtype=torch.float64, device=device)
        ratio_max = torch.zeros((), dtype=torch.float64, device=device)
        for group in self._micro_batches(self.share(batch), guided=False):
            start = clock(self.model)
            policy, kl, (stats, most) = self._micro_batch_sums(group, self._score(group))
            self.timings["policy_forward"] += clock(self.model) - start
            ((policy + self.config.kl_weight * kl) / tokens).backward()
            sums, ratio_max = sums + stats, torch.maximum(ratio_max, most)
        if self.world > 1:
            sums, ratio_max = summed_across_processes(self.model, sums, ratio_max)
        means = dict(zip(STATS, (sums / tokens).tolist()))
        return {"loss": means["policy"] + self.config.kl_weight * means["kl"], "policy_loss": means["policy"],
                "kl": means["kl"], "ratio_mean": means["ratio"], "ratio_max": ratio_max.item(),
                "clip_fraction": means["clipped"], "dual_clip_fraction": means["dual_clipped"],
                "policy_tokens": tokens}

    def train(self, record: Callable[[dict[str, Any]], None]) -> None:
        """Every step: gradients of the batch, clipped, one AdamW step; `record` gets the step's metrics."""
        import torch

        for step, batch in enumerate(self.batches, start=1):
            start, forward = clock(self.model), self.timings["policy_forward"]
            self.optimizer.zero_grad(set_to_none=True)
            row = self.gradients(batch)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            done = clock(self.model)
            # the rest of the step: backward passes, the sums across processes, the update
            self.timings["backward_and_update"] += done - start - (self.timings["policy_forward"] - forward)
            seen = sum(len(s.prompt_ids) + len(s.response_ids) for i in batch for s in self.examples[i].segments)
            record({"step": step, **row, "grad_norm": float(grad_norm),
                    "learning_rate": self.scheduler.get_last_lr()[0], "tokens": seen, "seconds": done - start})


def train_actguide(config: ActGuideTrainingConfig, model_path: str, dataset_folder: str | Path,
                   out_dir: str | Path, report: Reporter | None = None,
                   report_to: tuple[str, ...] = ()) -> TrainResult | None:
    """Train on the folder's `actguide` train split; write the run folder `out_dir` (emptied first) and log each
    step to the trackers `report_to` names. Under several processes rank 0 writes and returns; the others None."""
    import torch
    from accelerate import Accelerator, PartialState
    from transformers import AutoTokenizer

    PartialState()  # joins the process group its launcher (accelerate launch, torchrun) described, if any
    main = process_group()[0] == 0  # torch's rank: accelerate's state calls every CPU process the main one
    # trackers on rank 0 alone, their local files under trainer/ as the TRL stages' (trainer/runs/actguide/)
    accelerator = Accelerator(log_with=(list(report_to) or None) if main else None,
                              project_dir=str(Path(out_dir) / "trainer"))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    starting = local_identity(model_path, model_path, tokenizer.chat_template)
    examples, counts = prepare_examples(read_split(dataset_folder, "actguide"), tokenizer, config, starting)
    out = fresh_run_dir(out_dir) if main else Path(out_dir)
    torch.manual_seed(config.seed)
    model = load_model(model_path, config.precision).to(accelerator.device)
    if checkpointing_on(config.gradient_checkpointing):
        enable_checkpointing(model)
    trainer = ActGuideTrainer(model, tokenizer, examples, config)
    accelerator.init_trackers("runs/actguide", config=dataclasses.asdict(config))
    metrics = MetricsLog(out, report) if main else None

    def record(row: dict[str, Any]) -> None:
        if metrics is not None:
            metrics.add(row)
        accelerator.log(row, step=int(row["step"]))

    trainer.train(record)
    if main:
        model.save_pretrained(out / "checkpoint")
        tokenizer.save_pretrained(out / "checkpoint")
    accelerator.end_training()
    if not main:
        return None
    summary = {"stage": "actguide", "starting_model": model_path, "dataset": str(dataset_folder), **counts,
               "behaviour_logprobs": config.behaviour_logprobs, "starting_revision": starting.revision,
               "starting_chat_template_hash": starting.chat_template_hash,
               "dtype": PRECISION_DTYPES[resolved_precision(config.precision)], "processes": trainer.world,
               "trajectories": len(examples), "guided_trajectories": sum(e.sampled_under == "guided" for e in examples),
               **run_numbers(metrics.rows, trainer.timings)}
    used = {"stage": "actguide", "starting_model": model_path, "starting_identity": starting, "settings": config,
            "behaviour_logprobs": config.behaviour_logprobs}
    return finish_run(out, used, summary, metrics.rows)
