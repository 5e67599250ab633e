"""The attention sink and massive activations: attention patterns, each layer's and head's first-token share, the
largest residual value per layer and where the residual stream is large (analysis.SinkStats, ActivationStats)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import LogNorm
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ._style import _color, _finish, _integer_ticks, log_ticks, _plain, _wrap


def attention_maps(patterns: dict, tokens: list[str] | None = None, head: int | str = "mean",
                   title: str = "Attention patterns", first_query: int = 0, floor: float | None = None):
    """One panel per entry of {label: pattern (query_pos, key_pos)} or (head, query_pos, key_pos); with a
    head dimension, `head` picks one head or "mean" averages them. `first_query`: the position of the patterns'
    first row, when they are the later queries of a longer input (pattern[first_query:, :n_keys]).
    Colours run linearly from 0 to 1; with `floor` (e.g. 1e-3) they run on a log scale from floor to 1, so that
    small shares stay visible, and anything below floor (the zeros of future keys included) takes floor's colour.
    Labels are wrapped to the panel's width, so titles of neighbouring panels never run into each other."""
    n = len(patterns)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols + 0.9, 3.4 * rows), squeeze=False, layout="compressed")
    fig.get_layout_engine().set(h_pad=0.1)  # room between a row's tick labels and the titles below
    for ax in axes.flat[n:]:
        ax.axis("off")
    norm = plt.Normalize(0, 1) if floor is None else LogNorm(floor, 1, clip=True)
    for i, (ax, (label, p)) in enumerate(zip(axes.flat[:n], patterns.items(), strict=True)):
        p = p.detach().float().cpu()
        if p.dim() == 3:
            p = p.mean(0) if head == "mean" else p[head]
        extent = (-0.5, p.shape[1] - 0.5, first_query + p.shape[0] - 0.5, first_query - 0.5)
        shown = p if floor is None else p.clamp(min=floor)
        im = ax.imshow(shown.numpy(), cmap="viridis", norm=norm, interpolation="nearest", extent=extent)
        lines = [w for line in str(label).splitlines() for w in _wrap(line)]
        ax.set_title("\n".join([*lines, f"first-token share {p[:, 0].mean():.2f}"]), fontsize=9)
        if i // cols == rows - 1 or i + cols >= n:  # bottom panel of its column
            ax.set_xlabel("key position")
        if i % cols == 0:
            ax.set_ylabel("query position")
        if tokens is not None and len(tokens) <= 24:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
    if floor is None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="attention")
    else:  # the arrow at the bottom: values below floor, clipped to its colour
        bar = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, extend="min",
                           label=f"attention, log scale\n(below {floor:g} shown as {floor:g})")
        bar.ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    fig.suptitle(title)
    return fig


def first_token_share(sinks: dict, threshold: float = 0.3, title: str = "Attention on the first token",
                      uniform: float | None = None):
    """Per-layer F-Attn of several models ({name: SinkStats}) as diamonds, every head as a dot; heads above
    `threshold` (sink heads) ringed. `uniform`: the share uniform attention would give, drawn as a dashed line."""
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.6 / max(len(sinks), 1)
    for i, (name, s) in enumerate(sinks.items()):
        x = torch.arange(s.share.shape[0]) + (i - (len(sinks) - 1) / 2) * width  # models side by side per layer
        ax.plot(x.tolist(), s.per_layer.tolist(), "D", ms=7, ls="none", color=_color(name, i),
                label=f"{name}: F-Attn {s.f_attn:.3f}, sink rate {s.sink_rate:.0%}")
        for h in range(s.share.shape[1]):
            ax.scatter(x.tolist(), s.share[:, h].tolist(), s=10, color=_color(name, i), alpha=0.4)
        sink = s.share > threshold  # (layer, head)
        if sink.any():
            layer, head = sink.nonzero(as_tuple=True)
            ax.scatter(x[layer].tolist(), s.share[layer, head].tolist(), s=90, facecolors="none",
                       edgecolors=_color(name, i), linewidths=1.5)
    ax.axhline(threshold, color="grey", ls=":", label=f"sink-head threshold {threshold} (ringed: sink heads)")
    if uniform is not None:
        ax.axhline(uniform, color="black", ls="--", lw=1, label=f"uniform attention {uniform:.3f}")
    ax.set_xticks(range(max(s.share.shape[0] for s in sinks.values())))
    top = max(max(s.share.max().item() for s in sinks.values()) * 1.15, threshold * 1.2)
    ax.set(xlabel="layer", ylabel="mean attention on position 0", ylim=(0, min(1.0, top)), title=title)
    return _finish(fig, ax)


