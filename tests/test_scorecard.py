"""The scorecard (minigate/course/scorecard/, lesson 08): each claim's rule at, just under and just over its thresholds,
the rule text stating the bar the function applies, fragile verdicts, the claim-level verdicts and the tally, and that
its numbers are the measured ones."""

import dataclasses
import json
import math
import re
from types import SimpleNamespace

import pytest
import torch

from minigate.analysis import published_measures
from minigate.course import ROOT
from minigate.course import scaling
from minigate.course import scorecard as sc
from minigate.course.prose import printed_text
from minigate.course.published import REPORTED_CLOSED
from minigate.course import release

EPS = 1e-6
Iv = sc.Interval


def point(x):
    return Iv(x, x, x)


def ev(twins, **kw):
    """Evidence on one seed's worth of numbers unless told otherwise (models=3: not fragile for being one model)."""
    return sc.Evidence({g: (iv if isinstance(iv, Iv) else point(iv)) for g, iv in twins.items()}, "test",
                       **{"models": 3, **kw})


def verdict(claim, evidence):
    return sc.CLAIMS[claim].rule.verdict(evidence)


# ── each rule at, just under and just over its thresholds ─────────────────────────────────────────────────

RATIO_BARS = {  # claim -> {twin: the bar for "reproduced"}, as the paper (or the report, or the course) sets it
    "f_attn": {"headwise": 0.467 / 0.073 / 2, "elementwise": 0.467 / 0.048 / 2},
    "m_act": {"headwise": 1053 / 98 / 2, "elementwise": 1053 / 94 / 2},
    "closed": {"headwise": 304_000 / 12.39 / 2, "elementwise": 304_000 / 12.39 / 2},
    "bos": {"headwise": 2.0, "elementwise": 2.0},
    "lr m_act": {"elementwise": 1053 / 94 / 2},
}


@pytest.mark.parametrize("claim", RATIO_BARS)
def test_a_ratio_rule_at_and_around_its_bar_and_at_no_change(claim):
    bars = RATIO_BARS[claim]
    both = lambda f: ev({g: f(b) for g, b in bars.items()}, symptom=point(1.0))
    assert verdict(claim, both(lambda b: Iv(b, b, 2 * b))) == "reproduced"  # the low end at the bar
    assert verdict(claim, both(lambda b: Iv(b, b * (1 - EPS), 2 * b))) == "partly"  # just under it
    assert verdict(claim, both(lambda b: Iv(2, 1 + EPS, 3))) == "partly"  # just clear of no change
    assert verdict(claim, both(lambda b: Iv(2, 1.0, 3))) == "within noise"  # no change inside the interval
    assert verdict(claim, both(lambda b: Iv(1, 1 - EPS, 1 + EPS))) == "within noise"
    assert verdict(claim, both(lambda b: Iv(0.9, 0.8, 1.0))) == "contradicted"  # the high end at no change
    assert verdict(claim, both(lambda b: point(1.0))) == "contradicted"  # no change at all is no reproduction
    if len(bars) == 2:  # every twin must clear a bar; the worse twin decides
        g, other = list(bars)
        mixed = ev({g: Iv(2 * bars[g], 2 * bars[g], 3 * bars[g]), other: Iv(0.9, 0.8, 0.95)}, symptom=point(1.0))
        assert verdict(claim, mixed) == "contradicted"
        mixed = ev({g: Iv(2 * bars[g], 2 * bars[g], 3 * bars[g]), other: Iv(1.5, 1.2, 2.0)}, symptom=point(1.0))
        assert verdict(claim, mixed) == "partly"


def test_each_twin_has_its_own_bar_from_the_paper():
    """F-Attn: 3.2x for the headwise twin, 4.9x for the elementwise one (Table 4, halved), not one shared bar."""
    e = ev({"headwise": Iv(3.5, 3.5, 4), "elementwise": Iv(4, 4, 5)}, symptom=point(0.05))
    assert verdict("f_attn", e) == "partly"  # 4.0 clears the headwise bar, not the elementwise one
    e = ev({"headwise": Iv(3.3, 3.3, 4), "elementwise": Iv(5, 5, 6)}, symptom=point(0.05))
    assert verdict("f_attn", e) == "reproduced"


