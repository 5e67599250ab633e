"""Evaluation, apart from training: the next-token loss, eval mode, and the validation loss of a model.

    from minigate.evaluation import evaluate
    val_loss = evaluate(model, val_tokens, seq_len=128)   # mean next-token loss over fixed windows

train.py (the loop's validation), ablation.py (perplexity under interventions) and `minigate eval` use it.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from einops import rearrange

from .data import eval_batches


def token_cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits (batch, pos, vocab) against targets y (batch, pos), in float32: the mean over
    every token, or with reduction="none" each token's own, (batch, pos)."""
    loss = F.cross_entropy(rearrange(logits.float(), "b t v -> (b t) v"), rearrange(y, "b t -> (b t)"),
                           reduction=reduction)
    return loss if reduction == "mean" else rearrange(loss, "(b t) -> b t", b=y.shape[0])


@contextmanager
def eval_mode(model):
    """Evaluation mode inside the block; the model's own mode (training or not) back after it, errors included."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, seq_len: int, batch_size: int = 16, bos_id: int = 0,
             max_batches: int | None = None, amp_dtype: torch.dtype | None = None) -> float:
    """Mean next-token loss over fixed, non-overlapping windows of `tokens` (see data.eval_batches)."""
    device = model.device
    total, count = 0.0, 0
    with eval_mode(model):
        for x, y in eval_batches(tokens, batch_size, seq_len, bos_id, max_batches or None):
            with torch.autocast(device.type, amp_dtype) if amp_dtype else nullcontext():
                logits = model(x.to(device))
            total += token_cross_entropy(logits, y.to(device)).item() * y.numel()
            count += y.numel()
    return total / count
