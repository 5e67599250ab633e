"""Lesson 03's check: when a training run's attention sink sets in (the step from which a tracked metric stays up)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from functools import partial

import torch

from .engine import NONE_HINT, Mismatch, Mistake, check, what

EXERCISES = ("sink_onset",)  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── when the sink sets in ────────────────────────────────────────────────────────────────────────────


def reference_sink_onset(steps, values, threshold):
    """steps: the tracked training steps (increasing ints), values: a metric at each of them (floats) -> the first
    tracked step from which the metric stays above `threshold` (strictly) to the end of training, or None when its
    last value is not above it (the metric never settled above the threshold)."""
    return _sink_onset(steps, values, threshold)


def _sink_onset(steps, values, threshold, stay=True, strict=True, out="step", empty="step"):
    """The reference with switches for the typical mistakes."""
    above = [v > threshold if strict else v >= threshold for v in values]
    if not stay:  # the first crossing, even if the metric falls back later
        i = next((i for i, a in enumerate(above) if a), None)
    else:
        below = [i for i, a in enumerate(above) if not a]
        if not below:  # above from the first tracked step on
            i = None if empty == "none" else 0
        else:
            i = below[-1] + 1 if below[-1] + 1 < len(values) else None
            if i is not None and out == "last below":
                return steps[below[-1]]
            if i is not None and out == "last below + 1":
                return steps[below[-1]] + 1
    if i is None:
        return None
    return i if out == "index" else steps[i]


def _onsets(f: Callable) -> Callable:
    """f(steps, values, threshold) -> step or None  ==>  g(steps, values, thresholds) -> (threshold,) float64, NaN
    for None. A None where the metric does end above the threshold is the forgotten `return` (or a wrong never)."""
    def run(steps, values, thresholds):
        out = []
        for t in thresholds:
            x = f(list(steps), list(values), t)
            if x is None:
                if all(v > t for v in values):
                    raise Mismatch(f"threshold {t}: the metric is above the threshold from the first tracked step "
                                   f"on, so its onset is steps[0]; None is only for a metric that never settles above")
                if values[-1] > t:
                    raise Mismatch(f"threshold {t}: {NONE_HINT} (None means the metric never settles above the "
                                   f"threshold; here it ends at {values[-1]}, above it)")
                out.append(math.nan)
            elif isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_floating_point() \
                    or isinstance(x, numbers.Integral) and not isinstance(x, bool):
                out.append(float(x))
            else:
                raise Mismatch(f"threshold {t}: expected a step (an int from `steps`) or None, got {what(x)}")
        return torch.tensor(out, dtype=torch.float64)
    return run


MISTAKES["sink_onset"] = [
    ("first crossing", partial(_sink_onset, stay=False),
     "that is the first step above the threshold; the onset is the step from which the metric *stays* above it "
     "to the end (after its last dip below)"),
    ("index", partial(_sink_onset, out="index"),
     "that is the position in the list; return the training step, steps[i]"),
    (">=", partial(_sink_onset, strict=False),
     "above means strictly greater: a value equal to the threshold is not above it"),
    ("last step below", partial(_sink_onset, out="last below"),
     "that is the last step at or below the threshold; the onset is the tracked step after it"),
    ("step + 1", partial(_sink_onset, out="last below + 1"),
     "steps are tracked every few hundred steps: the onset is the next *tracked* step, steps[i + 1], "
     "not steps[i] + 1"),
]


def sink_onset(fn: Callable) -> Callable:
    """fn(steps, values, threshold) -> the onset step or None; see reference_sink_onset."""
    steps = list(range(250, 4001, 250))  # 16 tracked steps, as in the code models' histories
    rise = [0.05, 0.05, 0.06, 0.05, 0.10, 0.12, 0.20, 0.25, 0.20, 0.25, 0.30, 0.26, 0.28, 0.31, 0.30, 0.32]
    cases = [("16 tracked steps, a rise with a dip", (steps, rise, [0.2, 0.25, 0.1, 0.4, 0.0])),
             ("steps 1, 10, 100, 1000, 5000", ([1, 10, 100, 1000, 5000], [0.5, 0.1, 0.5, 0.75, 0.625],
                                               [0.25, 0.5, 0.05, 0.7])),
             ("a metric that falls", (steps[:6], [0.4, 0.35, 0.3, 0.2, 0.1, 0.05], [0.3, 0.0, 0.01]))]
    return check("sink_onset", fn, reference_sink_onset, cases, MISTAKES["sink_onset"], atol=0, rtol=0, wrap=_onsets,
                 index_label=lambda idx: f"threshold number {idx[0] + 1}",
                 raises=[(r"IndexError", "when the metric never ends above the threshold (or is above from the "
                                         "start), there is no step after the last dip: return None (or steps[0])")])
