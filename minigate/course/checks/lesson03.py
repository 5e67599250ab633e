"""Lesson 03's checks: the warmup + cosine learning-rate schedule, and the next-token loss."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .engine import NONE_HINT, Mismatch, check, randn, what

EXERCISES = ("lr_schedule", "next_token_loss")  # its check cells, in the lesson's order

# ── warmup + cosine learning-rate schedule ───────────────────────────────────────────────────────────


def _schedule(step, cfg, warmup_shift=0, floor="scaled", shape="cosine", from_warmup=True):
    """The schedule with switches for the typical mistakes (floor: "scaled", "none" or "clamp")."""
    if step <= cfg.warmup_steps:
        return cfg.lr * (step + warmup_shift) / cfg.warmup_steps
    start = cfg.warmup_steps if from_warmup else 0
    progress = min((step - start) / (cfg.steps - start), 1.0)
    min_lr = cfg.lr * cfg.min_lr_ratio if floor == "scaled" else 0.0
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if shape == "cosine" else 1 - progress
    lr = min_lr + (cfg.lr - min_lr) * decay
    return max(lr, cfg.lr * cfg.min_lr_ratio) if floor == "clamp" else lr


def _number(x, where: str) -> float:
    """One number from a learner's function (a float, an int, a one-element tensor), or a Mismatch naming it."""
    if x is None:
        raise Mismatch(f"{where}: {NONE_HINT}")
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_complex():
        return float(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool) or type(x).__module__ == "numpy" and not x.shape:
        return float(x)
    raise Mismatch(f"{where}: expected a number, got {what(x)}")


def _over_steps(f: Callable) -> Callable:
    """f(step, cfg) -> lr  ==>  g(cfg) -> the lr of every step 1..cfg.steps as one tensor."""
    def run(cfg):
        return torch.tensor([_number(f(s, cfg), f"step {s}") for s in range(1, cfg.steps + 1)], dtype=torch.float64)
    return run


def lr_schedule(fn: Callable) -> Callable:
    """fn(step (1-based), cfg: TrainConfig) -> lr, checked against minigate.train.lr_at over every step."""
    from ...train import TrainConfig, lr_at

    cfgs = [TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1),
            TrainConfig(steps=40, warmup_steps=4, lr=3e-3, min_lr_ratio=0.2),
            TrainConfig(steps=30, warmup_steps=0, lr=2e-3, min_lr_ratio=0.0)]
    cases = [(f"steps={c.steps} warmup={c.warmup_steps} min_lr_ratio={c.min_lr_ratio}", (c,)) for c in cfgs]
    variant = lambda **kw: _over_steps(lambda s, c: _schedule(s, c, **kw))
    mistakes = [
        (variant(warmup_shift=-1),
         "off by one in the warmup: step is 1-based, step s uses lr * s / warmup_steps (the first step is not 0)"),
        (variant(warmup_shift=1),
         "off by one in the warmup: step is 1-based, step s uses lr * s / warmup_steps (not (s + 1))"),
        (variant(floor="none"), "no min_lr floor: the cosine ends at lr * min_lr_ratio, not 0"),
        (variant(floor="clamp"),
         "the floor is not a clamp: the cosine runs from lr down to min_lr = lr * min_lr_ratio, "
         "min_lr + (lr - min_lr) * 0.5 (1 + cos(pi p))"),
        (variant(shape="linear"), "linear decay: use a cosine, 0.5 (1 + cos(pi p))"),
        (variant(from_warmup=False),
         "the cosine starts at the end of the warmup: progress = (step - warmup) / (steps - warmup)"),
    ]
    learner = _over_steps(fn)
    result = check("lr_schedule", learner, _over_steps(lr_at), cases, mistakes, atol=1e-12, rtol=1e-6,
                   index_label=lambda idx: f"step {idx[0] + 1}",
                   raises=[(r"ZeroDivisionError", "with warmup_steps = 0 there is no warmup: the first step is "
                                                  "already on the cosine (check step <= warmup_steps first)")])
    return fn if result is learner else lr_at


# ── the next-token loss ──────────────────────────────────────────────────────────────────────────────

def reference_next_token_loss(logits, tokens):
    """logits (b, t, v) of a model that read tokens (b, t) -> mean cross-entropy of predicting tokens[:, i + 1]
    from logits[:, i], over the b * (t - 1) predictions (the last position has no next token)."""
    return _next_token_loss(logits, tokens)


def _next_token_loss(logits, tokens, shift="right", divide="mean", norm=-1):
    """Log-softmax and gather, with switches for the typical mistakes."""
    if shift == "right":
        logits, targets = logits[:, :-1], tokens[:, 1:]
    elif shift == "left":
        logits, targets = logits[:, 1:], tokens[:, :-1]
    elif shift == "roll":
        targets = tokens.roll(-1, dims=1)
    else:
        targets = tokens
    logp = logits.double().log_softmax(norm) if norm is not None else logits.double()
    nll = -logp.gather(-1, targets[..., None])[..., 0]  # (b, t - 1)
    if divide == "sum":
        return nll.sum()
    return nll.sum() / (tokens.numel() if divide == "all tokens" else nll.numel())


def next_token_loss(fn: Callable) -> Callable:
    """fn(logits (b, t, v), tokens (b, t)) -> scalar mean next-token cross-entropy (nats per predicted token)."""
    cases = []
    for i, (b, t, v) in enumerate([(2, 6, 11), (1, 2, 5), (3, 9, 7)]):
        tokens = torch.randint(0, v, (b, t), generator=torch.Generator().manual_seed(100 + i))
        cases.append((f"b={b} t={t} vocab={v}", (randn(b, t, v, seed=i) * 2, tokens)))
    mistakes = [
        (lambda lg, tk: _next_token_loss(lg, tk, shift="none"),
         "no shift: logits[:, i] predict the *next* token, so compare logits[:, :-1] with tokens[:, 1:]"),
        (lambda lg, tk: _next_token_loss(lg, tk, shift="left"),
         "shifted the wrong way: position i predicts token i + 1, so drop the *last* logits and the *first* tokens"),
        (lambda lg, tk: _next_token_loss(lg, tk, shift="roll"),
         "torch.roll wraps around: the last position would 'predict' the first token; drop it instead "
         "(t - 1 predictions per row)"),
        (lambda lg, tk: _next_token_loss(lg, tk, divide="sum"),
         "a sum, not a mean: average over the b * (t - 1) predictions"),
        (lambda lg, tk: _next_token_loss(lg, tk, divide="all tokens"),
         "divide by the number of predictions, b * (t - 1), not by b * t"),
        (lambda lg, tk: _next_token_loss(lg, tk, norm=None),
         "logits are not log-probabilities: take log_softmax over the vocabulary first (or use F.cross_entropy)"),
        (lambda lg, tk: _next_token_loss(lg, tk, norm=1),
         "log_softmax over the wrong axis: normalise over the vocabulary (the last axis), not over positions"),
    ]
    raises = [(r"[Ee]xpected.*(target|batch_size)|only batches of spatial targets",
               "F.cross_entropy wants the vocabulary on axis 1: flatten first, "
               "rearrange(logits[:, :-1], 'b t v -> (b t) v') and rearrange(tokens[:, 1:], 'b t -> (b t)')")]
    return check("next_token_loss", fn, reference_next_token_loss, cases, mistakes, atol=1e-5, rtol=1e-5,
                 raises=raises)