@pytest.mark.parametrize("claim", RATIO_BARS)
def test_each_rule_text_states_the_bar_its_function_applies(claim):
    text = sc.CLAIMS[claim].rule.text
    for bar in set(RATIO_BARS[claim].values()):
        assert f"{bar:,.0f}x" in text if bar > 100 else (f"{bar:.1f}x" in text or f"{bar:.0f}x" in text), (bar, text)
    assert "partly above 1" in text and "contradicted at 1 or below" in text


def test_the_sink_rule_needs_none_left_for_reproduced():
    twins = {"headwise": 3, "elementwise": 3}  # baseline minus gated heads
    gone = ev(twins, gated={"headwise": point(0), "elementwise": point(0)}, symptom=point(3), unit="head")
    assert verdict("sink heads", gone) == "reproduced"
    one_left = dataclasses.replace(gone, gated={"headwise": point(0), "elementwise": Iv(0, 0, 1)})
    assert verdict("sink heads", one_left) == "partly"  # one resample keeps a head
    assert verdict("sink heads", dataclasses.replace(gone, twins={"headwise": Iv(1, 0, 2), "elementwise": point(3)})) \
        == "within noise"
    as_many = dataclasses.replace(gone, twins={"headwise": point(0), "elementwise": point(3)},
                                  gated={"headwise": point(3), "elementwise": point(0)})
    assert verdict("sink heads", as_many) == "contradicted"
    assert verdict("sink heads", dataclasses.replace(gone, symptom=Iv(0, 0, 1 - EPS))) == "not at this scale"
    assert verdict("sink heads", dataclasses.replace(gone, symptom=Iv(1, 1, 1))) == "reproduced"  # one head is some


def test_the_f_attn_rule_needs_a_sink_above_uniform():
    twins = {"headwise": 4.0, "elementwise": 5.0}
    assert verdict("f_attn", ev(twins, symptom=point(0.03))) == "reproduced"
    assert verdict("f_attn", ev(twins, symptom=point(0.03 - EPS))) == "not at this scale"


def test_the_bos_rule_needs_a_baseline_that_pays():
    twins = {"headwise": 3.0, "elementwise": 3.0}
    assert verdict("bos", ev(twins, symptom=Iv(0.1, 0.05, 0.2))) == "reproduced"
    assert verdict("bos", ev(twins, symptom=Iv(-0.01, -0.02, 0.0))) == "not at this scale"


def test_the_lr_loss_rule_is_half_the_papers_gap():
    bar = math.log(9.195 / 7.325) / 2  # Table 2 holds perplexities: the gap as a loss is 0.23 nats
    gap = lambda iv: ev({"elementwise": iv})
    assert verdict("lr loss", gap(Iv(1.0, bar, 1.2))) == "reproduced"
    assert verdict("lr loss", gap(Iv(1.0, bar - EPS, 1.2))) == "partly"
    assert verdict("lr loss", gap(Iv(0.5, EPS, 0.9))) == "partly"
    assert verdict("lr loss", gap(Iv(0.5, 0.0, 0.9))) == "within noise"
    assert verdict("lr loss", gap(Iv(-0.1, -0.2, 0.0))) == "contradicted"
    assert f"{bar:.2f} of {2 * bar:.2f}" in sc.CLAIMS["lr loss"].rule.text


def test_the_spike_rule():
    spikes = lambda base, gated: ev({"elementwise": base - gated}, symptom=point(base),
                                    gated={"elementwise": point(gated)})
    assert verdict("lr spikes", spikes(3, 0)) == "reproduced"
    assert verdict("lr spikes", spikes(3, 1)) == "partly"
    assert verdict("lr spikes", spikes(3, 3)) == "contradicted"
    assert verdict("lr spikes", spikes(0, 0)) == "not at this scale"


# ── fragile verdicts ────────────────────────────────────────────────────────────────────────────────────────

def fragile(claim, evidence):
    return sc.CLAIMS[claim].rule.fragile(evidence)


def test_a_verdict_on_one_model_is_fragile():
    twins = {"headwise": 3.0, "elementwise": 3.0}
    assert fragile("m_act", ev(twins)) == ()
    assert fragile("m_act", ev(twins, models=1)) == ("one model",)


