"""Lesson 02's checks: the G1 gate, its output projection, its parameter count, and where it hides in q_proj."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import rearrange

from .engine import check, randn

EXERCISES = ("g1_gate", "gated_output", "gate_param_count", "split_q_proj")  # its check cells, in the lesson's order

# ── the G1 gate and the gated output projection ──────────────────────────────────────────────────────


def reference_g1_gate(z, gate_logits):
    """z (b, t, h, d) * sigmoid(gate_logits): (b, t, h) headwise (one scalar per head) or (b, t, h, d)."""
    if gate_logits.dim() == 3:
        gate_logits = rearrange(gate_logits, "b t h -> b t h 1")
    return z * torch.sigmoid(gate_logits)


def _per_head(g):
    """A headwise gate (b, t, h) -> (b, t, h, 1); an elementwise one unchanged."""
    return g[..., None] if g.dim() == 3 else g


def g1_gate(fn: Callable) -> Callable:
    """fn(z (b, t, h, d), gate_logits (b, t, h) or (b, t, h, d)) -> the sigmoid-gated z (b, t, h, d)."""
    cases = [("headwise h=4 d=4", (randn(2, 3, 4, 4, seed=0), randn(2, 3, 4, seed=1))),
             ("headwise h=2 d=8", (randn(1, 5, 2, 8, seed=2), randn(1, 5, 2, seed=3))),
             ("elementwise h=4 d=4", (randn(2, 3, 4, 4, seed=4), randn(2, 3, 4, 4, seed=5))),
             ("elementwise h=3 d=2", (randn(1, 4, 3, 2, seed=6), randn(1, 4, 3, 2, seed=7)))]
    mistakes = [
        (lambda z, g: z * _per_head(g), "the gate is sigmoid(logits), not the logits"),
        (lambda z, g: z * F.silu(_per_head(g)), "G1 uses a sigmoid, not SiLU"),
        (lambda z, g: z * torch.sigmoid(-_per_head(g)), "sign flipped: sigmoid(logits)"),
        (lambda z, g: z * torch.sigmoid(g[:, :, None, :] if g.dim() == 3 else g),
         "a headwise gate (b, t, h) must become (b, t, h, 1): one scalar per head, broadcast over d"),
        (lambda z, g: torch.sigmoid(z * _per_head(g)),
         "the sigmoid goes on the gate logits only: z * sigmoid(gate_logits)"),
        (lambda z, g: z + torch.sigmoid(_per_head(g)), "the gate multiplies z: z * sigmoid(gate_logits), not +"),
    ]
    raises = [(r"size of tensor|shape|broadcast",
               "a headwise gate (b, t, h) must become (b, t, h, 1) to broadcast over d: "
               "rearrange(gate_logits, 'b t h -> b t h 1')")]
    return check("g1_gate", fn, reference_g1_gate, cases, mistakes, raises=raises)


def reference_gated_output(z, gate_logits, w_o):
    """o_proj(z * sigmoid(gate)): z and gate_logits (b, t, h, d), w_o (d_model, h * d) -> (b, t, d_model)."""
    return rearrange(z * torch.sigmoid(gate_logits), "b t h d -> b t (h d)") @ w_o.T


def gated_output(fn: Callable) -> Callable:
    """fn(z (b, t, h, d), gate_logits (b, t, h, d), w_o (d_model, h*d)) -> (b, t, d_model): G1, then o_proj."""
    shapes = [(4, 4, 16), (2, 8, 16), (3, 4, 10)]  # (h, d, d_model): the last has d_model != h * d
    cases = [(f"h={h} d={d} d_model={m}", (randn(2, 3, h, d, seed=i), randn(2, 3, h, d, seed=i + 10),
                                           randn(m, h * d, seed=i + 20) / h)) for i, (h, d, m) in enumerate(shapes)]
    flat = lambda x: rearrange(x, "b t h d -> b t (h d)")
    mistakes = [(lambda z, g, w: (flat(z) @ w.T) * torch.sigmoid(flat(g)),
                 "the gate is applied after o_proj (that is G5, the paper's weakest position): gate z, then project"),
                (lambda z, g, w: flat(z) @ w.T, "the gate is missing: multiply z by sigmoid(gate_logits) first"),
                (lambda z, g, w: flat(z * torch.sigmoid(g)) @ w,
                 "w_o is stored as nn.Linear stores it, (d_model, h * d): project with ... @ w_o.T"),
                (lambda z, g, w: rearrange(z * torch.sigmoid(g), "b t h d -> b t (d h)") @ w.T,
                 "flatten the heads one after the other, '(h d)': o_proj's columns are head 0's d values, then head "
                 "1's; '(d h)' interleaves them"),
                (lambda z, g, w: flat(z * g) @ w.T, "the gate is sigmoid(gate_logits), not the logits")]
    raises = [(r"cannot be multiplied|size of tensor|shape",
               "w_o is stored as nn.Linear stores it, (d_model, h * d): project with ... @ w_o.T")]
    return check("gated_output", fn, reference_gated_output, cases, mistakes, raises=raises)


# ── the gate's parameter count ───────────────────────────────────────────────────────────────────────

def reference_gate_param_count(cfg):
    """Extra parameters of a G1 gate: per layer, d_model inputs x (one row per head, or per head dimension)."""
    return cfg.n_layers * cfg.d_model * cfg.n_heads * (1 if cfg.gate_granularity == "headwise" else cfg.head_dim)


def _gate_params(cfg, layers=True, heads="query", width="granularity", inputs="d_model"):
    """The count with switches for the typical mistakes (width "d_model": elementwise as d_model x d_model)."""
    n_heads = cfg.n_heads if heads == "query" else cfg.n_kv_heads
    elementwise = cfg.gate_granularity == "elementwise"
    rows = n_heads * (cfg.head_dim if width == "head_dim" or elementwise else 1)
    if width == "d_model" and elementwise:
        rows = cfg.d_model
    n_in = cfg.d_model if inputs == "d_model" else cfg.head_dim
    return (cfg.n_layers if layers else 1) * n_in * rows


def gate_param_count(fn: Callable) -> Callable:
    """fn(cfg: ModelConfig with a G1 gate) -> number of parameters the gate adds to the whole model."""
    from ...config import ModelConfig

    shapes = [dict(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8),  # a tiny model
              dict(d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128),  # a Qwen3-1.7B-sized one
              dict(d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8)]  # n_heads * head_dim != d_model
    cases = [(f"{s['n_layers']} layers d_model={s['d_model']} {s['n_heads']}x{s['head_dim']} heads {gran}",
              (ModelConfig(vocab_size=100, gate="G1", gate_granularity=gran, **s),))
             for s in shapes for gran in ("headwise", "elementwise")]
    mistakes = [(lambda c: _gate_params(c, layers=False), "one layer only: every layer has its own gate"),
                (lambda c: _gate_params(c, heads="kv"), "one gate per *query* head (n_heads), not per kv head"),
                (lambda c: _gate_params(c, width="head_dim"), "a headwise gate has one row per head, not head_dim"),
                (lambda c: _gate_params(c, width="d_model"),
                 "an elementwise gate has one row per head dimension, n_heads * head_dim rows, which is not "
                 "d_model in general (here n_heads * head_dim != d_model)"),
                (lambda c: _gate_params(c, inputs="head_dim"),
                 "every gate row reads the whole hidden state: d_model inputs per row, not head_dim")]
    return check("gate_param_count", fn, reference_gate_param_count, cases, mistakes, atol=0, rtol=0)


# ── where the gate hides in q_proj ───────────────────────────────────────────────────────────────────

def _split(qg, n_heads, n_kv_heads, head_dim, granularity, layout="per kv group", group="(kv g)",
           gates_first=False):
    """Split q_proj's output (b, t, rows) into q (b, h, t, d) and gate logits (b, t, h[, d])."""
    H, K, D = n_heads, n_kv_heads, head_dim
    E = 1 if granularity == "headwise" else D
    if layout == "per kv group":  # the released checkpoints: per kv head [its g query heads | their gates]
        g = H // K
        parts = rearrange(qg, "b t (kv n) -> b t kv n", kv=K).split([g * E, g * D] if gates_first else [g * D, g * E],
                                                                      dim=-1)
        q, gate = parts[::-1] if gates_first else parts
        q, gate = (rearrange(x, f"b t kv (g e) -> b t {group} e", g=g) for x in (q, gate))
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
                                         (4, 1, 4, "elementwise"), (6, 3, 4, "elementwise")]):
        rows = H * D + H * (1 if gran == "headwise" else D)
        cases.append((f"h={H} kv={K} d={D} {gran}", (randn(2, 3, rows, seed=i), H, K, D, gran)))
    mistakes = [
        (lambda *a: _split(*a, layout="per head"), "rows are grouped per kv head, not per query head: for each "
         "kv head, first the queries of its group heads, then those heads' gate rows"),
        (lambda *a: _split(*a, layout="all queries first"), "the gate rows are not all at the end: q_proj's rows "
         "come per kv head, [queries of its group | gates of its group], one kv head after the other"),
        (lambda *a: _split(*a, group="(g kv)"),
         "query head h belongs to kv head h // (n_heads // n_kv_heads): merge the heads as '(kv g)', not '(g kv)'"),
        (lambda *a: _split(*a, gates_first=True),
         "within a kv head's rows the queries come first, then the gates: [queries of its group | their gates]"),
    ]
    raises = [(r"split|size|shape",
               "q_proj's rows come per kv head: (n_heads // n_kv_heads) * head_dim query rows, then as many gate "
               "rows per head as the granularity says (1 headwise, head_dim elementwise)")]
    return check("split_q_proj", fn, reference_split_q_proj, cases, mistakes, atol=0, rtol=0, raises=raises)
