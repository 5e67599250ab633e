"""The transformer: embeddings, pre-RMSNorm blocks of gated attention + SwiGLU MLP, unembedding.

One class for the tiny models we train and the paper's released 1B checkpoints (Qwen3 layout).
Hook points (see hooks.py; TransformerLens' names and layouts, `get_act_name` gives the short names):
    hook_embed                                                          (batch, pos, d_model)
    blocks.L.hook_resid_pre / hook_resid_mid / hook_resid_post          (batch, pos, d_model)
    blocks.L.hook_attn_out / hook_mlp_out                               (batch, pos, d_model)
    blocks.L.attn.hook_q, hook_rot_q (batch, pos, head, d_head): after QK-norm, before / after RoPE
    blocks.L.attn.hook_k, hook_rot_k, hook_v (batch, pos, kv_head, d_head)
    blocks.L.attn.hook_attn_scores, hook_pattern (batch, head, query_pos, key_pos): before / after softmax
    blocks.L.attn.hook_z (batch, pos, head, d_head)
    blocks.L.attn.hook_gate_logits / hook_gate (gated layers), hook_z_gated (G1 layers)
    blocks.L.attn.hook_q_gate (G1 layers): another name of hook_gate_logits, TransformerBridge's (hooks.py: aliases)
    blocks.L.mlp.hook_router_probs (batch, pos, expert), hook_expert_ids (batch, pos, k): MoE layers (moe.py)
The attention's docstring has the details; `d_head` is `ModelConfig.head_dim`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention, GatePositionAttention, RMSNorm, rope_cos_sin
from .config import ModelConfig
from .hooks import HookedRootModule, HookPoint
from .moe import MoE


def check_token_ids(tokens: torch.Tensor, vocab_size: int, what: str = "tokens"):
    """A ValueError naming vocab_size if any id is negative or >= vocab_size (torch's embedding would raise
    an IndexError deep inside, or on a GPU a device-side assert)."""
    if tokens.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(tokens))
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} hold token id {bad}, but the model's vocab_size is {vocab_size} (ids must be "
                         f"0..{vocab_size - 1}); use the tokenizer the model was built for, or build the model "
                         "with the tokenizer's vocabulary size")


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), of width d_ff (or `width`: one MoE expert's). (This `gate_proj` is the
    MLP's, not the attention gate.)"""

    def __init__(self, cfg: ModelConfig, width: int | None = None):
        super().__init__()
        width = width or cfg.d_ff
        self.gate_proj = nn.Linear(cfg.d_model, width, bias=False)  # SwiGLU gate (HF name), not the attention gate
        self.up_proj = nn.Linear(cfg.d_model, width, bias=False)
        self.down_proj = nn.Linear(width, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(x)). The attention is `Attention` (no gate, or the released G1) or, for
    the paper's other gates, `GatePositionAttention`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = (GatePositionAttention if cfg.gate != "none" and not cfg.released_g1 else Attention)(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MoE(cfg, MLP) if cfg.n_experts else MLP(cfg)  # a mixture of SwiGLU experts, or one
        # sandwich_norm: norm each sublayer's output too, before it joins the residual stream
        self.attn_out_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if cfg.sandwich_norm else nn.Identity()
        self.mlp_out_norm = RMSNorm(cfg.d_model, cfg.norm_eps) if cfg.sandwich_norm else nn.Identity()
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint(), HookPoint()
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
        """-> (the residual stream after the block, the MoE load-balancing loss or None for a dense MLP)."""
        x = self.hook_resid_pre(x)
        a = self.attn(self.attn_norm(x), cos, sin)  # for the pattern, hook (or cache) attn.hook_pattern
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn_out_norm(a)))
        m, aux_loss = self.mlp(self.mlp_norm(x)) if isinstance(self.mlp, MoE) else (self.mlp(self.mlp_norm(x)), None)
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp_out_norm(m))), aux_loss


class Transformer(HookedRootModule):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList([Block(cfg.layer_config(L)) for L in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2 style: scale down the residual-stream writers
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))
        self.setup_hooks()

    @staticmethod
    def _init_weights(module: nn.Module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def device(self) -> torch.device:
        """Where the weights are: inputs go there."""
        return self.embed.weight.device

    @property
    def unembed_weight(self) -> torch.Tensor:
        return self.embed.weight if self.cfg.tie_embeddings else self.lm_head.weight

    def forward(self, tokens: torch.Tensor, return_aux_loss: bool = False):
        """tokens (batch, pos) -> logits (batch, pos, vocab). For the attention patterns, cache hook_pattern.
        return_aux_loss: (logits, the MoE layers' load-balancing loss of this batch, averaged over them (moe.py);
        0 without MoE)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, pos) token ids, got shape {tuple(tokens.shape)}")
        if not torch.compiler.is_compiling():  # a data-dependent check would break the compiled graph
            check_token_ids(tokens, self.cfg.vocab_size)
        cos, sin = rope_cos_sin(tokens.shape[1], self.cfg.head_dim, self.cfg.rope_theta, tokens.device)
        x, aux_losses = self.hook_embed(self.embed(tokens)), []
        for block in self.blocks:
            x, aux_loss = block(x, cos, sin)
            if aux_loss is not None:
                aux_losses.append(aux_loss)
        logits = F.linear(self.norm(x), self.unembed_weight)
        if not return_aux_loss:
            return logits
        return logits, torch.stack(aux_losses).mean() if aux_losses else torch.zeros((), device=tokens.device)

    def num_params(self, gate_only: bool = False) -> int:
        """Parameter count (tied embeddings counted once); gate_only: only the attention-gate weights
        (the gate rows of q_proj or the gate projection, and the gate bias) of the layers that have a gate."""
        if not gate_only:
            return sum(p.numel() for p in self.parameters())
        return sum(b.attn.num_gate_params() for b in self.blocks)

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, max_new_tokens: int = 20, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample a few tokens (no KV cache: each step reruns the whole sequence; fine for short
        continuations). temperature=0 picks the most likely token."""
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            logits = self(tokens)[:, -1, :].float()
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
        self.train(was_training)
        return tokens
