"""Lesson 08's checks: how much a model's predictions depend on the context, and Qwen3-Next's gated q_proj in
minigate's layout."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from einops import rearrange

from .engine import Mistake, check, randn

EXERCISES = ("prediction_spread", "qwen3_next_q_proj")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── prediction spread ────────────────────────────────────────────────────────────────────────────────

def reference_prediction_spread(logits):
    """logits (batch, pos, vocab) -> the mean over every (window, position) of KL(p_i || p_mean), in nats: p_i the
    predicted next-token distribution there, p_mean the mean of all of them. Computed as entropies: the mean of
    KL(p_i || p_mean) is H(p_mean) - mean_i H(p_i) (the mutual information between the position and the token)."""
    p = logits.double().softmax(-1).flatten(0, -2)  # (batch * pos, vocab)
    entropy = lambda q: -torch.special.xlogy(q, q).sum(-1)
    return (entropy(p.mean(0)) - entropy(p).mean()).item()


def _prediction_spread(logits, *, reverse=False, mean_of="probs", over=(0, 1), softmax_dim=-1, vocab="sum",
                       log=math.log, reduce="mean"):
    """Direct KL(p_i || p_mean) with switches for the typical mistakes."""
    logp = logits.double().log_softmax(softmax_dim)
    p = logp.exp()
    mean = p.mean(over, keepdim=True) if mean_of == "probs" else logits.double().mean(over, keepdim=True).softmax(-1)
    logm = mean.log()
    kl = mean * (logm - logp) if reverse else p * (logp - logm)  # (batch, pos, vocab)
    kl = (kl.sum(-1) if vocab == "sum" else kl.mean(-1)) / log(math.e)  # (batch, pos), in nats or in bits
    if reduce == "batchmean":  # F.kl_div(..., reduction="batchmean") on (batch, pos, vocab): sum / batch
        return (kl.sum() / logits.shape[0]).item()
    return kl.mean().item()


MISTAKES["prediction_spread"] = [
    ("KL the other way round", partial(_prediction_spread, reverse=True),
     "KL(p_i || p_mean) weights log(p_i / p_mean) by p_i, each position's own prediction, not by p_mean "
     "(F.kl_div(input, target) computes KL(target || input), with input in log space)"),
    ("softmax of the mean logits", partial(_prediction_spread, mean_of="logits"),
     "p_mean is the mean of the predicted probabilities, softmax(logits).mean(...), not the softmax of the mean "
     "logits"),
    ("mean over the batch only", partial(_prediction_spread, over=0),
     "p_mean averages the predictions over every position of every window (dims 0 and 1), not per position over "
     "the batch"),
    ("mean over each window only", partial(_prediction_spread, over=1),
     "p_mean averages the predictions over every window too (dims 0 and 1), not within each window"),
    ("softmax over positions", partial(_prediction_spread, softmax_dim=1),
     "each prediction is a distribution over the vocabulary: softmax over the last dimension"),
    ("softmax over windows", partial(_prediction_spread, softmax_dim=0),
     "each prediction is a distribution over the vocabulary: softmax over the last dimension (F.softmax without "
     "dim picks dim 0 on a 3-d tensor)"),
    ("mean over the vocabulary", partial(_prediction_spread, vocab="mean"),
     "KL sums over the vocabulary; only the positions (and windows) are averaged"),
    ("in bits", partial(_prediction_spread, log=math.log2),
     "in nats, like the loss: the natural log, not log2"),
    ("kl_div batchmean", partial(_prediction_spread, reduce="batchmean"),
     "average over positions as well: F.kl_div's reduction='batchmean' divides by the first dimension only (the "
     "batch), so on (batch, pos, vocab) it is pos times too large; flatten to (batch * pos, vocab) first"),
]


def prediction_spread(fn: Callable) -> Callable:
    """fn(logits (batch, pos, vocab)) -> the mean KL, in nats, from each position's predicted next-token distribution
    to the mean of all of them (see reference_prediction_spread)."""
    def logits(shape, seed, scale):
        return randn(*shape, seed=seed) * scale

    same = logits((1, 1, 6), 5, 2.0).expand(3, 4, 6).clone()  # one prediction everywhere
    cases = [("2 windows of 3 positions, 5 tokens", (logits((2, 3, 5), 0, 1.0),)),
             ("4 x 6 positions, 7 tokens, peaked predictions", (logits((4, 6, 7), 1, 4.0),)),
             ("1 window of 5 positions", (logits((1, 5, 4), 2, 2.0),)),
             ("3 windows of 1 position", (logits((3, 1, 6), 3, 2.0),)),
             ("8 x 16 positions, 50 tokens, nearly flat", (logits((8, 16, 50), 4, 0.3),)),
             ("the same prediction everywhere: 0", (same,))]
    return check("prediction_spread", fn, reference_prediction_spread, cases, MISTAKES["prediction_spread"],
                 raises=[(r"cannot be converted to (a )?Scalar|only one element tensors",
                          "average down to a single number (over windows and positions) before .item()"),
                         (r"softmax\(\) (received an invalid|missing)",
                          "give softmax / log_softmax the vocabulary axis: dim=-1")])


# ── Qwen3-Next's gated q_proj in minigate's layout ───────────────────────────────────────────────────

def reference_qwen3_next_q_proj(weight, n_heads, n_kv_heads, head_dim):
    """Qwen3-Next's q_proj weight (n_heads * 2 * head_dim, d_model), whose rows come per query head as
    [query_h | gate_h], -> minigate's G1 elementwise layout: per kv head, [queries of its group | their gates]."""
    g, D = n_heads // n_kv_heads, head_dim
    rows = []
    for kv in range(n_kv_heads):
        heads = range(kv * g, (kv + 1) * g)  # the query heads that share kv head `kv`
        rows += [h * 2 * D + i for h in heads for i in range(D)]  # their queries: first half of each head's rows
        rows += [h * 2 * D + D + i for h in heads for i in range(D)]  # then their gates: the second half
    return weight[rows]