def first_token_excess_map(excess: dict, threshold: float | None = None,
                           title: str = "Attention on the first token above uniform, head by head"):
    """(layer x head) heatmap of each head's first-token excess over uniform attention, one panel per model
    ({name: (layer, head) tensor}), on one colour scale centred on 0 (red above uniform, blue below). Heads above
    `threshold` are boxed and counted in the panel's title; with at most 64 heads per model every value is printed."""
    grids = {name: torch.as_tensor(e, dtype=torch.float).detach().cpu() for name, e in excess.items()}
    vmax = max(g.abs().max().item() for g in grids.values()) or 1.0
    norm = plt.Normalize(-vmax, vmax)
    n_layers = max(g.shape[0] for g in grids.values())
    fig, axes = plt.subplots(1, len(grids), figsize=(3.2 * len(grids) + 1.2, min(8.0, max(3.0, 0.2 * n_layers + 2))),
                             squeeze=False, layout="constrained")
    for ax, (name, g) in zip(axes[0], grids.items(), strict=True):
        im = ax.imshow(g.numpy(), cmap="RdBu_r", norm=norm, aspect="auto")
        above = (g > threshold) if threshold is not None else torch.zeros_like(g, dtype=torch.bool)
        for L, h in above.nonzero().tolist():
            ax.add_patch(plt.Rectangle((h - 0.5, L - 0.5), 1, 1, fill=False, edgecolor="black",
                                       lw=1.5 if g.numel() <= 64 else 0.7))
        if g.numel() <= 64:
            for (L, h), v in zip(torch.cartesian_prod(torch.arange(g.shape[0]), torch.arange(g.shape[1])).tolist(),
                                 g.flatten().tolist(), strict=True):
                ax.text(h, L, f"{round(v, 2) + 0.0:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if abs(norm(v) - 0.5) > 0.35 else "black")
        n = int(above.sum())
        label = name if threshold is None else f"{name}\n{n} head{'' if n == 1 else 's'} above {threshold:g}"
        ax.set(xlabel="head", ylabel="layer", title=label)
        _integer_ticks(ax, x=True, y=True)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="first-token share above uniform")
    fig.suptitle(title)
    return fig


def m_act_per_layer(acts: dict, title: str = "Largest residual activation per layer"):
    """Per-layer max |residual| of several models ({name: ActivationStats}) as points, log scale."""
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.5 / max(len(acts), 1)
    for i, (name, a) in enumerate(acts.items()):
        x = [L + (i - (len(acts) - 1) / 2) * width for L in range(len(a.max_abs))]
        ax.plot(x, a.max_abs.tolist(), "o", ms=7, ls="none", color=_color(name, i),
                label=f"{name}: M-Act {a.m_act:.1f}, peak {a.peak:.0f}")
    ax.set(xlabel="layer", ylabel="max |residual value|", yscale="log", title=title)
    ax.set_xticks(range(max(len(a.max_abs) for a in acts.values())))
    log_ticks(ax)
    return _finish(fig, ax)


def residual_map(resid: dict, title: str = "Residual stream magnitude, position by dimension"):
    """Position x dimension maps of |residual stream| ({label: (pos, d_model) tensor}, e.g. one layer's
    hook_resid_post on one window), one panel per model, each as a multiple of its own median |value| (Sun et al.'s
    yardstick for a massive activation) on one shared log colour scale from 1 (the median; smaller values take its
    colour). Each panel's title gives its peak's multiple and place."""
    ratios = {}
    for label, r in resid.items():
        a = torch.as_tensor(r).detach().float().cpu().abs()
        ratios[label] = a / a.median()
    top = max(max(x.max().item() for x in ratios.values()), 2.0)
    norm = LogNorm(1, top, clip=True)
    n = len(ratios)
    pos, dims = next(iter(ratios.values())).shape
    fig, axes = plt.subplots(n, 1, figsize=(min(12.0, 2.0 + dims / 14), n * (0.6 + pos / 22)), squeeze=False,
                             layout="constrained")
    for ax, (label, x) in zip(axes[:, 0], ratios.items(), strict=True):
        im = ax.imshow(x.clamp(min=1).numpy(), cmap="magma", norm=norm, interpolation="nearest", aspect="auto")
        p, d = divmod(int(x.argmax()), x.shape[1])
        ax.scatter([d], [p], s=120, facecolors="none", edgecolors="cyan", linewidths=1.5)  # ring the peak
        ax.set_title(f"{label}: peak {x.max():.0f}x the median |value|, at position {p}, dimension {d}", fontsize=9)
        ax.set_ylabel("position")
        _integer_ticks(ax, x=True, y=True)
    axes[-1, 0].set_xlabel("dimension of the residual stream")
    bar = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.9, label="|value| / median |value|\n(log scale)")
    bar.ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5), numticks=12))
    bar.ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    bar.ax.yaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(title)
    return fig
