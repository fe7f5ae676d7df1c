"""Log-probs of sampled tokens without a whole row's full-vocabulary logits, and micro-batches sized in tokens.

A causal LM's forward returns logits of shape (rows, positions, vocabulary): at 8 rows of 8k tokens and Qwen's
151,936-token vocabulary that is 40 GB in fp32 before a single log-softmax. Here the backbone returns its last
hidden states, only the positions whose next token was sampled are kept, and training/head_logprobs.py projects them
through the output head `chunk` positions x 16,384 vocabulary entries at a time (an online logsumexp over the
vocabulary in fp32; its backward recomputes each tile instead of keeping it, and adds the head's gradient into the
weight's `.grad` in place rather than making a second dense gradient of the head's size).
"""

from __future__ import annotations

from typing import Sequence

Row = tuple[list[int], list[int], list[int]]  # (prefix ids, response ids, mask: 1 on the tokens to score)


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of `lengths` grouped so each group's padded size (rows x longest row) is at most `budget`:
    longest first, each row joining the current group while it fits. A row longer than `budget` gets a group
    of its own (the caller refuses those beforehand)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        # longest first: a group's width is its first row's length
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def head_scaling(model) -> tuple[float | None, float]:
    """The output head's final-logit softcap and the scale its logits are multiplied by, read from the model's
    config as TRL's fused head reads them (Gemma's softcap; Cohere, Granite, Falcon-H1 scales)."""
    text = model.config.get_text_config()
    scale = next((getattr(text, name) for name in ("logit_scale", "output_multiplier", "lm_head_multiplier")
                  if getattr(text, name, None) is not None), None)
    if scale is None and getattr(text, "logits_scaling", None) is not None:
        scale = text.logits_scaling if text.model_type == "hyperclovax" else 1 / text.logits_scaling
    return getattr(text, "final_logit_softcapping", None), 1.0 if scale is None else scale


def chunked_logps(model, hidden, targets, chunk: int):
    """log p(targets[n] | hidden[n]) through the model's output head, its logits `chunk` positions at a time; (N,)
    fp32. hidden: (N, H) last hidden states; targets: (N,) token ids."""
    from training.head_logprobs import HeadLogProbs

    head = model.get_output_embeddings()
    softcap, scale = head_scaling(model)
    return HeadLogProbs.apply(hidden, head.weight, getattr(head, "bias", None), targets, chunk, softcap, scale)


def sampled_logps(model, rows: Sequence[Row], pad_id: int, chunk: int) -> list:
    """Per row: log-probs of its response tokens where its mask is 1, after its prefix; one padded forward of the
    backbone, the head on those positions only (`chunked_logps`). A list of 1-D fp32 tensors."""
    import torch

    device = next(model.parameters()).device
    seqs = [p + r for p, r, _ in rows]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs], device=device)  # (rows, width)
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
    # the positions of the scored tokens: the token at t is predicted by the hidden state at t - 1
    where = [(row, len(p) + k) for row, (p, _, mask) in enumerate(rows) for k, keep in enumerate(mask) if keep]
    row_index = torch.tensor([w[0] for w in where], device=device, dtype=torch.long)
    position = torch.tensor([w[1] for w in where], device=device, dtype=torch.long)
    hidden = model.base_model(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    logps = chunked_logps(model, hidden[row_index, position - 1], ids[row_index, position], chunk)
    return list(logps.split([sum(mask) for _, _, mask in rows]))


def response_logps(model, prefixes: list[list[int]], responses: list[list[int]], pad_id: int, chunk: int = 2048):
    """Log-probs of each response's tokens after its prefix (one padded forward); a list of 1-D tensors."""
    return sampled_logps(model, [(p, r, [1] * len(r)) for p, r in zip(prefixes, responses)], pad_id, chunk)
