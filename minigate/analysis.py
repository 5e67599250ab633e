"""Measurements on a model, with the paper's metric definitions (tidy results, no plotting).

- F-Attn (attention sink): mean attention on position 0 over query positions and prompts, per
  (layer, head); averaged over heads, then layers.
- Sink rate (Gu et al., 2025): share of (layer, head) pairs whose mean first-token attention > 0.3.
- M-Act (massive activations): max |residual-stream value| output by each layer.
- Uncertainty: SinkStats.ci() uses stats.bootstrap_ci, which resamples whole sequences (prompts or chunks), never
  tokens. M-Act is a maximum, for which a bootstrap interval is unreliable, so it has none.

The gates are measured in gate_analysis.py (`gate_scores(model, prompts)` -> GateScores, with the views an independent
analysis of the 1B checkpoints reported: distribution, per layer / head, first token vs rest, per input type, per
dimension), with bootstrap intervals from the same stats.bootstrap_ci.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from .stats import CI, bootstrap_ci

SINK_THRESHOLD = 0.3  # Gu et al.: a head is a sink head when its mean first-token attention exceeds this
GU_LEN = 64  # Gu et al. measure the sink on windows of 64 tokens


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


@dataclass
class ActivationStats:
    max_abs: torch.Tensor  # (layer,): max |x| of the residual stream after each block
    where: torch.Tensor  # (layer, 3): (prompt, position, dimension) of that max
    per_window: torch.Tensor | None = None  # (window, layer): each window's own max |x| after each block
    # (layer, window, pos, d_model): the residual stream after each block, kept when asked for (residuals=True)
    resid: torch.Tensor | None = field(default=None, repr=False)

    @property
    def m_act(self) -> float:
        """The paper's M-Act: per-layer maximum, averaged over layers."""
        return self.max_abs.mean().item()

    @property
    def peak(self) -> float:
        return self.max_abs.max().item()

    @property
    def peak_to_median(self) -> torch.Tensor:
        """(layer,): each layer's largest |residual-stream value| divided by the median |value| of that layer over all
        windows, positions and dimensions: Sun et al.'s (2024) yardstick for a massive activation, which they find
        hundreds to thousands of times the median. Needs the residual stream (measured with residuals=True)."""
        if self.resid is None:
            raise ValueError("these ActivationStats kept no residual stream; measure with residuals=True")
        a = self.resid.abs().float().flatten(1)  # (layer, every value)
        return a.max(1).values / a.median(1).values


class _Recorder:
    """Forward hooks that collect, window batch by window batch, each (layer, head)'s mean first-token share per
    window (over the first q query positions, for each q in `queries`; None: all of them), each window's and each
    layer's largest |residual| with where it sits, and, with `residuals`, the residual stream itself: what
    attention_sink, massive_activations and published_measures report."""

    def __init__(self, model, n_windows: int, queries=(None,), residuals: bool = False):
        n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
        self.offset = 0  # windows recorded so far
        self.shares = {q: torch.zeros(n_windows, n_layers, n_heads, dtype=torch.float64) for q in queries}
        self.best = torch.full((n_layers,), -1.0)
        self.where = torch.zeros(n_layers, 3, dtype=torch.long)
        self.per_window = torch.zeros(n_windows, n_layers)
        self.kept = [[] for _ in range(n_layers)] if residuals else None  # each layer's (batch, pos, d_model) tensors

    def pattern(self, pattern, hook):  # pattern (batch, head, query, key): keep only what we need
        for q, share in self.shares.items():
            share[self.offset:self.offset + pattern.shape[0], hook.layer] = pattern[..., :q, 0].double().mean(-1).cpu()

    def resid(self, resid, hook):  # resid (batch, pos, d_model)
        layer, a = hook.layer, resid.abs().float()
        self.per_window[self.offset:self.offset + a.shape[0], layer] = a.amax((1, 2)).cpu()
        value, flat = a.flatten().max(0)
        if value.item() > self.best[layer]:
            self.best[layer] = value.item()
            b, p, d = torch.unravel_index(flat, a.shape)
            self.where[layer] = torch.tensor([self.offset + b.item(), p.item(), d.item()])
        if self.kept is not None:
            self.kept[layer].append(resid.detach().cpu())

    def measure(self, model, tokens: torch.Tensor, batch_size: int, sinks: bool = True, acts: bool = True):
        """One forward pass per batch of windows, with the hooks asked for."""
        hooks = ([(lambda name: name.endswith("hook_pattern"), self.pattern)] if sinks else []) + (
            [(lambda name: name.endswith("hook_resid_post"), self.resid)] if acts else [])
        for batch in _batches(tokens, batch_size):
            model.run_with_hooks(batch.to(model.device), fwd_hooks=hooks)
            self.offset += batch.shape[0]
        return self

    def sink(self, q=None) -> SinkStats:
        per_prompt = self.shares[q]
        return SinkStats(share=per_prompt.mean(0).float(), per_prompt=per_prompt.float())

    def act(self) -> ActivationStats:
        resid = None if self.kept is None else torch.stack([torch.cat(k) for k in self.kept])
        return ActivationStats(max_abs=self.best, where=self.where, per_window=self.per_window, resid=resid)


@torch.no_grad()
def attention_sink(model, tokens: torch.Tensor, batch_size: int = 16) -> SinkStats:
    """First-token attention share of every (layer, head) on `tokens` (batch, pos), bos at position 0."""
    return _Recorder(model, tokens.shape[0]).measure(model, tokens, batch_size, acts=False).sink()


