"""ActGuide's loss and gradient against a hand computation on a toy model, tokens a few per turn.

The toy model's logits at position t are A[x_t] + sum_{s<=t} B[x_s]: the next token depends on the
previous one and on everything before it, so a hint in the prompt changes every log-prob after it.
The cases are chosen so that each term, made wrong, moves the result: ratios on both sides of the clip
range under positive and negative advantages, group sizes whose std is not 1, a guided attempt (numerator
on the unguided prompt, denominator on the guided one), a current model away from the starting one (the
KL's direction) and a rescued group whose members only count when merged. The loss is VeRL's (ActGuide-RL's
reference): ratios clamped in log space, a dual clip on negative advantages, a clamped low-variance KL; its parts are
pinned on numbers worked out by hand, and the tiny model checks what micro-batches and chunked log-probs must not
change.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.agent.policy import PolicyIdentity
from training.actguide import ActGuideTrainer
from training.actguide_examples import prepare_examples
from training.actguide_objective import low_var_kl, policy_terms
from training.common import TrainingDataError
from training.config import ActGuideTrainingConfig
from training.logprobs import sampled_logps
from training.tiny_model import IM_END

IDENTITY = PolicyIdentity("toy", "sha256:toy", "template")
PROMPT = [{"role": "system", "content": "S", "tool_calls": None, "tool_call_id": None},
          {"role": "user", "content": "fix", "tool_calls": None, "tool_call_id": None}]
GUIDED = [PROMPT[0], {**PROMPT[1], "content": "fix hint: run tests"}]
# the advantages worked out by hand, as VeRL computes them: (r - mean) / (sample std + 1e-6) within each group
MIXED = {"u0": (2 / 3) / (3 ** -0.5 + 1e-6), "u1": (-1 / 3) / (3 ** -0.5 + 1e-6),
         "u2": (-1 / 3) / (3 ** -0.5 + 1e-6)}  # rewards 1, 0, 0: mean 1/3, sample std sqrt(1/3)
MERGED = {"b_u0": -0.25 / 0.500001, "b_u1": -0.25 / 0.500001, "b_g0": 0.75 / 0.500001,
          "b_g1": -0.25 / 0.500001}  # 0, 0 | 1, 0: mean 1/4, sample std 1/2
# stored behaviour chosen so ratios land on both sides of [0.8, 1.2], and 4.0 beyond the dual clip's 3
TARGET_RATIOS = (1.5, 0.5, 1.1, 0.7, 4.0)


class Toy(torch.nn.Module):
    """logits[t] = A[x_t] + cumulative sum of B[x_s] for s <= t, laid out as the trainer calls a causal LM: its
    backbone's hidden state at t is the one-hot of x_t beside the counts of x_0..x_t, its output head [A; B]^T."""

    def __init__(self, vocab: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.A = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g))
        self.B = torch.nn.Parameter(0.3 * torch.randn(vocab, vocab, generator=g))
        self.base_model = ToyBackbone(vocab)
        self.config = SimpleNamespace(get_text_config=SimpleNamespace)  # no softcap, no logit scale

    def get_output_embeddings(self):
        return SimpleNamespace(weight=torch.cat([self.A, self.B]).T, bias=None)  # (vocab, 2 * vocab)


class ToyBackbone(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids, attention_mask=None, use_cache=None):
        one_hot = torch.nn.functional.one_hot(input_ids, self.vocab).float()  # (rows, positions, vocab)
        return SimpleNamespace(last_hidden_state=torch.cat([one_hot, one_hot.cumsum(dim=1)], dim=-1))


def hand_logps(A, B, context: list[int], ids: list[int]):
    """log p(ids | context) under the toy model, position by position."""
    seq = torch.tensor(context + ids)
    logits = A[seq[:-1]] + B[seq[:-1]].cumsum(dim=0)
    return torch.log_softmax(logits, -1).gather(-1, seq[1:, None])[:, 0][len(context) - 1:]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def context_ids(tokenizer, prompt) -> list[int]:
    return tokenizer.apply_chat_template(prompt, tokenize=True, return_dict=True, add_generation_prompt=True)[
        "input_ids"]


