"""Lesson 05's new checks, read_gates and first_rest_ratio: the reference passes, each typical mistake earns its
hint, a stub falls back to the reference, and the references agree with the package's gates.gate_scores and
GateScores.first_vs_rest(ci=True) on a shipped model."""

import pytest
import torch

import minigate
from minigate.course import checks
from minigate.data import copy_task
from minigate.gates import gate_scores

R, F = checks._read_gates, checks._first_rest_ratio


def test_read_gates_reference_passes_and_is_returned(capsys):
    fn = lambda model, tokens, average_dims=False: checks.reference_read_gates(model, tokens, average_dims).clone()
    assert checks.read_gates(fn) is fn
    assert "✓ read_gates: passed (5 cases)" in capsys.readouterr().out


def test_read_gates_an_answer_with_run_with_hooks_passes(capsys):
    def fn(model, tokens, average_dims=False):
        seen = {}
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("attn.hook_gate"),
                                                 lambda g, hook: seen.__setitem__(hook.name, g))])
        g = torch.stack([seen[f"blocks.{L}.attn.hook_gate"] for L in range(model.cfg.n_layers)], dim=2)
        return g.mean(-1) if average_dims and g.dim() == 5 else g
    assert checks.read_gates(fn) is fn


@pytest.mark.parametrize("kw, hint", [
    (dict(hook="hook_gate_logits"), "gate *logits*"),
    (dict(order="sorted"), "blocks.10 before blocks.2"),
    (dict(order="reversed"), "reverse order"),
    (dict(layer_axis=1), "stack the layers on axis 2"),
    (dict(average="none"), "average_dims=True asks for the mean"),
    (dict(average="last"), "a headwise gate has no d_head axis"),
    (dict(average="heads"), "averages over the heads"),
])
def test_read_gates_each_mistake_gets_its_hint(kw, hint, capsys):
    with pytest.raises(AssertionError):
        checks.read_gates(lambda model, tokens, average_dims=False: R(model, tokens, average_dims, **kw))
    out = capsys.readouterr().out
    assert hint in out and out.startswith("✗ read_gates"), out


def test_read_gates_stub_falls_back_to_the_reference(capsys):
    def stub(model, tokens, average_dims=False):
        raise NotImplementedError()
    assert checks.read_gates(stub) is checks.reference_read_gates
    assert "read_gates not implemented yet" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["copy-headwise", "copy-elementwise"])
def test_read_gates_reference_matches_gate_scores(name):
    model = minigate.shipped(name)
    x = copy_task(3, seed=3)[:, :-1]
    g = gate_scores(model, x)
    got = checks.reference_read_gates(model, x)  # (batch, pos, layer, head[, d_head])
    torch.testing.assert_close(got.flatten(0, 1), g.values)
    torch.testing.assert_close(checks.reference_read_gates(model, x, True).flatten(0, 1), g.head_averaged().values)


def test_first_rest_ratio_reference_passes_and_is_returned(capsys):
    assert checks.first_rest_ratio(checks.reference_first_rest_ratio) is checks.reference_first_rest_ratio
    assert "✓ first_rest_ratio: passed (3 cases)" in capsys.readouterr().out


@pytest.mark.parametrize("kw, hint", [
    (dict(invert=True), "upside down"),
    (dict(first_in_rest=True), "includes the first token"),
    (dict(ratio="per_prompt"), "mean of per-prompt ratios"),
    (dict(ratio="prompt_means"), "weights every prompt equally"),
    (dict(unit="token"), "resample whole prompts"),
    (dict(fixed_seed=True), "ignores `seed`"),
])
def test_first_rest_ratio_each_mistake_gets_its_hint(kw, hint, capsys):
    with pytest.raises(AssertionError):
        checks.first_rest_ratio(lambda per_prompt, seed=0: F(per_prompt, seed, **kw))
    out = capsys.readouterr().out
    assert hint in out and out.startswith("✗ first_rest_ratio"), out


def test_first_rest_ratio_stub_falls_back_to_the_reference(capsys):
    def stub(per_prompt, seed=0):
        raise NotImplementedError()
    assert checks.first_rest_ratio(stub) is checks.reference_first_rest_ratio
    assert "first_rest_ratio not implemented yet" in capsys.readouterr().out


def test_first_rest_ratio_reference_is_first_vs_rest_with_ci():
    model = minigate.shipped("copy-elementwise")
    g = gate_scores(model, [row[: 20 + i] for i, row in enumerate(copy_task(16, seed=3))])  # unequal lengths
    per_prompt = [g.values[g.prompt == i].flatten(1).mean(1) for i in range(g.n_prompts)]
    fr = g.first_vs_rest(ci=True)
    ratio, low, high = checks.reference_first_rest_ratio(per_prompt)
    assert ratio.item() == pytest.approx(fr.ratio.item(), rel=1e-5)
    assert (low.item(), high.item()) == pytest.approx((fr.ci["ratio"][0].item(), fr.ci["ratio"][1].item()), rel=1e-5)
    assert low < ratio < high
