"""Figures for the lessons: each function takes tidy results (from analysis.py, ablation.py or a
training History) and returns a matplotlib Figure with titles, axis labels and colorbars.

    fig = plots.first_token_share({"baseline": sink_b, "headwise": sink_h})
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

COLORS = {"baseline": "tab:red", "none": "tab:red", "headwise": "tab:blue", "elementwise": "tab:green"}


def _color(name: str, i: int):
    return COLORS.get(name, f"C{i}")


def loss_curves(histories: dict, smooth: int = 20, title: str = "Training loss"):
    """Train loss (moving average over `smooth` steps) and validation loss of several runs."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, h) in enumerate(histories.items()):
        loss = torch.tensor(h.loss, dtype=torch.float64)
        k = max(1, min(smooth, len(loss)))
        avg = loss.unfold(0, k, 1).mean(1) if len(loss) >= k else loss
        ax.plot(h.step[k - 1:], avg.tolist(), color=_color(name, i), alpha=0.8, label=f"{name} train")
        if h.val_loss:
            ax.plot(h.eval_step, h.val_loss, "o--", color=_color(name, i), label=f"{name} validation")
        for s in h.spikes:
            ax.axvline(s, color=_color(name, i), alpha=0.15, lw=1)
    ax.set(xlabel="step", ylabel="loss (nats per token)", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def attention_maps(patterns: dict, tokens: list[str] | None = None, head: int | str = "mean",
                   title: str = "Attention patterns"):
    """One panel per entry of {label: pattern (query_pos, key_pos)} or (head, query_pos, key_pos); with a
    head dimension, `head` picks one head or "mean" averages them."""
    n = len(patterns)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (label, p) in zip(axes.flat[:n], patterns.items(), strict=True):
        p = p.detach().float().cpu()
        if p.dim() == 3:
            p = p.mean(0) if head == "mean" else p[head]
        im = ax.imshow(p.numpy(), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"{label}\nfirst-token share {p[:, 0].mean():.2f}", fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        if tokens is not None and len(tokens) <= 24:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="attention")
    fig.suptitle(title)
    return fig


def first_token_share(sinks: dict, threshold: float = 0.3, title: str = "Attention on the first token"):
    """Per-layer F-Attn of several models ({name: SinkStats}), with every head as a dot."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, s) in enumerate(sinks.items()):
        layers = torch.arange(s.share.shape[0])
        ax.plot(layers.tolist(), s.per_layer.tolist(), "o-", color=_color(name, i),
                label=f"{name}: F-Attn {s.f_attn:.3f}, sink rate {s.sink_rate:.0%}")
        jitter = (i - (len(sinks) - 1) / 2) * 0.08
        for h in range(s.share.shape[1]):
            ax.scatter((layers + jitter).tolist(), s.share[:, h].tolist(), s=8, color=_color(name, i), alpha=0.35)
    ax.axhline(threshold, color="grey", ls=":", label=f"sink-head threshold {threshold}")
    ax.set(xlabel="layer", ylabel="mean attention on position 0", ylim=(0, 1), title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def massive_activations(acts: dict, title: str = "Largest residual activation per layer"):
    """Per-layer max |residual| of several models ({name: ActivationStats}), log scale."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, a) in enumerate(acts.items()):
        ax.plot(range(len(a.max_abs)), a.max_abs.tolist(), "o-", color=_color(name, i),
                label=f"{name}: M-Act {a.m_act:.1f}, peak {a.peak:.0f}")
    ax.set(xlabel="layer", ylabel="max |residual value|", yscale="log", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def training_metric(histories: dict, metric: str = "f_attn", ylabel: str | None = None,
                    title: str | None = None):
    """A metric recorded by a training callback (e.g. analysis.sink_tracker) against the step."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, h) in enumerate(histories.items()):
        steps, values = h.metric(metric)
        ax.plot(steps, values, "o-", color=_color(name, i), label=name)
    ax.set(xlabel="step", ylabel=ylabel or metric, title=title or f"{metric} during training")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
