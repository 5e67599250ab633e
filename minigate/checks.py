"""Graded checks with hints for the course's exercises: `my_fn = checks.<exercise>(my_fn)`.

Each check runs the learner's function on a few cases and compares it with an independent reference
(never with the learner's own output). On a mismatch it looks for a *typical mistake*: a known-wrong
variant of the reference that the learner's output matches, and prints that mistake's hint; otherwise
a generic hint with the largest difference. Then:

    passed                    -> prints `✓ <exercise>: passed (N cases)`, returns the learner's function
    wrong                     -> prints `✗ ...` with the hint and raises AssertionError (instructors grade so)
    raises NotImplementedError -> prints a one-line notice and returns the reference, so the rest of the
                                 lesson runs (this is how the untouched lessons pass nbval in CI)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat

PASSED_RE = re.compile(r"^✓ (\S+): passed \(\d+ cases?\)$", re.M)

Case = tuple[str, tuple]  # (label shown in messages, positional arguments)
Mistake = tuple[Callable, str]  # (a wrong variant with the reference's signature, the hint it earns)


def not_implemented_notice(name: str) -> str:
    return f"… {name} not implemented yet: using the reference implementation so the rest of the lesson runs"


def _tensors(x):
    """Outputs as tensors (tuples stay tuples) so numbers, tensors and pairs compare the same way."""
    if isinstance(x, (tuple, list)):
        return tuple(_tensors(y) for y in x)
    return x if isinstance(x, torch.Tensor) else torch.tensor(float(x), dtype=torch.float64)


def _close(got, want, tol: dict) -> bool:
    try:
        torch.testing.assert_close(_tensors(got), _tensors(want), check_dtype=False, equal_nan=True, **tol)
        return True
    except (AssertionError, TypeError, ValueError, RuntimeError):
        return False


def _generic_hint(got, want) -> str:
    got, want = _tensors(got), _tensors(want)
    if isinstance(want, tuple) != isinstance(got, tuple) or isinstance(want, tuple) and len(want) != len(got):
        return f"expected {len(want) if isinstance(want, tuple) else 1} output(s), got " \
               f"{len(got) if isinstance(got, tuple) else 1}"
    pairs = zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]
    for i, (g, w) in enumerate(pairs):
        where = f"output {i}: " if isinstance(want, tuple) else ""
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            return f"{where}expected shape {tuple(w.shape)}, got {tuple(getattr(g, 'shape', ())) or type(g).__name__}"
        if torch.isnan(g).any():
            return f"{where}your output has NaNs (is a row of scores entirely -inf?)"
        diff = (g.double() - w.double()).abs()
        if diff.max() > 0:
            return f"{where}max |difference| = {diff.max().item():.3g}; print both on a small case and compare"
    return "the output differs only within the tolerance's reach; print both on a small case and compare"


def check(name: str, learner_fn: Callable, reference_fn: Callable, cases: Sequence[Case],
          mistakes: Sequence[Mistake] = (), atol: float = 1e-5, rtol: float = 1e-4) -> Callable:
    """Compare learner_fn with reference_fn on every case; see the module docstring for what it returns."""
    tol = dict(atol=atol, rtol=rtol)
    clone = lambda args: tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    for label, args in cases:
        try:
            got = learner_fn(*clone(args))
        except NotImplementedError:
            print(not_implemented_notice(name))
            return reference_fn
        want = reference_fn(*clone(args))
        if _close(got, want, tol):
            continue
        hint = next((h for wrong, h in mistakes if _close(got, wrong(*clone(args)), tol)), None)
        message = f"✗ {name}, case {label}: {hint or _generic_hint(got, want)}"
        print(message)
        raise AssertionError(message)
    print(f"✓ {name}: passed ({len(cases)} case{'s' if len(cases) != 1 else ''})")
    return learner_fn


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ── lesson 01: causal multi-head attention with GQA ──────────────────────────────────────────────────

def reference_causal_attention(q, k, v):
    """q (b, h, t, d), k and v (b, kv, t, d) -> (b, h, t, d); query head h reads kv head h // (h / kv)."""
    g = q.shape[1] // k.shape[1]
    k, v = (repeat(x, "b kv t d -> b (kv g) t d", g=g) for x in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _attention(q, k, v, *, scale=True, diagonal=0, softmax_dim=-1, causal=True, kv_order="(kv g)"):
    """Explicit attention with switches for the typical mistakes."""
    g = q.shape[1] // k.shape[1]
    k, v = (repeat(x, f"b kv t d -> b {kv_order} t d", g=g) for x in (k, v))
    scores = einsum(q, k, "b h i d, b h j d -> b h i j") / (math.sqrt(q.shape[-1]) if scale else 1)
    if causal:
        T = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(diagonal), float("-inf"))
    return einsum(torch.softmax(scores, dim=softmax_dim), v, "b h i j, b h j d -> b h i d")