def test_a_verdict_that_turns_on_one_head_is_fragile():
    one = ev({"headwise": -1, "elementwise": -1}, gated={"headwise": point(2), "elementwise": point(2)},
             symptom=point(1), unit="head")  # 1 -> 2 / 2 of 8, the copy models
    assert verdict("sink heads", one) == "contradicted" and fragile("sink heads", one) == ("one head",)
    gone = ev({"headwise": 1, "elementwise": 1}, gated={"headwise": point(0), "elementwise": point(0)},
              symptom=point(1), unit="head")  # 1 -> 0 / 0, the induction models
    assert verdict("sink heads", gone) == "reproduced" and fragile("sink heads", gone) == ("one head",)
    four = ev({"headwise": 4, "elementwise": 4}, gated={"headwise": point(2), "elementwise": point(2)},
              symptom=point(6), unit="head")  # 6 -> 2 / 2, the code models
    assert fragile("sink heads", four) == ()


def test_a_verdict_within_10_percent_of_a_bar_is_fragile():
    bar = 0.467 / 0.073 / 2  # 3.20x: seed 2's headwise raw F-Attn ratio was 3.16x
    near = ev({"headwise": Iv(3.16, 3.16, 3.3), "elementwise": Iv(6, 6, 7)}, symptom=point(0.05))
    assert verdict("f_attn", near) == "partly" and fragile("f_attn", near) == ("margin under 10%",)
    just_clear = ev({"headwise": Iv(bar * 1.1 + EPS, bar * 1.1 + EPS, 4), "elementwise": Iv(6, 6, 7)},
                    symptom=point(0.05))
    assert verdict("f_attn", just_clear) == "reproduced" and fragile("f_attn", just_clear) == ()
    near_one = ev({"headwise": Iv(1.05, 1.05, 1.2), "elementwise": Iv(2, 2, 2.5)}, symptom=point(0.05))
    assert "margin under 10%" in fragile("f_attn", near_one)  # 1.05x: barely the right way
    no_sink = ev({"headwise": 2.0, "elementwise": 2.0}, symptom=point(0.0295))
    assert verdict("f_attn", no_sink) == "not at this scale" and fragile("f_attn", no_sink) == ("margin under 10%",)


def test_a_verdict_that_one_seed_decides_is_fragile():
    seeds = [ev({"headwise": r, "elementwise": 3.0}, models=1) for r in (2.0, 2.2, 0.9)]
    combined = sc.combine(seeds, "3 seeds")
    assert combined.twins["headwise"] == Iv(2.0, 0.9, 2.2) and combined.models == 3
    assert verdict("m_act", combined) == "within noise"  # one seed the wrong way: no verdict, nothing to be fragile
    seeds[2] = ev({"headwise": 1.2, "elementwise": 3.0}, models=1)
    combined = sc.combine(seeds, "3 seeds")
    assert verdict("m_act", combined) == "partly" and fragile("m_act", combined) == ()
    up = [ev({"headwise": r, "elementwise": 6.0}, models=1) for r in (6.0, 6.5, 5.0)]  # one seed short of 5.37x
    combined = sc.combine(up, "3 seeds")
    assert verdict("m_act", combined) == "partly"
    assert fragile("m_act", combined) == ("one seed decides", "margin under 10%")


def test_a_within_noise_verdict_is_never_fragile():
    assert fragile("m_act", ev({"headwise": Iv(1.5, 0.9, 2.0), "elementwise": 3.0}, models=1)) == ()


# ── entries, claim verdicts, the tally ──────────────────────────────────────────────────────────────────────

def rows(**by_variant):
    """{variant: a Measurement-like row of a model with 8 heads} from (f_attn, excess, sink heads at T=64, m_act)."""
    return {v: SimpleNamespace(f_attn=f, f_attn_excess=x, sink_heads_64=s, heads=8, m_act=m)
            for v, (f, x, s, m) in by_variant.items()}


def test_seed_entries_take_the_range_over_the_seeds():
    good = rows(none=(0.9, 0.8, 4, 5000.0), headwise=(0.1, 0.05, 0, 200.0), elementwise=(0.1, 0.05, 0, 200.0))
    bad = rows(none=(0.9, 0.8, 4, 5000.0), headwise=(0.1, 0.05, 0, 200.0), elementwise=(0.1, 0.05, 0, 6000.0))
    e = {x.claim: x for x in sc.seed_entries("s", {0: good, 1: bad, 2: {"none": good["none"]}})}  # 2: incomplete
    assert e["m_act"].verdict == "within noise" and e["sink heads"].verdict == "reproduced"
    assert e["m_act"].value == "5000 -> 200 / 200: 25.0x [25.0, 25.0] / 25.0x [0.8, 25.0] (2 seeds)"
    assert e["sink heads"].value == "4 -> 0 / 0 of 8; baseline - gated [4, 4] / [4, 4] (2 seeds)"
    assert e["f_attn"].value.startswith("raw 9.0x [9.0, 9.0] / 9.0x [9.0, 9.0]; above uniform 16.0x")
    assert all(not x.fragile for x in e.values() if x.verdict != "within noise")


