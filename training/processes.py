"""Several training processes (`accelerate launch --num_processes N`, torchrun) as the ActGuide trainer uses them:
each knows its rank, scores its share of every batch, and the gradients and metric sums are added up across them.

No DistributedDataParallel: a process's share of a batch can take more micro-batches than another's (they are sized
in tokens), and DDP's per-backward all-reduce needs every process to call backward equally often. Each process
instead accumulates its micro-batches' gradients (each already divided by the whole batch's token count) and the
sums are all-reduced once per step, so every process takes the same optimizer step as one process over the batch.
"""

from __future__ import annotations


def process_group() -> tuple[int, int]:
    """This process's rank and the number of processes; (0, 1) outside torch.distributed."""
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def summed_across_processes(model, sums, most):
    """Every process's gradients summed into each process's `.grad` (zeros where a process had no micro-batch), and
    the tensors `sums` (summed) and `most` (maximum) across processes; returns (sums, most)."""
    import torch
    import torch.distributed as dist

    waits = []
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad
            waits.append(dist.all_reduce(p.grad, async_op=True))
    dist.all_reduce(sums)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    for wait in waits:
        wait.wait()
    return sums, most
