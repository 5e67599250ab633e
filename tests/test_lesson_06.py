"""Lesson 06's checks, gate_override, predict_bos_cost and forbid_bos: answers written otherwise pass, shape errors
and a lone pair name the fix, any well-formed prediction is recorded; and the references agree with plain computations
on a shipped model. That the references pass and a stub falls back is tests/test_checks.py's, and that each typical
mistake earns its hint tests/test_check_mutations.py's, for every check."""

import pytest
import torch

import minigate
from minigate import ablation as ab
from minigate.course import checks
from minigate.course.checks.lesson06 import _gate_override as G
from minigate.data import copy_task


def test_gate_override_in_place_edit_that_returns_passes(capsys):
    def fn(model, layer, value, head=None):
        def hook(gate, hook):
            if head is None:
                gate.fill_(value)
            else:
                gate[:, :, head] = value
            return gate
        return [(f"blocks.{layer}.attn.hook_gate", hook)]
    assert checks.gate_override(fn) is fn


def test_gate_override_shape_errors_name_the_fix(capsys):
    def four_d(model, layer, value, head=None):
        def hook(gate, hook):
            gate = gate.clone()
            gate[:, :, head if head is not None else slice(None), :] = value  # fails on headwise (3-d) gates
            return gate
        return [(f"blocks.{layer}.attn.hook_gate", hook)]
    with pytest.raises(AssertionError):
        checks.gate_override(four_d)
    assert "gate[:, :, head] picks the head in both" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        checks.gate_override(lambda m, L, v, h=None: G(m, L, v, h)[0])  # one pair, not a list
    assert "list of (hook name, hook function) pairs" in capsys.readouterr().out


def test_predict_bos_cost_records_any_well_formed_prediction(capsys):
    """A prediction has no right answer: the reference (the paper's story) and any other finite, non-negative
    number of nats per copy model are recorded, not "passed" (a guess cannot be wrong), as ints, floats or one-element
    tensors, in any key order; grading and the build read the recorded line as they read a passed one."""
    story = checks.reference_predict_bos_cost()
    assert set(story) == {"baseline", "headwise", "elementwise"}
    assert story["headwise"] < story["baseline"] / 2 and story["elementwise"] < story["baseline"] / 2  # gated: less
    for prediction in (story, {"elementwise": 12, "headwise": 7, "baseline": 10},
                       {"baseline": torch.tensor(3.0), "headwise": 0.0, "elementwise": torch.tensor([2.5])}):
        fn = lambda p=prediction: p
        assert checks.predict_bos_cost(fn) is fn
    out = capsys.readouterr().out
    assert out.count(f"✓ predict_bos_cost: {checks.lesson06.RECORDED}") == 3 and "passed" not in out
    assert [m.group(1) for m in checks.PASSED_RE.finditer(out)] == ["predict_bos_cost"] * 3


def test_closing_the_copy_head_with_the_reference_zeroes_its_output():
    model = minigate.shipped("copy-headwise")
    x = copy_task(4, seed=3)[:, :-1]
    name = "blocks.0.attn.hook_z_gated"
    with model.hooks(checks.reference_gate_override(model, 0, 0.0, head=3)):
        _, cache = model.run_with_cache(x, names_filter=name)
    z = cache[name]  # (batch, pos, head, d_head)
    assert z[:, :, 3].abs().max() == 0 and z[:, :, :3].abs().max() > 0


def test_forbid_bos_reference_and_equivalent_answers_pass(capsys):
    def on_the_scores(model, layer, head=None):  # -inf before the softmax is the same renormalisation
        def hook(scores, hook):
            scores = scores.clone()
            scores[:, slice(None) if head is None else head, 1:, 0] = float("-inf")
            return scores
        return [(f"blocks.{layer}.attn.hook_attn_scores", hook)]

    def in_place(model, layer, head=None):  # edits the pattern itself and returns nothing: that works too
        def hook(pattern, hook):
            h = slice(None) if head is None else head
            pattern[:, h, 1:, 0] = 0
            pattern[:, h] /= pattern[:, h].sum(-1, keepdim=True)
        return [(f"blocks.{layer}.attn.hook_pattern", hook)]

    assert checks.forbid_bos(on_the_scores) is on_the_scores and checks.forbid_bos(in_place) is in_place


def test_forbid_bos_reference_on_the_copy_model_moves_the_weight_off_bos():
    model = minigate.shipped("copy-baseline")
    x = copy_task(4, seed=3)[:, :-1]
    name = "blocks.0.attn.hook_pattern"
    _, clean = model.run_with_cache(x, names_filter=name)
    with model.hooks(checks.reference_forbid_bos(model, 0, head=3)):
        _, cache = model.run_with_cache(x, names_filter=name)
    before, after = clean[name], cache[name]  # (batch, head, query, key)
    assert before[:, 3, 1:33, 0].mean() > 0.5  # the sink head parks on <bos> on the random half (lesson 01)
    assert (after[:, 3, 1:, 0] == 0).all() and (after[:, 3, 0, 0] == 1).all()
    torch.testing.assert_close(after.sum(-1), torch.ones_like(after.sum(-1)))
    torch.testing.assert_close(after[:, [0, 1, 2]], before[:, [0, 1, 2]])
    forbidden = ab.perplexity(model, copy_task(8, seed=3), checks.reference_forbid_bos(model, 0, 3), ci=False)
    assert forbidden.loss > ab.perplexity(model, copy_task(8, seed=3), ci=False).loss + 1  # lesson 01: it matters
