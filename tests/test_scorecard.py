"""The scorecard (minigate/scorecard.py, lesson 08): its verdict rules, and that its numbers are the measured ones."""

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest

from minigate import measure
from minigate import scorecard as sc
from minigate.course import ROOT


def rows(**by_variant):
    """{variant: a Measures-like row} from (f_attn, excess, sinks at T=64, m_act) tuples."""
    return {v: SimpleNamespace(f_attn=f, f_attn_excess=x, sink_rate_64=s, sink_rate=s, m_act=m)
            for v, (f, x, s, m) in by_variant.items()}


def test_verdict_rules():
    assert sc.verdict([8.0, 6.0], 5) == "reproduced"
    assert sc.verdict([8.0, 2.0], 5) == "partly"  # the worse twin decides
    assert sc.verdict([8.0, 0.9], 5) == "contradicted"
    assert sc.verdict([8.0, 1.0], 5) == "contradicted"  # no change is no reproduction
    assert sc.verdict([8.0, 6.0], 5, absent=True) == "not at this scale"
    assert sc.worst(["partly", "reproduced"]) == "partly"
    assert sc.worst(["partly", "contradicted", "not at this scale"]) == "contradicted"


def test_measured_entries_follow_the_numbers():
    e = {x.claim: x for x in sc.measured_entries("s", rows(none=(0.4, 0.3, 0.25, 100.0),
                                                           headwise=(0.05, 0.03, 0.0, 9.0),
                                                           elementwise=(0.2, 0.1, 0.125, 120.0)), 8)}
    assert e["sink heads"].value == "2 -> 0 / 1 of 8" and e["sink heads"].verdict == "partly"
    assert e["f_attn"].value.startswith("8.0x / 2.0x (10.0x / 3.0x)") and e["f_attn"].verdict == "partly"
    assert e["m_act"].value == "100 -> 9 / 120: 11.1x / 0.8x" and e["m_act"].verdict == "contradicted"
    none = {x.claim: x.verdict for x in sc.measured_entries("s", rows(none=(0.05, 0.01, 0.0, 10.0),
                                                                      headwise=(0.04, 0.005, 0.0, 5.0)), 8)}
    assert none["sink heads"] == none["f_attn"] == "not at this scale"  # the baseline has no sink to remove
    gone = {x.claim: x.verdict for x in sc.measured_entries("s", rows(none=(0.9, 0.8, 0.5, 5000.0),
                                                                      headwise=(0.1, 0.05, 0.0, 200.0)), 8)}
    assert gone == {"sink heads": "reproduced", "f_attn": "reproduced", "m_act": "reproduced"}


def test_seed_entries_take_the_worst_seed_and_the_range():
    good = rows(none=(0.9, 0.8, 0.5, 5000.0), headwise=(0.1, 0.05, 0.0, 200.0), elementwise=(0.1, 0.05, 0.0, 200.0))
    bad = rows(none=(0.9, 0.8, 0.5, 5000.0), headwise=(0.1, 0.05, 0.0, 200.0), elementwise=(0.1, 0.05, 0.0, 6000.0))
    e = {x.claim: x for x in sc.seed_entries({0: good, 1: bad, 2: {"none": good["none"]}}, 8)}  # seed 2 incomplete
    assert e["m_act"].verdict == "contradicted" and e["sink heads"].verdict == "reproduced"
    assert e["m_act"].value == "2 seeds: 25.0x / 0.8x-25.0x"
    assert e["sink heads"].value == "2 seeds: 4 -> 0 / 0 of 8"