def member(tokenizer, rid: str, under: str, reward: float, ids: list[int], logprobs: list[float]) -> dict:
    """A row member as the actguide rows hold it: one assistant turn with its stored ids and log-probs."""
    context = context_ids(tokenizer, GUIDED if under == "guided" else PROMPT)
    return {"rollout_id": rid, "sampled_under": under, "sample_index": 0, "reward": reward,
            "resolved": reward > 0, "completion_tokens": len(ids),
            "completion": [{"role": "assistant", "content": "x", "tool_calls": None, "tool_call_id": None}],
            "prompt_token_ids": [context], "token_ids": [ids], "logprobs": [logprobs],
            "policy_model": IDENTITY.model, "policy_revision": IDENTITY.revision,
            "chat_template_hash": IDENTITY.chat_template_hash, "temperature": 1.0, "top_p": 1.0, "top_k": 0}


def cases(tokenizer, current: Toy):
    """(rows, expected): the rows' stored behaviour log-probs put the current model's ratios at TARGET_RATIOS."""
    end = tokenizer.convert_tokens_to_ids(IM_END)
    plan = [("m", "u0", "unguided", 1.0), ("m", "u1", "unguided", 0.0), ("m", "u2", "unguided", 0.0),
            ("b", "b_u0", "unguided", 0.0), ("b", "b_u1", "unguided", 0.0), ("b", "b_g0", "guided", 1.0),
            ("b", "b_g1", "guided", 0.0)]
    rows = {"m": [], "b": []}
    expected = []
    for n, (row, rid, under, reward) in enumerate(plan):
        ids = [100 + 7 * n, 300 + n, end][: 2 + n % 2]  # two or three tokens
        sampled = context_ids(tokenizer, GUIDED if under == "guided" else PROMPT)
        with torch.no_grad():
            current_logps = hand_logps(current.A, current.B, context_ids(tokenizer, PROMPT), ids)
        stored = [float(lp - math.log(TARGET_RATIOS[(n + j) % 5])) for j, lp in enumerate(current_logps)]
        rows[row].append(member(tokenizer, rid, under, reward, ids, stored))
        expected.append((rid, {**MIXED, **MERGED}[rid], sampled, ids, stored))
    chat = dict(tools="[]", prompt=PROMPT)
    return [{**chat, "guided_prompt": PROMPT, "group_id": "m", "trajectories": rows["m"]},
            {**chat, "guided_prompt": GUIDED, "group_id": "b", "trajectories": rows["b"]}], expected


def hand_loss(start: Toy, current: Toy, tokenizer, expected, mode: str, clip: float, kl_weight: float,
              dual_clip: float, seen: dict):
    """VeRL's clipped objective (dual clip below negative advantages) with its low-variance KL to the starting
    model, token mean, written out on its own; `seen` gets the ratios and which clip set each token's loss."""
    unguided = context_ids(tokenizer, PROMPT)
    terms, kls = [], []
    for _, advantage, sampled, ids, stored in expected:
        logp = hand_logps(current.A, current.B, unguided, ids)
        with torch.no_grad():
            behaviour = torch.tensor(stored) if mode == "stored" else hand_logps(start.A, start.B, sampled, ids)
            reference = hand_logps(start.A, start.B, unguided, ids)
        ratio = torch.exp(torch.clamp(logp - behaviour, -20, 20))
        unclipped, clipped = -advantage * ratio, -advantage * ratio.clamp(1 - clip, 1 + clip)
        loss = torch.maximum(unclipped, clipped)
        seen["clipped"] += (clipped > unclipped).tolist()
        seen["dual"] += ((loss > -advantage * dual_clip) & (advantage < 0)).tolist()
        seen["ratios"] += ratio.tolist()
        terms.append(torch.minimum(loss, torch.tensor(-advantage * dual_clip)) if advantage < 0 else loss)
        delta = torch.clamp(reference - logp, -20, 20)
        kls.append(torch.clamp(torch.exp(delta) - delta - 1, -10, 10))
    tokens = sum(len(ids) for *_, ids, _ in expected)
    return torch.cat(terms).sum() / tokens + kl_weight * torch.cat(kls).sum() / tokens