def _qwen3_next_q_proj(weight, n_heads, n_kv_heads, head_dim, *, source="per head", gate_first=False,
                       group="(kv g)", target="per kv group", inner="g d"):
    """einops version with switches for the typical mistakes."""
    two = "(two h d)" if source == "all queries first" else "(h two d)"
    w = rearrange(weight, f"{two} m -> h two d m", two=2, h=n_heads)
    if gate_first:
        w = w.flip(1)
    if target == "unchanged":
        return weight
    if target == "all queries first":
        return rearrange(w, "h two d m -> (two h d) m")
    w = rearrange(w, f"{group} two d m -> kv two g d m", kv=n_kv_heads)
    return rearrange(w, f"kv two g d m -> (kv two {inner}) m")


MISTAKES["qwen3_next_q_proj"] = [
    ("unchanged", partial(_qwen3_next_q_proj, target="unchanged"),
     "the rows need reordering: Qwen3-Next has per query head [query_h | gate_h], minigate per kv head "
     "[queries of its group heads | gates of those heads]"),
    ("gate first", partial(_qwen3_next_q_proj, gate_first=True),
     "in each head's 2 * head_dim rows Qwen3-Next puts the query first, then the gate (torch.chunk(..., 2) "
     "returns query_states, gate)"),
    ("source all queries first", partial(_qwen3_next_q_proj, source="all queries first"),
     "Qwen3-Next's rows are not [all queries | all gates]: its forward views q_proj's output as "
     "(..., n_heads, 2 * head_dim), so each head's query and gate rows sit together"),
    ("target all queries first", partial(_qwen3_next_q_proj, target="all queries first"),
     "the gates go after the queries of their own kv group, not after all queries (the two agree only "
     "when n_kv_heads = 1)"),
    ("(g kv)", partial(_qwen3_next_q_proj, group="(g kv)"),
     "query head h shares kv head h // (n_heads // n_kv_heads): consecutive heads form a group, heads are "
     "not dealt out to the kv heads in turn"),
    ("(d g)", partial(_qwen3_next_q_proj, inner="d g"),
     "within a group the rows go head by head, each head's head_dim rows together: '(g d)', not '(d g)'"),
]


def qwen3_next_q_proj(fn: Callable) -> Callable:
    """fn(weight (n_heads * 2 * head_dim, d_model), n_heads, n_kv_heads, head_dim) -> the same rows reordered
    into minigate's per-kv-group G1 elementwise layout (see reference_qwen3_next_q_proj)."""
    shapes = [(4, 2, 4, 8), (6, 3, 2, 4), (8, 2, 2, 3), (4, 1, 4, 8)]  # (heads, kv heads, head_dim, d_model)
    cases = [(f"h={H} kv={K} d={D}", (randn(H * 2 * D, M, seed=i), H, K, D)) for i, (H, K, D, M) in enumerate(shapes)]
    return check("qwen3_next_q_proj", fn, reference_qwen3_next_q_proj, cases, MISTAKES["qwen3_next_q_proj"], atol=0,
                 rtol=0)
