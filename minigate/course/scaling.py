"""Reading the scaling study (lesson 08): its rows as settings, a table, a figure and the bar a new recipe must meet,
for what makes the gate's effect larger (the `code` recipe at other sizes and training lengths, over seeds) and how
far each setting is from the paper's gap.

    pts = points()          # the settings measured, each with its seeds' rows (data/study, data/seeds)
    print("\n".join(table(pts)))
    figure(pts)             # each measure's baseline / gated ratio per setting, with the paper's as a line
    largest(pts)            # the study's setting with the largest effect: the scorecard's `study` column
    meets_bar(p)            # could it replace the recipe? 5x on every measure in 3 of 3 seeds, at no worse loss

Where the rows come from: `research/train_study.py` trains and measures the study's points into data/study/<axis>.json;
the recipe itself (`code`) is data/seeds/code.json, its GPU twin (`code-gpu`) data/seeds/code-gpu.json. Every model is
measured by the shipped protocol (measure.PROTOCOL: 75 held-out WikiText-2 windows, T=512 and Gu et al.'s T=64).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..measure import ratios
from ..model import Transformer
from ..presets import GATED, PRESETS, model_config
from ..resources import DATA_DIR
from .release import SEEDS_DIR
from ..rows import Row, read_rows
from .published import TABLE_4_RATIOS

DATA = DATA_DIR  # data/
# each measure's panel title; the sink rate is the share of heads that are sink heads (analysis.SINK_THRESHOLD), and
# its baseline / gated ratio is that of the sink-head counts: both models have the same heads
MEASURES = {"sink_rate_64": "sink rate at T=64", "f_attn_excess": "F-Attn above uniform", "m_act": "M-Act"}
# the paper's ratio drawn on each panel (Table 4, 15B MoE: baseline / gated). It reports raw F-Attn, drawn on the
# above-uniform panel: over a pretrained model's long windows uniform attention's share is far below its 0.048, so the
# raw ratio is close to the above-uniform one (here, at T=512, uniform is 0.013 and the two differ: lesson 04). It
# reports no sink heads
PAPER_RATIOS = {"f_attn_excess": TABLE_4_RATIOS["f_attn"], "m_act": TABLE_4_RATIOS["m_act"]}
TABLED = ("sink_rate_64", "f_attn_excess", "f_attn", "m_act")  # the table's ratios: the measures, and raw F-Attn


@dataclass
class Point:
    """One setting: its rows (rows.Row: measure.PROTOCOL's numbers plus the run's facts) by seed and variant."""
    name: str
    about: str
    seeds: dict[int, dict[str, Row]] = field(default_factory=dict)

    def rows(self) -> list[Row]:
        return [r for by_variant in self.seeds.values() for r in by_variant.values()]

    def value(self, key: str) -> float | None:
        """A fact of the setting (the baseline's params, tokens): the baseline's row's, else any row's (a setting
        whose baseline is still training); None where no row records it."""
        got = sorted((r.variant != "none", getattr(r, key)) for r in self.rows() if getattr(r, key) is not None)
        return got[0][1] if got else None

    def pairs(self, gated: str) -> list[dict[str, Row]]:
        """The rows {variant: row} of each seed that has the baseline and `gated`."""
        return [rows for rows in self.seeds.values() if "none" in rows and gated in rows]

    def paired(self, gated: str) -> int:
        """How many seeds have the baseline and `gated`."""
        return len(self.pairs(gated))

    def ratios(self, gated: str, key: str) -> list[float]:
        """baseline / gated of `key` for each seed with both models (inf where the gated model has none left; a seed
        whose baseline has none either gives no ratio: nothing to remove)."""
        out = []
        for rows in self.pairs(gated):
            if getattr(rows["none"], key) is not None and getattr(rows[gated], key) is not None:
                x = ratios({v: rows[v] for v in ("none", gated)}, keys=(key,))[gated][key]  # the one baseline / gated
                if not math.isnan(x):
                    out.append(x)
        return out


def _read(path: Path) -> list[Row]:
    return read_rows(path).rows if path.is_file() else []


def points(data: Path = DATA) -> list[Point]:
    """Every setting measured so far, smallest first (by parameters, then tokens), those trained on a CPU before
    those trained on a GPU: the study's sizes and lengths, the `code` recipe and its GPU twin. A point with no rows
    yet is left out."""
    study = {}
    for path in sorted((Path(data) / "study").glob("*.json")):
        doc = read_rows(path)  # every row checked, each naming one of the file's points
        for r in doc.rows:
            study.setdefault(r.point, {"about": doc.header["points"][r.point]["about"], "rows": []})["rows"].append(r)
    found = [(name, spec["about"], spec["rows"]) for name, spec in study.items()]
    seeds = Path(data) / SEEDS_DIR.name  # data/seeds, or its copy under another data/
    found.append(("code", "the recipe: 1.4M parameters, 16.4M tokens", _read(seeds / "code.json")))
    found.append(("code-gpu", "6.2M parameters, 49M tokens, on an H200", _read(seeds / "code-gpu.json")))
    out = []
    for name, about, rows in found:
        if rows:
            p = Point(name, about)
            for r in rows:
                p.seeds.setdefault(r.seed, {})[r.variant] = r
            out.append(p)
    return sorted(out, key=lambda p: (_on_gpu(p), _params(p), _tokens(p)))


def _on_gpu(p: Point) -> bool:
    """A setting trained on a GPU: the GPU recipe, or a study point whose rows name their GPU."""
    return p.name == "code-gpu" or any(r.gpu for r in p.rows())


def _params(p: Point) -> float:
    """The baseline's parameters: recorded in a study row, else counted from the recipe (the seeds' rows)."""
    if p.value("params") is None:
        with torch.device("meta"):  # shapes only, no memory
            return Transformer(model_config(p.name)).num_params()
    return p.value("params")


def _tokens(p: Point) -> float:
    if p.value("tokens") is None:
        t = PRESETS[p.name].train
        return t.steps * t.tokens_per_step
    return p.value("tokens")


def _span(xs: list[float], n: int) -> str:
    """The median and range of `xs`, ratios over n seeds; "a/n" where only a of them give one."""
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    fmt = lambda x: "inf" if math.isinf(x) else f"{x:.1f}"  # noqa: E731
    got = f"{fmt(statistics.median(xs))}x ({fmt(lo)}-{fmt(hi)})" if len(xs) > 1 else f"{fmt(xs[0])}x"
    return got + (f" {len(xs)}/{n}" if len(xs) < n else "")


FEWER = ("a/n: a ratio in a of the n seeds; in the others the baseline has none either (at T=64: no sink head), "
         "nothing to remove")


def table(pts: list[Point], gates: tuple[str, ...] = GATED) -> list[str]:
    """One line per setting and gate (of `gates`): parameters, tokens, seeds, each measure's baseline / gated ratio
    (median over the seeds and their range; F-Attn both above uniform, as the course measures it, and raw, as the
    paper reports it), the validation losses, the mean training time per model where recorded (train_s: from the
    run's own tokens/s, so time a stopped run's machine sat idle does not count) and the baselines' median M-Act (the
    magnitude the gate cuts: Table 4's baseline reaches 1053); a line on a/n ratios (FEWER) where some seed's baseline
    has nothing for the gate to remove."""
    lines = [f"{'setting':9s} {'params':>6s} {'tokens':>6s} {'gate':11s} {'seeds':>5s} {'sink heads':>19s} "
             f"{'F-Attn excess':>19s} {'raw F-Attn':>19s} {'M-Act':>19s} {'loss b -> g':>13s} {'min/model':>9s} "
             f"{'M-Act b':>7s}"]
    fewer = False
    for p in pts:
        for g in gates:
            n = p.paired(g)
            if not n:
                continue
            losses = [(rows["none"].val_loss_code, rows[g].val_loss_code) for rows in p.pairs(g)]
            walls = [r.train_s / 60 for r in p.rows() if r.train_s]
            spans = [_span(p.ratios(g, k), n) for k in TABLED]
            fewer |= any(0 < len(p.ratios(g, k)) < n for k in TABLED)  # as _span marks them
            lines.append(f"{p.name:9s} {_params(p) / 1e6:5.1f}M {_tokens(p) / 1e6:5.0f}M {g:11s} {n:5d} "
                         + " ".join(f"{x:>19s}" for x in spans)
                         + f" {statistics.mean(b for b, _ in losses):6.3f}→{statistics.mean(x for _, x in losses):.3f}"
                         + (f" {statistics.mean(walls):9.0f}" if walls else f" {'-':>9s}")
                         + f" {statistics.median(rows['none'].m_act for rows in p.pairs(g)):7.0f}")
    return lines + ([FEWER] if fewer else [])


BAR = 5.0  # the study's bar for a new recipe (issue 46): 5x on every measure, in each of BAR_SEEDS seeds
BAR_SEEDS = 3


def meets_bar(p: Point, gated: str = "elementwise") -> bool:
    """Whether a setting could replace the recipe: in at least BAR_SEEDS seeds, and in every seed measured, `gated`
    cuts each of MEASURES at least BAR times (F-Attn above uniform), at a validation loss no worse than the
    baseline's."""
    pairs = p.pairs(gated)
    return len(pairs) >= BAR_SEEDS and all(min(p.ratios(gated, k) or [0.0]) >= BAR for k in MEASURES) and all(
        rows[gated].val_loss_code <= rows["none"].val_loss_code for rows in pairs)


