"""Lesson 02's checks: the G1 gate, its output projection, what a head writes where its gate closes, and where the
gate hides in q_proj."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from einops import rearrange

from .engine import Mistake, check, randn

EXERCISES = ("g1_gate", "gated_output", "head_output_by_part", "split_q_proj")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── the G1 gate and the gated output projection ──────────────────────────────────────────────────────


def reference_g1_gate(z, gate_logits):
    """z (b, t, h, d) * sigmoid(gate_logits): (b, t, h) headwise (one scalar per head) or (b, t, h, d)."""
    if gate_logits.dim() == 3:
        gate_logits = rearrange(gate_logits, "b t h -> b t h 1")
    return z * torch.sigmoid(gate_logits)


def _per_head(g):
    """A headwise gate (b, t, h) -> (b, t, h, 1); an elementwise one unchanged."""
    return g[..., None] if g.dim() == 3 else g


MISTAKES["g1_gate"] = [
    ("logits", lambda z, g: z * _per_head(g), "the gate is sigmoid(logits), not the logits"),
    ("silu", lambda z, g: z * F.silu(_per_head(g)), "G1 uses a sigmoid, not SiLU"),
    ("sign", lambda z, g: z * torch.sigmoid(-_per_head(g)), "sign flipped: sigmoid(logits)"),
    ("headwise on the last axis", lambda z, g: z * torch.sigmoid(g[:, :, None, :] if g.dim() == 3 else g),
     "a headwise gate (b, t, h) must become (b, t, h, 1): one scalar per head, broadcast over d"),
    ("sigmoid of the product", lambda z, g: torch.sigmoid(z * _per_head(g)),
     "the sigmoid goes on the gate logits only: z * sigmoid(gate_logits)"),
    ("added", lambda z, g: z + torch.sigmoid(_per_head(g)), "the gate multiplies z: z * sigmoid(gate_logits), not +"),
]


def g1_gate(fn: Callable) -> Callable:
    """fn(z (b, t, h, d), gate_logits (b, t, h) or (b, t, h, d)) -> the sigmoid-gated z (b, t, h, d)."""
    cases = [("headwise h=4 d=4", (randn(2, 3, 4, 4, seed=0), randn(2, 3, 4, seed=1))),
             ("headwise h=2 d=8", (randn(1, 5, 2, 8, seed=2), randn(1, 5, 2, seed=3))),
             ("elementwise h=4 d=4", (randn(2, 3, 4, 4, seed=4), randn(2, 3, 4, 4, seed=5))),
             ("elementwise h=3 d=2", (randn(1, 4, 3, 2, seed=6), randn(1, 4, 3, 2, seed=7)))]
    raises = [(r"size of tensor|shape|broadcast",
               "a headwise gate (b, t, h) must become (b, t, h, 1) to broadcast over d: "
               "rearrange(gate_logits, 'b t h -> b t h 1')")]
    return check("g1_gate", fn, reference_g1_gate, cases, MISTAKES["g1_gate"], raises=raises)


def reference_gated_output(z, gate_logits, w_o):
    """o_proj(z * sigmoid(gate)): z and gate_logits (b, t, h, d), w_o (d_model, h * d) -> (b, t, d_model)."""
    return rearrange(z * torch.sigmoid(gate_logits), "b t h d -> b t (h d)") @ w_o.T


def _flat(x):
    return rearrange(x, "b t h d -> b t (h d)")


MISTAKES["gated_output"] = [
    ("G5", lambda z, g, w: (_flat(z) @ w.T) * torch.sigmoid(_flat(g)),
     "the gate is applied after o_proj (that is G5, the paper's weakest position): gate z, then project"),
    ("no gate", lambda z, g, w: _flat(z) @ w.T, "the gate is missing: multiply z by sigmoid(gate_logits) first"),
    ("w_o not transposed", lambda z, g, w: _flat(z * torch.sigmoid(g)) @ w,
     "w_o is stored as nn.Linear stores it, (d_model, h * d): project with ... @ w_o.T"),
    ("(d h)", lambda z, g, w: rearrange(z * torch.sigmoid(g), "b t h d -> b t (d h)") @ w.T,
     "flatten the heads one after the other, '(h d)': o_proj's columns are head 0's d values, then head 1's; "
     "'(d h)' interleaves them"),
    ("logits as the gate", lambda z, g, w: _flat(z * g) @ w.T, "the gate is sigmoid(gate_logits), not the logits"),
]


def gated_output(fn: Callable) -> Callable:
    """fn(z (b, t, h, d), gate_logits (b, t, h, d), w_o (d_model, h*d)) -> (b, t, d_model): G1, then o_proj."""
    shapes = [(4, 4, 16), (2, 8, 16), (3, 4, 10)]  # (h, d, d_model): the last has d_model != h * d
    cases = [(f"h={h} d={d} d_model={m}", (randn(2, 3, h, d, seed=i), randn(2, 3, h, d, seed=i + 10),
                                           randn(m, h * d, seed=i + 20) / h)) for i, (h, d, m) in enumerate(shapes)]
    raises = [(r"cannot be multiplied|size of tensor|shape",
               "w_o is stored as nn.Linear stores it, (d_model, h * d): project with ... @ w_o.T")]
    return check("gated_output", fn, reference_gated_output, cases, MISTAKES["gated_output"], raises=raises)


# ── what a closed gate writes ────────────────────────────────────────────────────────────────────────

def reference_head_output_by_part(model, tokens, layer, n_random):
    """tokens (batch, pos): copy-task rows (<bos>, n_random random symbols, the separator, the copy) -> (2, head):
    the mean L2 norm of what o_proj receives from each head of `layer` (after the gate: hook_z_gated in a gated layer,
    hook_z in an ungated one), over the rows and the random part's queries 1..n_random (row 0), then over the copy
    part's queries n_random + 1 .. (row 1, separator included)."""
    return _head_output_by_part(model, tokens, layer, n_random)


