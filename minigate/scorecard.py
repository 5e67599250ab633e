"""The course's scorecard (lesson 08): each claim about the gate against each setting the course measured, with a
verdict, the rule that gave it, and whether it is fragile.

Every claim has one `Rule`: the text printed beside its verdicts and the function that gives them, one object, so the
rule a reader sees is the rule the code applies. A rule judges `Evidence`: for each gated twin, an interval of the
gate's effect (baseline / gated, above 1 when the gate lowered the number; or baseline minus gated). The interval is
the range over seeds where the setting has several (the code recipes: data/seeds/*.json), else a 95% bootstrap over
its windows, rows or chunks (one model per variant: the MoE pair, the copy and induction trios, the overrides,
lesson 08's runs; M-Act, a maximum, over random halves of the windows instead). The verdicts:
- reproduced: every gated twin changes the number at least half as much as the paper's models do (the rule names the
  bar), clear of the noise (the interval's low end reaches it);
- partly: every gated twin changes it the right way, clear of the noise (the low end above no change), by less;
- within noise: no change is inside some twin's interval;
- contradicted: some gated twin changes it the wrong way or not at all, clear of the noise (the high end at or below no
  change);
- not at this scale: the baseline does not show the symptom, so there is nothing for the gate to remove.
A verdict is fragile when it rests on one model per variant (one seed), on one head, on one seed of several (leaving
any one out changes it) or on a margin under 10% (it changes when the measured numbers move by 10%).

Claims come from three sources, kept apart: the paper (Qiu et al., 2025), a third-party analysis of its released 1B
models ("reported"), and the course, which tests what the paper implies but did not measure. A claim's own verdict
(`claim_verdicts`, what `tally` counts, one per claim) is that of its settings whose verdict is not fragile, or of
all of them, marked fragile, where every one is.

Every number is measured here on the shipped models, or read from the one file that stores it (measurements.json,
data/seeds/<preset>.json); lesson 08 passes in its own learning-rate runs. Only the paper's and the report's figures
are typed in (PAPER).
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from minigate import ablation as ab
from minigate import data, measure, overrides
from minigate.analysis import GU_LEN, SINK_THRESHOLD, _Recorder, uniform_first_token_share
from minigate.presets import model_config
from minigate.pretrained import shipped
from minigate.stats import bootstrap_ci, quantile

VERDICTS = ("reproduced", "partly", "within noise", "not at this scale", "contradicted")
MIXED = "depends on the setting"  # a claim whose robust settings disagree in direction
CLAIM_VERDICTS = ("reproduced", "partly", MIXED, "within noise", "not at this scale", "contradicted")
GATED = ("headwise", "elementwise")
MARGIN = 1.1  # a verdict that a 10% change of the measured numbers would change is fragile
N_BOOT, LEVEL = 1000, 0.95
SOURCES = {  # where a claim comes from; the printout and the figure keep them apart
    "paper": "the paper's claims (Qiu et al., 2025)",
    "reported": "reported: a third-party analysis of the released 1B models (not the paper's; not checked here)",
    "course": "the course's tests of what the paper implies (the paper did not measure them)",
}
SETTINGS = {  # key -> where and how it was measured
    "paper": "the paper: 15B MoE (Table 4), 1.7B dense (Table 2); the 1B release as reported",
    "code": "code recipe, 3 seeds (seed 0 shipped; data/seeds/code.json): 75 held-out WikiText-2 windows of 512 "
            "tokens; the overrides on seed 0, 16 chunks of 256 tokens (lesson 06)",
    "code-gpu": "code-gpu recipe, 3 seeds trained and measured on an H200 (data/seeds/code-gpu.json; seed 0 in fp16), "
                "same windows",
    "code-moe": "code-moe pair (shipped), same windows",
    "copy": "copy trio (shipped): 256 held-out rows of 64 tokens (lesson 04); 64 rows for the overrides (lesson 06)",
    "induction": "induction trio (shipped): 256 held-out rows of 64 tokens (lesson 04)",
    "lesson 08": "lesson 08's pair at lr 0.1 (baseline and elementwise), trained in the notebook",
}
SEED_PRESETS = {"code": "code", "code-gpu": "code-gpu"}  # setting -> data/seeds/<preset>.json
PAPER = {  # the paper's figures (Qiu et al., 2025), and the third-party report on its released 1B models
    "f_attn": {"none": 0.467, "headwise": 0.073, "elementwise": 0.048},  # Table 4, 15B MoE
    "m_act": {"none": 1053, "headwise": 98, "elementwise": 94},  # Table 4, 15B MoE
    "lr loss": {"none": 9.195, "gated": 7.325},  # Table 2, 1.7B dense, lr 8e-3 (the baseline degrades)
    "closed": {"learned": 12.39, "gates=0": 304_000},  # released 1B headwise model, WikiText-2 (reported)
}
EXCESS_MIN = 0.03  # F-Attn above uniform below this: no sink to remove (measure.bar's line for a baseline)
BOS_BAR = 2.0  # the course's bar for "no need for a sink": <bos> costs a gated twin at most half the baseline's


def _half(key: str, twin: str) -> float:
    """Half the paper's own ratio for that twin (Table 4: baseline / gated)."""
    return PAPER[key]["none"] / PAPER[key][twin] / 2


