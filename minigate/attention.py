"""Gated multi-head attention (Qiu et al., 2025): the one file to read first.

    x ─ q_proj ─┬─ q ── QK-norm ── RoPE ─┐
                └─ gate logits           softmax(q kᵀ/√d) v = z ── z * sigmoid(gate) ── o_proj ─ out
    x ─ k_proj ──── k ── QK-norm ── RoPE ─┘          ▲                      ▲
    x ─ v_proj ──── v ───────────────────────────────┘                 the G1 gate

The paper's gate (G1) multiplies each head's attention output z by sigmoid(x W_gate), where x is
the same normed hidden state that feeds the query projection. It is computed per head
(`headwise`, one scalar) or per head dimension (`elementwise`). Other positions (G2 values, G3
keys, G4 queries, G5 after o_proj) and variants (SiLU, additive, head-shared) are here for the
paper's ablations. G2-G4 act on v, k, q just before attention, after QK-norm and RoPE (before the
norm, a headwise gate on q or k would simply be normalised away).

Checkpoint layout (the trap): in the released models the G1 gate weights are extra output rows of
q_proj, grouped per kv head. For each kv head: first the queries of its `group` query heads
(group * head_dim rows), then those heads' gate rows (group, or group * head_dim).
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
    """x / rms(x) * weight, computed in float32 (as Qwen3 does)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (seq_len, head_dim), float32; the two halves of head_dim share frequencies."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, D)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (x1, x2) half-pairs of x (batch, head, pos, d_head) by position-dependent angles."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def gate_activation(name: str):
    return torch.sigmoid if name == "sigmoid" else F.silu


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        H, K, D, E = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.gate_width_per_head
        # G1 in the official layout: gate rows inside q_proj (H*E extra rows, grouped per kv head)
        self.q_proj = nn.Linear(cfg.d_model, H * D + (H * E if cfg.gate_in_q_proj else 0), bias=False)
        self.k_proj = nn.Linear(cfg.d_model, K * D, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, K * D, bias=False)
        self.o_proj = nn.Linear(H * D, cfg.d_model, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(D, cfg.norm_eps)
            self.k_norm = RMSNorm(D, cfg.norm_eps)
        if cfg.gate != "none" and not cfg.gate_in_q_proj:  # every other variant: its own projection
            self.gate_proj = nn.Linear(cfg.d_model, self.n_gate_heads(shared=not cfg.gate_head_specific) * E
                                       if cfg.gate != "G5" else cfg.d_model, bias=False)
        if cfg.gate != "none" and cfg.gate_bias:  # optional learnable bias, one per gate score (not in the paper)
            width = cfg.d_model if cfg.gate == "G5" else self.n_gate_heads() * E
            self.gate_bias = nn.Parameter(torch.full((width,), float(cfg.gate_bias)))
        self.act = gate_activation(cfg.gate_activation)

        self.hook_q = HookPoint()  # (batch, head, pos, d_head)    after QK-norm and RoPE
        self.hook_k = HookPoint()  # (batch, kv_head, pos, d_head) after QK-norm and RoPE
        self.hook_v = HookPoint()  # (batch, kv_head, pos, d_head)
        self.hook_pattern = HookPoint()  # (batch, head, query_pos, key_pos); hooking it selects the explicit path
        self.hook_z = HookPoint()  # (batch, pos, head, d_head)    attention output before the G1 gate
        if cfg.gate != "none":
            self.hook_gate_logits = HookPoint()  # (batch, pos, gate_head[, d_head]); G5: (batch, pos, d_model)
            self.hook_gate = HookPoint()  # same shape, after the activation: the gate scores
        if cfg.gate == "G1":
            self.hook_z_gated = HookPoint()  # (batch, pos, head, d_head)  what o_proj sees

    def n_gate_heads(self, shared: bool = False) -> int:
        """How many heads the gate acts on: kv heads for G2/G3, query heads for G1/G4."""
        if shared:
            return 1
        return self.cfg.n_kv_heads if self.cfg.gate in ("G2", "G3") else self.cfg.n_heads

    def num_gate_params(self) -> int:
        """Weights that compute this layer's gate: its rows of q_proj (official G1 layout) or gate_proj, and
        the gate bias; 0 for an ungated layer."""
        cfg = self.cfg
        if cfg.gate == "none":
            return 0
        n = sum(p.numel() for name, p in self.named_parameters() if name.startswith("gate_"))
        return n + (cfg.n_heads * cfg.gate_width_per_head * cfg.d_model if cfg.gate_in_q_proj else 0)

    def _gate_logits(self, x: torch.Tensor, q_gate: torch.Tensor | None) -> torch.Tensor:
        """Gate logits, (batch, pos, gate_head, e) with e = 1 or d_head; G5: (batch, pos, d_model)."""
        cfg = self.cfg
        if q_gate is not None:  # official G1 layout, already split off q_proj
            return q_gate
        logits = self.gate_proj(x)
        if cfg.gate == "G5":
            return logits
        logits = rearrange(logits, "b t (h e) -> b t h e", e=cfg.gate_width_per_head)
        if not cfg.gate_head_specific:  # one shared gate, the same for every head
            logits = logits.expand(-1, -1, self.n_gate_heads(), -1)
        return logits

    def _gate(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return y * gate if self.cfg.gate_mode == "multiplicative" else y + gate

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, need_pattern: bool = False):
        """x: (batch, pos, d_model), already normed. Returns (out (batch, pos, d_model), pattern or None)."""
        cfg = self.cfg
        g, D, E = cfg.group_size, cfg.head_dim, cfg.gate_width_per_head

        qg = self.q_proj(x)
        q_gate = None
        if cfg.gate_in_q_proj:  # rows per kv head: [queries of its g heads | gates of its g heads]
            qg = rearrange(qg, "b t (kv n) -> b t kv n", kv=cfg.n_kv_heads)
            q, q_gate = qg.split([g * D, g * E], dim=-1)
            q = rearrange(q, "b t kv (g d) -> b (kv g) t d", g=g)  # head h = kv * g + i, as GQA expects
            q_gate = rearrange(q_gate, "b t kv (g e) -> b t (kv g) e", g=g)
        else:
            q = rearrange(qg, "b t (h d) -> b h t d", d=D)
        k = rearrange(self.k_proj(x), "b t (h d) -> b h t d", d=D)
        v = rearrange(self.v_proj(x), "b t (h d) -> b h t d", d=D)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        gate = None
        if cfg.gate != "none":
            logits = self._gate_logits(x, q_gate)
            if cfg.gate_bias:
                bias = self.gate_bias if cfg.gate == "G5" else rearrange(self.gate_bias, "(h e) -> h e", e=E)
                logits = logits + bias
            if cfg.gate_granularity == "headwise":  # hooks see (batch, pos, head) for headwise gates
                logits = rearrange(logits, "b t h 1 -> b t h")
            gate = self.hook_gate(self.act(self.hook_gate_logits(logits)))
            if cfg.gate_granularity == "headwise":
                gate = rearrange(gate, "b t h -> b t h 1")
            if cfg.gate in ("G2", "G3", "G4"):  # these gate (batch, head, pos, d_head) tensors
                gate_bhtd = rearrange(gate, "b t h e -> b h t e")
                if cfg.gate == "G4":
                    q = self._gate(q, gate_bhtd)
                elif cfg.gate == "G3":
                    k = self._gate(k, gate_bhtd)
                else:
                    v = self._gate(v, gate_bhtd)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)

        k = repeat(k, "b kv t d -> b (kv g) t d", g=g)  # GQA: each kv head serves g query heads
        v = repeat(v, "b kv t d -> b (kv g) t d", g=g)
        pattern = None
        if need_pattern or self.hook_pattern.active:  # explicit path: the pattern can be read or replaced
            T = q.shape[-2]
            scores = einsum(q, k, "b h i d, b h j d -> b h i j") / math.sqrt(D)
            causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            pattern = self.hook_pattern(torch.softmax(scores.float(), dim=-1).to(q.dtype))
            z = einsum(pattern, v, "b h i j, b h j d -> b h i d")
        else:  # fused path: same numbers, no (pos x pos) matrix kept
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        z = self.hook_z(rearrange(z, "b h t d -> b t h d"))

        if cfg.gate == "G1":
            z = self.hook_z_gated(self._gate(z, gate))
        out = self.o_proj(rearrange(z, "b t h d -> b t (h d)"))
        if cfg.gate == "G5":
            out = self._gate(out, gate)
        return out, pattern
