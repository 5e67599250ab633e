"""The sink, F-Attn and M-Act evidence: a recipe's seeds as stored (data/seeds/<preset>.json), or one model per
variant measured here window by window, so that a bootstrap over the windows gives the intervals.

    seed_entries("code", release.seed_rows("code"))          # the range over the seeds
    window_entries("copy", task_windows("copy"), "256 rows")  # 95% bootstraps over the rows (M-Act: random halves)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minigate import data, measure
from minigate.presets import NAMES
from minigate.analysis import SINK_THRESHOLD, PublishedMeasures, published_measures
from minigate.course import release
from minigate.course.release import shipped

from .rules import GATED, Entry, Evidence, Interval, boot, combine, halves, iv_text, judged, x_text


def _ivx(iv: Interval) -> str:
    """A ratio with its interval: 2.0x [1.9, 2.2]."""
    return f"{x_text(iv.estimate)} {iv_text(iv)}"


def _heads_value(heads: dict, ev: Evidence, n_heads: int, over: str) -> str:
    g = list(ev.twins)
    return (f"{heads['none']} -> {' / '.join(str(heads[t]) for t in g)} of {n_heads}; baseline - gated "
            f"{' / '.join(iv_text(ev.twins[t], '.0f') for t in g)} ({over})")


def _heads_short(heads: dict, n_heads: int) -> str:
    return f"{heads['none']} -> {' / '.join(str(v) for k, v in heads.items() if k != 'none')} of {n_heads}"


def _f_value(f: dict, excess: dict, over: str) -> str:
    return (f"raw {' / '.join(_ivx(iv) for iv in f.values())}; above uniform "
            f"{' / '.join(_ivx(iv) for iv in excess.values())} ({over})")


def _f_short(f: dict) -> str:
    return "raw " + " / ".join(x_text(iv.estimate) for iv in f.values())


def _x_short(m: dict) -> str:
    return " / ".join(x_text(iv.estimate) for iv in m.values())


def _m_value(m_act: dict, m: dict, over: str) -> str:
    return (f"{m_act['none']:.0f} -> {' / '.join(f'{m_act[g]:.0f}' for g in m)}: "
            f"{' / '.join(_ivx(iv) for iv in m.values())} ({over})")


# ── a recipe's seeds, as stored ─────────────────────────────────────────────────────────────────────────────

def _seed_evidence(rows: dict) -> dict[str, Evidence]:
    """One seed's trio {variant: Measurement}: point Evidence of the sink, F-Attn and M-Act claims."""
    b, gated = rows["none"], [g for g in GATED if g in rows]
    x = measure.ratios(rows, keys=("f_attn", "m_act"))
    point = Interval.point
    return {
        "sink heads": Evidence({g: point(b.sink_heads_64 - rows[g].sink_heads_64) for g in gated}, "",
                               symptom=point(b.sink_heads_64), gated={g: point(rows[g].sink_heads_64) for g in gated},
                               unit="head"),
        "f_attn": Evidence({g: point(x[g]["f_attn"]) for g in gated}, "", symptom=point(b.f_attn_excess)),
        "m_act": Evidence({g: point(x[g]["m_act"]) for g in gated}, ""),
    }


def seed_entries(setting: str, seeds: dict[int, dict], about: str = "") -> list[Entry]:
    """The sink, F-Attn and M-Act entries of a recipe over its seeds {seed: {variant: Measurement}} (those with all
    the variants any seed has: a trio, or a study point's baseline and elementwise pair; seed 0 first): each
    interval the range over the seeds, seed 0's value its estimate. Sink heads at T=64 (Gu et al.), out of the
    model's heads. `about` follows the seed count in each value: which setting this is."""
    variants = [v for v in NAMES if any(v in rows for rows in seeds.values())]
    whole = [rows for _, rows in sorted(seeds.items()) if set(rows) == set(variants)]
    over = f"{len(whole)} seed{'s' * (len(whole) > 1)}" + (f"; {about}" if about else "")
    ev = {claim: combine([_seed_evidence(rows)[claim] for rows in whole], over)
          for claim in ("sink heads", "f_attn", "m_act")}
    s0, n_heads = whole[0], whole[0]["none"].heads
    heads = {v: s0[v].sink_heads_64 for v in variants}
    excess = [measure.ratios(rows, keys=("f_attn_excess",)) for rows in whole]
    excess = {g: Interval.over([x[g]["f_attn_excess"] for x in excess]) for g in variants[1:]}
    f, m = ev["f_attn"].twins, ev["m_act"].twins
    return [
        judged("sink heads", setting, ev["sink heads"], _heads_value(heads, ev["sink heads"], n_heads, over),
               _heads_short(heads, n_heads)),
        judged("f_attn", setting, ev["f_attn"], _f_value(f, excess, over), _f_short(f)),
        judged("m_act", setting, ev["m_act"], _m_value({v: s0[v].m_act for v in variants}, m, over),
               _x_short(m)),
    ]


# ── one model per variant, window by window ─────────────────────────────────────────────────────────────────