# ── intervals, evidence, rules ──────────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Interval:
    """A number with its noise band: the estimate (seed 0's, or the whole sample's) and the interval around it."""
    estimate: float
    low: float
    high: float

    def scaled(self, f: float) -> Interval:
        return Interval(self.estimate * f, self.low * f, self.high * f)

    @classmethod
    def over(cls, values: list[float]) -> Interval:
        """The range over seeds, seed 0's value (the first) as the estimate."""
        return cls(values[0], min(values), max(values))


@dataclass(frozen=True)
class Evidence:
    """What a rule judges in one setting."""
    twins: dict  # gated twin -> Interval of the effect (baseline / gated, or baseline minus gated)
    over: str  # what the intervals are over: "3 seeds", "95% bootstrap over 256 rows", ...
    models: int = 1  # trained models per variant behind it (seeds)
    symptom: Interval | None = None  # the baseline's symptom (F-Attn above uniform, sink heads, <bos> cost, spikes)
    gated: dict | None = None  # the count claims: each twin's own count (reproduced: none left)
    per_seed: tuple = ()  # the seeds' own Evidence, for "one seed decides"
    unit: str = ""  # "head" where one head crossing the threshold moves the verdict

    def scaled(self, f: float) -> Evidence:
        return replace(self, twins={g: iv.scaled(f) for g, iv in self.twins.items()}, per_seed=())


def worst(verdicts) -> str:
    return max(verdicts, key=VERDICTS.index)


def _level(iv: Interval, none: float, target: float) -> str:
    """One twin's verdict: its interval against no change (`none`) and the bar (`target`)."""
    if iv.high <= none:
        return "contradicted"
    if iv.low <= none:
        return "within noise"
    return "reproduced" if iv.low >= target else "partly"


@dataclass(frozen=True)
class Rule:
    """A claim's rule: the text printed with its verdicts, and the function that gives them."""
    text: str
    judge: Callable  # Evidence -> verdict
    symptom_min: float | None = None  # the baseline shows the symptom when its value reaches this
    scalable: bool = True  # the 10% margin test applies (not to counts of heads or spikes)

    def verdict(self, ev: Evidence) -> str:
        if ev.symptom is not None and self.symptom_min is not None and ev.symptom.high < self.symptom_min:
            return "not at this scale"
        return self.judge(ev)

    def fragile(self, ev: Evidence) -> tuple[str, ...]:
        """Why the verdict on `ev` is fragile (empty: it is not); a verdict within noise claims nothing."""
        v = self.verdict(ev)
        if v == "within noise":
            return ()
        why = []
        if ev.models == 1:
            why.append("one model")
        if ev.unit == "head" and v != "not at this scale" and min(abs(iv.estimate) for iv in ev.twins.values()) <= 1:
            why.append("one head")
        if len(ev.per_seed) > 1 and any(self.verdict(combine(ev.per_seed[:i] + ev.per_seed[i + 1:], ev.over)) != v
                                        for i in range(len(ev.per_seed))):
            why.append("one seed decides")
        near = self.scalable and ev.symptom is not None and self.symptom_min and \
            self.symptom_min / MARGIN <= ev.symptom.high < self.symptom_min * MARGIN
        if near or (self.scalable and any(self.verdict(ev.scaled(f)) != v for f in (MARGIN, 1 / MARGIN))):
            why.append("margin under 10%")
        return tuple(why)


def ratio_rule(text: str, targets: dict, symptom_min: float | None = None) -> Rule:
    """baseline / gated, each twin against its bar: no change is 1."""
    return Rule(text, lambda ev: worst(_level(iv, 1.0, targets[g]) for g, iv in ev.twins.items()), symptom_min)


def gap_rule(text: str, target: float) -> Rule:
    """baseline minus gated (nats): no change is 0."""
    return Rule(text, lambda ev: worst(_level(iv, 0.0, target) for iv in ev.twins.values()))


def _count_judge(ev: Evidence) -> str:
    """Counts (baseline minus gated): reproduced when no twin has any left, in every seed or resample."""
    levels = []
    for g, diff in ev.twins.items():
        level = _level(diff, 0.0, math.inf)
        levels.append("reproduced" if level == "partly" and ev.gated[g].high == 0 else level)
    return worst(levels)


def count_rule(text: str) -> Rule:
    return Rule(text, _count_judge, symptom_min=1, scalable=False)


@dataclass(frozen=True)
class Claim:
    text: str  # the claim and its measure
    short: str  # its row label in the figure
    source: str  # a key of SOURCES
    rule: Rule