def causal_attention(fn: Callable) -> Callable:
    """fn(q (b, h, t, d), k (b, kv, t, d), v (b, kv, t, d)) -> (b, h, t, d), checked against PyTorch's SDPA."""
    shapes = [(2, 4, 2, 6, 8), (1, 3, 3, 5, 4), (1, 6, 1, 4, 16)]  # GQA, plain multi-head, multi-query
    cases = [(f"b={b} h={h} kv={kv} t={t} d={d}", (_randn(b, h, t, d, seed=3 * i), _randn(b, kv, t, d, seed=3 * i + 1),
                                                   _randn(b, kv, t, d, seed=3 * i + 2)))
             for i, (b, h, kv, t, d) in enumerate(shapes)]
    mistakes = [
        (lambda q, k, v: _attention(q, k, v, softmax_dim=-2),
         "softmax over the wrong axis: normalise over keys (the last axis of the (query, key) scores)"),
        (lambda q, k, v: _attention(q, k, v, diagonal=-1),
         "the mask is off by one: a query must see itself (tril(), not tril(-1)); query 0 sees only key 0"),
        (lambda q, k, v: _attention(q, k, v, diagonal=1),
         "the mask is off by one: query i may see keys 0..i, not key i + 1"),
        (lambda q, k, v: _attention(q, k, v, scale=False), "scale missing: divide the scores by sqrt(head_dim)"),
        (lambda q, k, v: _attention(q, k, v, causal=False),
         "no causal mask: query i must not see keys after i (mask them with -inf before the softmax)"),
        (lambda q, k, v: _attention(q, k, v, kv_order="(g kv)"),
         "GQA heads mismatched: query head h reads kv head h // group (repeat each kv head, don't tile them)"),
    ]
    return check("causal_attention", fn, reference_causal_attention, cases, mistakes)


# ── lesson 02: the G1 gate, its output projection, and where the gate hides in q_proj ────────────────

def reference_g1_gate(z, gate_logits):
    """z (b, t, h, d) * sigmoid(gate_logits): (b, t, h) headwise (one scalar per head) or (b, t, h, d)."""
    if gate_logits.dim() == 3:
        gate_logits = rearrange(gate_logits, "b t h -> b t h 1")
    return z * torch.sigmoid(gate_logits)


def g1_gate(fn: Callable) -> Callable:
    """fn(z (b, t, h, d), gate_logits (b, t, h) or (b, t, h, d)) -> the sigmoid-gated z (b, t, h, d)."""
    cases = [("headwise h=4 d=4", (_randn(2, 3, 4, 4, seed=0), _randn(2, 3, 4, seed=1))),
             ("headwise h=2 d=8", (_randn(1, 5, 2, 8, seed=2), _randn(1, 5, 2, seed=3))),
             ("elementwise h=4 d=4", (_randn(2, 3, 4, 4, seed=4), _randn(2, 3, 4, 4, seed=5)))]
    mistakes = [
        (lambda z, g: z * (g[..., None] if g.dim() == 3 else g), "the gate is sigmoid(logits), not the logits"),
        (lambda z, g: z * F.silu(g[..., None] if g.dim() == 3 else g), "G1 uses a sigmoid, not SiLU"),
        (lambda z, g: z * torch.sigmoid(-(g[..., None] if g.dim() == 3 else g)), "sign flipped: sigmoid(logits)"),
        (lambda z, g: z * torch.sigmoid(g[:, :, None, :] if g.dim() == 3 else g),
         "a headwise gate (b, t, h) must become (b, t, h, 1): one scalar per head, broadcast over d"),
    ]
    return check("g1_gate", fn, reference_g1_gate, cases, mistakes)


def reference_gated_output(z, gate_logits, w_o):
    """o_proj(z * sigmoid(gate)): z and gate_logits (b, t, h, d), w_o (d_model, h * d) -> (b, t, d_model)."""
    return rearrange(z * torch.sigmoid(gate_logits), "b t h d -> b t (h d)") @ w_o.T


def gated_output(fn: Callable) -> Callable:
    """fn(z (b, t, h, d), gate_logits (b, t, h, d), w_o (d_model, h*d)) -> (b, t, d_model): G1, then o_proj."""
    cases = [(f"h={h} d={d}", (_randn(2, 3, h, d, seed=i), _randn(2, 3, h, d, seed=i + 10),
                               _randn(h * d, h * d, seed=i + 20) / h)) for i, (h, d) in enumerate([(4, 4), (2, 8)])]
    flat = lambda x: rearrange(x, "b t h d -> b t (h d)")
    mistakes = [(lambda z, g, w: (flat(z) @ w.T) * torch.sigmoid(flat(g)),
                 "the gate is applied after o_proj (that is G5, the paper's weakest position): gate z, then project"),
                (lambda z, g, w: flat(z) @ w.T, "the gate is missing: multiply z by sigmoid(gate_logits) first")]
    return check("gated_output", fn, reference_gated_output, cases, mistakes)


def reference_gate_param_count(cfg):
    """Extra parameters of a G1 gate: per layer, d_model inputs x (one row per head, or per head dimension)."""
    return cfg.n_layers * cfg.d_model * cfg.n_heads * (1 if cfg.gate_granularity == "headwise" else cfg.head_dim)


def _gate_params(cfg, layers=True, heads="query", width="granularity"):
    n_heads = cfg.n_heads if heads == "query" else cfg.n_kv_heads
    e = cfg.head_dim if width == "head_dim" or cfg.gate_granularity == "elementwise" else 1
    return (cfg.n_layers if layers else 1) * cfg.d_model * n_heads * e


def gate_param_count(fn: Callable) -> Callable:
    """fn(cfg: ModelConfig with a G1 gate) -> number of parameters the gate adds to the whole model."""
    from .config import ModelConfig

    shapes = [dict(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8),  # a tiny model
              dict(d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128)]  # a Qwen3-1.7B-sized one
    cases = [(f"{s['n_layers']} layers d_model={s['d_model']} {gran}",
              (ModelConfig(vocab_size=100, gate="G1", gate_granularity=gran, **s),))
             for s in shapes for gran in ("headwise", "elementwise")]
    mistakes = [(lambda c: _gate_params(c, layers=False), "one layer only: every layer has its own gate"),
                (lambda c: _gate_params(c, heads="kv"), "one gate per *query* head (n_heads), not per kv head"),
                (lambda c: _gate_params(c, width="head_dim"), "a headwise gate has one row per head, not head_dim")]
    return check("gate_param_count", fn, reference_gate_param_count, cases, mistakes, atol=0, rtol=0)


