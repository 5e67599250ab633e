"""Lesson 02's checks: the G1 gate, what a head writes where its gate closes, how much of a head's output no linear
map of its mixed input explains, and where the gate hides in q_proj."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from einops import einsum, rearrange

from .engine import Mistake, check, randn

EXERCISES = ("g1_gate", "head_output_by_part", "nonlinear_share", "split_q_proj")  # check cells, in lesson order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── the G1 gate ────────────────────────────────────────────────────────────────────────────────────


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


# ── how much of a head's output no linear map explains ───────────────────────────────────────────────

def reference_nonlinear_share(model, tokens, layer):
    """tokens (batch, pos) -> (head,): for each head of `layer`, the share ||Z - M B||^2 / ||Z||^2 of its output Z
    (what o_proj receives from it: hook_z_gated in a gated layer, hook_z in an ungated one; (N, d_head), one row per
    batch row and position) that no linear map of its attention-mixed normed input M explains: M's row for query i is
    sum_j pattern[i, j] * attn_norm(resid_pre)[j], (N, d_model), and B the least-squares fit, one per head."""
    return _nonlinear_share(model, tokens, layer)


def _nonlinear_share(model, tokens, layer, point="after gate", normed=True, mix="keys", fit="per head",
                     stat="share"):
    a = f"blocks.{layer}.attn."
    out = a + ("hook_z_gated" if model.cfg.is_gated(layer) and point == "after gate" else "hook_z")
    names = [f"blocks.{layer}.hook_resid_pre", a + "hook_pattern", out, a + "hook_z"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
        x = cache[names[0]]
        x = model.blocks[layer].attn_norm(x) if normed else x  # (batch, pos, d_model)
    x, p, z = x.double().cpu(), cache[names[1]].double().cpu(), cache[out].double().cpu()
    if mix == "keys":  # m_i = sum_j p_ij x_j
        m = einsum(p, x, "b h i j, b j e -> h b i e")
    elif mix == "queries":  # the pattern read the wrong way round: sum_i p_ij x_i
        m = einsum(p, x, "b h i j, b i e -> h b j e")
    elif mix == "hook_z":  # the head's own output before the gate, m W_v (batch, pos, head, d_head)
        m = rearrange(cache[a + "hook_z"].double().cpu(), "b i h d -> h b i d")
    else:  # "none": the query's own x_i
        m = x.expand(p.shape[1], *x.shape)
    m, z = m.flatten(1, 2), rearrange(z, "b i h d -> h (b i) d")  # (head, N, d_model), (head, N, d_head)
    if fit == "per head":
        residual = z - m @ torch.linalg.lstsq(m, z).solution
    else:  # "shared": one map B for every head's (m, z) pairs
        H, N = z.shape[:2]
        b = torch.linalg.lstsq(m.flatten(0, 1), z.flatten(0, 1)).solution
        residual = z - (m.flatten(0, 1) @ b).reshape(H, N, -1)
    share = residual.pow(2).sum((1, 2)) / z.pow(2).sum((1, 2))
    if stat == "share":
        return share
    if stat == "explained":
        return 1 - share
    if stat == "ratio of norms":
        return share.sqrt()
    return (residual.pow(2).sum(-1) / z.pow(2).sum(-1)).mean(-1)  # "per position": the mean of per-row shares


def _nonlinear_case(seed: int, gate: str, granularity: str = "headwise", sharpen: float = 1.0):
    """A tiny random model (4 query heads sharing 2 kv heads) and 6 rows of 24 tokens. sharpen scales q_proj, whose
    rows hold the G1 gate's: QK-norm undoes the scale on the queries, so only the gate logits grow, and the scores
    spread out from 0.5."""
    from ...config import ModelConfig
    from ...model import Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, gate=gate,
                      gate_granularity=granularity)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_proj.weight.mul_(sharpen)
    tokens = torch.randint(0, 60, (6, 24), generator=torch.Generator().manual_seed(seed))
    return model, tokens


NOT_LINEAR_KEY_HINT = ("a gated layer's output after the gate is at blocks.{layer}.attn.hook_z_gated, an ungated "
                       "layer's at hook_z: model.cfg.is_gated(layer) says which")

MISTAKES["nonlinear_share"] = [
    ("before the gate", partial(_nonlinear_share, point="before gate"),
     "that is the output *before* the gate (hook_z), which is exactly linear in m: in a gated layer o_proj receives "
     "hook_z_gated"),
    ("raw residual stream", partial(_nonlinear_share, normed=False),
     "v_proj reads the *normed* hidden state: mix model.blocks[layer].attn_norm(hook_resid_pre), not the raw "
     "residual stream (the norm scales each token differently)"),
    ("mixed over queries", partial(_nonlinear_share, mix="queries"),
     "m at query i mixes the keys j it attends to, sum over the pattern's last axis: "
     "einsum(pattern, x, 'b h i j, b j e -> h b i e')"),
    ("the query's own input", partial(_nonlinear_share, mix="none"),
     "m is the attention-weighted mean of the normed inputs, sum_j pattern[i, j] x_j, not the query's own x_i"),
    ("fitted on hook_z", partial(_nonlinear_share, mix="hook_z"),
     "fit on M, the mixed normed input (N, d_model), not on hook_z = M W_v (N, d_head): a map from hook_z reaches "
     "less, so the share comes out too large"),
    ("one map for all heads", partial(_nonlinear_share, fit="shared"),
     "fit one linear map per head (each head has its own W_v): lstsq on (head, N, d_model) and (head, N, d_head) "
     "fits them all at once"),
    ("explained share", partial(_nonlinear_share, stat="explained"),
     "that is the share the linear map explains: return what it leaves out, ||Z - M B||^2 / ||Z||^2"),
    ("ratio of norms", partial(_nonlinear_share, stat="ratio of norms"),
     "a share of squared norms: ||Z - M B||^2 / ||Z||^2, not ||Z - M B|| / ||Z||"),
    ("mean of per-position shares", partial(_nonlinear_share, stat="per position"),
     "pool over all rows and positions: the sum of squared residuals over the sum of squared outputs, not the mean "
     "of each position's share"),
]


def nonlinear_share(fn: Callable) -> Callable:
    """fn(model, tokens, layer) -> (head,); see reference_nonlinear_share."""
    (m0, t0), (m1, t1) = _nonlinear_case(0, "G1", sharpen=4.0), _nonlinear_case(1, "G1", "elementwise", sharpen=3.0)
    (m2, t2), (m3, t3) = _nonlinear_case(2, "none"), _nonlinear_case(3, "G1")
    cases = [("tiny headwise model, gates spread, layer 1", (m0, t0, 1)),
             ("tiny elementwise model, gates spread, layer 0", (m1, t1, 0)),
             ("tiny baseline, layer 0", (m2, t2, 0)),
             ("tiny headwise model at initialisation, layer 0", (m3, t3, 0))]
    raises = [(r"NotImplementedError.*einsum", "einops' einsum cannot group axes in its output ('h (b i) e'): einsum "
               "to 'h b i e', then .flatten(1, 2)"),
              (r"KeyError", NOT_LINEAR_KEY_HINT),
              (r"dtype", "give lstsq M and Z of one dtype, float64: M.double(), Z.double()"),
              (r"lstsq|size\(-2\)|shape|size of tensor",
               "lstsq(M, Z) wants one row per (batch row, position) in both: M (head, N, d_model), "
               "Z (head, N, d_head), the heads in front")]
    return check("nonlinear_share", fn, reference_nonlinear_share, cases, MISTAKES["nonlinear_share"],
                 atol=1e-4, rtol=1e-3, raises=raises)