@pytest.mark.parametrize("mode", ["stored", "recompute"])
def test_loss_and_gradient_match_the_hand_computation(tokenizer, mode):
    vocab = len(tokenizer)
    start, current = Toy(vocab, seed=0), Toy(vocab, seed=0)
    with torch.no_grad():  # the current model has moved away from the starting one
        current.A.add_(0.5 * torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)))
        current.B.add_(0.2 * torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(2)))
    rows, expected = cases(tokenizer, current)
    config = ActGuideTrainingConfig(guided_group="merge", behaviour_logprobs=mode, batch_size=16, clip=0.2,
                                    kl_weight=0.5, dual_clip=3.0, micro_batch_tokens=64, logprob_chunk_tokens=2)
    examples, counts = prepare_examples(rows, tokenizer, config, IDENTITY)
    assert sorted(e.rollout_id for e in examples) == sorted(rid for rid, *_ in expected)
    assert {e.rollout_id: e.advantage for e in examples} == pytest.approx({**MIXED, **MERGED})
    model = Toy(vocab, seed=0)
    trainer = ActGuideTrainer(model, tokenizer, examples, config)  # behaviour and reference: the starting model
    assert len(trainer._micro_batches(trainer.batches[0], guided=False)) > 1  # the token mean spans micro-batches
    with torch.no_grad():
        model.A.copy_(current.A)
        model.B.copy_(current.B)
    model.zero_grad()
    row = trainer.gradients(trainer.batches[0])
    seen = {"ratios": [], "clipped": [], "dual": []}
    want = hand_loss(start, current, tokenizer, expected, mode, clip=0.2, kl_weight=0.5, dual_clip=3.0, seen=seen)
    want.backward()
    ratios = seen["ratios"]
    assert row["ratio_max"] == pytest.approx(max(ratios), rel=1e-5)
    assert row["ratio_mean"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-5)
    assert row["clip_fraction"] == pytest.approx(sum(seen["clipped"]) / len(ratios))
    assert row["dual_clip_fraction"] == pytest.approx(sum(seen["dual"]) / len(ratios))
    assert row["loss"] == pytest.approx(want.item(), abs=1e-5) and row["policy_tokens"] == len(ratios)
    assert torch.allclose(model.A.grad, current.A.grad, atol=1e-6)
    assert torch.allclose(model.B.grad, current.B.grad, atol=1e-6)
    assert row["clip_fraction"] > 0 and row["kl"] > 0  # the clip and the KL both bite in this case
    assert mode == "recompute" or row["dual_clip_fraction"] > 0  # stored: ratio 4 under a negative advantage


def test_dual_clip_bounds_a_negative_advantage_tokens_loss():
    """Ratio 5 (log-ratio log 5), advantage -2, clip 0.2: PPO's loss is max(-A r, -A clip(r)) = max(10, 2.4) = 10;
    the dual clip 3 bounds it at 3 * |A| = 6 and stops its gradient; without it (0) the loss stays 10, d/dlogp = 10."""
    logp = torch.tensor([math.log(5.0)], requires_grad=True)
    bounded = policy_terms(logp, torch.zeros(1), -2.0, clip=0.2, dual_clip=3.0)
    bounded.loss.sum().backward()
    assert bounded.loss.item() == pytest.approx(6.0) and logp.grad.item() == 0.0
    assert bounded.dual_clipped.tolist() == [True] and bounded.clipped.tolist() == [False]
    logp.grad = None
    free = policy_terms(logp, torch.zeros(1), -2.0, clip=0.2, dual_clip=0.0)
    free.loss.sum().backward()
    assert free.loss.item() == pytest.approx(10.0) and logp.grad.item() == pytest.approx(10.0)
    assert free.dual_clipped.tolist() == [False]
    # the same ratio under A = +2: clipped at 1.2, -2.4; ratio 0.5 under A = -2: clipped at 0.8, 1.6, within 6
    positive = policy_terms(torch.tensor([math.log(5.0)]), torch.zeros(1), 2.0, clip=0.2, dual_clip=3.0)
    assert positive.loss.item() == pytest.approx(-2.4) and positive.clipped.tolist() == [True]
    low = policy_terms(torch.tensor([math.log(0.5)]), torch.zeros(1), -2.0, clip=0.2, dual_clip=3.0)
    assert low.loss.item() == pytest.approx(1.6) and low.clipped.tolist() == [True]
    assert low.dual_clipped.tolist() == [False]


