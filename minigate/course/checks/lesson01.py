"""Lesson 01's checks: causal multi-head attention with GQA, and attention with a null key."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from functools import partial

import torch
from einops import einsum, repeat
from torch.overrides import TorchFunctionMode

from .engine import Mismatch, Mistake, check, randn

EXERCISES = ("causal_attention", "attention_with_null")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── causal multi-head attention with GQA ─────────────────────────────────────────────────────────────


def reference_causal_attention(q, k, v):
    """q (b, h, t, d), k and v (b, kv, t, d) -> (b, h, t, d); query head h reads kv head h // (h / kv). Computed
    step by step in float64 (tests/test_lesson_01.py checks it against PyTorch's SDPA), so that the check can refuse
    an answer that calls SDPA itself."""
    g = q.shape[1] // k.shape[1]
    k, v = (repeat(x.double(), "b kv t d -> b (kv g) t d", g=g) for x in (k, v))
    T = q.shape[-2]
    scores = (q.double() @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (b, h, query, key)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).to(q.dtype)


SDPA_HINT = ("your function calls F.scaled_dot_product_attention: the exercise asks for the steps themselves (repeat "
             "k and v, the scores, the mask, the softmax, the weighted sum); the fused kernel is what the next cell "
             "compares your function with")


class _RefuseSDPA(TorchFunctionMode):
    """While active, a call to PyTorch's fused attention raises Mismatch(SDPA_HINT), however it was imported
    (F.scaled_dot_product_attention, torch.nn.functional's name imported alone, torch._C._nn's)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch._C._nn.scaled_dot_product_attention:
            raise Mismatch(SDPA_HINT)
        return func(*args, **(kwargs or {}))


def _refusing_sdpa(fn: Callable) -> Callable:
    """fn, run with PyTorch's fused attention refused (functools.wraps: the check still recognises fn's stub)."""
    @functools.wraps(fn)
    def guarded(*args):
        with _RefuseSDPA():
            return fn(*args)
    return guarded


def _attention(q, k, v, *, scale=True, diagonal=0, softmax_dim=-1, causal=True, kv_order="(kv g)"):
    """Explicit attention with switches for the typical mistakes (scale: True, False or "d")."""
    g = q.shape[1] // k.shape[1]
    k, v = (repeat(x, f"b kv t d -> b {kv_order} t d", g=g) for x in (k, v))
    divisor = {True: math.sqrt(q.shape[-1]), False: 1, "d": q.shape[-1]}[scale]
    scores = einsum(q, k, "b h i d, b h j d -> b h i j") / divisor
    if causal:
        T = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(diagonal), float("-inf"))
    return einsum(torch.softmax(scores, dim=softmax_dim), v, "b h i j, b h j d -> b h i d")


MISTAKES["causal_attention"] = [
    ("softmax over queries", partial(_attention, softmax_dim=-2),
     "softmax over the wrong axis: normalise over keys (the last axis of the (query, key) scores)"),
    ("tril(-1)", partial(_attention, diagonal=-1),
     "the mask is off by one: a query must see itself (tril(), not tril(-1)); query 0 sees only key 0"),
    ("tril(1)", partial(_attention, diagonal=1), "the mask is off by one: query i may see keys 0..i, not key i + 1"),
    ("no scale", partial(_attention, scale=False), "scale missing: divide the scores by sqrt(head_dim)"),
    ("scaled by d", partial(_attention, scale="d"),
     "scaled by head_dim: divide the scores by sqrt(head_dim), not head_dim"),
    ("no mask", partial(_attention, causal=False),
     "no causal mask: query i must not see keys after i (mask them with -inf before the softmax)"),
    ("(g kv)", partial(_attention, kv_order="(g kv)"),
     "GQA heads mismatched: query head h reads kv head h // group (repeat each kv head, don't tile them: "
     "'(kv g)', not '(g kv)')"),
]