ON_THE_CARD = ("code", "code-gpu")  # the recipes the scorecard has its own settings for


def largest(pts: list[Point], gated: str = "elementwise") -> Point | None:
    """The study's setting where the gate's effect is largest: the greatest geometric mean, over the three measures,
    of the median baseline / `gated` ratio over seeds (a mean of log-ratios; every measure counts, as in the 5x bar).
    The recipes the scorecard already has are left out; None when no other setting has a measured pair."""
    def size(p: Point) -> float:
        meds = [statistics.median(xs) if (xs := p.ratios(gated, k)) else math.nan for k in MEASURES]
        return math.exp(statistics.mean(math.log(x) for x in meds)) if all(x > 0 for x in meds) else -math.inf

    found = [p for p in pts if p.name not in ON_THE_CARD and p.paired(gated) and size(p) > -math.inf]
    return max(found, key=size, default=None)


def figure(pts: list[Point], title: str = "Baseline / gated, per setting: each seed a dot, the paper's ratio dashed"):
    """Three panels, one per measure: the baseline / gated ratio at every setting (x: the settings in order, each
    seed a dot, headwise and elementwise side by side, the median a bar), a gated model with no sink head left
    marked at the top, one whose baseline has none (a ratio of 0) at the bottom, and the paper's ratio (Table 4) as
    a dashed line where the paper reports one. A fourth panel: along training, the tracker's baseline / elementwise
    ratios (F-Attn above uniform, M-Act) against tokens seen, a line per seed of each setting whose rows kept their
    tracker: every shorter length of a run, for free. A setting with no gated model yet (its baseline trained
    first) has no ratio and no place on the x axis, as in the table."""
    import matplotlib.pyplot as plt

    from ..plots import COLORS
    from ..plots._style import log_ticks

    pts = [p for p in pts if any(p.paired(g) for g in GATED)]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8), layout="constrained")
    _along_training(axes[3], pts)
    for ax, (key, label) in zip(axes[:3], MEASURES.items(), strict=True):
        top = 1.0
        for i, g in enumerate(GATED):
            for x, p in enumerate(pts):
                rs = p.ratios(g, key)
                finite = [r for r in rs if math.isfinite(r) and r > 0]
                top = max([top, *finite])
                xs = x + (i - 0.5) * 0.25
                ax.scatter([xs] * len(finite), finite, s=14, color=COLORS[g], alpha=0.7,
                           label=g if x == 0 else None)
                for where, text, n in ((1, "none left", sum(map(math.isinf, rs))), (0, "baseline none", rs.count(0))):
                    if n:  # off the log axis: the gated model has no sink head left, or the baseline has none
                        ax.annotate(text, (xs, where), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                                    ha="center", va="top" if where else "bottom", color=COLORS[g])
                if rs:
                    ax.hlines(statistics.median(rs) if finite else top, xs - 0.1, xs + 0.1, color=COLORS[g], lw=2)
            if key in PAPER_RATIOS:
                ax.axhline(PAPER_RATIOS[key][g], color=COLORS[g], ls="--", lw=1, label=f"paper, {g}")
        ax.axhline(1, color="gray", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(pts)), [p.name for p in pts], rotation=30)
        ax.set(title=label, ylabel="baseline / gated")
    for ax in axes:
        log_ticks(ax)
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)  # with the paper's lines
    fig.suptitle(title)
    return fig