def test_seed_entries_take_a_pair_where_a_setting_trained_no_headwise_model():
    """A study point with a baseline and an elementwise model only (4x, l): one twin per claim; one seed is fragile."""
    pair = rows(none=(0.9, 0.8, 4, 5000.0), elementwise=(0.1, 0.05, 1, 500.0))
    e = {x.claim: x for x in sc.seed_entries("s", {0: pair, 1: {"none": pair["none"]}}, "4x: longer")}
    assert e["m_act"].value == "5000 -> 500: 10.0x [10.0, 10.0] (1 seed; 4x: longer)"
    assert e["sink heads"].value == "4 -> 1 of 8; baseline - gated [3, 3] (1 seed; 4x: longer)"
    assert all("one model" in x.fragile for x in e.values())


def crafted_windows(shares, maxima, n=40, seed=0):
    """Windows of n rows whose per-head shares scatter a little around `shares` (layer, head)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.tensor(shares, dtype=torch.float64)[None] + 0.01 * torch.randn(n, *torch.tensor(shares).shape,
                                                                               generator=g, dtype=torch.float64)
    m = torch.tensor(maxima, dtype=torch.float64)[None] * (1 + 0.05 * torch.rand(n, len(maxima), generator=g))
    return sc.Windows(shares=s, shares_64=s, maxima=m, uniform=0.05)


def test_windows_are_published_measures_window_by_window(tiny_model):
    """A model's Windows give back published_measures' F-Attn, M-Act and sink heads at T=64 on the same windows."""
    model = tiny_model(gate="G1")
    tokens = torch.randint(1, 64, (6, 80), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 0  # <bos>
    w, m = sc.measure_windows(model, tokens, batch_size=4), published_measures(model, tokens)
    assert w.shares.shape == w.shares_64.shape == (6, 2, 4) and w.maxima.shape == (6, 2)
    assert w.f_attn == pytest.approx(m.f_attn, rel=1e-6) and w.m_act == pytest.approx(m.m_act, rel=1e-6)
    assert w.sink_heads == m.sink_heads_64 and w.uniform == m.uniform
    assert not torch.equal(w.shares, w.shares_64)  # T=80: the first 64 queries are not all of them


def test_window_entries_bootstrap_the_windows():
    trio = {"none": crafted_windows([[0.6, 0.1], [0.4, 0.1]], [100.0, 200.0]),
            "headwise": crafted_windows([[0.1, 0.1], [0.1, 0.1]], [10.0, 20.0], seed=1),
            "elementwise": crafted_windows([[0.35, 0.1], [0.1, 0.1]], [150.0, 250.0], seed=2)}
    e = {x.claim: x for x in sc.window_entries("t", trio, "40 rows")}
    assert e["sink heads"].value.startswith("2 -> 0 / 1 of 4; baseline - gated [2, 2] / [1, 1] (40 rows)")
    assert e["sink heads"].verdict == "partly" and e["sink heads"].fragile == ("one model", "one head")
    assert e["m_act"].verdict == "contradicted" and e["m_act"].value.endswith("(halves of 40 rows)")
    assert e["f_attn"].verdict == "partly" and "above uniform" in e["f_attn"].value
    f = e["f_attn"].evidence.twins["headwise"]
    assert f.low < f.estimate < f.high and f.estimate == pytest.approx(0.3 / 0.1, abs=0.05)  # 0.01 scatter


def entry(claim, setting, verdict_, fragile_=()):
    return sc.Entry(claim, setting, "", verdict_, fragile_)


def test_a_claims_verdict_comes_from_its_robust_settings():
    card = [entry("f_attn", "paper", ""), entry("f_attn", "code", "partly"), entry("f_attn", "code-gpu", "partly"),
            entry("f_attn", "copy", "contradicted", ("one model",)),
            entry("m_act", "code", "partly"), entry("m_act", "code-gpu", "contradicted"),
            entry("closed", "code", "partly", ("one model",)), entry("closed", "copy", "reproduced", ("one model",)),
            entry("bos", "code", "contradicted", ("one model",)), entry("bos", "copy", "within noise", ("one model",)),
            entry("lr spikes", "lesson 08", "not at this scale", ("one model",)),
            entry("sink heads", "code", "reproduced"), entry("sink heads", "code-gpu", "reproduced")]
    assert sc.claim_verdicts(card) == {"sink heads": ("reproduced", False), "f_attn": ("partly", False),
                                       "m_act": (sc.MIXED, False), "lr spikes": ("not at this scale", True),
                                       "closed": ("partly", True), "bos": ("contradicted", True)}
    tally = sc.tally(card)  # each claim once, whatever its settings
    assert sum(tally.values()) == 6 and tally["partly"] == 2 and tally[sc.MIXED] == 1


def test_lines_print_each_claims_rule_beside_its_verdicts_and_mark_fragile_ones():
    card = [entry("f_attn", "paper", ""), entry("f_attn", "code", "partly"),
            entry("f_attn", "copy", "contradicted", ("one model", "one head")), entry("bos", "code", "contradicted")]
    text = sc.lines(card)
    rule = next(i for i, line in enumerate(text) if line.startswith("  rule: raw F-Attn"))
    assert text[rule - 1] == sc.CLAIMS["f_attn"].text
    assert any(line.startswith("  copy       contradicted*") and line.endswith("[* one model, one head]")
               for line in text)
    assert text.index("━━ " + sc.SOURCES["paper"]) < rule < text.index("━━ " + sc.SOURCES["course"])
    assert "━━ " + sc.SOURCES["reported"] not in text  # no claim of that source measured


def test_lr_entries():
    flat = lambda x: torch.full((16,), x, dtype=torch.float64) + torch.linspace(-0.05, 0.05, 16, dtype=torch.float64)
    maxima = lambda x: torch.full((8, 2), x, dtype=torch.float64) * torch.linspace(1, 1.1, 8)[:, None]
    calm = sc.LrRuns(spikes={"none": 0, "elementwise": 0}, finished={"none": True, "elementwise": True},
                     losses={"none": flat(6.5), "elementwise": flat(6.45)},
                     maxima={"none": maxima(1e4), "elementwise": maxima(3e4)})
    e = {x.claim: x for x in sc.lr_entries(calm)}
    assert {c: x.verdict for c, x in e.items()} == {"lr spikes": "not at this scale", "lr loss": "partly",
                                                    "lr m_act": "contradicted"}
    assert all("one model" in x.fragile for x in e.values())
    assert e["lr loss"].value.startswith("6.50 -> 6.45 nats: +0.05 [")  # under half the paper's 0.23 nats: partly
    rough = dataclasses.replace(calm, spikes={"none": 3, "elementwise": 0},
                                finished={"none": False, "elementwise": True},
                                losses={"none": flat(8.0), "elementwise": flat(6.0)})
    e = {x.claim: x for x in sc.lr_entries(rough)}
    assert e["lr spikes"].verdict == e["lr loss"].verdict == "reproduced"
    assert e["lr spikes"].value == "3 spikes -> 0; the baseline diverged"


# ── the card itself, on the shipped models and the stored seeds ─────────────────────────────────────────────

@pytest.fixture(scope="module")
def card():
    flat = lambda x: torch.full((8,), x, dtype=torch.float64) + torch.linspace(-0.05, 0.05, 8, dtype=torch.float64)
    lr = sc.LrRuns(spikes={"none": 0, "elementwise": 0}, finished={"none": True, "elementwise": True},
                   losses={"none": flat(6.5), "elementwise": flat(6.0)},
                   maxima={"none": torch.ones(4, 2, dtype=torch.float64), "elementwise": 2 * torch.ones(4, 2)})
    return sc.scorecard(lr)


@pytest.mark.slow
def test_the_scorecard_states_the_stored_measurements(card):
    """The code and code-gpu columns are data/seeds' numbers (seed 0: the shipped trio's measurements.json), the
    code-moe column the shipped pair measured again, window by window (checked against measurements.json)."""
    e = {(x.claim, x.setting): x for x in card}
    for setting, n_heads in (("code", 16), ("code-gpu", 48)):
        seeds = release.seed_rows(setting)
        s0 = seeds[0]
        assert e["m_act", setting].value.startswith(f"{s0['none'].m_act:.0f} -> ")
        assert e["sink heads", setting].value.startswith(f"{round(s0['none'].sink_rate_64 * n_heads)} -> ")
        ratios = [s[g].f_attn and s["none"].f_attn / s[g].f_attn for s in seeds.values() for g in ("headwise",)]
        assert f"raw {ratios[0]:.1f}x [{min(ratios):.1f}, {max(ratios):.1f}]" in e["f_attn", setting].value
        assert all(e[c, setting].evidence.models == len(seeds) for c in ("sink heads", "f_attn", "m_act"))
    study = scaling.largest(scaling.points())  # the study's setting with the largest effect, its seeds as stored
    assert e["m_act", "study"].value.endswith(f"; {study.name}: {study.about})")
    variants = set().union(*study.seeds.values())  # a trio, or a baseline and elementwise pair
    assert e["m_act", "study"].evidence.models == sum(set(r) == variants for r in study.seeds.values())
    stored = release.shipped_rows("code-moe")
    assert e["m_act", "code-moe"].value.startswith(f"{stored['none'].m_act:.0f} -> {stored['elementwise'].m_act:.0f}")
    assert {x.setting for x in card} == set(sc.SETTINGS) and {x.claim for x in card} == set(sc.CLAIMS)
    assert all(x.verdict in sc.VERDICTS for x in card if x.setting != "paper")
    assert all(x.verdict == "" for x in card if x.setting == "paper")


@pytest.mark.slow
def test_the_overrides_are_lesson_06s(card):
    """The <bos> costs are the ones lesson 06 prints (its stored outputs: baseline, headwise, elementwise code models),
    and the code verdict is the worse twin's: the headwise model pays clearly less, the elementwise within noise."""
    nb = json.loads((ROOT / "solutions" / "06_breaking_the_gates.ipynb").read_text())
    printed = printed_text(nb)
    cost = {n: re.search(rf"code-{n} +all layers +(\S+ \[\S+ \S+\])", printed).group(1)
            for n in ("baseline", "headwise", "elementwise")}
    e = {(x.claim, x.setting): x for x in card}
    assert e["bos", "code"].value.startswith(f"{cost['baseline']} -> {cost['headwise']} / {cost['elementwise']}")
    twins = e["bos", "code"].evidence.twins
    assert twins["headwise"].low > 1 and twins["elementwise"].low < 1 < twins["elementwise"].high
    assert e["bos", "code"].verdict == "within noise"


