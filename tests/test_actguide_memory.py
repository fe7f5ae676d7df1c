"""What keeps ActGuide's step memory flat in the batch (issue #49; figures: benchmarks/training_memory.py): the output
head's gradient added into `.grad` in place, no second buffer of the head's size, and at the default
`micro_batch_tokens` (0) no forward bigger than the batch's longest segment; neither changes what a step computes."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.test_actguide_scale import first_step, folder, folder_examples, split_turns, tiny  # noqa: F401  fixtures


class Shapes(TorchDispatchMode):
    """The shape of every tensor an op makes while it is on."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += [tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else [out])
                      if isinstance(t, torch.Tensor)]
        return out


def test_the_head_gradient_is_added_into_grad_with_no_buffer_of_the_heads_size():
    """A second micro-batch's backward: `.grad` already holds the first's; the head's gradient lands in it, equal to
    the full log-softmax's, and no op of the backward makes a tensor of the head's shape (TRL's kernel makes one per
    call: a dense fp32 gradient, 0.5 GiB for Qwen2.5-0.5B's head)."""
    from training.head_logprobs import HeadLogProbs

    g = torch.Generator().manual_seed(0)
    vocab, width, n = 40_000, 8, 6  # more than two vocabulary tiles
    weight = torch.nn.Parameter(torch.randn(vocab, width, generator=g))
    hidden = torch.randn(n, width, generator=g, requires_grad=True)
    targets = torch.tensor([0, 16_383, 16_384, 39_999, 20_000, 5])  # at the tiles' edges
    earlier = torch.randn(vocab, width, generator=g)
    weight.grad = earlier.clone()
    logps = HeadLogProbs.apply(hidden, weight, None, targets, 4, None, 1.0)
    want = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets[:, None])[:, 0]
    assert torch.allclose(logps, want, atol=1e-5)
    with Shapes() as shapes:
        logps.sum().backward()
    assert (vocab, width) not in shapes.made and (width, vocab) not in shapes.made
    expected = torch.autograd.grad(want.sum(), weight)[0]
    assert torch.allclose(weight.grad - earlier, expected, atol=1e-5)


def test_by_default_a_micro_batch_is_no_bigger_than_the_longest_segment_and_the_step_is_the_same(tiny, folder):
    """micro_batch_tokens 0: each micro-batch's padded size is at most the batch's longest segment (shorter segments
    packed up to it), nothing is refused, and the loss and gradients are those of the whole batch in one forward."""
    examples = folder_examples(tiny, folder) + split_turns(tiny)
    whole, whole_grads, _ = first_step(tiny, examples, micro_batch_tokens=100_000)
    parts, part_grads, trainer = first_step(tiny, examples, micro_batch_tokens=0)
    lengths = [len(s.prompt_ids) + len(s.response_ids) for e in examples for s in e.segments]
    groups = trainer._micro_batches(trainer.batches[0], guided=False)
    sizes = [len(group) * max(len(p) + len(r) for _, (p, r, _) in group) for group in groups]
    assert max(sizes) <= max(lengths) and len(groups) < len(lengths)  # packed, but never past the longest
    assert parts["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert parts["kl"] == pytest.approx(whole["kl"], rel=1e-5)
    for name, grad in whole_grads.items():
        assert torch.allclose(part_grads[name], grad, rtol=1e-4, atol=1e-7), name
