"""Figures for the lessons: each function takes tidy results (from analysis.py, ablation.py or a
training History) and returns a matplotlib Figure with titles, axis labels and colorbars.

    fig = plots.first_token_share({"baseline": sink_b, "headwise": sink_h})
"""

from __future__ import annotations

import math
import re
import textwrap

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import LogNorm
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

COLORS = {"baseline": "tab:red", "none": "tab:red", "headwise": "tab:blue", "elementwise": "tab:green"}


def _color(name: str, i: int):
    return COLORS.get(name, f"C{i}")


def _integer_ticks(ax, x: bool = True, y: bool = False):
    """Layers and heads are whole numbers: no ticks at 0.5."""
    if x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _finish(fig, legend_ax=None):
    """The figure, laid out tight, with a small-type legend on `legend_ax` when given."""
    if legend_ax is not None:
        legend_ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plain(value: float, _pos=None) -> str:
    """A log axis's tick label as a plain number (150, 2,000), or 1e+06 once it gets long."""
    return f"{value:,.6g}" if 1e-3 <= value < 1e5 else f"{value:.0e}"


def _log_ticks(ax, axis: str = "y"):
    """Readable ticks on a log axis (call after plotting): plain numbers, and within three decades the
    1-2-5 steps (100, 200, 500; finer within one decade) instead of bare powers of ten."""
    a = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    decades = math.log10(hi / lo) if lo > 0 else math.inf
    subs = ((1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8) if decades <= 0.5 else (1, 1.5, 2, 3, 4, 5, 7) if decades <= 1
            else (1, 2, 5) if decades <= 3 else (1,))
    a.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    a.set_major_formatter(FuncFormatter(_plain))
    a.set_minor_formatter(NullFormatter())


def _wrap(text: str, width: int = 28) -> list[str]:
    """`text` in lines of at most `width` characters: as few lines as that takes, as even as they can be, broken
    after a comma where the comma-separated parts fit ("code-baseline, layer 0, head 2" -> 2 lines)."""
    def even(t):
        n = len(textwrap.wrap(t, width))
        return next((lines for w in range(1, width + 1) if len(lines := textwrap.wrap(t, w)) <= n), None) or [t]

    parts = text.split(", ")
    if len(parts) > 1 and len(text) > width and max(map(len, parts)) < width:  # keep each part whole
        return [line.replace("\0", " ") for line in even(", ".join(p.replace(" ", "\0") for p in parts))]
    return even(text)


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
    _log_ticks(ax)
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


def training_metric(histories: dict, metric: str = "f_attn", ylabel: str | None = None,
                    title: str | None = None):
    """A metric recorded by a training callback (e.g. analysis.sink_tracker) against the step."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, h) in enumerate(histories.items()):
        steps, values = h.metric(metric)
        ax.plot(steps, values, "o-", color=_color(name, i), label=name)
    ax.set(xlabel="step", ylabel=ylabel or metric, title=title or f"{metric} during training")
    return _finish(fig, ax)


# -- gate anatomy (gates.GateScores) ---------------------------------------------------------------------
def gate_distribution(scores: dict, bins: int = 20, title: str = "Distribution of gate scores"):
    """Histogram of every gate value of each model ({name: GateScores}), mean and median in the legend."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, g) in enumerate(scores.items()):
        d = g.distribution(bins=bins)
        centers = ((d.edges[:-1] + d.edges[1:]) / 2).tolist()
        ax.step(centers, d.hist.tolist(), where="mid", color=_color(name, i),
                label=f"{name}: mean {d.mean:.3f}, median {d.median:.3f}, <0.1: {d.frac_closed:.0%}")
    ax.set(xlabel="gate score", ylabel="share of gate values", title=title)
    return _finish(fig, ax)


