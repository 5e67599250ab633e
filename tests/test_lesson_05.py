"""Lesson 05's checks, gate_by_phase and first_rest_ratio: an answer written otherwise passes, and the references agree
with the package's gate_analysis.gate_scores and GateScores.first_vs_rest(ci=True) on a shipped
model. That the references pass and a stub falls back is tests/test_checks.py's, and that each typical mistake
earns its hint tests/test_check_mutations.py's, for every check."""

import pytest
import torch

from minigate.course import checks
from minigate.data import copy_task
from minigate.gate_analysis import gate_scores
from minigate.course import release


def test_gate_by_phase_an_answer_with_run_with_hooks_passes(capsys):
    def fn(model, tokens, layer, n_random):
        seen = {}
        model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_gate",
                                                 lambda g, hook: seen.__setitem__("g", g))])
        g = seen["g"] if seen["g"].dim() == 3 else seen["g"].mean(-1)  # (batch, pos, head)
        return torch.stack([g[:, 1:n_random + 1].mean((0, 1)), g[:, n_random + 1:].mean((0, 1))])
    assert checks.gate_by_phase(fn) is fn


@pytest.mark.parametrize("name", ["copy-headwise", "copy-elementwise"])
def test_gate_by_phase_reference_matches_gate_scores(name):
    model = release.shipped(name)
    x = copy_task(3, seed=3)[:, :-1]  # (3, 64): <bos>, 32 random, |, the copy
    g = gate_scores(model, x).head_averaged().values.reshape(3, x.shape[1], model.cfg.n_layers, -1)  # b pos L head
    want = torch.stack([g[:, 1:33, 1].mean((0, 1)), g[:, 33:, 1].mean((0, 1))])
    torch.testing.assert_close(checks.reference_gate_by_phase(model, x, 1, 32), want)


def test_gate_by_phase_copy_headwise_switches_by_phase():
    """The shipped copy model's layer 0: its copy head is shut on the random part and open on the copy part."""
    model = release.shipped("copy-headwise")
    random, copy = checks.reference_gate_by_phase(model, copy_task(64, seed=3)[:, :-1], 0, 32)
    h = int(random.argmin())
    assert random[h] < 0.1 < 0.8 < copy[h]


def test_first_rest_ratio_reference_is_first_vs_rest_with_ci():
    model = release.shipped("copy-elementwise")
    g = gate_scores(model, [row[: 20 + i] for i, row in enumerate(copy_task(16, seed=3))])  # unequal lengths
    per_prompt = [g.values[g.prompt == i].flatten(1).mean(1) for i in range(g.n_prompts)]
    fr = g.first_vs_rest(ci=True)
    ratio, low, high, gated_more = checks.reference_first_rest_ratio(per_prompt)
    assert gated_more is bool(high < 1)
    assert ratio.item() == pytest.approx(fr.ratio.item(), rel=1e-5)
    assert (low.item(), high.item()) == pytest.approx((fr.ci["ratio"][0].item(), fr.ci["ratio"][1].item()), rel=1e-5)
    assert low < ratio < high


def test_first_rest_ratio_planted_cases():
    """The check's planted cases: with no effect (a true ratio of 1) the sample ratio is below 1, the interval over
    prompts reaches past 1 and one over tokens does not, so only the prompt bootstrap gives the planted verdict; with
    the first token gated less, the whole interval lies above 1."""
    from minigate.course.checks import lesson05 as l5

    none = l5._no_effect(l5.NO_EFFECT_SEED)
    ratio, low, high, gated_more = checks.reference_first_rest_ratio(none, 3)
    assert ratio < 0.95 and low < 1 < high and not gated_more
    _, _, token_high, token_verdict = l5._first_rest_ratio(none, 3, unit="token")
    assert token_high < 1 and token_verdict
    assert all(p[0] == 0.5 for p in none)  # the first token's gate: the same in every prompt, as <bos>'s
    ratio, low, high, gated_more = checks.reference_first_rest_ratio(l5._prompts(4, 30, 20, first=1.6), 4)
    assert low > 1 and not gated_more