TRACKED_SHOWN = {"f_attn_excess": "-", "m_act": ":"}  # the along-training panel's measures and their line styles


def _along_training(ax, pts: list[Point]) -> None:
    """A line per seed and measure (its gid names them: "2x seed 0, M-Act"); the legend names each setting's colour
    and each measure's line style, not every line."""
    from matplotlib.lines import Line2D

    handles = []
    for i, p in enumerate(q for q in pts if any(r.tracker for r in q.rows())):
        seeds = 0  # those with a line drawn
        for seed, rows in sorted(p.seeds.items()):
            drawn = False
            for key, style in TRACKED_SHOWN.items():
                got = tracked(list(rows.values()), key)
                if got:
                    ax.plot([t / 1e6 for t, _ in got], [x for _, x in got], style, color=f"C{i}", lw=1,
                            gid=f"{p.name} seed {seed}, {MEASURES[key]}")
                    drawn = True
            seeds += drawn
        if seeds:
            handles.append(Line2D([], [], color=f"C{i}", label=f"{p.name} ({seeds} seed{'s' * (seeds > 1)})"))
    ax.axhline(1, color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set(title="along training (tracker, 8 windows)", xlabel="tokens seen (M)", ylabel="baseline / elementwise")
    if handles:
        handles += [Line2D([], [], ls=style, color="gray", label=MEASURES[k]) for k, style in TRACKED_SHOWN.items()]
        ax.legend(handles=handles, fontsize=7)


def tracked(rows: list[Row], key: str) -> list[tuple[int, float]]:
    """(tokens seen, baseline / elementwise of `key`) along one seed's runs of a setting, from their trackers (8 prose
    windows every eval_every steps), where both runs recorded that step."""
    by = {r.variant: {m["step"]: m[key] for m in r.tracker or []} for r in rows}
    if "none" not in by or "elementwise" not in by:
        return []
    step_tokens = rows[0].tokens / rows[0].steps
    steps = sorted(set(by["none"]) & set(by["elementwise"]))
    return [(s * step_tokens, by["none"][s] / by["elementwise"][s]) for s in steps if by["elementwise"][s] > 0]