def _split(qg, n_heads, n_kv_heads, head_dim, granularity, layout="per kv group"):
    """Split q_proj's output (b, t, rows) into q (b, h, t, d) and gate logits (b, t, h[, d])."""
    H, K, D = n_heads, n_kv_heads, head_dim
    E = 1 if granularity == "headwise" else D
    if layout == "per kv group":  # the released checkpoints: per kv head [its g query heads | their gates]
        g = H // K
        q, gate = rearrange(qg, "b t (kv n) -> b t kv n", kv=K).split([g * D, g * E], dim=-1)
        q, gate = (rearrange(x, "b t kv (g e) -> b t (kv g) e", g=g) for x in (q, gate))
    elif layout == "per head":  # [q_0 | gate_0 | q_1 | gate_1 | ...]
        q, gate = rearrange(qg, "b t (h n) -> b t h n", h=H).split([D, E], dim=-1)
    else:  # "all queries first": [q_0 ... q_H-1 | gate_0 ... gate_H-1]
        q, gate = qg.split([H * D, H * E], dim=-1)
        q, gate = (rearrange(x, "b t (h e) -> b t h e", h=H) for x in (q, gate))
    q = rearrange(q, "b t h d -> b h t d")
    return q, (rearrange(gate, "b t h 1 -> b t h") if granularity == "headwise" else gate)


def reference_split_q_proj(qg, n_heads, n_kv_heads, head_dim, granularity):
    """The official per-kv-group layout (see minigate/attention.py's docstring)."""
    return _split(qg, n_heads, n_kv_heads, head_dim, granularity)


def split_q_proj(fn: Callable) -> Callable:
    """fn(qg (b, t, rows), n_heads, n_kv_heads, head_dim, granularity) -> (q (b, h, t, d), gates (b, t, h[, d]))."""
    cases = []
    for i, (H, K, D, gran) in enumerate([(4, 2, 4, "headwise"), (4, 2, 4, "elementwise"), (6, 2, 2, "headwise"),
                                         (4, 1, 4, "elementwise")]):
        rows = H * D + H * (1 if gran == "headwise" else D)
        cases.append((f"h={H} kv={K} d={D} {gran}", (_randn(2, 3, rows, seed=i), H, K, D, gran)))
    mistakes = [
        (lambda *a: _split(*a, layout="per head"), "rows are grouped per kv head, not per query head: for each "
         "kv head, first the queries of its group heads, then those heads' gate rows"),
        (lambda *a: _split(*a, layout="all queries first"), "the gate rows are not all at the end: q_proj's rows "
         "come per kv head, [queries of its group | gates of its group], one kv head after the other"),
    ]
    return check("split_q_proj", fn, reference_split_q_proj, cases, mistakes, atol=0, rtol=0)


# ── lesson 03: warmup + cosine learning-rate schedule ────────────────────────────────────────────────

def _schedule(step, cfg, warmup_shift=0, floor=True, shape="cosine", from_warmup=True):
    if step <= cfg.warmup_steps:
        return cfg.lr * (step + warmup_shift) / cfg.warmup_steps
    start = cfg.warmup_steps if from_warmup else 0
    progress = min((step - start) / (cfg.steps - start), 1.0)
    min_lr = cfg.lr * cfg.min_lr_ratio if floor else 0.0
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if shape == "cosine" else 1 - progress
    return min_lr + (cfg.lr - min_lr) * decay


def lr_schedule(fn: Callable) -> Callable:
    """fn(step (1-based), cfg: TrainConfig) -> lr, checked against minigate.train.lr_at over every step."""
    from .train import TrainConfig, lr_at

    cfgs = [TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1),
            TrainConfig(steps=40, warmup_steps=4, lr=3e-3, min_lr_ratio=0.2),
            TrainConfig(steps=30, warmup_steps=0, lr=2e-3, min_lr_ratio=0.0)]
    over_steps = lambda f: lambda cfg: [f(s, cfg) for s in range(1, cfg.steps + 1)]
    cases = [(f"steps={c.steps} warmup={c.warmup_steps} min_lr_ratio={c.min_lr_ratio}", (c,)) for c in cfgs]
    mistakes = [
        (over_steps(lambda s, c: _schedule(s, c, warmup_shift=-1)),
         "off by one in the warmup: step is 1-based, step s uses lr * s / warmup_steps (the first step is not 0)"),
        (over_steps(lambda s, c: _schedule(s, c, warmup_shift=1)),
         "off by one in the warmup: step is 1-based, step s uses lr * s / warmup_steps (not (s + 1))"),
        (over_steps(lambda s, c: _schedule(s, c, floor=False)),
         "no min_lr floor: the cosine ends at lr * min_lr_ratio, not 0"),
        (over_steps(lambda s, c: _schedule(s, c, shape="linear")), "linear decay: use a cosine, 0.5 (1 + cos(pi p))"),
        (over_steps(lambda s, c: _schedule(s, c, from_warmup=False)),
         "the cosine starts at the end of the warmup: progress = (step - warmup) / (steps - warmup)"),
    ]
    learner = over_steps(fn)
    result = check("lr_schedule", learner, over_steps(lr_at), cases, mistakes, atol=1e-12, rtol=1e-6)
    return fn if result is learner else lr_at