@torch.no_grad()
def massive_activations(model, tokens: torch.Tensor, batch_size: int = 16, residuals: bool = False) -> ActivationStats:
    """Largest absolute residual-stream value output by each layer, and where it sits; with `residuals`, the residual
    stream itself too (ActivationStats.resid, .peak_to_median)."""
    rec = _Recorder(model, tokens.shape[0], residuals=residuals)
    return rec.measure(model, tokens, batch_size, sinks=False).act()


@dataclass
class PublishedMeasures:
    """The published sink and activation numbers of a model on held-out windows (batch, T), <bos> first, each named
    with its protocol (these names are measurements.json's keys and the tracker's), and the stats behind them."""
    seq_len: int  # T, tokens per window
    windows: int  # how many windows
    heads: int  # attention heads in the model: layers x heads per layer
    uniform: float  # F-Attn of a head attending uniformly to all earlier positions, at T
    f_attn: float  # the paper's F-Attn at T: mean first-token share, averaged over heads, then layers
    f_attn_excess: float  # f_attn - uniform
    f_attn_per_layer: list  # (layer,): F-Attn of each layer at T
    max_head: float  # the largest head's mean first-token share at T
    max_head_at: list  # [layer, head] of that head
    sink_rate: float  # share of heads above SINK_THRESHOLD at T
    sink_heads: int  # how many heads are above it: sink_rate * heads
    f_attn_64: float | None  # the same on the windows' first GU_LEN tokens: Gu et al.'s protocol (a head is a sink
    sink_rate_64: float | None  # head when its mean first-token share exceeds 0.3); None when T <= GU_LEN
    sink_heads_64: int | None
    max_head_64: float | None
    m_act: float  # the paper's M-Act: each layer's max |residual|, averaged over layers (at T)
    max_act: float  # the largest |residual| of all
    m_act_per_layer: list  # (layer,)
    sink: SinkStats | None = field(default=None, repr=False)  # the shares at T behind these numbers (for plots)
    sink_64: SinkStats | None = field(default=None, repr=False)  # ... at GU_LEN
    act: ActivationStats | None = field(default=None, repr=False)  # the activations behind M-Act

    def numbers(self) -> dict:
        """Every field but the stats: what measurements.json and the tracker store."""
        return {f.name: getattr(self, f.name) for f in fields(PublishedMeasures) if f.name not in STATS}


STATS = ("sink", "sink_64", "act")  # the fields of PublishedMeasures that hold tensors, not numbers


@torch.no_grad()
def published_measures(model, tokens: torch.Tensor, batch_size: int = 16,
                       residuals: bool = False) -> PublishedMeasures:
    """The published measures of a model on held-out windows `tokens` (batch, T), <bos> first, in one forward pass per
    batch: the shares at T and at Gu et al.'s T=64 come from the same attention patterns (attention is causal, so a
    window's first 64 queries see what a window of 64 tokens would show them), M-Act from the same pass's residual
    stream, which `residuals` also keeps (PublishedMeasures.act.resid: peak_to_median, maps of it). The tracker
    (sink_tracker), minigate.measure and the lessons measure with this one function; attention_sink and
    massive_activations are its halves, for one of the two alone."""
    T = tokens.shape[1]
    short = GU_LEN if T > GU_LEN else None
    rec = _Recorder(model, tokens.shape[0], (None, short) if short else (None,), residuals)
    rec.measure(model, tokens, batch_size)
    sink, act = rec.sink(), rec.act()
    sink_64 = rec.sink(short) if short else None
    uniform = uniform_first_token_share(T)
    layer, head = divmod(int(sink.share.argmax()), sink.share.shape[1])
    return PublishedMeasures(
        seq_len=T, windows=tokens.shape[0], heads=sink.share.numel(), uniform=uniform, f_attn=sink.f_attn,
        f_attn_excess=sink.f_attn - uniform, f_attn_per_layer=sink.per_layer.tolist(), max_head=sink.share.max().item(),
        max_head_at=[layer, head], sink_rate=sink.sink_rate, sink_heads=sink.n_sink_heads,
        f_attn_64=sink_64.f_attn if short else None, sink_rate_64=sink_64.sink_rate if short else None,
        sink_heads_64=sink_64.n_sink_heads if short else None,
        max_head_64=sink_64.share.max().item() if short else None, m_act=act.m_act, max_act=act.peak,
        m_act_per_layer=act.max_abs.tolist(), sink=sink, sink_64=sink_64, act=act)


TRACKED = ("f_attn", "f_attn_excess", "sink_rate", "max_head", "m_act", "max_act", "f_attn_per_layer", "f_attn_64",
           "sink_rate_64", "sink_heads_64", "max_head_64")  # the PublishedMeasures fields sink_tracker records


def sink_tracker(tokens: torch.Tensor, batch_size: int = 16):
    """A `train()` callback that records published_measures on fixed `tokens` (batch, pos), so you can watch the sink
    form: history.metric("f_attn") -> (steps, values), for each PublishedMeasures field in TRACKED (the T=64 ones only
    when the windows are longer than GU_LEN)."""

    def callback(step, model, history) -> dict:
        m = published_measures(model, tokens, batch_size).numbers()
        return {k: m[k] for k in TRACKED if m[k] is not None}

    return callback