_CLEAR = "each bar cleared by the whole interval, else within noise"
_LR_GAP = PAPER["lr loss"]["none"] - PAPER["lr loss"]["gated"]
_CLOSED = PAPER["closed"]["gates=0"] / PAPER["closed"]["learned"]

CLAIMS = {
    "sink heads": Claim(
        f"fewer sink heads: heads above {SINK_THRESHOLD} on the first token, windows of {GU_LEN} tokens (Gu et al.)",
        "fewer sink heads", "paper", count_rule(
            "baseline minus gated sink heads: reproduced when no gated twin keeps one (the title: attention-sink-"
            f"free), partly when each has fewer, contradicted when one has as many or more ({_CLEAR}); not at this "
            "scale: the baseline has none")),
    "f_attn": Claim(
        "less first-token attention: raw F-Attn, as Table 4 (above uniform beside it)", "less F-Attn (raw)", "paper",
        ratio_rule(f"raw F-Attn, baseline / gated: reproduced at half the paper's own ratio or more "
                   f"({_half('f_attn', 'headwise'):.1f}x headwise, {_half('f_attn', 'elementwise'):.1f}x elementwise), "
                   f"partly above 1, contradicted at 1 or below ({_CLEAR}); not at this scale: the baseline under "
                   f"{EXCESS_MIN} above uniform", {g: _half("f_attn", g) for g in GATED}, EXCESS_MIN)),
    "m_act": Claim(
        "smaller massive activations: M-Act, each layer's max |residual| averaged over layers", "smaller M-Act",
        "paper", ratio_rule(
            f"M-Act, baseline / gated: reproduced at half the paper's own ratio or more "
            f"({_half('m_act', 'headwise'):.1f}x headwise, {_half('m_act', 'elementwise'):.1f}x elementwise), partly "
            f"above 1, contradicted at 1 or below ({_CLEAR})", {g: _half("m_act", g) for g in GATED})),
    "lr spikes": Claim(
        "a high learning rate: no loss spikes or divergence where the baseline has them", "high lr: no spikes",
        "paper", count_rule(
            "spikes (a divergence counts one more), baseline minus gated: reproduced when the gated model has none, "
            "partly when fewer, contradicted when as many or more; not at this scale: the baseline has none")),
    "lr loss": Claim(
        "a high learning rate: a lower final loss than the baseline's (Table 2)", "high lr: lower loss", "paper",
        gap_rule(f"validation loss, baseline minus gated (nats): reproduced at half the paper's gap or more "
                 f"({_LR_GAP / 2:.2f} of {_LR_GAP:.2f}), partly above 0, contradicted at 0 or below ({_CLEAR})",
                 _LR_GAP / 2)),
    "closed": Claim(
        "the gates carry the model: closing them all multiplies the perplexity", "closing the gates breaks it",
        "reported", ratio_rule(
            f"perplexity, every gate at 0 / learned gates: reproduced at half the reported 1B headwise factor or more "
            f"({_CLOSED / 2:,.0f}x), partly above 1, contradicted at 1 or below ({_CLEAR})",
            dict.fromkeys(GATED, _CLOSED / 2))),
    "bos": Claim(
        "no need for a sink: forbidding attention to <bos> costs a gated model less", "<bos> costs the gated less",
        "course", ratio_rule(
            f"the loss <bos> costs, baseline / gated: reproduced at {BOS_BAR:.0f}x or more (the course's bar), partly "
            f"above 1, contradicted at 1 or below ({_CLEAR}); not at this scale: the baseline pays nothing",
            dict.fromkeys(GATED, BOS_BAR), 1e-9)),
    "lr m_act": Claim(
        "... because the gate keeps M-Act small: M-Act at the high learning rate", "high lr: smaller M-Act",
        "course", ratio_rule(
            f"M-Act, baseline / gated: reproduced at half Table 4's elementwise ratio or more "
            f"({_half('m_act', 'elementwise'):.1f}x), partly above 1, contradicted at 1 or below ({_CLEAR})",
            {"elementwise": _half("m_act", "elementwise")})),
}


@dataclass(frozen=True)
class Entry:
    claim: str  # a key of CLAIMS
    setting: str  # a key of SETTINGS
    value: str  # the numbers, as printed
    verdict: str  # one of VERDICTS; "" for the paper's own column
    fragile: tuple = ()  # why the verdict is fragile (empty: it is not)
    short: str = ""  # the figure's text for the cell
    evidence: Evidence | None = field(default=None, repr=False, compare=False)


def judged(claim: str, setting: str, ev: Evidence, value: str, short: str) -> Entry:
    rule = CLAIMS[claim].rule
    return Entry(claim, setting, value, rule.verdict(ev), rule.fragile(ev), short, ev)


