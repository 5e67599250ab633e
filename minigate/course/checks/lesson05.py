"""Lesson 05's checks: reading the gates, and the first token's gate with a bootstrap CI."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .engine import check

EXERCISES = ("read_gates", "first_rest_ratio")  # its check cells, in the lesson's order


def reference_read_gates(model, tokens, average_dims=False):
    """The G1 gate scores of every layer: tokens (batch, pos) -> (batch, pos, layer, head) for a headwise model,
    (batch, pos, layer, head, d_head) for an elementwise one, or with average_dims=True (batch, pos, layer, head)
    for both (an elementwise gate averaged over each head's dimensions). Read at blocks.{L}.attn.hook_gate (the
    sigmoid scores), layers in model order 0..n_layers-1 (every layer is gated in the checked models)."""
    return _read_gates(model, tokens, average_dims)


@torch.no_grad()
def _read_gates(model, tokens, average_dims=False, hook="hook_gate", order="model", layer_axis=2, average="dims"):
    names = [f"blocks.{L}.attn.{hook}" for L in range(model.cfg.n_layers)]
    if order == "sorted":  # sorted(cache) puts blocks.10 before blocks.2
        names = sorted(names)
    elif order == "reversed":
        names = names[::-1]
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    gates = torch.stack([cache[n] for n in names], dim=layer_axis)  # (batch, pos, layer, head[, d_head])
    if average_dims and average == "dims" and gates.dim() == 5:
        gates = gates.mean(-1)
    elif average_dims and average == "last":  # also "averages" a headwise gate: over its heads
        gates = gates.mean(-1)
    elif average_dims and average == "heads" and gates.dim() == 5:
        gates = gates.mean(3)
    return gates


def _gated_model(seed: int, granularity: str, n_layers: int = 3):
    """A small seeded G1 model in eval mode: what lessons 05 and 06 check exercises on."""
    from ... import ModelConfig, Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                      gate="G1", gate_granularity=granularity)
    return Transformer(cfg).eval()


def read_gates(fn: Callable) -> Callable:
    """fn(model, tokens (batch, pos), average_dims=False) -> stacked gate scores; see reference_read_gates."""
    tokens = lambda seed: torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(seed))
    cases = [("headwise, 3 layers", (_gated_model(0, "headwise"), tokens(0), False)),
             ("elementwise, 3 layers", (_gated_model(1, "elementwise"), tokens(1), False)),
             ("elementwise, 3 layers, average_dims=True", (_gated_model(1, "elementwise"), tokens(1), True)),
             ("headwise, average_dims=True (nothing to average)", (_gated_model(0, "headwise"), tokens(0), True)),
             ("headwise, 12 layers", (_gated_model(2, "headwise", n_layers=12), tokens(2), False))]
    mistakes = [
        (lambda m, t, a: _read_gates(m, t, a, hook="hook_gate_logits"),
         "those are the gate *logits* (hook_gate_logits, any real number); the gate scores are their sigmoid, "
         "in (0, 1): read blocks.{L}.attn.hook_gate"),
        (lambda m, t, a: _read_gates(m, t, a, order="sorted"),
         "the layers are out of order: sorting the names as strings puts blocks.10 before blocks.2; build the "
         "names in order, for L in range(model.cfg.n_layers)"),
        (lambda m, t, a: _read_gates(m, t, a, order="reversed"),
         "the layers are in reverse order: layer 0 comes first on the layer axis"),
        (lambda m, t, a: _read_gates(m, t, a, layer_axis=1),
         "the layer axis is in the wrong place: stack the layers on axis 2, (batch, pos, layer, head[, d_head])"),
        (lambda m, t, a: _read_gates(m, t, a, average="none"),
         "average_dims=True asks for the mean over each head's d_head dimensions (the last axis) of an "
         "elementwise gate, giving (batch, pos, layer, head)"),
        (lambda m, t, a: _read_gates(m, t, a, average="last"),
         "a headwise gate has no d_head axis: average only a 5-d (elementwise) gate; a headwise one is already "
         "(batch, pos, layer, head)"),
        (lambda m, t, a: _read_gates(m, t, a, average="heads"),
         "that averages over the heads; average over each head's dimensions (the last axis) instead"),
    ]
    raises = [(r"KeyError", "the cache holds only the names your names_filter kept: keep every "
                            "f'blocks.{L}.attn.hook_gate' (or pass no filter)")]
    return check("read_gates", fn, reference_read_gates, cases, mistakes, atol=1e-6, rtol=1e-5, raises=raises)


def reference_first_rest_ratio(per_prompt, seed=0):
    """per_prompt: a list of (pos,) tensors, the gate score of every token of one prompt (position 0: the first
    token) -> (ratio, low, high): the mean gate on the first tokens divided by the mean gate on every later token
    (pooled over all later tokens, so a long prompt counts more), and its 95% percentile bootstrap interval
    that resamples whole prompts (stats.bootstrap_ci: 1000 resamples drawn with `seed`)."""
    return _first_rest_ratio(per_prompt, seed)


def _first_rest_ratio(per_prompt, seed=0, ratio="pooled", first_in_rest=False, unit="prompt", invert=False,
                      fixed_seed=False):
    from ...stats import bootstrap_ci

    seed = 0 if fixed_seed else seed
    start = 0 if first_in_rest else 1
    if unit == "token":  # every token a unit: (token, 2) = (is first, gate)
        rows = torch.cat([torch.stack([torch.arange(len(p)) == 0, p.double()], 1).double() for p in per_prompt])

        def stat(x, dim):
            first, g = x.unbind(-1)
            f, r = (g * first).sum(dim) / first.sum(dim), (g * (1 - first)).sum(dim) / (1 - first).sum(dim)
            return r / f if invert else f / r

        return tuple(bootstrap_ci(rows, stat=stat, seed=seed))
    n_rest = lambda p: torch.tensor(len(p) - start, dtype=torch.float64)
    units = torch.stack([torch.stack([p[0].double(), p[start:].double().sum(), n_rest(p)])
                         for p in per_prompt])  # (prompt, 3): first gate, sum and number of the later gates

    def stat(x, dim):
        f, s, n = x.unbind(-1)
        if ratio == "per_prompt":
            r = f / (s / n)
            return (1 / r).mean(dim) if invert else r.mean(dim)
        rest = (s / n).mean(dim) if ratio == "prompt_means" else s.sum(dim) / n.sum(dim)
        return rest / f.mean(dim) if invert else f.mean(dim) / rest

    return tuple(bootstrap_ci(units, stat=stat, seed=seed))


def first_rest_ratio(fn: Callable) -> Callable:
    """fn(per_prompt: list of (pos,) tensors, seed=0) -> (ratio, low, high); see reference_first_rest_ratio."""
    def prompts(seed, n, max_len):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, max_len + 1, (n,), generator=g).tolist()
        out = []
        for length in lengths:
            p = torch.sigmoid(torch.randn(length, generator=g) - 1)  # gate scores in (0, 1)
            p[0] = p[0] * 0.4  # a first token with a lower gate, as in the paper
            out.append(p)
        return out

    cases = [("12 prompts of 3-12 tokens, seed 0", (prompts(0, 12, 12), 0)),
             ("20 prompts of 3-30 tokens, seed 1", (prompts(1, 20, 30), 1)),
             ("3 prompts, seed 2", (prompts(2, 3, 8), 2))]
    mistakes = [
        (lambda p, s: _first_rest_ratio(p, s, invert=True),
         "the ratio is upside down: first-token mean / later-token mean (below 1 when the first token is gated more)"),
        (lambda p, s: _first_rest_ratio(p, s, first_in_rest=True),
         "the 'rest' includes the first token: average the gates at positions 1.. only"),
        (lambda p, s: _first_rest_ratio(p, s, ratio="per_prompt"),
         "that is the mean of per-prompt ratios; take the ratio of the two means instead (first-token mean over "
         "prompts / later-token mean pooled over every later token)"),
        (lambda p, s: _first_rest_ratio(p, s, ratio="prompt_means"),
         "the later tokens' mean weights every prompt equally; pool them: (sum of all later gates) / (number of "
         "later tokens), so a long prompt counts more, as the published numbers do"),
        (lambda p, s: _first_rest_ratio(p, s, unit="token"),
         "that resamples tokens; tokens of one prompt are not independent: resample whole prompts (one row per "
         "prompt holding its first gate, the sum of its later gates and their number)"),
        (lambda p, s: _first_rest_ratio(p, s, fixed_seed=True),
         "the interval ignores `seed`: pass it on (bootstrap_ci(..., seed=seed))"),
    ]
    return check("first_rest_ratio", fn, reference_first_rest_ratio, cases, mistakes, atol=1e-6, rtol=1e-5)