def test_the_log_ratio_and_the_kl_are_clamped():
    """A log-ratio of 30 is taken as 20: ratio e^20 = 485,165,195.4 (not e^30), the loss under A = -1 with no dual
    clip e^20. k3 = e^d - d - 1 of d = reference - logp: d = 0.5 gives 0.148721; d = 3 gives 16.09, clamped to 10;
    d = -30 gives 29, clamped to 10; d = 1000 would overflow: taken as 20, clamped to 10, its gradient 0 (not nan)."""
    far = policy_terms(torch.tensor([30.0]), torch.zeros(1), -1.0, clip=0.2, dual_clip=0.0)
    assert far.ratio.item() == pytest.approx(485165195.4, rel=1e-6) and far.loss.item() == pytest.approx(485165195.4,
                                                                                                           rel=1e-6)
    logp = torch.zeros(4, requires_grad=True)
    kl = low_var_kl(logp, torch.tensor([0.5, 3.0, -30.0, 1000.0]))
    assert kl.tolist() == pytest.approx([math.exp(0.5) - 1.5, 10.0, 10.0, 10.0], rel=1e-6)
    kl.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-(math.exp(0.5) - 1), 0.0, 0.0, 0.0], rel=1e-6)


def test_replace_trains_on_the_guided_attempts_alone(tokenizer):
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    config = ActGuideTrainingConfig(guided_group="replace", behaviour_logprobs="stored")
    examples, _ = prepare_examples(rows, tokenizer, config, IDENTITY)
    one = 0.5 / (0.5 ** 0.5 + 1e-6)  # rewards 1, 0: mean 1/2, sample std sqrt(1/2)
    assert {e.rollout_id: e.advantage for e in examples} == pytest.approx({**MIXED, "b_g0": one, "b_g1": -one})


def test_counts_say_where_each_trajectorys_tokens_came_from(tokenizer):
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    _, stored = prepare_examples(rows, tokenizer, ActGuideTrainingConfig(behaviour_logprobs="stored"), IDENTITY)
    assert stored == {"groups": 2, "guided_groups": 1, "equal_reward_groups": 0, "zero_advantage_members": 0,
                      "rerender_mismatch": 0, "too_long": 0, "cut_before_last_edit": 0, "stored_tokens": 5,
                      "rendered_tokens": 0}  # replace: b's two guided attempts, not its unguided ones
    other = PolicyIdentity("toy", IDENTITY.revision, "another template")  # its ids would not be this template's
    _, rendered = prepare_examples(rows, tokenizer, ActGuideTrainingConfig(behaviour_logprobs="recompute"), other)
    assert (rendered["stored_tokens"], rendered["rendered_tokens"]) == (0, 5)
    same = prepare_examples(rows, tokenizer, ActGuideTrainingConfig(behaviour_logprobs="recompute"), IDENTITY)
    assert (same[1]["stored_tokens"], same[1]["rendered_tokens"]) == (5, 0)
    assert all(e.recorded is None for e in same[0])  # recomputed: the stored numbers are not the behaviour


def test_a_partly_solved_task_keeps_its_unguided_group(tokenizer):
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    rescued = rows[1]
    solved = {**rescued, "trajectories": [{**rescued["trajectories"][0], "reward": 1.0, "resolved": True}]
              + rescued["trajectories"][1:]}
    examples, counts = prepare_examples([solved], tokenizer, ActGuideTrainingConfig(), IDENTITY)
    one = 0.5 / (0.5 ** 0.5 + 1e-6)  # rewards 1, 0
    assert {e.rollout_id: e.advantage for e in examples} == pytest.approx({"b_u0": one, "b_u1": -one})
    assert counts["guided_groups"] == 0


