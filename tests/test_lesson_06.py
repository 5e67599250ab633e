"""Lesson 06's new checks, gate_override and rank_layers: the reference passes, each typical mistake earns its
hint, a stub falls back to the reference; and the references agree with plain computations on a shipped model."""

import math

import pytest

import minigate
from minigate import ablation as ab
from minigate.course import checks
from minigate.data import copy_task

G = checks._gate_override
R = checks._rank_layers


def test_gate_override_reference_passes_and_is_returned(capsys):
    fn = lambda model, layer, value, head=None: checks.reference_gate_override(model, layer, value, head)
    assert checks.gate_override(fn) is fn
    assert "✓ gate_override: passed (5 cases)" in capsys.readouterr().out


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


@pytest.mark.parametrize("kw, hint", [
    (dict(index="last axis"), "gate[..., head] indexes the last axis"),
    (dict(index="second axis"), "sets a position"),
    (dict(every_layer=True), "acts on every layer"),
    (dict(returns=False), "leaves the model unchanged"),
    (dict(point="hook_gate_logits"), "gate *logits*"),
    (dict(whole_layer=True), "the whole layer"),
])
def test_gate_override_each_mistake_gets_its_hint(kw, hint, capsys):
    with pytest.raises(AssertionError):
        checks.gate_override(lambda m, L, v, h=None: G(m, L, v, h, **kw))
    assert hint in capsys.readouterr().out


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


def test_stubs_fall_back_to_the_references(capsys):
    def stub(*args):
        raise NotImplementedError()
    assert checks.gate_override(stub) is checks.reference_gate_override
    assert checks.rank_layers(stub) is checks.reference_rank_layers
    out = capsys.readouterr().out
    assert "gate_override not implemented yet" in out and "rank_layers not implemented yet" in out


def test_closing_the_copy_head_with_the_reference_zeroes_its_output():
    model = minigate.shipped("copy-headwise")
    x = copy_task(4, seed=3)[:, :-1]
    name = "blocks.0.attn.hook_z_gated"
    with model.hooks(checks.reference_gate_override(model, 0, 0.0, head=3)):
        _, cache = model.run_with_cache(x, names_filter=name)
    z = cache[name]  # (batch, pos, head, d_head)
    assert z[:, :, 3].abs().max() == 0 and z[:, :, :3].abs().max() > 0


def test_rank_layers_reference_passes_and_is_returned(capsys):
    fn = lambda r, k="open": list(checks.reference_rank_layers(r, k))
    assert checks.rank_layers(fn) is fn
    assert "✓ rank_layers: passed (3 cases)" in capsys.readouterr().out


@pytest.mark.parametrize("kw, hint", [
    (dict(descending=False), "descending"),
    (dict(pairs=False), "(layer, damage) pairs"),
    (dict(damage="ppl difference"), "not ppl - ppl_learned"),
    (dict(damage="ppl ratio"), "not the ratio itself"),
    (dict(damage="absolute"), "subtract results['learned'].loss"),
    (dict(pattern="prefix"), "is a head condition"),
    (dict(pattern="one digit"), "two digits"),
])
def test_rank_layers_each_mistake_gets_its_hint(kw, hint, capsys):
    with pytest.raises(AssertionError):
        checks.rank_layers(lambda r, k="open": R(r, k, **kw))
    assert hint in capsys.readouterr().out


def test_rank_layers_reference_on_a_real_sweep_equals_a_plain_computation():
    model = minigate.shipped("copy-elementwise")
    rows = copy_task(8, seed=3)
    results = ab.sweep(model, rows, {"learned": [], **ab.layer_conditions(model)}, ci=False, progress=False)
    ranked = checks.reference_rank_layers(results, "closed")
    want = sorted(((L, math.log(results[f"L{L} closed"].ppl / results["learned"].ppl)) for L in range(2)),
                  key=lambda p: -p[1])
    assert [L for L, _ in ranked] == [L for L, _ in want]
    assert all(d == pytest.approx(w, abs=1e-9) for (_, d), (_, w) in zip(ranked, want, strict=True))