@dataclass
class Windows:
    """One model's numbers window by window, what a bootstrap over windows resamples; the whole sample gives
    analysis.published_measures' F-Attn, sink heads at T=64 and M-Act."""
    shares: torch.Tensor  # (window, layer, head): mean first-token share over the window's queries
    shares_64: torch.Tensor  # (window, layer, head): the same over its first 64 queries (Gu et al.)
    maxima: torch.Tensor  # (window, layer): the largest |residual| after each layer
    uniform: float  # uniform attention's share at the windows' length

    @classmethod
    def of(cls, m: PublishedMeasures) -> Windows:
        """The window-by-window tensors behind published_measures' numbers `m` (windows of 64 tokens or fewer: the
        shares at T are Gu et al.'s)."""
        return cls(m.sink.per_prompt, (m.sink_64 or m.sink).per_prompt, m.act.per_window, m.uniform)

    @property
    def f_attn(self) -> float:
        return self.shares.mean().item()

    @property
    def m_act(self) -> float:
        return self.maxima.amax(0).mean().item()

    @property
    def sink_heads(self) -> int:
        return int((self.shares_64.mean(0) > SINK_THRESHOLD).sum())


def measure_windows(model, tokens: torch.Tensor, batch_size: int = 16) -> Windows:
    """`model` on held-out windows `tokens` (batch, T), <bos> first: published_measures, window by window."""
    return Windows.of(published_measures(model.eval(), tokens, batch_size))


def task_windows(task: str, device="cpu", n: int = 256) -> dict[str, Windows]:
    """The shipped copy or induction trio on lesson 04's held-out rows (seed 3), window by window."""
    rows = {"copy": data.copy_task, "induction": data.induction_task}[task](n, seed=3)[:, :-1]  # (n, 64)
    return {v: measure_windows(shipped(f"{task}-{name}", device=device), rows.to(device))
            for v, name in NAMES.items()}


def shipped_windows(preset: str, device="cpu", prose: torch.Tensor | None = None) -> dict[str, Windows]:
    """A shipped natural-data trio or pair on the prose windows, window by window: release.measure_preset, each model
    checked against its measurements.json."""
    return {v: Windows.of(m) for v, m in release.measure_preset(preset, device, prose).items()}


def window_entries(setting: str, rows: dict[str, Windows], over: str) -> list[Entry]:
    """The sink, F-Attn and M-Act entries of one trio or pair measured window by window, rows {variant: Windows}
    with "none" the baseline: the sink heads and F-Attn with a 95% bootstrap over the windows (paired: the same
    resamples for every model), M-Act over random halves of them."""
    b, gated = rows["none"], [g for g in GATED if g in rows]
    n_heads = b.shares.shape[1] * b.shares.shape[2]
    models = ["none", *gated]
    heads = torch.cat([rows[v].shares_64.flatten(1) for v in models], 1).double()  # (window, model * head)
    shares = torch.cat([rows[v].shares.flatten(1) for v in models], 1).double()

    def count_stat(x, dim):  # -> (..., 1 + 2 * twins): baseline heads, then each twin's difference and count
        n = (x.mean(dim) > SINK_THRESHOLD).unflatten(-1, (len(models), n_heads)).double().sum(-1)
        return torch.cat([n[..., :1], n[..., :1] - n[..., 1:], n[..., 1:]], -1)

    def f_stat(x, dim):  # -> (..., twins): raw F-Attn ratios, then the baseline's excess and the excess ratios
        f = x.mean(dim).unflatten(-1, (len(models), n_heads)).mean(-1)
        e = f - b.uniform
        return torch.cat([f[..., :1] / f[..., 1:], e[..., :1], e[..., :1] / e[..., 1:]], -1)

    counts = boot(heads, count_stat)
    fs = boot(shares, f_stat)
    k = len(gated)
    maxima = torch.stack([rows[v].maxima for v in models], 1)  # (window, model, layer)
    m = {g: halves(maxima, lambda x, d, i=i: x.amax(d)[..., 0, :].mean(-1) / x.amax(d)[..., i + 1, :].mean(-1))
         for i, g in enumerate(gated)}
    ev_heads = Evidence(dict(zip(gated, counts[1:1 + k], strict=True)), over, symptom=counts[0],
                        gated=dict(zip(gated, counts[1 + k:], strict=True)), unit="head")
    f = dict(zip(gated, fs[:k], strict=True))
    x = dict(zip(gated, fs[k + 1:], strict=True))
    ev_f = Evidence(f, over, symptom=Interval.point(fs[k].estimate))
    ev_m = Evidence(m, f"halves of {over}")
    heads = {v: rows[v].sink_heads for v in models}
    return [
        judged("sink heads", setting, ev_heads, _heads_value(heads, ev_heads, n_heads, over),
               _heads_short(heads, n_heads)),
        judged("f_attn", setting, ev_f, _f_value(f, x, over), _f_short(f)),
        judged("m_act", setting, ev_m, _m_value({v: rows[v].m_act for v in models}, m, ev_m.over), _x_short(m)),
    ]