def refusal(tokenizer, change) -> str:
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    rows[0]["trajectories"][1] = change(rows[0]["trajectories"][1])
    with pytest.raises(TrainingDataError) as info:
        prepare_examples(rows, tokenizer, ActGuideTrainingConfig(behaviour_logprobs="stored"), IDENTITY)
    assert str(info.value).endswith("set training.actguide.behaviour_logprobs: recompute to compute the behaviour "
                                    "policy with the starting model instead")
    return str(info.value)


@pytest.mark.parametrize("change, says", [
    (lambda m: {**m, "token_ids": None, "policy_model": ""},
     "trajectory u1 has no stored token ids and log-probs for every turn (policy unknown); "),
    (lambda m: {**m, "logprobs": [None]}, "trajectory u1 has no stored token ids and log-probs for every turn (policy toy)"),
    (lambda m: {**m, "prompt_token_ids": m["prompt_token_ids"] * 2}, "has no stored token ids"),
    (lambda m: {**m, "policy_revision": "sha256:other"},
     "trajectory u1 was not sampled by the starting model: weights sha256:other (policy toy) vs sha256:toy (toy); "),
    (lambda m: {**m, "chat_template_hash": "other"},
     "trajectory u1 was not sampled by the starting model: chat template other vs template; "),
])
def test_stored_logprobs_are_refused_unless_the_starting_model_sampled_them(tokenizer, change, says):
    assert says in refusal(tokenizer, change)


def test_stored_ids_that_do_not_continue_their_prompt_are_refused(tokenizer):
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    member = rows[0]["trajectories"][0]
    rows[0]["trajectories"][0] = {**member, "prompt_token_ids": [[5] + member["prompt_token_ids"][0]]}
    with pytest.raises(TrainingDataError, match="trajectory u0 turn 0: its stored context does not start with its "
                                                "prompt as this tokenizer renders it; set training.actguide"):
        prepare_examples(rows, tokenizer, ActGuideTrainingConfig(behaviour_logprobs="stored"), IDENTITY)
    examples, counts = prepare_examples(rows, tokenizer, ActGuideTrainingConfig(behaviour_logprobs="recompute"),
                                        IDENTITY)
    assert counts["rendered_tokens"] == 1 and counts["stored_tokens"] == 4  # u0 re-rendered from its text


def test_counts_of_equal_reward_groups_and_turns_too_long(tokenizer):
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    equal = {**rows[0], "group_id": "e", "trajectories": [{**m, "reward": 0.0, "resolved": False}
                                                          for m in rows[0]["trajectories"]]}
    longest = max(len(m["prompt_token_ids"][0]) + len(m["token_ids"][0]) for m in rows[0]["trajectories"])
    _, counts = prepare_examples([equal, rows[0]], tokenizer, ActGuideTrainingConfig(max_length=longest - 1),
                                 IDENTITY)
    assert (counts["groups"], counts["equal_reward_groups"], counts["too_long"], counts["stored_tokens"]) == (2, 1, 1, 2)


def test_a_member_with_a_turn_without_ids_or_without_turns_is_refused(tokenizer):
    def two_turns(m):  # the second turn came back without ids
        return {**m, "completion": m["completion"] * 2, "token_ids": m["token_ids"] + [None],
                "prompt_token_ids": m["prompt_token_ids"] * 2, "logprobs": m["logprobs"] * 2}

    assert "trajectory u1 has no stored token ids" in refusal(tokenizer, two_turns)
    no_turn = {"completion": [], "prompt_token_ids": [], "token_ids": [], "logprobs": []}
    assert "trajectory u1 has no stored token ids" in refusal(tokenizer, lambda m: {**m, **no_turn})