def head_table(tables: dict, title: str = "Per head", vmax: float = 1.0, row_labels: list[str] | None = None,
               log: bool = False, fmt: str = ".2f"):
    """Per-head numbers as an annotated heatmap, one panel per model: {model: {column: (head,) tensor}}; heads down
    (named h0, h1, ... or by row_labels), columns across, each cell printed with `fmt`. Columns a model lacks (an
    ungated model's gate) and NaNs stay blank. log=True colours on a log scale from the smallest to the largest
    number (for numbers that span decades, such as perplexities); vmax is then ignored."""
    columns = list(dict.fromkeys(c for cols in tables.values() for c in cols))
    n_heads = max(len(v) for cols in tables.values() for v in cols.values())
    values = torch.cat([torch.as_tensor(v, dtype=torch.float).flatten().cpu() for cols in tables.values()
                        for v in cols.values()])
    values = values[~values.isnan()]  # a NaN is a blank cell
    norm = LogNorm(values.min().item(), values.max().item()) if log else plt.Normalize(0, vmax)
    labels = row_labels or [f"h{h}" for h in range(n_heads)]
    panel = 0.9 * len(columns) + 0.08 * max(len(label) for label in labels)  # inches: the cells and the row labels
    fig, axes = plt.subplots(1, len(tables), figsize=(panel * len(tables) + 1.5, 0.45 * n_heads + 1.6),
                             squeeze=False, layout="constrained")
    for ax, (name, cols) in zip(axes[0], tables.items(), strict=True):
        grid = torch.full((n_heads, len(columns)), float("nan"))  # (head, column)
        for j, c in enumerate(columns):
            if c in cols:
                grid[: len(cols[c]), j] = torch.as_tensor(cols[c], dtype=torch.float).cpu()
        im = ax.imshow(grid.numpy(), cmap="viridis", norm=norm, aspect="auto")
        for h, row in enumerate(grid.tolist()):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, h, format(v, fmt), ha="center", va="center", fontsize=8,
                            color="black" if norm(v) > 0.6 else "white")
        ax.set_xticks(range(len(columns)), columns, rotation=35, ha="right", fontsize=8)
        ax.set_yticks(range(n_heads), labels)
        ax.set_title(name)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8)
    fig.suptitle(title)
    return fig


BAR_COLORS = ("tab:orange", "tab:purple", "tab:cyan", "tab:olive", "tab:pink", "tab:brown", "0.4")


def head_writes_and_looks(writes: dict, looks: dict, before: dict | None = None,
                          title: str = "What each head writes, and where it looks",
                          write_label: str = "mean norm of the head's output", look_label: str = "share of attention"):
    """Grouped bars per head of one layer, one column of panels per model. On top what each head writes
    ({model: {bar: (head,)}}, e.g. the mean norm of what o_proj receives from it on each part of the input), with
    `before` ({model: {bar: (head,)}}, the same before its gate; gated models only) as a dashed outline around each
    bar: the gap is what the gate took away. Below, where it looks ({model: {bar: (head,)}}, attention shares from 0
    to 1). Each bar is labelled with its value; the k-th bar of a row has the k-th colour in every panel (so the
    k-th bars of the two rows can name the same part of the input)."""
    before = before or {}
    models = list(dict.fromkeys([*writes, *looks]))
    fig, axes = plt.subplots(2, len(models), figsize=(4.2 * len(models) + 1.6, 6.4), squeeze=False, sharey="row",
                             layout="constrained")
    for i, row in enumerate((writes, looks)):
        bars = list(dict.fromkeys(b for cols in row.values() for b in cols))
        color = {b: BAR_COLORS[k % len(BAR_COLORS)] for k, b in enumerate(bars)}
        for j, name in enumerate(models):
            ax, cols = axes[i, j], row.get(name, {})
            width = 0.84 / max(1, len(cols))
            for k, (b, v) in enumerate(cols.items()):
                v = torch.as_tensor(v, dtype=torch.float).flatten().cpu()
                xs = [h + (k - (len(cols) - 1) / 2) * width for h in range(len(v))]
                rects = ax.bar(xs, v.tolist(), width, color=color[b], label=b)
                ax.bar_label(rects, fmt="%.2f", fontsize=7, padding=1)
                if i == 0 and b in before.get(name, {}):
                    ax.bar(xs, torch.as_tensor(before[name][b], dtype=torch.float).flatten().cpu().tolist(), width,
                           fill=False, edgecolor="black", linestyle="--", linewidth=0.9, label="before the gate")
            _integer_ticks(ax)
            ax.set_xlabel("head" if i == 1 else "")
            if i == 0:
                ax.set_title(name, color=COLORS.get(name, "black"))
                ax.margins(y=0.12)
            else:
                ax.set_ylim(0, 1.12)
        axes[i, 0].set_ylabel(write_label if i == 0 else look_label)
        shown = {label: h for a in axes[i] for h, label in zip(*a.get_legend_handles_labels(), strict=True)}
        axes[i, -1].legend(shown.values(), shown.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title)
    return fig


