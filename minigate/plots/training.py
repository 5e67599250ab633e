"""Training: loss curves and the numbers a training callback records (checkpoint.History)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from ._style import _color, _finish


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
    return _finish(fig, ax)


def training_metric(histories: dict, metric: str = "f_attn", ylabel: str | None = None,
                    title: str | None = None):
    """A metric recorded by a training callback (e.g. analysis.sink_tracker) against the step, one line per run
    ({name: History})."""
    fig, ax = plt.subplots(figsize=(7, 4))
    _metric_lines(ax, histories, metric)
    ax.set(xlabel="step", ylabel=ylabel or metric, title=title or f"{metric} during training")
    return _finish(fig, ax)


def training_metrics(histories: dict, metrics: dict, title: str | None = None):
    """Several callback metrics side by side: one panel per metric ({metric: the panel's title}), one line per run
    ({name: History}), the legend in the first panel."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.3 * len(metrics) + 0.1, 3.4), squeeze=False,
                             layout="constrained")
    for ax, (metric, label) in zip(axes[0], metrics.items(), strict=True):
        _metric_lines(ax, histories, metric, ms=3)
        ax.set(title=label, xlabel="step")
    axes[0, 0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def _metric_lines(ax, histories: dict, metric: str, **style):
    for i, (name, h) in enumerate(histories.items()):
        steps, values = h.metric(metric)
        ax.plot(steps, values, "o-", color=_color(name, i), label=name, **style)
