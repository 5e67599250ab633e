"""The scorecard's rules: the claims, the verdicts and how a rule reaches one from the evidence of a setting.

A rule judges `Evidence`: for each gated twin, an `Interval` of the gate's effect (baseline / gated, above 1 when the
gate lowered the number; or baseline minus gated). Its verdict: reproduced (every twin clears the rule's bar with its
whole interval), partly (every twin changes the number the right way, clear of the noise, by less), within noise (no
change is inside some twin's interval), contradicted (some twin changes it the wrong way or not at all, clear of the
noise), not at this scale (the baseline does not show the symptom). `Rule.fragile` says why a verdict would not
survive a small change: one model, one head, one seed of several, or a margin under 10%.

The bars come from the published figures (course/published.py): half the paper's own ratio or gap, half the reported
factor; the course's own bar for <bos> (BOS_BAR).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from minigate.analysis import GU_LEN, SINK_THRESHOLD
from minigate.presets import GATED
from minigate.stats import bootstrap_ci, quantile

from ..published import REPORTED_CLOSED, TABLE_2_LR, TABLE_2_LR_GAP, TABLE_4_RATIOS

VERDICTS = ("reproduced", "partly", "within noise", "not at this scale", "contradicted")
MIXED = "depends on the setting"  # a claim whose robust settings disagree in direction
CLAIM_VERDICTS = ("reproduced", "partly", MIXED, "within noise", "not at this scale", "contradicted")
MARGIN = 1.1  # a verdict that a 10% change of the measured numbers would change is fragile
N_BOOT, LEVEL = 1000, 0.95
SOURCES = {  # where a claim comes from; the printout and the figure keep them apart
    "paper": "the paper's claims (Qiu et al., 2025)",
    "reported": "reported: a third-party analysis of the released 1B models (not the paper's; not checked here)",
    "course": "the course's tests of what the paper implies (the paper did not measure them)",
}
EXCESS_MIN = 0.03  # F-Attn above uniform below this: no sink to remove (scripts/ship.py's bar too)
BOS_BAR = 2.0  # the course's bar for "no need for a sink": <bos> costs a gated twin at most half the baseline's


def _half(key: str, twin: str) -> float:
    """Half the paper's own ratio for that twin (Table 4: baseline / gated)."""
    return TABLE_4_RATIOS[key][twin] / 2


# ── intervals and evidence ──────────────────────────────────────────────────────────────────────────────

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

    @classmethod
    def point(cls, x: float) -> Interval:
        """One number, no noise band (one seed's value, a count of spikes)."""
        return cls(x, x, x)


def boot(x: torch.Tensor, stat) -> list[Interval]:
    """A 95% bootstrap over the first dimension of x (windows, rows, chunks) of a stat returning several numbers: one
    Interval each."""
    est, low, high = bootstrap_ci(x, stat=stat, n_boot=N_BOOT, ci=LEVEL)
    return [Interval(*v) for v in zip(est.tolist(), low.tolist(), high.tolist(), strict=True)]


