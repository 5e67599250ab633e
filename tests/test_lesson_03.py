"""Lesson 03's check, sink_onset: the reference passes, a wrong step no typical mistake explains gets the generic
hint, a stub falls back, and on the shipped code models' histories the reference finds the baseline's sink and none
in the gated twins. That each typical mistake earns its hint is tests/test_check_mutations.py's, for every check."""

import pytest

import minigate
from minigate.analysis import uniform_first_token_share
from minigate.course import checks


def test_reference_passes_and_is_returned(capsys):
    assert checks.sink_onset(checks.reference_sink_onset) is checks.reference_sink_onset
    assert "✓ sink_onset: passed (3 cases)" in capsys.readouterr().out


def test_a_loop_from_the_end_passes(capsys):
    def fn(steps, values, threshold):
        onset = None
        for step, value in zip(reversed(steps), reversed(values), strict=True):
            if value <= threshold:
                return onset
            onset = step
        return onset
    assert checks.sink_onset(fn) is fn


def test_an_unrecognised_wrong_step_gets_the_generic_hint(capsys):
    def late(steps, values, threshold):  # one tracked step late
        onset = checks.reference_sink_onset(steps, values, threshold)
        return None if onset is None else steps[min(steps.index(onset) + 1, len(steps) - 1)]
    with pytest.raises(AssertionError):
        checks.sink_onset(late)
    assert "max |difference| = 250 at threshold number 1 (yours is higher)" in capsys.readouterr().out


def test_stub_falls_back_to_the_reference(capsys):
    def stub(steps, values, threshold):
        raise NotImplementedError()
    assert checks.sink_onset(stub) is checks.reference_sink_onset
    assert "sink_onset not implemented yet" in capsys.readouterr().out


def test_the_shipped_baseline_has_an_onset_and_its_gated_twins_none():
    """F-Attn above uniform at T=512 settles above 0.03 in code-baseline during training, never in the gated twins."""
    uniform = uniform_first_token_share(512)
    onsets = {}
    for name in ("baseline", "headwise", "elementwise"):
        metrics = minigate.shipped_run(f"code-{name}")["history"]["metrics"]
        steps, excess = [m["step"] for m in metrics], [m["f_attn"] - uniform for m in metrics]
        onsets[name] = checks.reference_sink_onset(steps, excess, 0.03)
    assert onsets["baseline"] is not None and onsets["baseline"] < 4000
    assert onsets["headwise"] is None and onsets["elementwise"] is None