def test_lr_entries():
    calm = sc.LrRuns(spikes={"none": 0, "gated": 0}, final={"none": 6.5, "gated": 6.0}, m_act={"none": 10, "gated": 30},
                     finished={"none": True, "gated": True})
    v = {e.claim: e.verdict for e in sc.lr_entries(calm)}
    assert v == {"lr spikes": "not at this scale", "lr loss": "reproduced", "lr m_act": "contradicted"}
    rough = sc.LrRuns(spikes={"none": 3, "gated": 0}, final={"none": 6.5, "gated": 6.45},
                      m_act={"none": 90, "gated": 30}, finished={"none": False, "gated": True})
    v = {e.claim: e.verdict for e in sc.lr_entries(rough)}
    assert v == {"lr spikes": "reproduced", "lr loss": "partly", "lr m_act": "reproduced"}
    both = sc.LrRuns(spikes={"none": 3, "gated": 3}, final={"none": 6.5, "gated": 6.0}, m_act={"none": 9, "gated": 3},
                     finished={"none": True, "gated": True})
    assert sc.lr_entries(both)[0].verdict == "contradicted"  # a gated model that spikes as often removes nothing
    fewer = dataclasses.replace(both, spikes={"none": 3, "gated": 1})
    assert sc.lr_entries(fewer)[0].verdict == "partly"
    diverged = dataclasses.replace(both, spikes={"none": 0, "gated": 0}, finished={"none": False, "gated": True})
    e = sc.lr_entries(diverged)[0]
    assert e.verdict == "reproduced" and e.value == "0 spikes -> 0; the baseline diverged"


@pytest.fixture(scope="module")
def card():
    lr = sc.LrRuns(spikes={"none": 0, "gated": 0}, final={"none": 6.5, "gated": 6.0}, m_act={"none": 1, "gated": 2},
                   finished={"none": True, "gated": True})
    return sc.scorecard(lr)


def test_the_scorecard_states_the_stored_measurements(card):
    """The code and code-moe columns are measurements.json's numbers, the seeds column data/seeds/code.json's."""
    e = {(x.claim, x.setting): x for x in card}
    for setting, preset in (("code", "code"), ("code-moe", "code-moe")):
        stored = measure.shipped_rows(preset)
        assert e["m_act", setting].value.startswith(f"{stored['none'].m_act:.0f} -> ")
        heads = {v: round(r.sink_rate_64 * 16) for v, r in stored.items()}
        assert e["sink heads", setting].value.startswith(f"{heads['none']} -> ")
        for g in ("headwise", "elementwise"):
            if g in stored:
                assert f"{stored['none'].f_attn / stored[g].f_attn:.1f}x" in e["f_attn", setting].value
    n_seeds = len([s for s, r in measure.seed_rows("code").items() if len(r) == 3])
    assert all(x.value.startswith(f"{n_seeds} seeds") for x in card if x.setting == "seeds")
    assert {x.setting for x in card} == set(sc.SETTINGS) and {x.claim for x in card} == set(sc.CLAIMS)
    assert all(x.verdict in sc.VERDICTS for x in card if x.setting != "paper")
    assert all(x.verdict == "" for x in card if x.setting == "paper")


def test_the_paper_column_is_the_papers_table_4():
    e = {x.claim: x.value for x in sc.paper_entries()}
    assert e["f_attn"] == "0.467 -> 0.073 / 0.048: 6.4x / 9.7x" and e["m_act"] == "1053 -> 98 / 94: 10.7x / 11.2x"
    assert math.isclose(sc.PAPER["closed"]["gates=0"] / sc.PAPER["closed"]["learned"], 24536, rel_tol=1e-4)


def test_lines_print_every_claim_once(card):
    text = "\n".join(sc.lines(card))
    for claim in sc.CLAIMS.values():
        assert text.count(claim) == 1


def test_the_readme_summary_links_the_scorecard():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"\[[^\]]*scorecard[^\]]*\]\(lessons/08_beyond_the_paper\.ipynb", readme, flags=re.I), \
        "the README's summary should link lesson 08's scorecard"
    lesson = (ROOT / "solutions" / "08_beyond_the_paper.ipynb").read_text(encoding="utf-8")
    assert "sc.scorecard(" in lesson and "## The scorecard" in lesson