# ── lesson 04: F-Attn and M-Act from a cache ─────────────────────────────────────────────────────────

def reference_f_attn_m_act(cache, n_layers):
    """F-Attn: mean attention on key 0 over prompts, query positions and heads per layer, then over layers.
    M-Act: max |residual stream| after each layer (hook_resid_post), averaged over layers.
    The same definitions as minigate.analysis.attention_sink(...).f_attn and massive_activations(...).m_act."""
    return _f_attn_m_act(cache, n_layers)


def _f_attn_m_act(cache, n_layers, first_query=0, key_axis=True, layer_stat="mean", absolute=True):
    shares, acts = [], []
    for layer in range(n_layers):
        p = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # (batch, head, query, key)
        shares.append((p[..., first_query:, 0] if key_axis else p[..., 0, :]).mean())
        r = cache[f"blocks.{layer}.hook_resid_post"].double()  # (batch, pos, d_model)
        acts.append((r.abs() if absolute else r).max())
    acts = torch.stack(acts)
    return torch.stack(shares).mean().item(), (acts.mean() if layer_stat == "mean" else acts.max()).item()


def _cache_case(seed: int, gate: str):
    from . import ModelConfig, Transformer

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
    ]
    return check("f_attn_m_act", fn, reference_f_attn_m_act, cases, mistakes, atol=1e-6, rtol=1e-5)


# ── lesson 04: where a head parks its attention, part by part ───────────────────────────────────────

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
        scores = _randn(b, h, t, t, seed=seed) * 3
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


# ── lesson 01: a head with nothing to attend to: attention with a null key ───────────────────────────

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


def attention_with_null(fn: Callable) -> Callable:
    """fn(scores (b, h, q, k), v (b, h, k, d), null_logit (h,)) -> (out (b, h, q, d), null_weight (b, h, q))."""
    def case(seed, b, h, t, d, scale, null_logit, blind_row=None):
        scores = _randn(b, h, t, t, seed=seed) * scale
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))  # causal
        if blind_row is not None:  # a query that may see no key at all
            scores[:, :, blind_row] = float("-inf")
        return scores, _randn(b, h, t, d, seed=seed + 1), torch.tensor(null_logit)

    cases = [("b=2 h=3 q=k=5 d=4", case(0, 2, 3, 5, 4, 1.0, [0.5, -1.0, 2.0])),
             ("scores up to ~100 (exp overflows in float32)", case(1, 1, 2, 6, 3, 50.0, [1.0, 60.0])),
             ("query 2 may see no key", case(2, 1, 2, 4, 3, 1.0, [0.0, 3.0], blind_row=2))]
    mistakes = [
        (lambda s, v, n: _null_attention(s, v, n, null="none"),
         "the null key is missing: append null_logit as one more score column and take ONE softmax over the "
         "k + 1 columns, so the real keys' weights can add up to less than 1"),
        (lambda s, v, n: _null_attention(s, v, n, null="zero"),
         "the null key's score is null_logit (one per head), not 0: softmax-off-by-one is the special case "
         "null_logit = 0"),
        (lambda s, v, n: _null_attention(s, v, n, stable=False),
         "exp overflows for large scores (float32 exp(89) = inf -> NaN): subtract each row's max first, "
         "or let torch.softmax do it on the concatenated scores"),
        (lambda s, v, n: _null_attention(s, v, n, prepend_misaligned=True),
         "the weights are shifted by one key: with the null column first, the real keys are columns 1..k "
         "(with it last, columns 0..k-1)"),
    ]
    return check("attention_with_null", fn, reference_attention_with_null, cases, mistakes, atol=1e-6, rtol=1e-5)


# ── lesson 03: the next-token loss ───────────────────────────────────────────────────────────────────

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
        cases.append((f"b={b} t={t} vocab={v}", (_randn(b, t, v, seed=i) * 2, tokens)))
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
    return check("next_token_loss", fn, reference_next_token_loss, cases, mistakes, atol=1e-5, rtol=1e-5)


# ── lesson 05: reading the gates, and the first token's gate with a bootstrap CI ─────────────────────

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
    from . import ModelConfig, Transformer

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
    return check("read_gates", fn, reference_read_gates, cases, mistakes, atol=1e-6, rtol=1e-5)


def reference_first_rest_ratio(per_prompt, seed=0):
    """per_prompt: a list of (pos,) tensors, the gate score of every token of one prompt (position 0: the first
    token) -> (ratio, low, high): the mean gate on the first tokens divided by the mean gate on every later token
    (pooled over all later tokens, so a long prompt counts more), and its 95% percentile bootstrap interval
    that resamples whole prompts (stats.bootstrap_ci: 1000 resamples drawn with `seed`)."""
    return _first_rest_ratio(per_prompt, seed)


def _first_rest_ratio(per_prompt, seed=0, ratio="pooled", first_in_rest=False, unit="prompt", invert=False,
                      fixed_seed=False):
    from .stats import bootstrap_ci

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


# ── lesson 06: a gate-override hook, and layers ranked by the damage their override does ─────────────

def reference_gate_override(model, layer, value, head=None):
    """fwd_hooks [(hook name, fn)] that set the gate scores of layer `layer` (of its head `head` only, if given)
    to `value`: the overrides of minigate.ablation.force_layer and close_head."""
    from . import ablation as ab

    return ab.force_layer(model, layer, value) if head is None else ab.close_head(model, layer, head, value)


