"""Log-probs of target tokens through a causal LM's output head, tile by tile, the head's gradient added in place.

    logps = HeadLogProbs.apply(hidden, weight, bias, targets, block, softcap, scale)   # (N,) fp32

The logits of `block` positions x VOCABULARY_TILE vocabulary entries exist at a time (fp32; an online logsumexp
over the vocabulary), and the backward recomputes each tile instead of keeping it: TRL's ChunkedLogProbFunction's
arithmetic. What differs is where the head's gradient goes. TRL's backward returns it as a fresh dense fp32
(vocabulary x hidden) tensor, 0.5 GiB for Qwen2.5-0.5B's head, which autograd holds through the whole backbone's
backward (a tied head's waits there for the embedding's gradient) before adding it to `.grad`: from a step's second
micro-batch on, a second buffer of the vocabulary's size next to `.grad` just when the activations peak. Here the
backward adds each tile's product straight into the weight's `.grad` (made as zeros at a step's first backward, as
autograd would make it), and returns no gradient for the weight, so nothing of the vocabulary's size is made besides.
A head that is not a leaf parameter, or one in 16 bits (`precision: bf16`), gets TRL's way: a returned fp32 gradient.
"""

from __future__ import annotations

import torch

# Vocabulary entries per tile: a tile's logits are (block positions, this) fp32; 256 MiB at 4096 positions
VOCABULARY_TILE = 16384


def compute_dtype(device_type: str, dtype):
    """The dtype the head's products run in: autocast's (bf16-mixed), else the hidden states' own."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else dtype


def logits(h, weight, bias, start: int, end: int, softcap: float | None, scale: float):
    """The transformed fp32 logits of the positions `h` for vocabulary entries [start, end)."""
    z = torch.mm(h, weight[start:end].to(h.dtype).t()).float()
    if bias is not None:
        z += bias[start:end].float()
    if scale != 1.0:
        z.mul_(scale)
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)
    return z


def in_tile(targets, start: int, end: int):
    """The rows whose target lies in [start, end), and the target's column within the tile."""
    rows = ((targets >= start) & (targets < end)).nonzero()[:, 0]
    return rows, targets[rows] - start


def add_product(acc, a, b) -> None:
    """`acc += a @ b` into an fp32 `acc`, on a GPU without rounding the product to bf16 first (as TRL's kernel: a
    rounded sum over vocabulary tiles biases training)."""
    if acc.device.type == "cuda" and a.dtype != torch.float32:
        try:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            return
        except TypeError:  # a torch without out_dtype
            pass
    acc.addmm_(a.float(), b.float())


def gradient_target(weight):
    """Where the backward sums the head's gradient, and whether that is the weight's `.grad` itself: a leaf weight's
    fp32 `.grad` (made as zeros when there is none yet), in place; else (a head computed from other tensors, or one
    in 16 bits) a fresh fp32 buffer of the weight's shape, returned to autograd as TRL's kernel returns it."""
    if weight.is_leaf and weight.dtype == torch.float32 and (weight.grad is None or weight.grad.dtype == torch.float32):
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        return weight.grad, True
    return torch.zeros(weight.shape, device=weight.device, dtype=torch.float32), False


class HeadLogProbs(torch.autograd.Function):
    """log p(targets[n] | hidden[n]) through the head `weight` (vocabulary x hidden), with TRL's softcap and scale."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, block: int, softcap: float | None, scale: float):
        dtype = compute_dtype(hidden.device.type, hidden.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            h, n = hidden.detach().to(dtype), hidden.shape[0]
            top = torch.full((n,), float("-inf"), device=hidden.device)
            total, target_z = torch.zeros(n, device=hidden.device), torch.zeros(n, device=hidden.device)
            for start in range(0, weight.shape[0], VOCABULARY_TILE):
                end = min(start + VOCABULARY_TILE, weight.shape[0])
                for first in range(0, n, block):
                    part = slice(first, first + block)
                    z = logits(h[part], weight, bias, start, end, softcap, scale)
                    rows, column = in_tile(targets[part], start, end)
                    target_z[first + rows] = z[rows, column]
                    new_top = torch.maximum(top[part], z.amax(-1))
                    total[part] = total[part] * torch.exp(top[part] - new_top) \
                        + z.sub_(new_top[:, None]).exp_().sum(-1)
                    top[part] = new_top
            log_z = top + torch.log(total)
        ctx.save_for_backward(hidden, weight, bias, targets, log_z)
        ctx.settings = block, softcap, scale, dtype
        return target_z - log_z

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, log_z = ctx.saved_tensors
        block, softcap, scale, dtype = ctx.settings
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
            h, n, grad = hidden.detach().to(dtype), hidden.shape[0], grad.float()
            grad_hidden = torch.zeros(hidden.shape, device=hidden.device) if want_hidden else None
            grad_bias = torch.zeros(bias.shape, device=bias.device) if want_bias else None
            grad_weight, in_place = gradient_target(weight) if want_weight else (None, False)
            for start in range(0, weight.shape[0], VOCABULARY_TILE):
                end = min(start + VOCABULARY_TILE, weight.shape[0])
                w = weight[start:end].to(dtype)
                for first in range(0, n, block):
                    part = slice(first, first + block)
                    z = logits(h[part], weight, bias, start, end, softcap, scale)
                    slope = 1 - (z / softcap) ** 2 if softcap is not None else None  # d tanh, before z is reused
                    # d log p(target) / dz = 1[target] - p, times the incoming gradient; in place in z's buffer
                    dz = z.sub_(log_z[part, None]).exp_().mul_(-grad[part, None])
                    rows, column = in_tile(targets[part], start, end)
                    dz[rows, column] += grad[part][rows]
                    if slope is not None:
                        dz.mul_(slope)
                    if scale != 1.0:
                        dz.mul_(scale)
                    if grad_bias is not None:
                        grad_bias[start:end] += dz.sum(0)
                    dz = dz.to(dtype)
                    if grad_hidden is not None:
                        add_product(grad_hidden[part], dz, w)
                    if grad_weight is not None:
                        add_product(grad_weight[start:end], dz.t(), h[part])
        returned = grad_weight.to(weight.dtype) if grad_weight is not None and not in_place else None
        return (grad_hidden.to(hidden.dtype) if grad_hidden is not None else None, returned,
                grad_bias.to(bias.dtype) if grad_bias is not None else None, None, None, None, None)