def causal_attention(fn: Callable) -> Callable:
    """fn(q (b, h, t, d), k (b, kv, t, d), v (b, kv, t, d)) -> (b, h, t, d), checked against the step-by-step
    reference; an answer that calls F.scaled_dot_product_attention fails with SDPA_HINT, as the lesson asks."""
    shapes = [(2, 4, 2, 6, 8), (1, 3, 3, 5, 4), (1, 6, 1, 4, 16), (1, 6, 3, 5, 4)]  # GQA, MHA, MQA, GQA of 2
    cases = [(f"b={b} h={h} kv={kv} t={t} d={d}", (randn(b, h, t, d, seed=3 * i), randn(b, kv, t, d, seed=3 * i + 1),
                                                   randn(b, kv, t, d, seed=3 * i + 2)))
             for i, (b, h, kv, t, d) in enumerate(shapes)]
    raises = [(r"size of tensor|shape|must match",
               "k and v have n_kv_heads heads: repeat each kv head h // kv times on the head axis first, "
               "repeat(k, 'b kv t d -> b (kv g) t d', g=h // kv)")]
    guarded = _refusing_sdpa(fn)
    out = check("causal_attention", guarded, reference_causal_attention, cases, MISTAKES["causal_attention"],
                raises=raises)
    return fn if out is guarded else out


# ── a head with nothing to attend to: attention with a null key ──────────────────────────────────────

def reference_attention_with_null(scores, v, null_logit):
    """Attention with one extra "null" key per head whose value is the zero vector.
    scores (b, h, q, k) (masked entries already -inf), v (b, h, k, d), null_logit (h,) ->
    (out (b, h, q, d), null_weight (b, h, q)): softmax over the k real keys *and* the null key together."""
    b, h, q, _ = scores.shape
    null = repeat(null_logit.to(scores.dtype), "h -> b h q 1", b=b, q=q)
    weights = torch.softmax(torch.cat([scores, null], dim=-1), dim=-1)  # (b, h, q, k + 1)
    return einsum(weights[..., :-1], v, "b h q k, b h k d -> b h q d"), weights[..., -1]


def _null_attention(scores, v, null_logit, *, null="logit", stable=True, prepend_misaligned=False):
    """Explicit version with switches for the typical mistakes."""
    if null == "none":  # no null key: plain softmax attention, nothing left over
        w = torch.softmax(scores, -1)
        return w @ v, torch.zeros(scores.shape[:-1])
    logit = torch.zeros_like(null_logit) if null == "zero" else null_logit
    s = torch.cat([logit[None, :, None, None].expand(*scores.shape[:-1], 1), scores], -1)  # null first
    if stable:
        s = s - s.amax(-1, keepdim=True)
    e = s.exp()
    w = e / e.sum(-1, keepdim=True)
    real = w[..., :-1] if prepend_misaligned else w[..., 1:]
    return real @ v, w[..., 0]


MISTAKES["attention_with_null"] = [
    ("no null key", partial(_null_attention, null="none"),
     "the null key is missing: append null_logit as one more score column and take ONE softmax over the "
     "k + 1 columns, so the real keys' weights can add up to less than 1"),
    ("null logit 0", partial(_null_attention, null="zero"),
     "the null key's score is null_logit (one per head), not 0: softmax-off-by-one is the special case "
     "null_logit = 0"),
    ("exp overflows", partial(_null_attention, stable=False),
     "exp overflows for large scores (float32 exp(89) = inf -> NaN): subtract each row's max first, "
     "or let torch.softmax do it on the concatenated scores"),
    ("misaligned", partial(_null_attention, prepend_misaligned=True),
     "the weights are shifted by one key: with the null column first, the real keys are columns 1..k "
     "(with it last, columns 0..k-1)"),
]


def attention_with_null(fn: Callable) -> Callable:
    """fn(scores (b, h, q, k), v (b, h, k, d), null_logit (h,)) -> (out (b, h, q, d), null_weight (b, h, q))."""
    def case(seed, b, h, t, d, scale, null_logit, blind_row=None):
        scores = randn(b, h, t, t, seed=seed) * scale
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))  # causal
        if blind_row is not None:  # a query that may see no key at all
            scores[:, :, blind_row] = float("-inf")
        return scores, randn(b, h, t, d, seed=seed + 1), torch.tensor(null_logit)

    cases = [("b=2 h=3 q=k=5 d=4", case(0, 2, 3, 5, 4, 1.0, [0.5, -1.0, 2.0])),
             ("scores up to ~100 (exp overflows in float32)", case(1, 1, 2, 6, 3, 50.0, [1.0, 60.0])),
             ("query 2 may see no key", case(2, 1, 2, 4, 3, 1.0, [0.0, 3.0], blind_row=2))]
    return check("attention_with_null", fn, reference_attention_with_null, cases, MISTAKES["attention_with_null"],
                 atol=1e-6, rtol=1e-5)