def _gate_override(model, layer, value, head=None, index="head axis", every_layer=False, returns=True,
                   point="hook_gate", whole_layer=False):
    """A gate override with switches for the typical mistakes."""
    def hook(gate, hook):
        new = gate.clone()
        if head is None or whole_layer:
            new[...] = value
        elif index == "head axis":
            new[:, :, head] = value
        elif index == "last axis":  # right for (batch, pos, head), wrong for (batch, pos, head, d_head)
            new[..., head] = value
        else:  # "second axis": a position
            new[:, head] = value
        return new if returns else None

    name = (lambda n: n.endswith(f"attn.{point}")) if every_layer else f"blocks.{layer}.attn.{point}"
    return [(name, hook)]


def _tiny_gated(granularity: str, seed: int):
    from . import ModelConfig, Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                      gate="G1", gate_granularity=granularity)
    return Transformer(cfg).eval()


def _logits_under(make_hooks):
    """make_hooks(model, layer, value, head) -> fwd_hooks  ==>  fn(model, tokens, layer, value, head) -> logits."""
    def run(model, tokens, layer, value, head):
        hooks = make_hooks(model, layer, value, head)
        if not isinstance(hooks, (list, tuple)) or not all(isinstance(p, tuple) and len(p) == 2 for p in hooks):
            message = ("✗ gate_override: return a list of (hook name, hook function) pairs, e.g. "
                       "[('blocks.0.attn.hook_gate', fn)], as ablation.close_head does")
            print(message)
            raise AssertionError(message)
        try:
            with torch.no_grad():
                return model.run_with_hooks(tokens, fwd_hooks=hooks)
        except IndexError as e:
            message = (f"✗ gate_override: IndexError ({e}). A headwise gate is (batch, pos, head), an elementwise "
                       "one (batch, pos, head, d_head): gate[:, :, head] picks the head in both")
            print(message)
            raise AssertionError(message) from e
    return run


def gate_override(fn: Callable) -> Callable:
    """fn(model, layer, value, head=None) -> fwd_hooks; checked by running tiny headwise and elementwise models
    with its hooks against ablation.force_layer / close_head."""
    models = {gran: _tiny_gated(gran, seed) for seed, gran in enumerate(["headwise", "elementwise"])}
    tokens = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(6))
    cases = [(f"{gran}, layer {layer}, " + (f"head {head}" if head is not None else "every head") + f" = {value}",
              (models[gran], tokens, layer, value, head))
             for gran, layer, value, head in [("headwise", 1, 0.0, 2), ("headwise", 0, 1.0, None),
                                              ("elementwise", 2, 0.0, 1), ("elementwise", 1, 0.25, None),
                                              ("elementwise", 0, 1.0, 3)]]
    variant = lambda **kw: _logits_under(lambda m, L, v, h: _gate_override(m, L, v, h, **kw))
    mistakes = [
        (variant(index="last axis"),
         "gate[..., head] indexes the last axis: that is the head for a headwise gate (batch, pos, head) but a "
         "head *dimension* for an elementwise one (batch, pos, head, d_head); use gate[:, :, head]"),
        (variant(index="second axis"),
         "gate[:, head] sets a position, not a head: gates are (batch, pos, head[, d_head])"),
        (variant(every_layer=True),
         "your hook acts on every layer: hook only f'blocks.{layer}.attn.hook_gate' (or check hook.name in a filter)"),
        (variant(returns=False),
         "your hook leaves the model unchanged: build the new gate and `return` it (rebinding the argument inside "
         "the hook changes nothing outside it)"),
        (variant(point="hook_gate_logits"),
         "you set the gate *logits* (before the sigmoid): `value` is a gate score, hook 'hook_gate' "
         "(1 = open, 0 = closed)"),
        (variant(whole_layer=True), "you set the whole layer: with `head` given, only gate[:, :, head] changes"),
    ]
    learner = _logits_under(fn)
    result = check("gate_override", learner, _logits_under(reference_gate_override), cases, mistakes,
                   atol=1e-5, rtol=1e-4)
    return fn if result is learner else reference_gate_override


def reference_rank_layers(results, kind="open"):
    """results {condition name: ablation.Perplexity} with "learned" and "L{layer} {kind}" entries (others are
    ignored) -> [(layer, damage)], most damaging first; damage = loss increase over the learned model, in nats
    (= ln(ppl / ppl_learned))."""
    return _rank_layers(results, kind)


def _rank_layers(results, kind, pattern="exact", damage="nats", descending=True, pairs=True):
    base = results["learned"]
    found = []
    for name, r in results.items():
        if pattern == "exact":
            m = re.fullmatch(rf"L(\d+) {re.escape(kind)}", name)
            layer = int(m[1]) if m else None
        elif pattern == "prefix":  # also catches head conditions such as "L0H3 closed"
            m = re.match(r"L(\d+)", name)
            layer = int(m[1]) if m and name.endswith(" " + kind) else None
        else:  # "one digit": name[1]
            layer = int(name[1]) if re.fullmatch(rf"L(\d+) {re.escape(kind)}", name) else None
        if layer is None:
            continue
        d = {"nats": r.loss - base.loss, "ppl difference": r.ppl - base.ppl, "ppl ratio": r.ppl / base.ppl,
             "absolute": r.loss}[damage]
        found.append((layer, d))
    found.sort(key=lambda p: p[1], reverse=descending)
    return found if pairs else [layer for layer, _ in found]