@pytest.mark.slow
def test_fragile_verdicts_are_marked(card):
    e = {(x.claim, x.setting): x for x in card}
    assert "one head" in e["sink heads", "copy"].fragile and "one head" in e["sink heads", "induction"].fragile
    assert all("one model" in x.fragile for x in card if x.setting in ("code-moe", "copy", "induction", "lesson 08")
               and x.verdict != "within noise")
    natural = [(c, s) for c in ("sink heads", "f_attn", "m_act") for s in ("code", "code-gpu")]
    assert [(c, s) for c, s in natural if e[c, s].fragile] == [("sink heads", "code")]  # a seed one head apart
    assert "one head" in e["sink heads", "code"].fragile


@pytest.mark.slow
def test_the_tally_counts_each_claim_once(card):
    tally = sc.tally(card)
    assert sum(tally.values()) == len(sc.CLAIMS)
    assert set(sc.claim_verdicts(card)) == set(sc.CLAIMS)


@pytest.mark.slow
def test_the_sources_are_kept_apart(card):
    assert {c.source for c in sc.CLAIMS.values()} == set(sc.SOURCES)
    assert sc.CLAIMS["closed"].source == "reported" and {sc.CLAIMS[c].source for c in ("bos", "lr m_act")} == {"course"}
    text = sc.lines(card)
    heads = [line for line in text if line.startswith("━━ ")]
    assert heads == [f"━━ {h}" for h in sc.SOURCES.values()]
    table = sc.table(card)
    assert [line for line in table[1:-1] if not line.startswith(" ")] == [h.split(" (")[0]
                                                                          for h in sc.SOURCES.values()]