def combine(per_seed, over: str) -> Evidence:
    """Several seeds' Evidence as one: each interval the range over the seeds, the first seed's value its estimate."""
    first = per_seed[0]
    span = lambda ivs: Interval.over([iv.estimate for iv in ivs])
    return Evidence(twins={g: span([e.twins[g] for e in per_seed]) for g in first.twins},
                    over=over, models=len(per_seed),
                    symptom=None if first.symptom is None else span([e.symptom for e in per_seed]),
                    gated=None if first.gated is None else {g: span([e.gated[g] for e in per_seed])
                                                          for g in first.gated},
                    per_seed=tuple(per_seed), unit=first.unit)


def _point(x: float) -> Interval:
    return Interval(x, x, x)


def _ratio(b: float, g: float) -> float:
    return b / g if g > 0 else math.inf


def _x(r: float) -> str:
    return "all gone" if r == math.inf else f"{r:.1f}x"


def _iv(iv: Interval, spec: str = ".1f") -> str:
    return f"[{iv.low:{spec}}, {iv.high:{spec}}]"


def _ivx(iv: Interval) -> str:
    """A ratio with its interval: 2.0x [1.9, 2.2]."""
    return f"{_x(iv.estimate)} {_iv(iv)}"


def _heads_value(heads: dict, ev: Evidence, n_heads: int, over: str) -> str:
    g = list(ev.twins)
    return (f"{heads['none']} -> {' / '.join(str(heads[t]) for t in g)} of {n_heads}; baseline - gated "
            f"{' / '.join(_iv(ev.twins[t], '.0f') for t in g)} ({over})")


def _heads_short(heads: dict, n_heads: int) -> str:
    return f"{heads['none']} -> {' / '.join(str(v) for k, v in heads.items() if k != 'none')} of {n_heads}"


def _f_value(f: dict, excess: dict, over: str) -> str:
    return (f"raw {' / '.join(_ivx(iv) for iv in f.values())}; above uniform "
            f"{' / '.join(_ivx(iv) for iv in excess.values())} ({over})")


def _f_short(f: dict) -> str:
    return "raw " + " / ".join(_x(iv.estimate) for iv in f.values())


def _x_short(m: dict) -> str:
    return " / ".join(_x(iv.estimate) for iv in m.values())


def _m_value(m_act: dict, m: dict, over: str) -> str:
    return (f"{m_act['none']:.0f} -> {' / '.join(f'{m_act[g]:.0f}' for g in m)}: "
            f"{' / '.join(_ivx(iv) for iv in m.values())} ({over})")


# ── the sink, F-Attn and M-Act: seeds (stored) and single models (measured here) ───────────────────────────

def _heads(row, n_heads: int) -> int:
    rate = row.sink_rate_64 if row.sink_rate_64 is not None else row.sink_rate  # windows of 64 tokens: the same
    return round(rate * n_heads)


def _seed_evidence(rows: dict, n_heads: int) -> dict[str, Evidence]:
    """One seed's trio {variant: Measures-like row}: point Evidence of the sink, F-Attn and M-Act claims."""
    b, gated = rows["none"], [g for g in GATED if g in rows]
    hb = _heads(b, n_heads)
    return {
        "sink heads": Evidence({g: _point(hb - _heads(rows[g], n_heads)) for g in gated}, "", symptom=_point(hb),
                               gated={g: _point(_heads(rows[g], n_heads)) for g in gated}, unit="head"),
        "f_attn": Evidence({g: _point(_ratio(b.f_attn, rows[g].f_attn)) for g in gated}, "",
                           symptom=_point(b.f_attn_excess)),
        "m_act": Evidence({g: _point(_ratio(b.m_act, rows[g].m_act)) for g in gated}, ""),
    }


def seed_entries(setting: str, seeds: dict[int, dict], n_heads: int) -> list[Entry]:
    """The sink, F-Attn and M-Act entries of a recipe over its seeds (those with all three models; seed 0 first):
    each interval the range over the seeds, seed 0's value its estimate."""
    whole = [rows for _, rows in sorted(seeds.items()) if set(rows) == set(measure.NAMES)]
    over = f"{len(whole)} seeds"
    ev = {claim: combine([_seed_evidence(rows, n_heads)[claim] for rows in whole], over)
          for claim in ("sink heads", "f_attn", "m_act")}
    s0 = whole[0]
    heads = {v: _heads(s0[v], n_heads) for v in measure.NAMES}
    excess = {g: Interval.over([_ratio(r["none"].f_attn_excess, r[g].f_attn_excess) for r in whole]) for g in GATED}
    f, m = ev["f_attn"].twins, ev["m_act"].twins
    return [
        judged("sink heads", setting, ev["sink heads"], _heads_value(heads, ev["sink heads"], n_heads, over),
               _heads_short(heads, n_heads)),
        judged("f_attn", setting, ev["f_attn"], _f_value(f, excess, over), _f_short(f)),
        judged("m_act", setting, ev["m_act"], _m_value({v: s0[v].m_act for v in measure.NAMES}, m, over),
               _x_short(m)),
    ]


