"""Bootstrap confidence intervals that resample whole sequences, vectorized in torch. The resampling unit is the
*sequence*: one row the model reads whole (a prompt, a chunk of an ablation, a measured window, a task row).

Tokens of one sequence are not independent draws: a code prompt keeps its gates low at every token,
so an interval from resampled *tokens* is far too narrow. We resample sequences instead: draw n_units
sequences with replacement, recompute the statistic, repeat n_boot times, and report the middle `ci`
of those n_boot values (the percentile interval).

    est, low, high = bootstrap_ci(loss_per_chunk)                         # mean over chunks
    est, low, high = bootstrap_ci(mean_per_prompt, weights=tokens_per_prompt)  # mean over all tokens
    est, low, high = bootstrap_ci(loss_per_chunk, stat=lambda x, dim: x.mean(dim).exp())  # perplexity

All resamples are drawn at once, as an index matrix (n_boot, n_units). For a mean that becomes a
count matrix times the values (one matmul); any other statistic gathers (n_boot, n_units, ...) and
reduces over the unit axis.

For a handful of seeds, where a bootstrap has too few units, `t_quantile(p, df)` gives Student's t quantile for a t
interval, mean ± t_quantile((1 + level) / 2, n - 1) · s / sqrt(n): scipy.stats.t's, with a one-line error for input
that has no quantile.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import NamedTuple

import torch


class CI(NamedTuple):
    estimate: torch.Tensor  # the statistic of the data as observed
    low: torch.Tensor  # lower end of the interval, same shape
    high: torch.Tensor  # upper end


def quantile(x: torch.Tensor, q: float | Sequence[float], dim: int = -1) -> torch.Tensor:
    """torch.quantile (linear interpolation, numpy's default) without its 16M-element limit, and faster
    for a few quantiles. A float q removes `dim`; a sequence of q puts an axis of len(q) first."""
    x = x.movedim(dim, -1).contiguous()  # (..., n)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("quantile of an empty tensor")
    qs = torch.as_tensor(q, dtype=torch.float64).reshape(-1)
    at = qs * (n - 1)  # fractional index of each quantile among the sorted values
    lo, hi = at.floor().long(), at.ceil().long()
    needed = sorted(set(lo.tolist() + hi.tolist()))
    if len(needed) <= 4:  # selecting a few order statistics is O(n) each; sorting is O(n log n)
        kth = {k: x.kthvalue(k + 1, dim=-1).values for k in needed}
        below, above = torch.stack([kth[k] for k in lo.tolist()]), torch.stack([kth[k] for k in hi.tolist()])
    else:
        s = x.sort(dim=-1).values
        below, above = s[..., lo].movedim(-1, 0), s[..., hi].movedim(-1, 0)  # (len(q), ...)
    out = torch.lerp(below, above, (at - lo).to(x.dtype).reshape(-1, *[1] * (below.dim() - 1)))
    return out[0] if isinstance(q, (int, float)) else out


def bootstrap_ci(values_per_unit, stat=torch.mean, n_boot: int = 1000, ci: float = 0.95, seed: int = 0,
                 weights=None) -> CI:
    """Percentile bootstrap over units. Returns CI(estimate, low, high), each of shape values.shape[1:].

    values_per_unit: (unit, ...) one value, or one tensor of values, per prompt or chunk.
    stat: a reduction `f(x, dim)` like torch.mean (the default, computed as one matmul); functions
        returning (values, indices), like torch.median, are fine too.
    weights: (unit,) for a weighted mean sum(w x) / sum(w), only with stat=torch.mean. With per-prompt
        means and w = tokens per prompt, this is the mean over all tokens of the resampled prompts.
        Units of weight 0 are ignored (their value may be nan).
    The same seed draws the same resamples, so CIs of different statistics of the same units match up.
    """
    x = torch.as_tensor(values_per_unit).double()
    n = x.shape[0] if x.dim() else 0
    if n < 2:
        raise ValueError(f"a bootstrap needs at least 2 sequences (prompts, chunks or windows), got {n}; "
                         "pass one value per sequence")
    if not 0 < ci < 1:
        raise ValueError(f"ci={ci} is the interval's coverage, a number between 0 and 1 (e.g. 0.95)")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(n, (n_boot, n), generator=g)  # (boot, unit): the units of each resample

    if stat is torch.mean:
        w = torch.ones(n, dtype=torch.float64) if weights is None else torch.as_tensor(weights).double()
        if w.shape != (n,) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be {n} non-negative numbers, not all 0; got shape {tuple(w.shape)}")
        flat = x.reshape(n, -1)  # (unit, stat)
        flat = torch.where(w[:, None] > 0, flat, 0.0)
        ones = torch.ones(n_boot, n, dtype=torch.float64)
        counts = torch.zeros(n_boot, n, dtype=torch.float64).scatter_add_(1, idx, ones)  # times each unit was drawn
        boot = (counts * w) @ flat / (counts @ w)[:, None]  # (boot, stat): each resample's weighted mean
        boot = boot.reshape(n_boot, *x.shape[1:])
        estimate = (w @ flat / w.sum()).reshape(x.shape[1:])
    else:
        if weights is not None:
            raise ValueError("weights go with stat=torch.mean only; fold them into your stat instead")

        def reduce(t, dim):
            out = stat(t, dim=dim)
            return out[0] if isinstance(out, tuple) else out

        boot = reduce(x[idx], 1)  # x[idx]: (boot, unit, ...)
        estimate = reduce(x, 0)
    alpha = (1 - ci) / 2
    low, high = quantile(boot, [alpha, 1 - alpha], dim=0)
    return CI(estimate.float(), low.float(), high.float())


# ── Student's t, for an interval over a few seeds ─────────────────────────────────────────────────────

def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t distribution with df degrees of freedom (df > 0, not necessarily whole):
    t_quantile(0.975, 4) = 2.776..., the factor of a 95% interval over 5 seeds, mean ± t · s / sqrt(n) with
    df = n - 1. scipy.stats.t.ppf computes it; this checks the input first, with a one-line error."""
    p, df = (x.item() if isinstance(x, torch.Tensor) and x.numel() == 1 else x for x in (p, df))
    if not (isinstance(p, numbers.Real) and 0 < p < 1):
        raise ValueError(f"t_quantile: p={p!r} is a probability strictly between 0 and 1 (0.975 for a 95% interval)")
    if not (isinstance(df, numbers.Real) and not isinstance(df, bool) and math.isfinite(df) and df > 0):
        raise ValueError(f"t_quantile: df={df!r} degrees of freedom; it must be a number above 0")
    from scipy import stats  # here, not at the top: importing it takes a second or two, and only this needs it

    return float(stats.t.ppf(float(p), float(df)))