def _fake_results(seed: int, n_layers: int, n_heads: int = 2):
    """A sweep-like {name: Perplexity} with distinct, made-up chunk losses."""
    from .ablation import Perplexity

    g = torch.Generator().manual_seed(seed)

    def ppl(level):
        losses = (level + 0.1 * torch.rand(4, generator=g)).double()
        return Perplexity(ppl=math.exp(losses.mean().item()), chunk_losses=losses, ci=None, n_tokens=4 * 16)

    out = {"learned": ppl(3.0), "gates=0.5": ppl(6.0)}
    levels = 3.2 + 5 * torch.randperm(2 * n_layers, generator=g).double() / n_layers
    for L in range(n_layers):
        out[f"L{L} open"], out[f"L{L} closed"] = ppl(levels[2 * L].item()), ppl(levels[2 * L + 1].item())
    for L in range(min(2, n_layers)):
        for h in range(n_heads):
            out[f"L{L}H{h} closed"] = ppl(9.0 + h + L)  # more damaging than any layer: a trap for loose matching
    return out


def rank_layers(fn: Callable) -> Callable:
    """fn(results {name: Perplexity}, kind="open") -> [(layer, damage in nats)], most damaging first."""
    cases = [("4 layers, kind='open'", (_fake_results(0, 4), "open")),
             ("4 layers with head conditions, kind='closed'", (_fake_results(1, 4), "closed")),
             ("12 layers, kind='open'", (_fake_results(2, 12), "open"))]
    mistakes = [
        (lambda r, k: _rank_layers(r, k, descending=False), "most damaging first: sort by damage, descending"),
        (lambda r, k: _rank_layers(r, k, pairs=False), "return (layer, damage) pairs, not only the layers"),
        (lambda r, k: _rank_layers(r, k, damage="ppl difference"),
         "damage is a loss difference in nats, ln(ppl / ppl_learned) = r.loss - learned.loss, not ppl - ppl_learned"),
        (lambda r, k: _rank_layers(r, k, damage="ppl ratio"),
         "damage is ln(ppl / ppl_learned) (the loss difference), not the ratio itself"),
        (lambda r, k: _rank_layers(r, k, damage="absolute"),
         "damage is measured against the learned model: subtract results['learned'].loss"),
        (lambda r, k: _rank_layers(r, k, pattern="prefix"),
         "'L0H3 closed' is a head condition, not a layer one: match the whole name, e.g. "
         "re.fullmatch(rf'L(\\d+) {kind}', name)"),
        (lambda r, k: _rank_layers(r, k, pattern="one digit"),
         "layer numbers can have two digits ('L10 open'): parse all of them, e.g. int(name[1:].split()[0])"),
    ]
    return check("rank_layers", fn, reference_rank_layers, cases, mistakes, atol=1e-9, rtol=1e-9)


# ── lesson 08: loss spikes, and Qwen3-Next's gated q_proj in minigate's layout ───────────────────────

def reference_loss_spikes(losses, factor, window):
    """The 1-based steps whose loss is above `factor` times the mean of the `window` losses just before it;
    a step needs `window` earlier losses to be judged (what train() records in History.spikes)."""
    x = torch.as_tensor(losses, dtype=torch.float64)
    if x.numel() <= window:
        return []
    csum = torch.cat([torch.zeros(1, dtype=torch.float64), x.cumsum(0)])
    i = torch.arange(window, x.numel())  # 0-based indices with `window` predecessors
    mean_before = (csum[i] - csum[i - window]) / window
    return (i[x[i] > factor * mean_before] + 1).tolist()


def _loss_spikes(losses, factor, window, *, one_based=True, include_self=False, partial=False, all_previous=False):
    """Plain loop with switches for the typical mistakes."""
    out = []
    for i, loss in enumerate(losses):
        before = losses[max(0, i + 1 - window): i + 1] if include_self else losses[:i] if all_previous \
            else losses[max(0, i - window): i]
        if not before or (i < window and not partial):
            continue
        if loss > factor * sum(before) / len(before):
            out.append(i + 1 if one_based else i)
    return out


def loss_spikes(fn: Callable) -> Callable:
    """fn(losses: list of floats, factor, window) -> list of the 1-based steps that are loss spikes."""
    def curve(seed, n, spikes, decay=0.02, noise=0.05):  # spikes: {step (1-based): height factor}
        base = 2.0 + 6.0 * torch.exp(-decay * torch.arange(n, dtype=torch.float64))
        for step, height in spikes.items():
            base[step - 1] *= height
        return (base + _randn(n, seed=seed).double() * noise).tolist()

    cases = [("120 steps, spikes at 40 and 90, factor 1.5, window 20", (curve(0, 120, {40: 2, 90: 2}), 1.5, 20)),
             ("a spike at step 4, inside the first window", (curve(1, 60, {4: 1.6, 30: 1.6}), 1.3, 10)),
             ("fast early decline, two spikes in a row",
              (curve(2, 50, {12: 1.5, 13: 1.5, 35: 1.5}, decay=0.15), 1.2, 5)),
             ("a small spike (1.25x) at factor 1.2", (curve(3, 40, {25: 1.25}, decay=0.0, noise=0.01), 1.2, 5)),
             ("no spikes", (curve(4, 40, {}), 1.5, 10))]
    wrap = lambda f: lambda *a: torch.tensor([int(s) for s in f(*a)], dtype=torch.long)
    mistakes = [
        (wrap(lambda *a: _loss_spikes(*a, one_based=False)),
         "steps are 1-based, as in History.step: the first loss is step 1, so losses[i] is step i + 1"),
        (wrap(lambda *a: _loss_spikes(*a, include_self=True)),
         "the running mean is over the `window` losses *before* the step; including the step's own loss dampens "
         "the spike it should reveal"),
        (wrap(lambda *a: _loss_spikes(*a, partial=True)),
         "no step is judged before `window` earlier losses exist: steps 1..window are never spikes"),
        (wrap(lambda *a: _loss_spikes(*a, all_previous=True)),
         "use the mean of the last `window` losses only, not of every earlier loss: the loss falls during "
         "training, so an old mean is too high and hides spikes"),
    ]
    reference = wrap(reference_loss_spikes)
    result = check("loss_spikes", wrap(fn), reference, cases, mistakes, atol=0, rtol=0)
    return reference_loss_spikes if result is reference else fn


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
                       group="(kv g)", target="per kv group"):
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
    return rearrange(w, "kv two g d m -> (kv two g d) m")