def gate_head_means(scores: dict, title: str = "Mean gate score per head"):
    """(layer x head) heatmap of the mean gate, one panel per model ({name: GateScores})."""
    fig, axes = plt.subplots(1, len(scores), figsize=(4 * len(scores), 3.6), squeeze=False, layout="constrained")
    for ax, (name, g) in zip(axes[0], scores.items(), strict=True):
        im = ax.imshow(g.head_means().numpy(), cmap="magma", vmin=0, vmax=1, aspect="auto")  # (layer, head)
        ax.set(xlabel="head", ylabel="layer", title=name)
        ax.set_yticks(range(len(g.layers)), g.layers)
        _integer_ticks(ax)
    fig.colorbar(im, ax=axes.ravel().tolist(), label="mean gate score")
    fig.suptitle(title)
    return fig


def gate_first_vs_rest(scores: dict, title: str = "Gate on the first token vs the others"):
    """Per-layer mean gate at position 0 (solid) and at all later positions (dashed)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, g) in enumerate(scores.items()):
        fr = g.first_vs_rest(by_layer=True)
        ax.plot(g.layers, fr.first.tolist(), "o-", color=_color(name, i), label=f"{name}: first token")
        ax.plot(g.layers, fr.rest.tolist(), "s--", color=_color(name, i), label=f"{name}: other tokens")
    ax.set(xlabel="layer", ylabel="mean gate score", ylim=(0, 1), title=title)
    _integer_ticks(ax)
    return _finish(fig, ax)


def gate_token_matrix(matrix: torch.Tensor, tokens: list[str] | None = None, layers: list[int] | None = None,
                      title: str = "Gate score of each token in each layer"):
    """Heatmap of a (pos, layer) gate matrix (GateScores.token_matrix) for one prompt."""
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * matrix.shape[1] + 3), max(3, 0.22 * matrix.shape[0] + 1)))
    im = ax.imshow(matrix.numpy(), cmap="magma", vmin=0, vmax=1, aspect="auto")
    ax.set(xlabel="layer", ylabel="token", title=title)
    if layers is not None:
        ax.set_xticks(range(len(layers)), layers)
    if tokens is not None:
        ax.set_yticks(range(len(tokens)), [repr(t)[1:-1] for t in tokens], fontsize=7)
    fig.colorbar(im, ax=ax, label="gate score")
    return _finish(fig)


def gate_by_type(table: dict, stat: str = "mean", title: str = "Mean gate score by input type"):
    """Bars of one statistic per row of gates.compare_gates(..., ci=True), with its interval."""
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(table)
    values = [table[n][stat] for n in names]
    err = None
    if all(f"{stat}_low" in table[n] for n in names):
        err = [[v - table[n][f"{stat}_low"] for n, v in zip(names, values, strict=True)],
               [table[n][f"{stat}_high"] - v for n, v in zip(names, values, strict=True)]]
    ax.bar(names, values, yerr=err, capsize=4, color=[f"C{i}" for i in range(len(names))])
    ax.set(ylabel=stat.replace("_", " "), title=title + (" (95% bootstrap CI)" if err else ""))
    return _finish(fig)


def gate_layer_quantiles(scores: dict, title: str = "Gate distribution by depth"):
    """Median per layer with 25-75% and 5-95% bands (GateScores.layer_quantiles)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, g) in enumerate(scores.items()):
        q = g.layer_quantiles((0.05, 0.25, 0.5, 0.75, 0.95))
        c = _color(name, i)
        ax.fill_between(g.layers, q[:, 0].tolist(), q[:, 4].tolist(), color=c, alpha=0.12)
        ax.fill_between(g.layers, q[:, 1].tolist(), q[:, 3].tolist(), color=c, alpha=0.25)
        ax.plot(g.layers, q[:, 2].tolist(), "o-", color=c, label=f"{name}: median, 25-75%, 5-95%")
    ax.set(xlabel="layer", ylabel="gate score", ylim=(0, 1), title=title)
    _integer_ticks(ax)
    return _finish(fig, ax)