def halves(x: torch.Tensor, stat, n: int = N_BOOT, seed: int = 0) -> Interval:
    """stat(x[some windows]) on `n` random halves of the windows (drawn without replacement), as an interval: the
    noise band of a maximum, for which a bootstrap would not do. x (window, ...)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(n, x.shape[0], generator=g).argsort(1)[:, : x.shape[0] // 2]
    values = stat(x[idx], 1)  # (n,)
    low, high = quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], dim=0).tolist()
    return Interval(stat(x, 0).item(), low, high)


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


# ── rules ───────────────────────────────────────────────────────────────────────────────────────────────────

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
    bars: dict | None = None  # twin -> its reproduced bar, where the rule has one (a partly interval may reach it)

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

    def straddles(self, ev: Evidence) -> tuple[str, ...]:
        """The twins whose interval reaches their reproduced bar while its low end does not: partly, but not clear
        of reproduced (the verdict needs the whole interval past a bar)."""
        if self.bars is None or self.verdict(ev) != "partly":
            return ()
        return tuple(g for g, iv in ev.twins.items() if g in self.bars and iv.low < self.bars[g] <= iv.high)


def ratio_rule(text: str, targets: dict, symptom_min: float | None = None) -> Rule:
    """baseline / gated, each twin against its bar: no change is 1."""
    return Rule(text, lambda ev: worst(_level(iv, 1.0, targets[g]) for g, iv in ev.twins.items()), symptom_min,
                bars=targets)


def gap_rule(text: str, target: float) -> Rule:
    """baseline minus gated (nats): no change is 0."""
    return Rule(text, lambda ev: worst(_level(iv, 0.0, target) for iv in ev.twins.values()),
                bars=dict.fromkeys(GATED, target))


def _count_judge(ev: Evidence) -> str:
    """Counts (baseline minus gated): reproduced when no twin has any left, in every seed or resample."""
    levels = []
    for g, diff in ev.twins.items():
        level = _level(diff, 0.0, math.inf)
        levels.append("reproduced" if level == "partly" and ev.gated[g].high == 0 else level)
    return worst(levels)


def count_rule(text: str) -> Rule:
    return Rule(text, _count_judge, symptom_min=1, scalable=False)


# ── the claims ──────────────────────────────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Claim:
    text: str  # the claim and its measure
    short: str  # its row label in the figure
    source: str  # a key of SOURCES
    rule: Rule


_CLEAR = ("a verdict needs the whole interval past its bar: one across no change is within noise, one across the "
          "reproduced bar partly, marked ^")
LR_GAP = TABLE_2_LR_GAP  # Table 2: the loss the gate saves at the high learning rate, ln of its perplexities' ratio
CLOSED = REPORTED_CLOSED["gates=0"] / REPORTED_CLOSED["learned"]  # reported: closing every gate multiplies perplexity

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
                 f"({LR_GAP / 2:.2f} of {LR_GAP:.2f}: perplexity {TABLE_2_LR['none']} -> "
                 f"{TABLE_2_LR['elementwise']} as a loss), partly above 0, contradicted at 0 or below ({_CLEAR})",
                 LR_GAP / 2)),
    "closed": Claim(
        "the gates carry the model: closing them all multiplies the perplexity", "closing the gates breaks it",
        "reported", ratio_rule(
            f"perplexity, every gate at 0 / learned gates: reproduced at half the reported 1B headwise factor or more "
            f"({CLOSED / 2:,.0f}x), partly above 1, contradicted at 1 or below ({_CLEAR})",
            dict.fromkeys(GATED, CLOSED / 2))),
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


# ── entries ─────────────────────────────────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Entry:
    """One cell of the card: a claim in a setting, its numbers as printed and its verdict."""
    claim: str  # a key of CLAIMS
    setting: str  # a key of SETTINGS
    value: str  # the numbers, as printed
    verdict: str  # one of VERDICTS; "" for the paper's own column
    fragile: tuple = ()  # why the verdict is fragile (empty: it is not)
    short: str = ""  # the figure's text for the cell
    evidence: Evidence | None = field(default=None, repr=False, compare=False)
    straddles: tuple = ()  # the twins whose interval reaches the reproduced bar (a partly verdict, marked ^)


def judged(claim: str, setting: str, ev: Evidence, value: str, short: str) -> Entry:
    """The entry of `claim` in `setting`, its verdict and fragility from the claim's rule on `ev`."""
    rule = CLAIMS[claim].rule
    return Entry(claim, setting, value, rule.verdict(ev), rule.fragile(ev), short, ev, rule.straddles(ev))


def x_text(r: float) -> str:
    """A ratio as printed: 2.0x, or "all gone" where the gated model has none left."""
    return "all gone" if r == math.inf else f"{r:.1f}x"


def iv_text(iv: Interval, spec: str = ".1f") -> str:
    """An interval's ends: [1.9, 2.2]."""
    return f"[{iv.low:{spec}}, {iv.high:{spec}}]"