def qwen3_next_q_proj(fn: Callable) -> Callable:
    """fn(weight (n_heads * 2 * head_dim, d_model), n_heads, n_kv_heads, head_dim) -> the same rows reordered
    into minigate's per-kv-group G1 elementwise layout (see reference_qwen3_next_q_proj)."""
    shapes = [(4, 2, 4, 8), (6, 3, 2, 4), (8, 2, 2, 3), (4, 1, 4, 8)]  # (heads, kv heads, head_dim, d_model)
    cases = [(f"h={H} kv={K} d={D}", (_randn(H * 2 * D, M, seed=i), H, K, D)) for i, (H, K, D, M) in enumerate(shapes)]
    mistakes = [
        (lambda *a: _qwen3_next_q_proj(*a, target="unchanged"),
         "the rows need reordering: Qwen3-Next has per query head [query_h | gate_h], minigate per kv head "
         "[queries of its group heads | gates of those heads]"),
        (lambda *a: _qwen3_next_q_proj(*a, gate_first=True),
         "in each head's 2 * head_dim rows Qwen3-Next puts the query first, then the gate (torch.chunk(..., 2) "
         "returns query_states, gate)"),
        (lambda *a: _qwen3_next_q_proj(*a, source="all queries first"),
         "Qwen3-Next's rows are not [all queries | all gates]: its forward views q_proj's output as "
         "(..., n_heads, 2 * head_dim), so each head's query and gate rows sit together"),
        (lambda *a: _qwen3_next_q_proj(*a, target="all queries first"),
         "the gates go after the queries of their own kv group, not after all queries (the two agree only "
         "when n_kv_heads = 1)"),
        (lambda *a: _qwen3_next_q_proj(*a, group="(g kv)"),
         "query head h shares kv head h // (n_heads // n_kv_heads): consecutive heads form a group, heads are "
         "not dealt out to the kv heads in turn"),
    ]
    return check("qwen3_next_q_proj", fn, reference_qwen3_next_q_proj, cases, mistakes, atol=0, rtol=0)


# ── lesson 07: the 1B models' size, and a T4 time budget from FLOPs ──────────────────────────────────

def reference_param_count(cfg):
    """Parameters of a model in the released checkpoints' format (Qwen3 blocks, no gate or a G1 gate inside
    q_proj; no sandwich norm, no gate bias), from its ModelConfig alone."""
    return _param_count(cfg)


def _param_count(cfg, *, kv="kv", gate="granularity", lm_head="if untied", norms="all", mlp=3, head_dim="cfg"):
    """Explicit count with switches for the typical mistakes."""
    d, H, V = cfg.d_model, cfg.n_heads, cfg.vocab_size
    D = cfg.head_dim if head_dim == "cfg" else d // H
    K = cfg.n_kv_heads if kv == "kv" else H
    gate_rows = 0
    if cfg.gate != "none" and gate != "ignored":
        per_head = cfg.head_dim if cfg.gate_granularity == "elementwise" else 1
        if gate == "swapped":
            per_head = 1 if cfg.gate_granularity == "elementwise" else cfg.head_dim
        gate_rows = H * per_head
    attention = d * (H * D + gate_rows) + 2 * d * K * D + H * D * d  # q_proj (with gate rows), k_proj, v_proj, o_proj
    block_norms = {"all": 2 * d + (2 * D if cfg.qk_norm else 0), "no qk": 2 * d, "none": 0}[norms]
    block = attention + mlp * d * cfg.d_ff + block_norms
    head = {"if untied": 0 if cfg.tie_embeddings else V * d, "always": V * d, "never": 0}[lm_head]
    return V * d + cfg.n_layers * block + (d if norms != "none" else 0) + head


def _paper_1b_configs():
    """The three released 1B models' ModelConfigs, from the architecture in docs (official-checkpoints.md):
    28 layers, hidden 2048, 16 query heads and 8 kv heads of 128, SwiGLU 6144 (5504 reported for the
    parameter-matched elementwise model), vocab 152064, tied embeddings, QK-norm."""
    from .config import ModelConfig

    base = dict(vocab_size=152064, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=6144,
                qk_norm=True, tie_embeddings=True, max_seq_len=4096)
    return {"baseline": ModelConfig(**base),
            "headwise": ModelConfig(**base, gate="G1", gate_granularity="headwise"),
            "elementwise": ModelConfig(**{**base, "d_ff": 5504}, gate="G1", gate_granularity="elementwise")}


