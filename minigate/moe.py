"""A mixture-of-experts feed-forward, as Qwen3-MoE computes it (the paper's 15B-A2.5B models are MoE models).

Each token's normed hidden state x goes to a router, a linear map to one logit per expert; a softmax over the
experts gives the router probabilities; the token goes to its `n_experts_per_token` most probable experts (top-k),
each a SwiGLU MLP of width `expert_width`, and their outputs are summed, weighted by those probabilities (renormalised
over the k chosen when `norm_topk_prob`). A loop over the experts: readable, and fast enough at this size.

Hook points (ModelConfig.n_experts > 0):
    blocks.L.mlp.hook_router_probs    (batch, pos, expert): softmax over the experts
    blocks.L.mlp.hook_expert_ids      (batch, pos, k): the experts each token goes to, most probable first

The forward returns, with its output, the Switch Transformer's load-balancing loss of that batch (`aux_loss`):
n_experts times the sum over experts of (share of the routed token slots it received) x (its mean router probability);
1 when the load is perfectly balanced, n_experts when one expert takes everything. `Transformer(tokens,
return_aux_loss=True)` gives its mean over the MoE layers, which train() adds to the loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from einops import rearrange
from torch import nn

from .config import ModelConfig
from .hooks import HookPoint


class MoE(nn.Module):
    """n_experts feed-forward experts, each `expert(cfg, cfg.expert_width)` (the model's SwiGLU MLP, model.MLP, at
    the expert's width), n_experts_per_token of them per token, chosen by a router."""

    def __init__(self, cfg: ModelConfig, expert: Callable[[ModelConfig, int], nn.Module]):
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)  # transformers calls it mlp.gate
        self.experts = nn.ModuleList([expert(cfg, cfg.expert_width) for _ in range(cfg.n_experts)])
        self.hook_router_probs, self.hook_expert_ids = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (batch, pos, d_model), already normed -> (output (batch, pos, d_model), load-balancing loss ())."""
        batch = x.shape[0]
        probs = self.hook_router_probs(torch.softmax(self.router(x).float(), dim=-1))  # (batch, pos, expert)
        weights, ids = torch.topk(probs, self.cfg.n_experts_per_token, dim=-1)  # (batch, pos, k), most probable first
        ids = self.hook_expert_ids(ids)
        if self.cfg.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        tokens = rearrange(x, "batch pos d_model -> (batch pos) d_model")
        ids_flat = rearrange(ids, "batch pos k -> (batch pos) k")
        weights_flat = rearrange(weights, "batch pos k -> (batch pos) k").to(x.dtype)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(ids_flat == e)  # the tokens routed to expert e, and in which of their k slots
            if token.numel():
                out.index_add_(0, token, expert(tokens[token]) * weights_flat[token, slot, None])
        load = torch.zeros(self.cfg.n_experts, device=x.device).index_add_(
            0, ids_flat.flatten(), torch.ones(ids_flat.numel(), device=x.device)) / ids_flat.numel()
        aux_loss = self.cfg.n_experts * (load * rearrange(probs, "b p e -> (b p) e").mean(0)).sum()
        return rearrange(out, "(batch pos) d_model -> batch pos d_model", batch=batch), aux_loss
