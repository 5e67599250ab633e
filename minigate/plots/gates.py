"""The gates and what closing them costs: gate scores (gates.GateScores), per-head tables, and the ablation sweeps
({condition name: Perplexity}, ablation.sweep) and paired costs."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import LogNorm

from ._style import COLORS, _color, _finish, _integer_ticks, log_ticks


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
    """Bars of one statistic per row of gate_analysis.compare_gates(..., ci=True), with its interval."""
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
    from ..gate_analysis import CLASSES

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
    log_ticks(ax)
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
    log_ticks(ax)
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
