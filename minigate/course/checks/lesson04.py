"""Lesson 04's checks: where the massive activation sits, F-Attn and M-Act from a cache, and where a head parks its
attention, part by part."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .engine import check, randn

EXERCISES = ("locate_massive", "f_attn_m_act", "bos_share_by_part")  # its check cells, in the lesson's order

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


def locate_massive(fn: Callable) -> Callable:
    """fn(cache from run_with_cache, n_layers) -> (values (layer,), where (layer, 3)); see reference_locate_massive."""
    cache = _resid_cache(2, n_layers=2, batch=3, pos=5, d=6)
    for layer in range(2):  # here the largest |value| is off position 0 and positive
        cache[f"blocks.{layer}.hook_resid_post"][2, 3, 1] = 20.0 + layer
    cases = [("3 layers, planted at <bos> of prompt 1", (_resid_cache(0), 3)),
             ("2 layers, planted at position 3 of prompt 2", (cache, 2))]
    mistakes = [
        (lambda c, n: _locate_massive(c, n, absolute=False),
         "take absolute values: a massive activation is often large and negative"),
        (lambda c, n: _locate_massive(c, n, order=(1, 0, 2)),
         "give each place as (prompt, position, dimension), in that order "
         "(unravel the flat index over (batch, pos, d_model))"),
        (lambda c, n: _locate_massive(c, n, only_first=True),
         "search every position, not only <bos>: where it sits is what we want to find out"),
        (lambda c, n: _locate_massive(c, n, hook="hook_resid_pre"),
         "read the residual stream *after* each block: blocks.{L}.hook_resid_post"),
    ]
    return check("locate_massive", fn, reference_locate_massive, cases, mistakes, atol=1e-6, rtol=1e-5)


# ── F-Attn and M-Act from a cache ─────────────────────────────────────────────────────────

def reference_f_attn_m_act(cache, n_layers):
    """F-Attn: mean attention on key 0 over prompts, query positions and heads per layer, then over layers.
    M-Act: max |residual stream| after each layer (hook_resid_post), averaged over layers.
    The same definitions as minigate.analysis.attention_sink(...).f_attn and massive_activations(...).m_act."""
    return _f_attn_m_act(cache, n_layers)


def _f_attn_m_act(cache, n_layers, first_query=0, key_axis=True, layer_stat="mean", absolute=True, act_stat="max"):
    shares, acts = [], []
    for layer in range(n_layers):
        p = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # (batch, head, query, key)
        shares.append((p[..., first_query:, 0] if key_axis else p[..., 0, :]).mean())
        r = cache[f"blocks.{layer}.hook_resid_post"].double()  # (batch, pos, d_model)
        r = r.abs() if absolute else r
        acts.append(r.max() if act_stat == "max" else r.mean())
    acts = torch.stack(acts)
    return torch.stack(shares).mean().item(), (acts.mean() if layer_stat == "mean" else acts.max()).item()


def _cache_case(seed: int, gate: str):
    from ... import ModelConfig, Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, gate=gate)
    model = Transformer(cfg).eval()
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens, names_filter=lambda n: n.endswith("hook_pattern") or n.endswith("hook_resid_post"))
    return cache


def f_attn_m_act(fn: Callable) -> Callable:
    """fn(cache from run_with_cache, n_layers) -> (f_attn, m_act) as floats."""
    cases = [(f"tiny {gate} model", (_cache_case(i, gate), 3)) for i, gate in enumerate(["none", "G1"])]
    mistakes = [
        (lambda c, n: _f_attn_m_act(c, n, first_query=1),
         "F-Attn averages over every query position, query 0 included (it always puts all its mass on key 0)"),
        (lambda c, n: _f_attn_m_act(c, n, key_axis=False),
         "that is the attention *from* token 0; F-Attn is the attention *to* key 0: pattern[..., 0] (last axis)"),
        (lambda c, n: _f_attn_m_act(c, n, layer_stat="max"),
         "M-Act is the per-layer maximum averaged over layers, not the maximum over layers"),
        (lambda c, n: _f_attn_m_act(c, n, absolute=False),
         "M-Act takes absolute values: massive activations are often large and negative"),
        (lambda c, n: _f_attn_m_act(c, n)[::-1], "return (f_attn, m_act) in that order"),
        (lambda c, n: _f_attn_m_act(c, n, act_stat="mean"),
         "M-Act is the *largest* |activation| of each layer (max over batch, positions and channels), not the mean"),
    ]
    return check("f_attn_m_act", fn, reference_f_attn_m_act, cases, mistakes, atol=1e-6, rtol=1e-5)


# ── where a head parks its attention, part by part ───────────────────────────────────────

def reference_bos_share_by_part(pattern, n_random):
    """pattern (batch, head, query, key) of copy-task rows -> (2, head): mean attention on key 0 (<bos>)
    over the random-part queries 1..n_random (row 0) and over the copy-part queries n_random+1.. (row 1)."""
    return _bos_share_by_part(pattern, n_random)


def _bos_share_by_part(pattern, n_random, start=1, split=0, to_key=True, head_mean=False):
    p = pattern[..., 0] if to_key else pattern[..., 0, :]  # (batch, head, query)
    rand, copy = p[..., start: n_random + 1 + split], p[..., n_random + 1 + split:]
    out = torch.stack([rand.mean((0, 2)), copy.mean((0, 2))])  # (2, head)
    return out.mean(1, keepdim=True).expand_as(out) if head_mean else out


def bos_share_by_part(fn: Callable) -> Callable:
    """fn(pattern (batch, head, query, key), n_random) -> (2, head) tensor; see reference_bos_share_by_part."""
    def case(seed, b, h, t, n_random):
        scores = randn(b, h, t, t, seed=seed) * 3
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        return scores.masked_fill(mask, float("-inf")).softmax(-1), n_random

    cases = [("4 heads, 9 positions, 4 random", case(0, 2, 4, 9, 4)),
             ("2 heads, 12 positions, 6 random", case(1, 3, 2, 12, 6))]
    mistakes = [
        (lambda p, n: _bos_share_by_part(p, n, start=0),
         "leave out query 0: <bos> can only attend to itself, so it always puts 1.0 on key 0"),
        (lambda p, n: _bos_share_by_part(p, n, split=-1),
         "the random part's queries are positions 1..n_random inclusive: slice 1 : n_random + 1"),
        (lambda p, n: _bos_share_by_part(p, n, split=1),
         "the separator (position n_random + 1) already belongs to the copy part: it must retrieve a_1"),
        (lambda p, n: _bos_share_by_part(p, n, to_key=False),
         "that is the attention *from* <bos>; we want attention *to* key 0: pattern[..., 0] (last axis)"),
        (lambda p, n: _bos_share_by_part(p, n, head_mean=True),
         "keep one number per head: average over batch and queries only"),
    ]
    return check("bos_share_by_part", fn, reference_bos_share_by_part, cases, mistakes, atol=1e-6, rtol=1e-5)