class _WindowRecorder(_Recorder):
    """analysis' recorder (the shares published_measures reports), keeping each window's largest |residual| too."""

    def __init__(self, model, n_windows: int, queries):
        super().__init__(model, n_windows, queries)
        self.maxima = torch.zeros(n_windows, model.cfg.n_layers, dtype=torch.float64)

    def resid(self, resid, hook):  # resid (batch, pos, d_model)
        super().resid(resid, hook)
        self.maxima[self.offset:self.offset + resid.shape[0], hook.layer] = resid.abs().float().amax((1, 2)).cpu()


@dataclass
class Windows:
    """One model's numbers window by window, what a bootstrap over windows resamples; the whole sample gives
    analysis.published_measures' F-Attn, sink heads at T=64 and M-Act."""
    shares: torch.Tensor  # (window, layer, head): mean first-token share over the window's queries
    shares_64: torch.Tensor  # (window, layer, head): the same over its first 64 queries (Gu et al.)
    maxima: torch.Tensor  # (window, layer): the largest |residual| after each layer
    uniform: float  # uniform attention's share at the windows' length

    @property
    def f_attn(self) -> float:
        return self.shares.mean().item()

    @property
    def m_act(self) -> float:
        return self.maxima.amax(0).mean().item()

    @property
    def sink_heads(self) -> int:
        return int((self.shares_64.mean(0) > SINK_THRESHOLD).sum())


@torch.no_grad()
def measure_windows(model, tokens: torch.Tensor, batch_size: int = 16) -> Windows:
    """`model` on held-out windows `tokens` (batch, T), <bos> first, in one pass per batch."""
    T = tokens.shape[1]
    short = GU_LEN if T > GU_LEN else None
    rec = _WindowRecorder(model, tokens.shape[0], (None, short) if short else (None,))
    rec.run(model.eval(), tokens, batch_size)
    return Windows(rec.shares[None], rec.shares[short], rec.maxima, uniform_first_token_share(T))


def _halves(x: torch.Tensor, stat, n: int = N_BOOT, seed: int = 0) -> Interval:
    """stat(x[some windows]) on `n` random halves of the windows (drawn without replacement), as an interval: the
    noise band of a maximum, for which a bootstrap would not do. x (window, ...)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(n, x.shape[0], generator=g).argsort(1)[:, : x.shape[0] // 2]
    values = stat(x[idx], 1)  # (n,)
    low, high = quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], dim=0).tolist()
    return Interval(stat(x, 0).item(), low, high)


def _boot(x: torch.Tensor, stat) -> list[Interval]:
    """bootstrap_ci over windows of a stat returning several numbers: one Interval each."""
    est, low, high = bootstrap_ci(x, stat=stat, n_boot=N_BOOT, ci=LEVEL)
    return [Interval(*v) for v in zip(est.tolist(), low.tolist(), high.tolist(), strict=True)]


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

    counts = _boot(heads, count_stat)
    fs = _boot(shares, f_stat)
    k = len(gated)
    maxima = torch.stack([rows[v].maxima for v in models], 1)  # (window, model, layer)
    m = {g: _halves(maxima, lambda x, d, i=i: x.amax(d)[..., 0, :].mean(-1) / x.amax(d)[..., i + 1, :].mean(-1))
         for i, g in enumerate(gated)}
    ev_heads = Evidence(dict(zip(gated, counts[1:1 + k], strict=True)), over, symptom=counts[0],
                        gated=dict(zip(gated, counts[1 + k:], strict=True)), unit="head")
    f = dict(zip(gated, fs[:k], strict=True))
    x = dict(zip(gated, fs[k + 1:], strict=True))
    ev_f = Evidence(f, over, symptom=_point(fs[k].estimate))
    ev_m = Evidence(m, f"halves of {over}")
    heads = {v: rows[v].sink_heads for v in models}
    return [
        judged("sink heads", setting, ev_heads, _heads_value(heads, ev_heads, n_heads, over),
               _heads_short(heads, n_heads)),
        judged("f_attn", setting, ev_f, _f_value(f, x, over), _f_short(f)),
        judged("m_act", setting, ev_m, _m_value({v: rows[v].m_act for v in models}, m, ev_m.over), _x_short(m)),
    ]


def task_windows(task: str, device="cpu", n: int = 256) -> dict[str, Windows]:
    """The shipped copy or induction trio on lesson 04's held-out rows (seed 3), window by window."""
    rows = {"copy": data.copy_task, "induction": data.induction_task}[task](n, seed=3)[:, :-1]  # (n, 64)
    return {v: measure_windows(shipped(f"{task}-{name}", device=device), rows.to(device))
            for v, name in measure.NAMES.items()}