def test_the_schedule_of_batches_and_learning_rate(tokenizer):
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    examples, _ = prepare_examples(rows, tokenizer, ActGuideTrainingConfig(guided_group="merge"), IDENTITY)  # 7
    model = Toy(len(tokenizer), seed=0)
    two_epochs = ActGuideTrainer(model, tokenizer, examples, ActGuideTrainingConfig(batch_size=3, epochs=2))
    assert [len(b) for b in two_epochs.batches] == [3, 3, 1] * 2 and len(two_epochs.first_epoch) == 3
    assert sorted(i for b in two_epochs.batches[:3] for i in b) == list(range(7))
    capped = ActGuideTrainer(model, tokenizer, examples, ActGuideTrainingConfig(batch_size=3, max_steps=4,
                                                                               learning_rate=0.25))
    assert [len(b) for b in capped.batches] == [3, 3, 1, 3] and capped.scheduler.get_last_lr() == [0.25]
    assert ActGuideTrainer(model, tokenizer, examples, ActGuideTrainingConfig(max_steps=0)).batches == []
    one_epoch = ActGuideTrainer(model, tokenizer, examples, ActGuideTrainingConfig(batch_size=3))
    assert [len(b) for b in one_epoch.batches] == [3, 3, 1]
    linear = ActGuideTrainer(model, tokenizer, examples, ActGuideTrainingConfig(lr_scheduler="linear", max_steps=4,
                                                                                learning_rate=0.25))
    assert linear.scheduler.get_last_lr() == [0.25]  # no warm-up: the first step takes the full rate


def test_a_member_at_the_group_mean_counts_with_advantage_zero_unless_skipped(tokenizer):
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    rewards = {"u0": 1.0, "u1": 0.5, "u2": 0.0}  # mean 1/2, sample std 1/2: advantages 1, 0, -1 (std + 1e-6)
    row = {**rows[0], "trajectories": [{**m, "reward": rewards[m["rollout_id"]]} for m in rows[0]["trajectories"]]}
    examples, counts = prepare_examples([row], tokenizer, ActGuideTrainingConfig(), IDENTITY)
    one = 0.5 / 0.500001
    assert {e.rollout_id: e.advantage for e in examples} == pytest.approx({"u0": one, "u1": 0.0, "u2": -one})
    assert counts["equal_reward_groups"] == 0 and counts["zero_advantage_members"] == 1
    skipped, _ = prepare_examples([row], tokenizer, ActGuideTrainingConfig(zero_advantage_tokens="skip"), IDENTITY)
    assert sorted(e.rollout_id for e in skipped) == ["u0", "u2"]


def test_zero_advantage_tokens_count_in_the_token_mean_and_the_kl(tokenizer, tiny_model):
    """u0 (advantage A = 0.5 / (0.5 + 1e-6), about 1; 2 tokens) and u1 (advantage 0, 3 tokens) in one batch. At the
    first step every ratio is exactly 1, so each token's loss is -A: the mean is -(2 * A + 3 * 0) / 5, about -0.4,
    not -2 A / 2. Once the model moves, the KL is the k3 sum over all 5 tokens over 5."""
    rows, _ = cases(tokenizer, Toy(len(tokenizer), seed=0))
    rewards = {"u0": 1.0, "u1": 0.5, "u2": 0.0}
    row = {**rows[0], "trajectories": [{**m, "reward": rewards[m["rollout_id"]]} for m in rows[0]["trajectories"]]}
    config = ActGuideTrainingConfig(behaviour_logprobs="recompute", batch_size=2, kl_weight=0.5)
    examples, _ = prepare_examples([row], tokenizer, config, IDENTITY)
    pair = [e for e in examples if e.rollout_id in ("u0", "u1")]
    assert [e.advantage for e in pair] == pytest.approx([0.5 / 0.500001, 0.0])
    assert [e.policy_tokens for e in pair] == [2, 3]
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    trainer = ActGuideTrainer(model, tokenizer, pair, config)
    first = trainer.gradients(trainer.batches[0])
    assert first["loss"] == pytest.approx(-2 * (0.5 / 0.500001) / 5) and first["policy_tokens"] == 5
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    moved = trainer.gradients(trainer.batches[0])
    k3 = []
    for e in pair:
        (s,) = e.segments
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            now, then = (torch.log_softmax(m(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
                         [len(s.prompt_ids) - 1:] for m in (model, start))
        k3 += (torch.exp(then - now) - (then - now) - 1).tolist()
    assert len(k3) == 5 and moved["kl"] == pytest.approx(sum(k3) / 5, rel=1e-4) and moved["kl"] > 0
    assert moved["loss"] == pytest.approx(moved["policy_loss"] + 0.5 * moved["kl"])
