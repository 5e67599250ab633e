"""What lesson 03's GROW switch shows in a notebook (minigate.course.grow): while the models grow, a progress bar per
model and the tracker's curves, redrawn as the runs write them; then the grown trio beside the course's numbers, like
with like (the same corpus). `Grow` has these as its methods `show`, `curves` and `compare`."""

from __future__ import annotations

import threading
import time

import json

import torch

from .. import measure
from ..presets import NAMES, VARIANTS
from ..rows import read_rows
from . import release
from .release import SEEDS_DIR, shipped_run

SHOWN = {"sink_rate_64": "sink rate at T=64", "f_attn_excess": "F-Attn above uniform", "m_act": "M-Act"}


class GrowView:
    """The notebook view of a Grow: reads only what Grow reads (status, histories), never the processes."""

    def show(self, every: float = 30.0):
        """A progress bar per model and the tracker's curves, redrawn every `every` seconds by a background thread
        until the three are done or nothing trains them (the notebook stays free). Returns the widget."""
        import ipywidgets as W
        from IPython.display import display

        bars = {v: W.IntProgress(min=0, max=1, description=NAMES[v], layout=W.Layout(width="60%")) for v in VARIANTS}
        labels = {v: W.Label() for v in VARIANTS}
        out = W.Output()
        box = W.VBox([W.HBox([bars[v], labels[v]]) for v in VARIANTS] + [out])
        drawn = {"steps": None}

        def redraw():
            for v, p in self.status().items():
                bars[v].max, bars[v].value = p.steps, p.step
                labels[v].value = f"{p.step} / {p.steps} steps, {p.state}"
            histories = self.histories()
            seen = {name: [m["step"] for m in h.get("metrics", [])] for name, h in histories.items()}
            if seen != drawn["steps"]:
                drawn["steps"] = seen
                with out:
                    out.clear_output(wait=True)
                    display(self.curves(histories))

        def loop():
            while True:
                redraw()
                if self.finished() or not self.running():
                    redraw()
                    return
                time.sleep(every)

        display(box)
        redraw()
        if not self.finished() and self.running():
            threading.Thread(target=loop, daemon=True).start()
        return box

    def curves(self, histories: dict | None = None, title: str | None = None):
        """The tracker's sink rate at T=64 (the share of heads that are sink heads), F-Attn above uniform and M-Act
        (8 held-out prose windows, every eval_every steps) of each model against the step: plots.training_metrics,
        one figure, three panels.
        `histories`: {name: history.json dict}, by default this seed's runs (lesson 03 also draws the shipped seed 0's
        through it)."""
        import matplotlib.pyplot as plt

        from ..checkpoint import History
        from ..plots import training_metrics

        histories = self.histories() if histories is None else histories
        title = title or f"{self.preset}, seed {self.seed}: the tracker's numbers as the runs write them"
        fig = training_metrics({name: History.from_dict(h) for name, h in histories.items()}, SHOWN, title)
        plt.close(fig)
        return fig

    def compare(self, prose: torch.Tensor, device="cpu") -> str:
        """The finished trio measured on `prose`, beside the course's numbers for the same recipe: the shipped trio
        where there is one (`code`), and the range over the recipe's seeds (data/seeds/<preset>.json). "" until all
        three are finished."""
        yours = self.measure(prose, device)
        if yours is None:
            return ""
        for v, row in yours.items():  # beside each run, and in the kept copy (lesson 04 reads it on another runtime)
            for folder in (self.folder(v), *([self.keep / NAMES[v]] if self.keep else [])):
                if folder.is_dir():
                    measure.write_measurements(folder, row, prose)
        mine = self.corpus()
        trios, apart = {"yours": yours}, []  # apart: the course's trios on another corpus, named but not set beside
        if release.shipped_variants(self.preset) == list(NAMES):
            theirs = corpus_of(shipped_run(f"{self.preset}-baseline"))
            if theirs[0] == mine[0]:
                trios = {"shipped": release.shipped_rows(self.preset), **trios}
            else:
                apart.append(f"the shipped trio read {_corpus_text(theirs)}")
        lines = [f"{'':8s} {'model':20s} {'sink heads, T=64':>17s} {'strongest, T=64':>16s} {'above uniform':>14s} "
                 f"{'M-Act':>6s} {'val loss':>9s}"]
        for v in VARIANTS:
            for who, trio in trios.items():
                r = trio[v]
                lines.append(f"{who:8s} {r.name:20s} {r.sink_heads_64:>12d} / {r.heads} {r.max_head_64:16.2f} "
                             f"{r.f_attn_excess:14.3f} {r.m_act:6.1f} {r.val_loss_code:9.3f}")
        for who, trio in trios.items():
            x = measure.ratios(trio)
            lines.append(f"{who}: baseline / gated, F-Attn above uniform " + ", ".join(
                f"{x[g]['f_attn_excess']:.1f}x ({g})" for g in x) + "; M-Act " + ", ".join(
                f"{x[g]['m_act']:.1f}x ({g})" for g in x))
        seeds = SEEDS_DIR / f"{self.preset}.json"
        if seeds.is_file():
            rows = read_rows(seeds).rows
            others = sorted({(r.corpus_sha256, r.corpus_files) for r in rows} - {mine})
            if not others:  # like with like: every seed read the corpus yours read
                first = "the shipped models" if "shipped" in trios else "one of the course's runs"
                lines += ["", f"the course's seeds of the {self.preset} recipe (data/seeds/{seeds.name}),"]
                lines += release.spread_lines(release.spread(release.seed_rows(self.preset)), seed0=first)
            else:
                apart.append(f"the course's seeds (data/seeds/{seeds.name}) read " + "; ".join(
                    _corpus_text(c) for c in others))
        if apart:
            lines += ["", f"yours read {_corpus_text(mine)}; not set beside yours, as a gap could come from the data "
                      "as well as the seed: " + "; ".join(apart)]
        return "\n".join(lines)

    def corpus(self) -> tuple[str | None, int | None]:
        """(SHA-256, files) of the python-code corpus the trio's baseline read (run.json); (None, None) unrecorded."""
        folder = self.folder("none")
        run_json = folder / "run.json" if (folder / "run.json").is_file() else folder / "model" / "run.json"
        return corpus_of(json.loads(run_json.read_text())) if run_json.is_file() else (None, None)


def corpus_of(run_json: dict) -> tuple[str | None, int | None]:
    """(SHA-256, files) of the python-code corpus a run read, from its run.json."""
    code = run_json.get("python_code", {})
    return code.get("sha256"), code.get("files")


def _corpus_text(corpus: tuple) -> str:
    sha, files = corpus
    return f"python-code {sha[:12]} ({files:,} files)" if sha else "a corpus it did not record"