def shipped_windows(preset: str, device="cpu", prose: torch.Tensor | None = None) -> dict[str, Windows]:
    """A shipped natural-data trio or pair on the windows its measurements.json records, window by window, each
    checked against that file (F-Attn, sink heads at T=64, M-Act)."""
    prose = measure.prose_windows(data.DEFAULT_TOKENIZER) if prose is None else prose
    out = {}
    for v in measure.shipped_variants(preset):
        name = f"{preset}-{measure.NAMES[v]}"
        w = out[v] = measure_windows(shipped(name, device=device), prose.to(device))
        record, tol = measure.stored(name), 1e-4 if str(device) == "cpu" else 1e-3
        if measure.windows_digest(prose) == record["protocol"]["windows_sha256"]:
            for got, key in ((w.f_attn, "f_attn"), (w.m_act, "m_act"), (w.sink_heads / w.shares.shape[1] /
                                                                          w.shares.shape[2], "sink_rate_64")):
                assert abs(got - record[key]) <= tol * max(1.0, abs(record[key])), (name, key, got, record[key])
    return out


# ── the overrides: closing the gates, forbidding <bos> ────────────────────────────────────────────────────

def code_chunks() -> torch.Tensor:
    """Lesson 06's prose chunks: the first 16 windows of 256 held-out WikiText-2 tokens, (16, 257), <bos> first."""
    val_ids = data.encode(data.load_documents("wikitext-2")[1], data.get_tokenizer().tok)
    return ab.chunks(val_ids, n_chunks=16, chunk_len=256)


