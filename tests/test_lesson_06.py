"""Lesson 06's checks, gate_override, predict_bos_cost and forbid_bos: answers written otherwise pass, shape errors
and a lone pair name the fix, any well-formed prediction is recorded, an answer that calls the library's overrides
is refused however they were imported; the references write the hooks the library does and agree with plain
computations on a shipped model. That the references pass and a stub falls back is tests/test_checks.py's, and that
each typical mistake earns its hint tests/test_check_mutations.py's, for every check."""

import sys

import pytest
import torch

import minigate
from minigate import ablation as ab
from minigate import overrides as ov
from minigate.course import checks
from minigate.course.checks import lesson06 as l6
from minigate.course.checks.lesson06 import _gate_override as G
from minigate.data import copy_task
from minigate.overrides import close_head, forbid_bos, force_layer, set_gates
from minigate.course import release


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
    model = release.shipped("copy-headwise")
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
    model = release.shipped("copy-baseline")
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


# ── the library's one-call answers are refused, however they were imported ──────────────────────────

ONE_CALL_OVERRIDES = [  # (label, a learner's gate_override that calls the library, the override it calls first)
    ("force_layer imported by name", lambda m, L, v, h=None: force_layer(m, L, v), "force_layer"),
    ("close_head imported by name", lambda m, L, v, h=None: close_head(m, L, h or 0, v), "close_head"),
    ("set_gates imported by name", lambda m, L, v, h=None: set_gates(m, v, [L]), "set_gates"),
    ("ov.force_layer / ov.close_head",
     lambda m, L, v, h=None: ov.force_layer(m, L, v) if h is None else ov.close_head(m, L, h, v), "close_head"),
    ("minigate.overrides.force_layer", lambda m, L, v, h=None: minigate.overrides.force_layer(m, L, v),
     "force_layer"),
    ("ov.Edit as the hook", lambda m, L, v, h=None: [(f"blocks.{L}.attn.hook_gate", ov.Edit("set", v, h))], "Edit"),
]


@pytest.mark.parametrize("label, answer, called", ONE_CALL_OVERRIDES, ids=[a[0] for a in ONE_CALL_OVERRIDES])
def test_gate_override_refuses_the_librarys_overrides_only_inside_the_answer(label, answer, called, capsys):
    """An answer that calls overrides.force_layer, close_head or set_gates (or returns their Edit hook) fails on the
    first case with the hint naming it, in one line; the refusal ends with the answer's run: the library and the
    reference, which writes the hook itself, still work and pass."""
    with pytest.raises(AssertionError):
        checks.gate_override(answer)
    out = capsys.readouterr().out
    assert out == f"✗ gate_override, case headwise, layer 1, head 2 = 0.0: {l6._override_hint(called)}\n", out
    assert sys.getprofile() is None  # nothing left behind
    assert ov.close_head(l6._gated_model(0, "headwise"), 1, 2)[0][0] == "blocks.1.attn.hook_gate"
    assert checks.gate_override(checks.reference_gate_override) is checks.reference_gate_override


def _learners_forbid_bos():
    def forbid_bos(model, layer, head=None):  # the learner's own, shadowing the library's name: calls it by path
        return minigate.overrides.forbid_bos(model, layer, head)
    return forbid_bos


ONE_CALL_FORBIDS = [
    ("imported by name", lambda m, L, h=None: forbid_bos(m, L, h)),
    ("ov.forbid_bos", lambda m, L, h=None: ov.forbid_bos(m, L, h)),
    ("the learner's forbid_bos calls minigate.overrides.forbid_bos", _learners_forbid_bos()),
]


@pytest.mark.parametrize("label, answer", ONE_CALL_FORBIDS, ids=[a[0] for a in ONE_CALL_FORBIDS])
def test_forbid_bos_refuses_the_librarys_forbid_bos_only_inside_the_answer(label, answer, capsys):
    with pytest.raises(AssertionError):
        checks.forbid_bos(answer)
    assert capsys.readouterr().out == f"✗ forbid_bos, case baseline, layer 2, head 1: {l6.FORBID_BOS_HINT}\n"
    assert sys.getprofile() is None
    assert checks.forbid_bos(checks.reference_forbid_bos) is checks.reference_forbid_bos


def test_the_refusal_restores_a_profile_function_set_before_the_check(capsys):
    def profiler(frame, event, arg):
        pass

    sys.setprofile(profiler)
    try:
        with pytest.raises(AssertionError, match="calls overrides.forbid_bos"):
            checks.forbid_bos(ov.forbid_bos)
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)


def test_the_references_write_the_hooks_the_library_does():
    """The references are the library's overrides written as hooks (so that the checks can refuse an answer that
    calls the library): the same hook points and the same logits, bit for bit, and a row with nothing but <bos>
    stays 0, as in overrides.forbid_bos."""
    x = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    for seed, gran in enumerate(["headwise", "elementwise"]):
        model = l6._gated_model(seed, gran)
        for layer, value, head in [(1, 0.0, 2), (0, 0.3, None), (2, 1.0, 3), (1, 0.25, 0)]:
            lib = ov.force_layer(model, layer, value) if head is None else ov.close_head(model, layer, head, value)
            ref = checks.reference_gate_override(model, layer, value, head)
            assert [n for n, _ in ref] == [n for n, _ in lib]
            assert torch.equal(model.run_with_hooks(x, fwd_hooks=ref), model.run_with_hooks(x, fwd_hooks=lib))
    model = l6._bos_model(2, n_heads=6, n_kv_heads=3, head_dim=4)
    for layer, head in [(0, None), (2, 5), (1, 0)]:
        lib, ref = ov.forbid_bos(model, layer, head), checks.reference_forbid_bos(model, layer, head)
        assert [n for n, _ in ref] == [n for n, _ in lib]
        assert torch.equal(model.run_with_hooks(x, fwd_hooks=ref), model.run_with_hooks(x, fwd_hooks=lib))
    pattern = torch.zeros(1, 2, 3, 3)
    pattern[..., 0] = 1.0  # every query on <bos> alone: nothing left to renormalise over
    (_, forbid), = checks.reference_forbid_bos(model, 0)
    assert torch.equal(forbid(pattern, None), ov.forbid_bos(model, 0)[0][1](pattern))
