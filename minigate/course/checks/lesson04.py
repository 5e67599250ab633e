"""Lesson 04's checks: where the massive activation sits, whether a <bos>-attending head is a no-op, and where each
head parks its attention, part by part (from which F-Attn follows)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from .engine import Mistake, check, randn
from .lesson02 import _copy_parts  # the random part and the copy part of copy-task rows

EXERCISES = ("locate_massive", "bos_noop_test", "bos_share_by_part")  # check cells, in lesson order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── where the massive activation sits ─────────────────────────────────────────────────────

def reference_locate_massive(cache, n_layers):
    """-> (values (layer,), where (layer, 3) long): each layer's largest |residual stream| value after the block
    (hook_resid_post, (batch, pos, d_model)) and its (prompt, position, dimension), as massive_activations() gives."""
    return _locate_massive(cache, n_layers)


def _locate_massive(cache, n_layers, absolute=True, order=(0, 1, 2), only_first=False, hook="hook_resid_post"):
    values, where = [], []
    for layer in range(n_layers):
        r = cache[f"blocks.{layer}.{hook}"].float()  # (batch, pos, d_model)
        a = r.abs() if absolute else r
        if only_first:
            a = a[:, :1]
        flat = int(a.flatten().argmax())
        idx = [int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)]  # (prompt, position, dimension)
        values.append(a.flatten()[flat])
        where.append(torch.tensor([idx[i] for i in order]))
    return torch.stack(values), torch.stack(where)


def _resid_cache(seed: int, n_layers: int = 3, batch: int = 2, pos: int = 7, d: int = 8) -> dict:
    """A made-up cache: random residuals, one planted large negative value and one large value off position 0."""
    cache = {}
    for layer in range(n_layers):
        r = randn(batch, pos, d, seed=seed * 10 + layer)
        r[1, 0, 3] = -9.0 - layer  # the layer's largest |value| is negative, at <bos> of prompt 1
        r[0, 4, 5] = 6.0 + layer   # the largest positive value, off position 0
        cache[f"blocks.{layer}.hook_resid_pre"] = randn(batch, pos, d, seed=seed * 10 + layer + 5) * 20
        cache[f"blocks.{layer}.hook_resid_post"] = r
    return cache


MISTAKES["locate_massive"] = [
    ("signed max", partial(_locate_massive, absolute=False),
     "take absolute values: a massive activation is often large and negative"),
    ("position first", partial(_locate_massive, order=(1, 0, 2)),
     "give each place as (prompt, position, dimension), in that order "
     "(unravel the flat index over (batch, pos, d_model))"),
    ("<bos> only", partial(_locate_massive, only_first=True),
     "search every position, not only <bos>: where it sits is what we want to find out"),
    ("before the block", partial(_locate_massive, hook="hook_resid_pre"),
     "read the residual stream *after* each block: blocks.{L}.hook_resid_post"),
]


def locate_massive(fn: Callable) -> Callable:
    """fn(cache from run_with_cache, n_layers) -> (values (layer,), where (layer, 3)); see reference_locate_massive."""
    cache = _resid_cache(2, n_layers=2, batch=3, pos=5, d=6)
    for layer in range(2):  # here the largest |value| is off position 0 and positive
        cache[f"blocks.{layer}.hook_resid_post"][2, 3, 1] = 20.0 + layer
    cases = [("3 layers, planted at <bos> of prompt 1", (_resid_cache(0), 3)),
             ("2 layers, planted at position 3 of prompt 2", (cache, 2))]
    return check("locate_massive", fn, reference_locate_massive, cases, MISTAKES["locate_massive"], atol=1e-6,
                 rtol=1e-5)


# ── where each head parks its attention, part by part; F-Attn follows ────────────────────

def reference_bos_share_by_part(cache, n_layers, n_random):
    """cache with blocks.{L}.attn.hook_pattern (batch, head, query, key) of copy-task rows -> (layer, 3, head): each
    head's mean attention on key 0 (<bos>), averaged over the batch and over every query (row 0, query 0 included:
    the share F-Attn averages, so F-Attn = out[:, 0].mean(), as minigate.analysis.attention_sink(...).f_attn), over
    the random part's queries 1..n_random (row 1) and over the copy part's queries n_random+1.. (row 2)."""
    return _bos_share_by_part(cache, n_layers, n_random)


def _bos_share_by_part(cache, n_layers, n_random, first=0, start=1, split=0, to_key=True, head_mean=False,
                       whole="queries"):
    out = []
    for layer in range(n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # (batch, head, query, key)
        p = pattern[..., 0] if to_key else pattern[..., 0, :]  # (batch, head, query)
        rand, copy = _copy_parts(p, n_random, dim=-1, start=start, split=split)
        rand, copy = rand.mean((0, 2)), copy.mean((0, 2))  # (head,) each
        every = p[..., first:].mean((0, 2)) if whole == "queries" else (rand + copy) / 2
        out.append(torch.stack([every, rand, copy]))  # (3, head)
    out = torch.stack(out).float()  # (layer, 3, head)
    return out.mean(2, keepdim=True).expand_as(out) if head_mean else out


MISTAKES["bos_share_by_part"] = [
    ("query 0 left out of row 0", partial(_bos_share_by_part, first=1),
     "row 0 averages over every query, query 0 included, as F-Attn does (query 0 always puts 1.0 on key 0)"),
    ("row 0 from the two parts", partial(_bos_share_by_part, whole="parts"),
     "row 0 is the mean over every query (query 0 included), not the mean of the two parts' means"),
    ("query 0 in the random part", partial(_bos_share_by_part, start=0),
     "leave query 0 out of the random part (row 1): <bos> can only attend to itself, so it always puts 1.0 on key 0"),
    ("split -1", partial(_bos_share_by_part, split=-1),
     "the random part's queries are positions 1..n_random inclusive: slice 1 : n_random + 1"),
    ("split +1", partial(_bos_share_by_part, split=1),
     "the separator (position n_random + 1) already belongs to the copy part: it must retrieve a_1"),
    ("from <bos>", partial(_bos_share_by_part, to_key=False),
     "that is the attention *from* <bos>; we want attention *to* key 0: pattern[..., 0] (last axis)"),
    ("head mean", partial(_bos_share_by_part, head_mean=True),
     "keep one number per head: average over batch and queries only"),
]


def _pattern_cache(seed: int, n_layers: int, b: int, h: int, t: int) -> dict:
    """A made-up cache of causal attention patterns, one per layer."""
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    return {f"blocks.{layer}.attn.hook_pattern":
            (randn(b, h, t, t, seed=seed * 10 + layer) * 3).masked_fill(mask, float("-inf")).softmax(-1)
            for layer in range(n_layers)}


def bos_share_by_part(fn: Callable) -> Callable:
    """fn(cache from run_with_cache, n_layers, n_random) -> (layer, 3, head) tensor; see
    reference_bos_share_by_part."""
    cases = [("2 layers, 4 heads, 9 positions, 3 random", (_pattern_cache(0, 2, 2, 4, 9), 2, 3)),
             ("3 layers, 2 heads, 12 positions, 6 random", (_pattern_cache(1, 3, 3, 2, 12), 3, 6))]
    return check("bos_share_by_part", fn, reference_bos_share_by_part, cases, MISTAKES["bos_share_by_part"],
                 atol=1e-6, rtol=1e-5)


# ── is a <bos> head a no-op? ──────────────────────────────────────────────────────────────

def reference_bos_noop_test(model, tokens, layer, head):
    """tokens (batch, pos), <bos> first -> (value_ratio, d_zero, d_mean), floats, for one head of one layer:
    value_ratio: mean |v| at <bos> / mean |v| at the other positions (the head's value vectors, hook_v);
    d_zero: the change of the mean next-token loss (nats) when the head's value at <bos> is set to zero;
    d_mean: the same when it is replaced by the mean of the head's values at the other positions.
    A no-op sink reads a value near zero (small ratio), so neither replacement changes the loss."""
    return _bos_noop_test(model, tokens, layer, head)


def _bos_noop_test(model, tokens, layer, head, others_from=1, where="bos", which_heads="one", difference=True,
                   mean_from=1):
    import torch.nn.functional as F

    name = f"blocks.{layer}.attn.hook_v"
    kv = head // (model.cfg.n_heads // model.cfg.n_kv_heads)  # the value head this query head reads
    heads = slice(None) if which_heads == "all" else kv
    positions = 0 if where == "bos" else slice(None)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=name)
        v = cache[name][:, :, kv].float()  # (batch, pos, d_head)
        norms = v.norm(dim=-1)  # (batch, pos)
        ratio = (norms[:, 0].mean() / norms[:, others_from:].mean()).item()
        mean_v = cache[name][:, mean_from:, heads].mean((0, 1))  # (d_head,) or (kv_head, d_head)

        def loss(hooks):
            logits = model.run_with_hooks(tokens, fwd_hooks=hooks)  # (batch, pos, vocab)
            return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten()).item()

        def replace(value):
            def hook(v, hook):  # v (batch, pos, kv_head, d_head)
                v = v.clone()
                v[:, positions, heads] = value
                return v
            return [(name, hook)]

        base = loss([])
        zero, mean = loss(replace(0.0)), loss(replace(mean_v))
    return (ratio, zero - base, mean - base) if difference else (ratio, zero, mean)


def _noop_case(seed: int, gate: str, n_kv_heads: int = 4):
    from ... import ModelConfig, Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, head_dim=8, d_ff=48,
                      gate=gate)
    model = Transformer(cfg).eval()
    for p in model.parameters():  # larger weights than at initialisation, so every ablation moves the loss
        p.data.mul_(3.0)
    tokens = torch.randint(1, 40, (3, 12), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = 0  # <bos>
    return model, tokens


MISTAKES["bos_noop_test"] = [
    ("<bos> in the denominator", partial(_bos_noop_test, others_from=0),
     "compare |v| at <bos> with the *other* positions (1, 2, ...): leave <bos> out of the denominator"),
    ("every position replaced", partial(_bos_noop_test, where="all"),
     "replace the value at <bos> only (position 0): the other positions keep theirs"),
    ("every head replaced", partial(_bos_noop_test, which_heads="all"),
     "replace the value of one head only: hook_v is (batch, pos, kv_head, d_head), index the head's axis"),
    ("losses, not changes", partial(_bos_noop_test, difference=False),
     "return the *change* of the loss (ablated minus unchanged), not the ablated loss itself"),
    ("mean over <bos> too", partial(_bos_noop_test, mean_from=0),
     "the mean value comes from the other positions (1, 2, ...), not from <bos> itself"),
]


def bos_noop_test(fn: Callable) -> Callable:
    """fn(model, tokens (batch, pos), layer, head) -> (value_ratio, d_zero, d_mean); see reference_bos_noop_test."""
    m0, t0 = _noop_case(0, "none")
    m1, t1 = _noop_case(1, "G1")
    m2, t2 = _noop_case(2, "none", n_kv_heads=2)
    cases = [("tiny baseline, layer 1 head 2", (m0, t0, 1, 2)), ("tiny gated model, layer 0 head 1", (m1, t1, 0, 1)),
             ("tiny GQA model (2 value heads), layer 1 head 3", (m2, t2, 1, 3))]
    raises = [(r"IndexError: index \d+ is out of bounds for dimension 2",
               "hook_v has n_kv_heads value heads: with grouped-query attention, query head h reads value head "
               "h // (model.cfg.n_heads // model.cfg.n_kv_heads)")]
    return check("bos_noop_test", fn, reference_bos_noop_test, cases, MISTAKES["bos_noop_test"], atol=1e-5,
                 rtol=1e-4, raises=raises)