def chunk_costs(model, chunk_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each chunk's loss change (nats, (chunk,)) with attention to <bos> forbidden in every layer ("bos", as lesson
    06 measures it) and, for a gated model, with every gate set to 0 ("closed")."""
    conds = {"learned": [], "bos": [h for layer in range(model.cfg.n_layers)
                                    for h in overrides.forbid_bos(model, layer)]}
    if model.cfg.gate != "none":
        conds["closed"] = overrides.set_gates(model, 0.0)
    res = ab.sweep(model, chunk_ids, conds, ci=False, progress=False)
    return {k: res[k].chunk_losses - res["learned"].chunk_losses for k in conds if k != "learned"}


def bos_cost(model, chunk_ids: torch.Tensor):
    """What forbidding attention to <bos> in every layer costs: the paired loss change in nats (stats.CI: estimate,
    low, high, a bootstrap over chunks), as lesson 06 measures it."""
    return bootstrap_ci(chunk_costs(model, chunk_ids)["bos"])


def override_entries(setting: str, models: dict, chunk_ids: torch.Tensor) -> list[Entry]:
    """The closed-gates and forbidden-<bos> entries of one trio, models {variant: model}: 95% bootstraps over the
    chunks (paired: every model on the same resamples)."""
    cost = {v: chunk_costs(m, chunk_ids) for v, m in models.items()}
    gated = [g for g in GATED if g in models]
    over = f"{len(chunk_ids)} {'chunks' if chunk_ids.shape[1] > 100 else 'rows'}"
    closed = {g: Interval(*(math.exp(t.item()) for t in bootstrap_ci(cost[g]["closed"], n_boot=N_BOOT, ci=LEVEL)))
              for g in gated}
    bos = torch.stack([cost[v]["bos"] for v in ("none", *gated)], 1)  # (chunk, model)
    means = _boot(bos, lambda x, dim: x.mean(dim))  # each model's cost
    ratios = _boot(bos, lambda x, dim: x.mean(dim)[..., :1] / x.mean(dim)[..., 1:])
    ev_closed = Evidence(closed, over)
    ev_bos = Evidence(dict(zip(gated, ratios, strict=True)), over, symptom=means[0])
    return [judged("closed", setting, ev_closed,
                   " / ".join(f"{closed[g].estimate:.2g}x {_iv(closed[g], '.2g')}" for g in gated) + f" ({over})",
                   " / ".join(f"{closed[g].estimate:.2g}x" for g in gated)),
            judged("bos", setting, ev_bos,
                   f"{_nats(means[0])} -> {' / '.join(_nats(c) for c in means[1:])} nats: "
                   + " / ".join(f"{r.estimate:.2f}x {_iv(r, '.2f')}" for r in ratios) + f" ({over})",
                   " / ".join(f"{r.estimate:.2f}x" for r in ratios))]


def _nats(iv: Interval) -> str:
    return f"{iv.estimate:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"


# ── lesson 08's learning-rate runs ───────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class LrRuns:
    """Lesson 08's high-learning-rate pair, "none" (the baseline) and "gated": spikes and whether each run finished
    (did not diverge); each chunk's validation loss at the end; each probe window's largest |residual| per layer."""
    spikes: dict  # {"none": int, "gated": int}
    finished: dict  # {"none": bool, "gated": bool}
    losses: dict  # {"none": (chunk,), "gated": (chunk,)}: mean next-token loss of each validation chunk, nats
    maxima: dict  # {"none": (window, layer), "gated": (window, layer)}: Windows.maxima on the probe windows

    @classmethod
    def measure(cls, histories: dict, models: dict, chunk_ids: torch.Tensor, probe: torch.Tensor) -> LrRuns:
        """From the two runs' histories and models {"none": ..., "gated": ...}, on validation chunks
        (ablation.chunks) and probe windows."""
        return cls(spikes={k: len(h.spikes) for k, h in histories.items()},
                   finished={k: "stopped" not in h.info for k, h in histories.items()},
                   losses={k: ab.perplexity(m, chunk_ids.long(), ci=False).chunk_losses for k, m in models.items()},
                   maxima={k: measure_windows(m, probe).maxima for k, m in models.items()})


def lr_entries(runs: LrRuns) -> list[Entry]:
    """The learning-rate entries (the gated model is elementwise)."""
    s, done = runs.spikes, runs.finished
    trouble = {k: s[k] + (not done[k]) for k in s}  # spikes, and a divergence counted as one more
    ev_spikes = Evidence({"elementwise": _point(trouble["none"] - trouble["gated"])}, "one run each",
                         symptom=_point(trouble["none"]), gated={"elementwise": _point(trouble["gated"])})
    diverged = [who for k, who in (("none", "the baseline"), ("gated", "the gated model")) if not done[k]]
    losses = torch.stack([runs.losses["none"], runs.losses["gated"]], 1).double()
    over = f"{len(losses)} chunks"
    (gap,) = _boot(losses, lambda x, dim: x.mean(dim)[..., :1] - x.mean(dim)[..., 1:])
    maxima = torch.stack([runs.maxima["none"], runs.maxima["gated"]], 1)  # (window, model, layer)
    m = _halves(maxima, lambda x, d: x.amax(d)[..., 0, :].mean(-1) / x.amax(d)[..., 1, :].mean(-1))
    m_over = f"halves of {len(maxima)} windows"
    m_act = {k: runs.maxima[k].amax(0).mean().item() for k in ("none", "gated")}
    return [judged("lr spikes", "lesson 08", ev_spikes, f"{s['none']} spikes -> {s['gated']}; "
                   + ("neither diverged" if not diverged else " and ".join(diverged) + " diverged"),
                   f"{s['none']} -> {s['gated']} spikes"),
            judged("lr loss", "lesson 08", Evidence({"elementwise": gap}, over),
                   f"{losses[:, 0].mean():.2f} -> {losses[:, 1].mean():.2f} nats: {gap.estimate:+.2f} "
                   f"{_iv(gap, '+.2f')} ({over})", f"{gap.estimate:+.2f} nats"),
            judged("lr m_act", "lesson 08", Evidence({"elementwise": m}, m_over),
                   f"{m_act['none']:.2g} -> {m_act['gated']:.2g}: {m.estimate:.2f}x {_iv(m, '.2f')} "
                   f"({m_over})", f"{m.estimate:.2f}x")]


# ── the whole card ───────────────────────────────────────────────────────────────────────────────────────

def paper_entries() -> list[Entry]:
    p = PAPER
    return [
        Entry("sink heads", "paper", "no count (its title: attention-sink-free)", "", short="sink-free"),
        Entry("f_attn", "paper", f"{p['f_attn']['none']} -> {p['f_attn']['headwise']} / {p['f_attn']['elementwise']}: "
              "raw " + " / ".join(_x(p["f_attn"]["none"] / p["f_attn"][g]) for g in GATED) + " (Table 4, 15B MoE)",
              "", short="raw " + " / ".join(_x(p["f_attn"]["none"] / p["f_attn"][g]) for g in GATED)),
        Entry("m_act", "paper", f"{p['m_act']['none']} -> {p['m_act']['headwise']} / {p['m_act']['elementwise']}: "
              + " / ".join(_x(p["m_act"]["none"] / p["m_act"][g]) for g in GATED) + " (Table 4, 15B MoE)", "",
              short=" / ".join(_x(p["m_act"]["none"] / p["m_act"][g]) for g in GATED)),
        Entry("lr spikes", "paper", "baseline degrades at lr 8e-3, diverges with 1T tokens (1.7B dense)", "",
              short="baseline degrades"),
        Entry("lr loss", "paper", f"{p['lr loss']['none']} -> {p['lr loss']['gated']} nats (Table 2, 1.7B dense)", "",
              short=f"{p['lr loss']['none'] - p['lr loss']['gated']:+.2f} nats"),
        Entry("closed", "paper", f"{p['closed']['gates=0'] / p['closed']['learned']:,.0f}x (1B headwise, reported)",
              "", short=f"{p['closed']['gates=0'] / p['closed']['learned']:,.0f}x"),
        Entry("bos", "paper", "not measured", "", short="not measured"),
        Entry("lr m_act", "paper", "its explanation; M-Act not measured at the high lr", "", short="its explanation"),
    ]


def scorecard(lr: LrRuns | None = None, device="cpu") -> list[Entry]:
    """Every entry: the paper's column, then the settings, measured (the shipped models, on a CPU: seconds)."""
    entries = paper_entries()
    for setting, preset in SEED_PRESETS.items():
        cfg = model_config(preset)
        entries += seed_entries(setting, measure.seed_rows(preset), cfg.n_layers * cfg.n_heads)
    prose = measure.prose_windows(data.DEFAULT_TOKENIZER)
    entries += window_entries("code-moe", shipped_windows("code-moe", device, prose),
                              f"{len(prose)} windows")
    for task in ("copy", "induction"):
        entries += window_entries(task, task_windows(task, device), "256 rows")
    code = {v: shipped(f"code-{n}", device=device) for v, n in measure.NAMES.items()}
    entries += override_entries("code", code, code_chunks())
    copy = {v: shipped(f"copy-{n}", device=device) for v, n in measure.NAMES.items()}
    entries += override_entries("copy", copy, data.copy_task(64, seed=3))
    if lr is not None:
        entries += lr_entries(lr)
    return entries