QUERY0_HINT = "leave out query 0 (<bos>): the random part's queries are positions 1..n_random"
SEPARATOR_HINT = ("the separator (position n_random + 1) belongs to the copy part: slice the random part as "
                  "1 : n_random + 1")


def _copy_parts(x, n_random, dim=1, start=1, split=0):
    """x along `dim` (the query positions of copy-task rows) -> (the random part's queries 1..n_random, the copy part's
    n_random + 1 .., separator included); start and split move the cut, as the typical mistakes do."""
    cut = n_random + 1 + split
    return x.narrow(dim, start, cut - start), x.narrow(dim, cut, x.shape[dim] - cut)


def _head_output_by_part(model, tokens, layer, n_random, point="after gate", start=1, split=0, stat="mean norm"):
    gated = model.cfg.is_gated(layer) and point == "after gate"
    name = f"blocks.{layer}.attn." + ("hook_z_gated" if gated else "hook_z")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=name)
    z = cache[name].float()  # (batch, pos, head, d_head)
    parts = _copy_parts(z, n_random, start=start, split=split)
    if stat == "mean norm":
        return torch.stack([p.norm(dim=-1).mean((0, 1)) for p in parts])  # (2, head)
    if stat == "norm of mean":
        return torch.stack([p.mean((0, 1)).norm(dim=-1) for p in parts])
    if stat == "squared":
        return torch.stack([(p ** 2).sum(-1).mean((0, 1)) for p in parts])
    return torch.stack([p.norm(dim=-1).mean() for p in parts])[:, None].expand(2, z.shape[2])  # "head mean"


def _copy_model(seed: int, gate: str, granularity: str = "headwise"):
    from ...config import ModelConfig
    from ...model import Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, gate=gate,
                      gate_granularity=granularity)
    model = Transformer(cfg).eval()
    tokens = torch.randint(1, 40, (3, 14), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = 0  # <bos>
    return model, tokens


MISTAKES["head_output_by_part"] = [
    ("before the gate", partial(_head_output_by_part, point="before gate"),
     "that is the output *before* the gate (hook_z): in a gated layer o_proj receives hook_z_gated"),
    ("query 0 included", partial(_head_output_by_part, start=0), QUERY0_HINT),
    ("separator in the random part", partial(_head_output_by_part, split=1), SEPARATOR_HINT),
    ("norm of the mean", partial(_head_output_by_part, stat="norm of mean"),
     "take each output vector's norm, then average: the norm of the mean vector hides outputs that vary"),
    ("squared norm", partial(_head_output_by_part, stat="squared"),
     "the L2 norm (vector.norm(dim=-1)), not its square"),
    ("one number for all heads", partial(_head_output_by_part, stat="head mean"),
     "keep one number per head: average over rows and queries only"),
]


def head_output_by_part(fn: Callable) -> Callable:
    """fn(model, tokens, layer, n_random) -> (2, head); see reference_head_output_by_part."""
    (m0, t0), (m1, t1), (m2, t2) = _copy_model(0, "G1"), _copy_model(1, "G1", "elementwise"), _copy_model(2, "none")
    cases = [("tiny headwise model, layer 1, 6 random", (m0, t0, 1, 6)),
             ("tiny elementwise model, layer 0, 5 random", (m1, t1, 0, 5)),
             ("tiny baseline, layer 0, 6 random", (m2, t2, 0, 6))]
    raises = [(r"KeyError", "a gated layer's output after the gate is at blocks.{layer}.attn.hook_z_gated, an ungated "
                            "layer's at hook_z: model.cfg.is_gated(layer) says which")]
    return check("head_output_by_part", fn, reference_head_output_by_part, cases, MISTAKES["head_output_by_part"],
                 atol=1e-5, rtol=1e-4,
                 raises=raises)


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


MISTAKES["split_q_proj"] = [
    ("per head", partial(_split, layout="per head"), "rows are grouped per kv head, not per query head: for each "
     "kv head, first the queries of its group heads, then those heads' gate rows"),
    ("all queries first", partial(_split, layout="all queries first"), "the gate rows are not all at the end: "
     "q_proj's rows come per kv head, [queries of its group | gates of its group], one kv head after the other"),
    ("(g kv)", partial(_split, group="(g kv)"),
     "query head h belongs to kv head h // (n_heads // n_kv_heads): merge the heads as '(kv g)', not '(g kv)'"),
    ("gates first", partial(_split, gates_first=True),
     "within a kv head's rows the queries come first, then the gates: [queries of its group | their gates]"),
]


def split_q_proj(fn: Callable) -> Callable:
    """fn(qg (b, t, rows), n_heads, n_kv_heads, head_dim, granularity) -> (q (b, h, t, d), gates (b, t, h[, d]))."""
    cases = []
    for i, (H, K, D, gran) in enumerate([(4, 2, 4, "headwise"), (4, 2, 4, "elementwise"), (6, 2, 2, "headwise"),
                                         (4, 1, 4, "elementwise"), (6, 3, 4, "elementwise")]):
        rows = H * D + H * (1 if gran == "headwise" else D)
        cases.append((f"h={H} kv={K} d={D} {gran}", (randn(2, 3, rows, seed=i), H, K, D, gran)))
    raises = [(r"split|size|shape",
               "q_proj's rows come per kv head: (n_heads // n_kv_heads) * head_dim query rows, then as many gate "
               "rows per head as the granularity says (1 headwise, head_dim elementwise)")]
    return check("split_q_proj", fn, reference_split_q_proj, cases, MISTAKES["split_q_proj"], atol=0, rtol=0,
                 raises=raises)