def param_count(fn: Callable) -> Callable:
    """fn(cfg: ModelConfig) -> number of parameters (an int) of the model that config describes."""
    from .config import ModelConfig

    paper = _paper_1b_configs()
    small = [ModelConfig(vocab_size=300, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=96,
                         qk_norm=False, tie_embeddings=False, gate="G1", gate_granularity="headwise"),
             ModelConfig(vocab_size=500, d_model=48, n_layers=2, n_heads=6, n_kv_heads=6, head_dim=16, d_ff=80,
                         gate="G1", gate_granularity="elementwise")]
    cases = [(f"the 1B {name} model", (cfg,)) for name, cfg in paper.items()]
    cases += [("3 layers, GQA 4/2, head_dim 32 != 64/4, untied, no QK-norm, headwise", (small[0],)),
              ("2 layers, 6 heads of 16 != 48/6, tied, elementwise", (small[1],))]
    mistakes = [
        (lambda c: _param_count(c, kv="heads"),
         "k_proj and v_proj have n_kv_heads * head_dim rows each (GQA: 8 kv heads for 16 query heads), "
         "not n_heads * head_dim"),
        (lambda c: _param_count(c, gate="ignored"),
         "the G1 gate lives in extra rows of q_proj: n_heads more (headwise) or n_heads * head_dim more "
         "(elementwise) per layer; check cfg.gate and cfg.gate_granularity"),
        (lambda c: _param_count(c, gate="swapped"),
         "headwise means one gate row per head, elementwise one per head dimension (head_dim rows per head)"),
        (lambda c: _param_count(c, lm_head="always"),
         "with tied embeddings (cfg.tie_embeddings) the unembedding *is* the embedding matrix: count it once"),
        (lambda c: _param_count(c, lm_head="never"),
         "an untied model (cfg.tie_embeddings False) has its own lm_head, vocab_size x d_model"),
        (lambda c: _param_count(c, norms="none"),
         "count the RMSNorm weights too: 2 per block (d_model each), the final norm, and q_norm / k_norm "
         "(head_dim each) when cfg.qk_norm"),
        (lambda c: _param_count(c, norms="no qk"),
         "with cfg.qk_norm each block also has q_norm and k_norm, head_dim weights each"),
        (lambda c: _param_count(c, mlp=2),
         "the SwiGLU MLP has three matrices: gate_proj and up_proj (d_ff x d_model) and down_proj"),
        (lambda c: _param_count(c, head_dim="d/H"),
         "use cfg.head_dim: a head's width need not be d_model / n_heads"),
    ]
    return check("param_count", fn, reference_param_count, cases, mistakes, atol=0, rtol=0)


def reference_t4_minutes(params, n_layers, n_heads, head_dim, n_chunks, chunk_len, n_passes, utilisation):
    """Projected minutes on a T4 for n_passes forward passes over n_chunks x chunk_len tokens: 2 FLOPs per
    parameter per token plus causal attention (q.k and pattern.v, 2 FLOPs per multiply-add, chunk_len / 2
    keys per query on average), at `utilisation` x the T4's fp16 peak (minigate.bench.ablation.T4_PEAK)."""
    return _t4_minutes(params, n_layers, n_heads, head_dim, n_chunks, chunk_len, n_passes, utilisation)


def _t4_minutes(params, n_layers, n_heads, head_dim, n_chunks, chunk_len, n_passes, utilisation, *,
                per_param=2, per_mac=2, matmuls=2, keys="causal", attention=True, unit=60, rate="peak x u",
                passes=True):
    from .bench.ablation import T4_PEAK

    n_keys = chunk_len / 2 if keys == "causal" else chunk_len
    attn = per_mac * matmuls * n_layers * n_heads * head_dim * n_keys if attention else 0
    flops = (n_passes if passes else 1) * n_chunks * chunk_len * (per_param * params * per_mac / 2 + attn)
    speed = T4_PEAK * utilisation if rate == "peak x u" else T4_PEAK / utilisation
    return flops / speed / unit


def t4_minutes(fn: Callable) -> Callable:
    """fn(params, n_layers, n_heads, head_dim, n_chunks, chunk_len, n_passes, utilisation) -> projected minutes."""
    paper = (1.7e9, 28, 16, 128, 50, 512)
    cases = [("the 1B ablation set: 117 passes of 50 x 512 at 35%", (*paper, 117, 0.35)),
             ("the 1B model, 3 passes of 20 x 1024 at 15%", (1.7e9, 28, 16, 128, 20, 1024, 3, 0.15)),
             ("a tiny text model, 36 passes of 16 x 256 at 5%", (1.38e6, 4, 8, 16, 16, 256, 36, 0.05))]
    mistakes = [
        (lambda *a: _t4_minutes(*a, unit=1), "return minutes: the seconds divided by 60"),
        (lambda *a: _t4_minutes(*a, unit=3600), "return minutes, not hours"),
        (lambda *a: _t4_minutes(*a, rate="peak / u"),
         "the T4 delivers utilisation x its peak: divide the FLOPs by T4_PEAK * utilisation"),
        (lambda *a: _t4_minutes(*a, passes=False),
         "every pass (one per condition) runs the model over all the chunks again: multiply by n_passes"),
        (lambda *a: _t4_minutes(*a, per_param=6),
         "forward passes only: 2 FLOPs per parameter per token (6 counts the backward pass of training too)"),
        (lambda *a: _t4_minutes(*a, per_mac=1), "a multiply-add is 2 FLOPs: 2 per parameter per token"),
        (lambda *a: _t4_minutes(*a, attention=False),
         "add the attention: per token and layer, 2 x 2 x n_heads x head_dim FLOPs per key (q.k and pattern.v), "
         "over chunk_len / 2 keys"),
        (lambda *a: _t4_minutes(*a, keys="all"),
         "attention is causal: a query sees chunk_len / 2 keys on average, not chunk_len"),
        (lambda *a: _t4_minutes(*a, matmuls=1), "attention has two matmuls per head: q.k (scores) and pattern.v"),
    ]
    return check("t4_minutes", fn, reference_t4_minutes, cases, mistakes, atol=0, rtol=1e-9)