def test_the_table_marks_each_setting_and_explain_gives_the_numbers():
    card = [entry("f_attn", "paper", ""), entry("f_attn", "code", "partly"),
            entry("f_attn", "copy", "contradicted", ("one model",)), entry("bos", "code", "within noise")]
    table = sc.table(card)
    assert table[0].split()[-2:] == ["code", "copy"]  # only the settings measured, in SETTINGS' order
    row = next(line for line in table if line.startswith("  " + sc.CLAIMS["f_attn"].short))
    assert row.split()[-3:] == ["partly", "~", "✗*"]  # the claim's own verdict (copy is fragile), then the marks
    assert "(not yet measured)" in next(line for line in table if sc.CLAIMS["m_act"].short in line)
    text, full = sc.explain(card, "f_attn"), sc.lines(card)
    start = full.index(sc.CLAIMS["f_attn"].text)
    assert full[start:start + len(text)] == text and text[-1] == "  => partly"  # the whole card is the claims in turn
    assert any(line.startswith("  copy       contradicted*") for line in text)
    with pytest.raises(KeyError, match="no claim 'F-Attn': the claims are sink heads, f_attn"):
        sc.explain(card, "F-Attn")


def test_docs_scorecard_states_the_rules_the_code_applies():
    doc = (ROOT / "docs" / "scorecard.md").read_text(encoding="utf-8")
    assert doc == sc.rules_markdown() + "\n", "docs/scorecard.md is stale: run python -m scripts.readme"
    assert all(f"Rule: {c.rule.text}." in doc for c in sc.CLAIMS.values()) and sc.LEGEND in doc


