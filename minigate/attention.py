"""Gated multi-head attention (Qiu et al., 2025): the one file to read first.

                ┌─ gate logits ── sigmoid ── score ───────────────────────┐  the G1 gate
    x ─ q_proj ─┴─ q ── QK-norm ── RoPE ─┐                                ▼
                                         softmax(q kᵀ/√d_head) v = z ── z * score ── o_proj ─ out
    x ─ k_proj ─── k ── QK-norm ── RoPE ─┘                     ▲
    x ─ v_proj ─── v ──────────────────────────────────────────┘

The paper's gate (G1) multiplies each head's attention output z by a gate score sigmoid(x W_gate),
where x is the same normed hidden state that feeds the query projection. There is one score per
head (the `headwise` variant) or one per head dimension (`elementwise`). `Attention` is exactly that:
Qwen3's attention and the released G1 gate, to read top to bottom. The other gate positions (G2 values,
G3 keys, G4 queries, G5 after o_proj) and the study's other choices (SiLU, additive, head-shared, a bias), here
for the paper's ablations, are `GatePositionAttention`, a subclass that `model.Block` picks from the config.

Words, one per meaning. The gate *position* is `ModelConfig.gate` (none, G1..G5): where the gate acts. A run's
*variant* is none, headwise or elementwise: what a training run (`minigate train`) picks. The gate *logits* are
x W_gate (hook_gate_logits; TransformerLens' TransformerBridge calls them hook_q_gate); the gate *score* is the
sigmoid of the logits (hook_gate); *gating* is applying the score (z * score, at hook_z_gated). The MLP's
`gate_proj` is SwiGLU's gate (Hugging Face's name), unrelated to the attention gate; `GatePositionAttention.gate_proj`
is a study gate's own projection. `d_head` in shapes and einops patterns is `ModelConfig.head_dim`.

Checkpoint layout (the trap): in the released models the G1 gate weights are extra output rows of
q_proj, grouped per kv head. For each kv head: first the queries of its `group` query heads
(group * d_head rows), then those heads' gate rows (group, or group * d_head).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat
from torch import nn

from .config import ModelConfig
from .hooks import HookPoint


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last axis, computed in float32 (as Qwen3 does)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (pos, d_head), float32; the two halves of d_head share frequencies."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)  # (pos, d_head/2)
    angles = torch.cat([angles, angles], dim=-1)  # (pos, d_head)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the (x1, x2) half-pairs of x by position-dependent angles. x (batch, head, pos, d_head) with
    cos, sin (pos, d_head); for x (batch, pos, head, d_head) pass cos, sin as (pos, 1, d_head)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    """Qwen3's attention (QK-norm, RoPE, grouped-query attention) with the paper's G1 gate as released.

    forward(x (batch, pos, d_model), cos, sin) -> out (batch, pos, d_model); for the pattern, hook hook_pattern.
    Shapes: head = n_heads query heads; kv_head = n_kv_heads key/value heads, each serving `group` =
    n_heads / n_kv_heads neighbouring query heads; d_head = cfg.head_dim.

    This class computes a model without a gate and the released G1 gate (`cfg.released_g1`): the score
    sigmoid(x W_gate), x the normed input, W_gate the extra rows of q_proj; one score per head (headwise) or per
    head dimension (elementwise), multiplying each head's attention output z before o_proj. The gates the paper
    compared it with (G2-G5, head-shared, SiLU, additive, a bias) are `GatePositionAttention`, which `model.Block`
    builds instead for any other gate.

    Hook points, in the order they fire (TransformerLens' names and layouts):
        hook_q (batch, pos, head, d_head), hook_k, hook_v (batch, pos, kv_head, d_head): the projections,
            q and k after QK-norm, before RoPE and before any G2-G4 gate
        hook_rot_q, hook_rot_k: q and k after RoPE (same shapes)
        hook_gate_logits, hook_gate (gated layers): the gate's logits and scores, (batch, pos, head)
            headwise, (batch, pos, head, d_head) elementwise (kv heads for G2/G3), G5 (batch, pos, d_model)
        hook_attn_scores (batch, head, query_pos, key_pos): q kᵀ/√d_head, future keys -inf, before softmax
        hook_pattern (batch, head, query_pos, key_pos): the softmax
        hook_z (batch, pos, head, d_head): each head's attention output; hook_z_gated (G1): z * score
    hook_q_gate (G1 layers): another name of hook_gate_logits (hooks.py: aliases), the logits before the sigmoid,
        as TransformerLens' TransformerBridge names Qwen3-Next's gate (it applies torch.sigmoid after that hook;
        it flattens the logits to (batch, pos, head * d_head)). W_Q: q_proj's query rows alone, in TL's layout.
    hook_attn_scores and hook_pattern fire on the explicit path only: it runs when either point has a hook of its
    own (see HookPoint.active; a global module hook does not count); otherwise PyTorch's fused kernel computes
    the same z.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if type(self) is Attention and cfg.gate != "none" and not cfg.released_g1:
            raise ValueError(f"Attention computes no gate or the released G1 gate, not {cfg.describe_gate()!r}"
                             f"{' with a gate bias' if cfg.gate_bias else ''}: build GatePositionAttention")
        self.cfg = cfg
        H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        # a head-specific G1 gate's weights are extra rows of q_proj, grouped per kv head (the checkpoints' layout)
        self.gate_in_q_proj = cfg.gate == "G1" and cfg.gate_head_specific
        gate_rows = H * cfg.gate_width_per_head if self.gate_in_q_proj else 0
        self.q_proj = nn.Linear(cfg.d_model, H * D + gate_rows, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, K * D, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, K * D, bias=False)
        self.o_proj = nn.Linear(H * D, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(D, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(D, cfg.norm_eps) if cfg.qk_norm else nn.Identity()

        self.hook_q = HookPoint()  # (batch, pos, head, d_head)     after QK-norm, before RoPE
        self.hook_k = HookPoint()  # (batch, pos, kv_head, d_head)  after QK-norm, before RoPE
        self.hook_v = HookPoint()  # (batch, pos, kv_head, d_head)
        self.hook_rot_q = HookPoint()  # (batch, pos, head, d_head)     after RoPE
        self.hook_rot_k = HookPoint()  # (batch, pos, kv_head, d_head)  after RoPE
        self.hook_attn_scores = HookPoint()  # (batch, head, query_pos, key_pos) before softmax; explicit path only
        self.hook_pattern = HookPoint()  # (batch, head, query_pos, key_pos); explicit path only
        self.hook_z = HookPoint()  # (batch, pos, head, d_head)  attention output before the G1 gate
        if cfg.gate != "none":  # (batch, pos, head[, d_head]); G5: (batch, pos, d_model). G1: also hook_q_gate
            self.hook_gate_logits = HookPoint(aliases=("hook_q_gate",) if cfg.gate == "G1" else ())
            self.hook_gate = HookPoint()  # same shape, after the sigmoid (or SiLU): the gate scores
        if cfg.gate == "G1":
            self.hook_z_gated = HookPoint()  # (batch, pos, head, d_head)  what o_proj sees

    @property
    def W_Q(self) -> torch.Tensor:
        """q_proj's query rows in TransformerLens' layout (head, d_model, d_head), heads in hook_q's order, without
        the G1 gate rows q_proj may also hold: hook_q is einsum(x, W_Q, "batch pos d_model, head d_model d_head ->
        batch pos head d_head"), then QK-norm. A view of q_proj.weight."""
        cfg = self.cfg
        rows = rearrange(self.q_proj.weight, "(kv_head rows) d_model -> kv_head rows d_model", kv_head=cfg.n_kv_heads)
        queries = rows[:, : cfg.group_size * cfg.head_dim]  # each kv head's rows: [its group's queries | gate rows]
        return rearrange(queries, "kv_head (group d_head) d_model -> (kv_head group) d_model d_head",
                         d_head=cfg.head_dim)

    def num_gate_params(self) -> int:
        """Weights that compute this layer's gate: its rows of q_proj (released G1 layout), gate_proj and the
        gate bias; 0 for an ungated layer."""
        cfg = self.cfg
        in_q_proj = cfg.n_heads * cfg.gate_width_per_head * cfg.d_model if self.gate_in_q_proj else 0
        return in_q_proj + sum(p.numel() for name, p in self.named_parameters() if name.startswith("gate_"))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (batch, pos, d_model), already normed; cos, sin (pos, d_head) from rope_cos_sin.
        Returns out (batch, pos, d_model), see the class docstring."""
        gated = self.cfg.gate == "G1"  # the released G1 gate; Attention computes no other
        q, k, v, gate_logits = self._project(x, cos, sin)  # gate_logits: G1's rows of q_proj, else None
        if gated:  # the gate score: (batch, pos, head) headwise, (batch, pos, head, d_head) elementwise
            score = self.hook_gate(torch.sigmoid(self.hook_gate_logits(gate_logits)))
        z = self.hook_z(self._attend(q, k, v))  # (batch, pos, head, d_head)
        if gated:  # gating: each head's attention output times its score
            if self.cfg.gate_granularity == "headwise":  # one score per head, the same for all its d_head
                score = rearrange(score, "batch pos head -> batch pos head 1")
            z = self.hook_z_gated(z * score)
        return self.o_proj(rearrange(z, "batch pos head d_head -> batch pos (head d_head)"))

    def _project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q (batch, pos, head, d_head), k and v (batch, pos, kv_head, d_head), q and k after QK-norm and RoPE;
        and the gate logits that share q_proj (see _queries), else None."""
        cfg = self.cfg
        q, gate_logits = self._queries(x)
        k = rearrange(self.k_proj(x), "batch pos (kv_head d_head) -> batch pos kv_head d_head", d_head=cfg.head_dim)
        v = rearrange(self.v_proj(x), "batch pos (kv_head d_head) -> batch pos kv_head d_head", d_head=cfg.head_dim)
        q, k, v = self.hook_q(self.q_norm(q)), self.hook_k(self.k_norm(k)), self.hook_v(v)
        cos, sin = (rearrange(t, "pos d_head -> pos 1 d_head") for t in (cos, sin))  # the same angle for every head
        q, k = self.hook_rot_q(apply_rope(q, cos, sin)), self.hook_rot_k(apply_rope(k, cos, sin))
        return q, k, v, gate_logits

    def _queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q_proj(x) as queries (batch, pos, head, d_head) and, when q_proj holds a G1 gate's rows, the gate logits,
        (batch, pos, head) headwise or (batch, pos, head, d_head) elementwise; None for every other layout."""
        cfg = self.cfg
        if not self.gate_in_q_proj:
            q = rearrange(self.q_proj(x), "batch pos (head d_head) -> batch pos head d_head", d_head=cfg.head_dim)
            return q, None
        # q_proj's rows per kv head: [queries of its group of heads | gate rows of those heads]
        rows = rearrange(self.q_proj(x), "batch pos (kv_head rows) -> batch pos kv_head rows", kv_head=cfg.n_kv_heads)
        q, logits = rows.split([cfg.group_size * cfg.head_dim, cfg.group_size * cfg.gate_width_per_head], dim=-1)
        # head = kv_head * group + i, the order GQA expects
        q = rearrange(q, "batch pos kv_head (group d_head) -> batch pos (kv_head group) d_head", d_head=cfg.head_dim)
        if cfg.gate_granularity == "headwise":  # one logit per head
            return q, rearrange(logits, "batch pos kv_head group -> batch pos (kv_head group)")
        return q, rearrange(logits, "batch pos kv_head (group d_head) -> batch pos (kv_head group) d_head",
                            d_head=cfg.head_dim)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax(q kᵀ/√d_head) v: q (batch, pos, head, d_head), k and v (batch, pos, kv_head, d_head)
        -> z (batch, pos, head, d_head). The pattern (batch, head, query_pos, key_pos) passes hook_pattern on the
        explicit path, taken only when hook_attn_scores or hook_pattern is hooked."""
        q = rearrange(q, "batch pos head d_head -> batch head pos d_head")
        k, v = (repeat(t, "batch pos kv_head d_head -> batch (kv_head group) pos d_head", group=self.cfg.group_size)
                for t in (k, v))  # GQA: each kv head serves `group` query heads
        if not (self.hook_attn_scores.active or self.hook_pattern.active):
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # fused: same numbers, no (pos x pos) matrix
            return rearrange(z, "batch head pos d_head -> batch pos head d_head")
        scores = einsum(q, k, "batch head query_pos d_head, batch head key_pos d_head -> batch head query_pos key_pos")
        T = q.shape[-2]
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # key_pos > query_pos
        # in place: the einsum's output is fresh and its backward does not need it (two (pos x pos) copies saved)
        scores = self.hook_attn_scores(scores.div_(math.sqrt(q.shape[-1])).masked_fill_(future, float("-inf")))
        pattern = self.hook_pattern(torch.softmax(scores.float(), dim=-1).to(q.dtype))
        z = einsum(pattern, v, "batch head query_pos key_pos, batch head key_pos d_head -> batch head query_pos d_head")
        return rearrange(z, "batch head query_pos d_head -> batch query_pos head d_head")


class GatePositionAttention(Attention):
    """The gates the paper compared with G1 (its Tables 1 and 2), for the study: `cfg.gate` says where the score
    acts, the other gate fields how it is made:
        G1  z:   each head's attention output, before o_proj (as Attention)
        G2  v:   the values, one score per kv head
        G3  k:   the rotated keys, one score per kv head
        G4  q:   the rotated queries
        G5  out: the output of o_proj, one score per d_model channel
    gate_activation="silu" makes the score SiLU(logits) instead of the sigmoid, gate_mode="additive" adds the score
    instead of multiplying, gate_head_specific=False shares one projection (one score) across heads, gate_bias adds
    a learnable bias to the logits. A head-specific G1 keeps its gate rows in q_proj (as Attention); every other gate
    has its own projection, gate_proj. G2-G4 act on v, k, q just before attention, after QK-norm and RoPE (before
    the norm, a headwise gate on q or k would simply be normalised away). Hook names and shapes are Attention's.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        width = cfg.gate_width_per_head
        if not self.gate_in_q_proj:  # the gate's own projection
            if cfg.gate == "G5":
                gate_rows = cfg.d_model
            elif cfg.gate_head_specific:
                gate_rows = cfg.n_gate_heads * width
            else:  # head-shared: one score (per dimension) for all heads
                gate_rows = width
            self.gate_proj = nn.Linear(cfg.d_model, gate_rows, bias=False)
        if cfg.gate_bias:  # a learnable bias, one per gate score (not in the paper)
            n_scores = cfg.d_model if cfg.gate == "G5" else cfg.n_gate_heads * width
            self.gate_bias = nn.Parameter(torch.full((n_scores,), float(cfg.gate_bias)))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """As Attention.forward, with the score made and applied as cfg says."""
        cfg = self.cfg
        q, k, v, q_proj_logits = self._project(x, cos, sin)  # a head-specific G1's logits, else None
        logits = self.hook_gate_logits(self._gate_logits(x, q_proj_logits))
        score = self.hook_gate(torch.sigmoid(logits) if cfg.gate_activation == "sigmoid" else F.silu(logits))
        if cfg.gate == "G2":  # G2, G3, G4: gate the values, keys or queries just before attention
            v = self._apply_gate(v, score)
        elif cfg.gate == "G3":
            k = self._apply_gate(k, score)
        elif cfg.gate == "G4":
            q = self._apply_gate(q, score)
        z = self.hook_z(self._attend(q, k, v))
        if cfg.gate == "G1":
            z = self.hook_z_gated(self._apply_gate(z, score))
        out = self.o_proj(rearrange(z, "batch pos head d_head -> batch pos (head d_head)"))
        return self._apply_gate(out, score) if cfg.gate == "G5" else out  # G5: gate the output of o_proj

    def _apply_gate(self, y: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        """y * score (y + score when gate_mode="additive"): y (batch, pos, head, d_head) with a score of hook_gate's
        shape, a headwise score broadcast over d_head; G5: y and score (batch, pos, d_model)."""
        if self.cfg.gate_granularity == "headwise":
            score = rearrange(score, "batch pos head -> batch pos head 1")
        return y * score if self.cfg.gate_mode == "multiplicative" else y + score

    def _gate_logits(self, x: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        """The logits x W_gate [+ bias] in hook_gate_logits' shape: (batch, pos, head) headwise, (batch, pos, head,
        d_head) elementwise, head the kv heads for G2/G3; G5 (batch, pos, d_model). `logits`: a head-specific G1's
        rows of q_proj, else None."""
        cfg = self.cfg
        elementwise = cfg.gate != "G5" and cfg.gate_granularity == "elementwise"  # logits per (head, d_head)
        if logits is None:
            logits = self.gate_proj(x)  # (batch, pos, head) headwise; G5 (batch, pos, d_model)
            if elementwise:
                logits = rearrange(logits, "batch pos (head d_head) -> batch pos head d_head", d_head=cfg.head_dim)
            if not cfg.gate_head_specific:  # one shared score, the same for every head
                logits = repeat(logits, "batch pos 1 ... -> batch pos head ...", head=cfg.n_gate_heads)
        if cfg.gate_bias:
            bias = self.gate_bias  # (head), (head * d_head) or G5 (d_model)
            if elementwise:
                bias = rearrange(bias, "(head d_head) -> head d_head", d_head=cfg.head_dim)
            logits = logits + bias
        return logits
