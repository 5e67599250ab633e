"""Measurements on a model, with the paper's metric definitions (tidy results, no plotting).

- F-Attn (attention sink): mean attention on position 0 over query positions and prompts, per
  (layer, head); averaged over heads, then layers.
- Sink rate (Gu et al., 2025): share of (layer, head) pairs whose mean first-token attention > 0.3.
- M-Act (massive activations): max |residual-stream value| output by each layer.
- Uncertainty: SinkStats.ci() uses stats.bootstrap_ci, which resamples prompts or chunks, never tokens. M-Act is
  a maximum, for which a bootstrap interval is unreliable, so it has none.

The gates are measured in gates.py (`gate_scores(model, prompts)` -> GateScores, with the views an independent
analysis of the 1B checkpoints reported: distribution, per layer / head, first token vs rest, per input type, per
dimension), with bootstrap intervals from the same stats.bootstrap_ci.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .stats import CI, bootstrap_ci

SINK_THRESHOLD = 0.3  # Gu et al.: a head is a sink head when its mean first-token attention exceeds this


def _batches(tokens: torch.Tensor, batch_size: int):
    if tokens.dim() != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"tokens must be a non-empty (batch, pos) tensor of ids, got shape {tuple(tokens.shape)}")
    for i in range(0, tokens.shape[0], batch_size):
        yield tokens[i:i + batch_size]


def uniform_first_token_share(seq_len: int) -> float:
    """F-Attn of a head attending uniformly to all earlier positions: mean over queries of 1/(i+1)."""
    return sum(1.0 / (i + 1) for i in range(seq_len)) / seq_len


@dataclass
class SinkStats:
    share: torch.Tensor  # (layer, head): mean attention on position 0, over prompts and query positions
    per_prompt: torch.Tensor | None = None  # (prompt, layer, head): the same for each prompt alone

    @property
    def per_layer(self) -> torch.Tensor:  # (layer,)
        return self.share.mean(1)

    @property
    def f_attn(self) -> float:
        """The paper's F-Attn: averaged over heads, then layers."""
        return self.per_layer.mean().item()

    @property
    def sink_rate(self) -> float:
        return (self.share > SINK_THRESHOLD).float().mean().item()

    @property
    def n_sink_heads(self) -> int:
        return int((self.share > SINK_THRESHOLD).sum())

    def ci(self, ci: float = 0.95, **boot) -> dict[str, CI]:
        """Bootstrap intervals over prompts: {"f_attn": (), "per_layer": (layer,), "sink_rate": ()} CIs."""
        if self.per_prompt is None:
            raise ValueError("these SinkStats hold no per-prompt shares; compute them with attention_sink()")
        p = self.per_prompt  # (prompt, layer, head)

        def sink_rate(x, dim):  # x (..., prompt, layer, head): share of heads whose mean is above threshold
            return (x.mean(dim) > SINK_THRESHOLD).double().mean((-2, -1))

        return {"f_attn": bootstrap_ci(p.mean((1, 2)), ci=ci, **boot),
                "per_layer": bootstrap_ci(p.mean(2), ci=ci, **boot),
                "sink_rate": bootstrap_ci(p, stat=sink_rate, ci=ci, **boot)}


@torch.no_grad()
def attention_sink(model, tokens: torch.Tensor, batch_size: int = 16) -> SinkStats:
    """First-token attention share of every (layer, head) on `tokens` (batch, pos), bos at position 0."""
    batches = list(_batches(tokens, batch_size))
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    per_prompt = torch.zeros(tokens.shape[0], n_layers, n_heads, dtype=torch.float64)
    offset = 0

    def record(pattern, hook):  # pattern (batch, head, query, key): keep only what we need
        per_prompt[offset:offset + pattern.shape[0], hook.layer] = pattern[..., 0].double().mean(-1).cpu()

    for batch in batches:
        model.run_with_hooks(batch.to(model.device), fwd_hooks=[(lambda name: name.endswith("hook_pattern"), record)])
        offset += batch.shape[0]
    return SinkStats(share=per_prompt.mean(0).float(), per_prompt=per_prompt.float())


@dataclass
class ActivationStats:
    max_abs: torch.Tensor  # (layer,): max |x| of the residual stream after each block
    where: torch.Tensor  # (layer, 3): (prompt, position, dimension) of that max

    @property
    def m_act(self) -> float:
        """The paper's M-Act: per-layer maximum, averaged over layers."""
        return self.max_abs.mean().item()

    @property
    def peak(self) -> float:
        return self.max_abs.max().item()


