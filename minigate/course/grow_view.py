"""What lesson 03's GROW switch shows in a notebook while the models grow (minigate.course.grow): a progress bar per
model and the tracker's curves, redrawn as the runs write them. `Grow` has these as its methods `show` and `curves`."""

from __future__ import annotations

import threading
import time

from ..presets import NAMES, VARIANTS

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