def claim_verdicts(entries: list[Entry]) -> dict[str, tuple[str, bool]]:
    """{claim: (verdict, fragile)}: each claim measured, once. Its verdict is that of its settings whose verdict is
    not fragile, or, where every one is, of all of them (then marked fragile): one verdict where they agree;
    "partly" where they are reproduced and partly; "depends on the setting" where some hold (reproduced or partly)
    and some are contradicted; within noise and not at this scale count only where nothing else does."""
    out = {}
    for claim in CLAIMS:
        measured = [e for e in entries if e.claim == claim and e.verdict]
        if not measured:
            continue
        robust = [e for e in measured if not e.fragile]
        use = robust or measured
        found = {e.verdict for e in use}
        clear = found - {"within noise", "not at this scale"}
        if not clear:
            v = "not at this scale" if "not at this scale" in found else "within noise"
        elif clear == {"contradicted"}:
            v = "contradicted"
        elif "contradicted" in clear:
            v = MIXED
        else:
            v = "reproduced" if clear == {"reproduced"} else "partly"
        out[claim] = (v, not robust)
    return out


def tally(entries: list[Entry]) -> dict[str, int]:
    """How many claims got each verdict (claim_verdicts): each claim counted once, whatever its settings."""
    verdicts = [v for v, _ in claim_verdicts(entries).values()]
    return {v: verdicts.count(v) for v in CLAIM_VERDICTS}


def _mark(e: Entry) -> str:
    return e.verdict + ("*" if e.fragile else "")


LEGEND = ("[low, high]: the range over seeds, or a 95% bootstrap over one model's windows, rows or chunks (M-Act: "
          "random halves)")


def lines(entries: list[Entry], width: int = 116) -> list[str]:
    """The scorecard as text: the claims by source; per claim its rule, then one line per setting (verdict, numbers;
    * fragile, with why), then the claim's own verdict (=>)."""
    out, verdicts = textwrap.wrap(LEGEND, width), claim_verdicts(entries)
    for source, heading in SOURCES.items():
        claims = [c for c, claim in CLAIMS.items() if claim.source == source and any(e.claim == c for e in entries)]
        if claims:
            out.append(f"━━ {heading}")
        for c in claims:
            out.append(CLAIMS[c].text)
            out += textwrap.wrap(CLAIMS[c].rule.text, width, initial_indent="  rule: ", subsequent_indent=" " * 8)
            for e in (e for e in entries if e.claim == c):
                why = f" [* {', '.join(e.fragile)}]" if e.fragile else ""
                out.append(f"  {e.setting:10s} {_mark(e) or '(the claim)':14s} {e.value}{why}")
            if c in verdicts:
                v, fragile = verdicts[c]
                out.append(f"  => {v}" + (" (every setting fragile)" if fragile else ""))
    return out


def summary(entries: list[Entry]) -> list[str]:
    """One line per claim, by source: its own verdict (claim_verdicts; * every setting fragile), then each
    setting's."""
    out, verdicts = [], claim_verdicts(entries)
    for source, heading in SOURCES.items():
        out.append(heading.split(" (")[0])
        for c, claim in CLAIMS.items():
            if claim.source == source:
                v = verdicts.get(c)
                head = "(not yet measured)" if v is None else v[0] + ("*" if v[1] else "")
                out.append(f"  {claim.short:28s} {head:18s} " + ", ".join(
                    f"{e.setting} {_mark(e)}" for e in entries if e.claim == c and e.verdict))
    return out


def n_heads_of(name: str) -> int:
    cfg = json.loads((measure.SHIPPED_DIR / name / "config.json").read_text())  # Hugging Face's keys
    return cfg["num_hidden_layers"] * cfg["num_attention_heads"]