@torch.no_grad()
def massive_activations(model, tokens: torch.Tensor, batch_size: int = 16) -> ActivationStats:
    """Largest absolute residual-stream value output by each layer, and where it sits."""
    n_layers = model.cfg.n_layers
    best = torch.full((n_layers,), -1.0)
    where = torch.zeros(n_layers, 3, dtype=torch.long)
    offset = 0

    def record(resid, hook):  # resid (batch, pos, d_model)
        layer = hook.layer
        a = resid.abs().float()
        value, flat = a.flatten().max(0)
        if value.item() > best[layer]:
            best[layer] = value.item()
            b, p, d = torch.unravel_index(flat, a.shape)
            where[layer] = torch.tensor([offset + b.item(), p.item(), d.item()])

    for batch in _batches(tokens, batch_size):
        model.run_with_hooks(batch.to(model.device),
                             fwd_hooks=[(lambda name: name.endswith("hook_resid_post"), record)])
        offset += batch.shape[0]
    return ActivationStats(max_abs=best, where=where)


GU_LEN = 64  # Gu et al. measure the sink on windows of 64 tokens


@torch.no_grad()
def published_measures(model, tokens: torch.Tensor, short: int = GU_LEN, batch_size: int = 16) -> dict:
    """The published sink and activation numbers of a model on held-out windows `tokens` (batch, T), <bos> first,
    each named with its protocol:
        f_attn, f_attn_excess, uniform   the paper's F-Attn at T, its excess over uniform attention (which gives
                                         `uniform`), at T = tokens.shape[1]
        max_head_share, max_head_at      the largest head's mean first-token share at T, and its [layer, head]
        sink_rate                        share of heads above SINK_THRESHOLD at T
        f_attn_{short}, sink_rate_{short}, max_head_share_{short}
                                         the same on the windows' first `short` tokens: Gu et al.'s protocol
                                         (T=64: a head is a sink head when its mean first-token share exceeds 0.3)
        m_act, max_act, m_act_per_layer  the paper's M-Act (per-layer max |residual|, averaged over layers), its peak
        share_per_layer                  F-Attn of each layer at T
        sink, act                        the SinkStats and ActivationStats at T behind these numbers (for plots)
    The tracker (sink_tracker), minigate.ship and the lessons measure with this one function."""
    T = tokens.shape[1]
    sink, act = attention_sink(model, tokens, batch_size), massive_activations(model, tokens, batch_size)
    uniform = uniform_first_token_share(T)
    layer, head = divmod(int(sink.share.argmax()), sink.share.shape[1])
    out = {"seq_len": T, "windows": tokens.shape[0], "f_attn": sink.f_attn, "f_attn_excess": sink.f_attn - uniform,
           "uniform": uniform, "max_head_share": sink.share.max().item(), "max_head_at": [layer, head],
           "sink_rate": sink.sink_rate, "m_act": act.m_act, "max_act": act.peak,
           "m_act_per_layer": act.max_abs.tolist(), "share_per_layer": sink.per_layer.tolist(), "sink": sink,
           "act": act}
    if T > short:
        s = attention_sink(model, tokens[:, :short], batch_size)
        out.update({f"f_attn_{short}": s.f_attn, f"sink_rate_{short}": s.sink_rate,
                    f"max_head_share_{short}": s.share.max().item()})
    return out


def sink_tracker(tokens: torch.Tensor, batch_size: int = 16, short: int = GU_LEN):
    """A `train()` callback that records published_measures on fixed `tokens` (batch, pos), so you can watch the sink
    form: history.metric("f_attn") -> (steps, values); keys f_attn, sink_rate, max_head_share, m_act, max_act,
    share_per_layer and, when the windows are longer than `short`, f_attn_64, sink_rate_64, max_head_share_64
    (Gu et al.'s T=64 on their first `short` tokens; the key is named after `short`)."""
    keys = ("f_attn", "sink_rate", "max_head_share", "m_act", "max_act", "share_per_layer",
            f"f_attn_{short}", f"sink_rate_{short}", f"max_head_share_{short}")

    def callback(step, model, history) -> dict:
        m = published_measures(model, tokens, short, batch_size)
        return {k: m[k] for k in keys if k in m}

    return callback