def gate_dimension_classes(classes, layers: list[int] | None = None,
                           title: str = "Gate dimensions: always closed, input-dependent, always open"):
    """Stacked bars per layer of a gates.DimensionClasses."""
    from .gates import CLASSES

    shares = classes.per_layer  # (layer, 3)
    x = layers if layers is not None else list(range(shares.shape[0]))
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = torch.zeros(shares.shape[0])
    for j, (name, color) in enumerate(zip(CLASSES, ["black", "tab:orange", "gold"], strict=True)):
        ax.bar(x, shares[:, j].tolist(), bottom=bottom.tolist(), color=color, label=name.replace("_", " "))
        bottom += shares[:, j]
    ax.set(xlabel="layer", ylabel="share of gate dimensions", ylim=(0, 1), title=title)
    _integer_ticks(ax)
    return _finish(fig, ax)


# -- ablations (ablation.sweep results: {condition name: Perplexity}) --------------------------------------
def _err(results: dict, names: list):
    if not all(results[n].ci for n in names):
        return None
    return [[results[n].ppl - results[n].ci[0] for n in names], [results[n].ci[1] - results[n].ppl for n in names]]


def sweep_curve(results: dict, title: str = "All gates fixed to one constant"):
    """Perplexity (log scale) against the constant, from the "gates=V" entries of a sweep; the
    "learned" and "gates=mean" entries, when present, as horizontal lines."""
    names = sorted((n for n in results if re.fullmatch(r"gates=[\d.e-]+", n)), key=lambda n: float(n[6:]))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.errorbar([float(n[6:]) for n in names], [results[n].ppl for n in names], yerr=_err(results, names),
                fmt="o-", capsize=3, label="all gates = constant")
    for ref, style in (("learned", "g--"), ("gates=mean", "m:")):
        if ref in results:
            ax.axhline(results[ref].ppl, color=style[0], ls=style[1:], label=f"{ref}: {results[ref].ppl:.4g}")
    ax.set(xlabel="gate value", ylabel="perplexity", yscale="log", title=title)
    _log_ticks(ax)
    return _finish(fig, ax)


def layer_ablation(results: dict, title: str = "One layer's gates forced open or closed"):
    """Grouped bars (log scale) from the "L{layer} open" / "L{layer} closed" entries of a sweep."""
    found = [re.fullmatch(r"L(\d+) (open|closed)", n) for n in results]
    layers = sorted({int(m[1]) for m in found if m})
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (word, color) in enumerate((("open", "tab:orange"), ("closed", "tab:purple"))):
        names = [f"L{L} {word}" for L in layers if f"L{L} {word}" in results]
        xs = [int(n.split()[0][1:]) + (k - 0.5) * 0.4 for n in names]
        ax.bar(xs, [results[n].ppl for n in names], width=0.4, yerr=_err(results, names), capsize=2,
               color=color, label=f"layer forced {word}")
    if "learned" in results:
        ax.axhline(results["learned"].ppl, color="g", ls="--", label=f"learned: {results['learned'].ppl:.4g}")
    ax.set(xlabel="layer", ylabel="perplexity", yscale="log", title=title)
    ax.set_xticks(layers)
    _log_ticks(ax)
    return _finish(fig, ax)


def cost_bars(costs: dict, predicted: dict | None = None, ylabel: str = "loss increase (nats per token)",
              title: str = "What forbidding <bos> costs, with 95% intervals"):
    """Paired costs as grouped bars with their intervals, one panel per setting, each on its own scale:
    {panel: {model: {condition: (estimate, low, high)}}} (e.g. stats.bootstrap_ci of the per-chunk loss increase
    when <bos> is forbidden in all layers or in one). Conditions across, one bar per model, coloured by the gate its
    name contains (COLORS); the interval is the error bar. predicted {model: value}: a black diamond on that model's
    bar of the first condition (a prediction written down before measuring)."""
    fig, axes = plt.subplots(1, len(costs), figsize=(4.6 * len(costs) + 0.6, 4), squeeze=False)
    for ax, (panel, models) in zip(axes[0], costs.items(), strict=True):
        conditions = list(dict.fromkeys(c for by_cond in models.values() for c in by_cond))
        width = 0.8 / max(len(models), 1)
        for i, (name, by_cond) in enumerate(models.items()):
            names = [c for c in conditions if c in by_cond]
            est, low, high = ([float(by_cond[c][k]) for c in names] for k in range(3))
            xs = [conditions.index(c) + (i - (len(models) - 1) / 2) * width for c in names]
            color = next((c for key, c in COLORS.items() if key in name), f"C{i}")
            err = [[e - lo for e, lo in zip(est, low, strict=True)], [hi - e for e, hi in zip(est, high, strict=True)]]
            ax.bar(xs, est, width, yerr=err, capsize=3, error_kw=dict(lw=1), color=color, label=name)
            if predicted and name in predicted and names and names[0] == conditions[0]:
                ax.plot(xs[0], float(predicted[name]), "D", color="black", ms=6, zorder=3,
                        label="predicted" if not ax.get_legend_handles_labels()[1].count("predicted") else None)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(conditions)), conditions)
        ax.set(ylabel=ylabel, title=panel)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