def test_the_paper_column_is_the_papers_table_4():
    e = {x.claim: x.value for x in sc.paper_entries()}
    assert e["f_attn"].startswith("0.467 -> 0.073 / 0.048: raw 6.4x / 9.7x")
    assert e["m_act"].startswith("1053 -> 98 / 94: 10.7x / 11.2x")
    assert e["closed"].startswith("24,536x") and e["lr loss"].startswith("perplexity 9.195 -> 7.325: 0.23 nats")
    assert math.isclose(REPORTED_CLOSED["gates=0"] / REPORTED_CLOSED["learned"], 24536, rel_tol=1e-4)


def test_the_readme_summary_links_the_scorecard():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"\[[^\]]*scorecard[^\]]*\]\(lessons/08_beyond_the_paper\.ipynb", readme, flags=re.I), \
        "the README's summary should link lesson 08's scorecard"
    lesson = (ROOT / "solutions" / "08_beyond_the_paper.ipynb").read_text(encoding="utf-8")
    assert "sc.scorecard(" in lesson and "## The scorecard" in lesson


def test_the_legend_states_how_twins_and_settings_combine():
    # worst(): a setting's verdict is its worse twin's; claim_verdicts(): fragile settings left out unless all are
    assert "worse gated twin" in sc.LEGEND and sc.MIXED in sc.LEGEND and "not fragile" in sc.LEGEND
    twins = lambda lo, hi: ev({"headwise": Iv((lo + hi) / 2, lo, hi), "elementwise": Iv(9.0, 8.0, 10.0)})
    assert verdict("m_act", twins(0.5, 0.9)) == "contradicted"  # one twin contradicted: so is the setting
    assert verdict("m_act", twins(1.5, 1.9)) == "partly"  # the other clears the bar: the worse one decides


def test_an_interval_across_the_reproduced_bar_reads_partly_and_is_marked():
    """code-gpu's headwise M-Act, 4.6x [2.7, 5.9] against a 5.4x bar: partly (the whole interval must pass a bar),
    marked ^ in the table and named in explain; an interval wholly past the bar is reproduced, unmarked."""
    iv = sc.Interval
    ev = sc.Evidence({"headwise": iv(4.6, 2.7, 5.9), "elementwise": iv(4.4, 3.1, 4.4)}, "3 seeds", models=3)
    e = sc.judged("m_act", "code-gpu", ev, "239 -> 52 / 54", "4.6x / 4.4x")
    assert (e.verdict, e.straddles) == ("partly", ("headwise",))
    assert any(line.endswith("[^ headwise reaches the bar]") for line in sc.explain([e], "m_act"))
    assert "~^" in next(line for line in sc.table([e]) if sc.CLAIMS["m_act"].short in line)
    clear = sc.judged("m_act", "code-gpu", sc.Evidence({"headwise": iv(6, 5.5, 6.5), "elementwise": iv(6, 5.7, 7)},
                                                       "3 seeds", models=3), "", "")
    assert (clear.verdict, clear.straddles) == ("reproduced", ())
    low = sc.judged("lr loss", "lesson 08", sc.Evidence({"elementwise": iv(0.1, 0.05, 0.15)}, "chunks"), "", "")
    assert (low.verdict, low.straddles) == ("partly", ("elementwise",))  # the gap rule's bar: 0.11 nats