VERDICT_COLORS = {"reproduced": "#4daf4a", "partly": "#ffd92f", "depends on the setting": "#fdae61",
                  "within noise": "#c6dbef", "not at this scale": "#bdbdbd", "contradicted": "#e41a1c", "": "#ffffff"}


def scorecard(entries: list, claims: dict, settings: list[str], verdicts: dict | None = None,
              sources: dict | None = None, title: str = "The claims, as the course measured them"):
    """The scorecard (minigate.scorecard): one row per claim, grouped by where the claim comes from (a heading row
    per source, `sources` {key: heading}; each claim's `.source`), one column per setting, each cell coloured by its
    verdict and holding its numbers in short (`.short`, else `.value`), hatched where the verdict is fragile; the
    paper's own column is white. `verdicts` {claim: (verdict, fragile)} adds a last column, each claim's own."""
    keys = [c for c in claims if any(e.claim == c for e in entries)]
    groups = {}
    for c in keys:
        groups.setdefault(getattr(claims[c], "source", ""), []).append(c)
    layout = []  # ("head", text) or ("claim", key), top to bottom
    for source, members in groups.items():
        if sources and source in sources:
            layout.append(("head", sources[source]))
        layout += [("claim", c) for c in members]
    columns = list(settings) + (["the claim"] if verdicts else [])
    height = [0.5 if kind == "head" else 1.0 for kind, _ in layout]
    top = [sum(height[:i]) for i in range(len(layout))]
    fig, ax = plt.subplots(figsize=(12, 0.5 * sum(height) + 1.3))
    for (kind, key), y, h in zip(layout, top, height, strict=True):
        if kind == "head":
            ax.text(0.02, y + h / 2, key, ha="left", va="center", fontsize=8, fontweight="bold")
            continue
        for j, setting in enumerate(columns):
            if setting == "the claim":
                verdict, fragile = verdicts.get(key, ("", False))
                text, color = verdict or "-", VERDICT_COLORS.get(verdict, "#f7f7f7")
            else:
                e = next((e for e in entries if e.claim == key and e.setting == setting), None)
                verdict, fragile = (e.verdict, bool(getattr(e, "fragile", ()))) if e else ("", False)
                text = "\n".join(_wrap(getattr(e, "short", "") or e.value, 15)[:2]) if e else "-"
                color = VERDICT_COLORS[verdict] if e else "#f7f7f7"
            ax.add_patch(plt.Rectangle((j, y), 1, h, facecolor=color, edgecolor="white", lw=2))
            if fragile:
                ax.add_patch(plt.Rectangle((j + 0.03, y + 0.05), 0.94, h - 0.1, fill=False, hatch="///",
                                           edgecolor="#666666", lw=0))
            ax.text(j + 0.5, y + h / 2, text, ha="center", va="center", fontsize=7.5,
                    bbox=dict(facecolor=color, edgecolor="none", pad=1) if fragile else None)
    ax.set(xlim=(0, len(columns)), ylim=(sum(height), 0))
    ax.set_title(title, fontsize=10, pad=24)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], columns, fontsize=8)
    ax.xaxis.tick_top()
    claim_rows = [(y + h / 2, key) for (kind, key), y, h in zip(layout, top, height, strict=True) if kind == "claim"]
    label = lambda c: getattr(claims[c], "short", None) or claims[c]
    ax.set_yticks([y for y, _ in claim_rows], ["\n".join(_wrap(label(c), 26)) for _, c in claim_rows], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    shown = [v for v in VERDICT_COLORS if v and (v != "depends on the setting" or verdicts)]
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=VERDICT_COLORS[v]) for v in shown]
    handles.append(plt.Rectangle((0, 0), 1, 1, fill=False, hatch="///", edgecolor="#666666", lw=0))
    ax.legend(handles, [*shown, "fragile (hatched)"], loc="upper center", bbox_to_anchor=(0.5, -0.01),
              ncol=len(handles), fontsize=8, frameon=False, handlelength=1.5, columnspacing=1.2)
    return _finish(fig)
