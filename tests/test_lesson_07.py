"""Lesson 07's new checks, param_count and t4_minutes: the reference passes, each typical mistake earns its hint,
a stub falls back to the reference; and the references agree with the package (a model's real parameter count,
the FLOP model of minigate.bench.ablation)."""

import pytest
import torch

import minigate
from minigate.course import checks
from minigate.bench.ablation import PAPER, T4_PEAK, forward_flops, n_published_conditions

P = checks._param_count
T = checks._t4_minutes


def test_param_count_reference_passes_and_is_returned(capsys):
    fn = lambda cfg: int(checks.reference_param_count(cfg))
    assert checks.param_count(fn) is fn
    assert "✓ param_count: passed (5 cases)" in capsys.readouterr().out


@pytest.mark.parametrize("kw, hint", [
    (dict(kv="heads"), "n_kv_heads * head_dim rows"),
    (dict(gate="ignored"), "extra rows of q_proj"),
    (dict(gate="swapped"), "one gate row per head"),
    (dict(lm_head="always"), "count it once"),
    (dict(lm_head="never"), "has its own lm_head"),
    (dict(norms="none"), "RMSNorm weights too"),
    (dict(norms="no qk"), "q_norm and k_norm"),
    (dict(mlp=2), "three matrices"),
    (dict(head_dim="d/H"), "use cfg.head_dim"),
])
def test_param_count_each_mistake_gets_its_hint(kw, hint, capsys):
    with pytest.raises(AssertionError):
        checks.param_count(lambda cfg: P(cfg, **kw))
    assert hint in capsys.readouterr().out


@pytest.mark.parametrize("cfg", [
    *checks._paper_1b_configs().values(),
    minigate.ModelConfig(vocab_size=300, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=96,
                         qk_norm=False, tie_embeddings=False, gate="G1", gate_granularity="headwise"),
    minigate.ModelConfig(vocab_size=500, d_model=48, n_layers=2, n_heads=6, n_kv_heads=3, head_dim=16, d_ff=80,
                         gate="G1", gate_granularity="elementwise"),
    minigate.ModelConfig(),  # the defaults: no gate
])
def test_param_count_reference_equals_the_models_own_count(cfg):
    with torch.device("meta"):  # no memory: the 1B models are built without weights
        model = minigate.Transformer(cfg)
    assert checks.reference_param_count(cfg) == model.num_params() == sum(p.numel() for p in model.parameters())


def test_param_count_reference_on_the_shipped_text_models():
    for name in ("text-baseline", "text-headwise", "text-elementwise"):
        model = minigate.shipped(name)
        assert checks.reference_param_count(model.cfg) == model.num_params()


def test_t4_minutes_reference_passes_and_is_returned(capsys):
    fn = lambda *a: float(checks.reference_t4_minutes(*a))
    assert checks.t4_minutes(fn) is fn
    assert "✓ t4_minutes: passed (3 cases)" in capsys.readouterr().out


@pytest.mark.parametrize("kw, hint", [
    (dict(unit=1), "the seconds divided by 60"),
    (dict(unit=3600), "not hours"),
    (dict(rate="peak / u"), "T4_PEAK * utilisation"),
    (dict(passes=False), "multiply by n_passes"),
    (dict(per_param=6), "forward passes only"),
    (dict(per_mac=1), "a multiply-add is 2 FLOPs"),
    (dict(attention=False), "add the attention"),
    (dict(keys="all"), "attention is causal"),
    (dict(matmuls=1), "two matmuls per head"),
])
def test_t4_minutes_each_mistake_gets_its_hint(kw, hint, capsys):
    with pytest.raises(AssertionError):
        checks.t4_minutes(lambda *a: T(*a, **kw))
    assert hint in capsys.readouterr().out


def test_stubs_fall_back_to_the_references(capsys):
    def stub(*args):
        raise NotImplementedError()
    assert checks.param_count(stub) is checks.reference_param_count
    assert checks.t4_minutes(stub) is checks.reference_t4_minutes
    out = capsys.readouterr().out
    assert "param_count not implemented yet" in out and "t4_minutes not implemented yet" in out


def test_t4_minutes_reference_equals_the_bench_projection():
    """The bench's projection of the published ablation set (+1 pass for the mean gates) at 35%: about 7.6 min."""
    p = PAPER
    n = n_published_conditions(p["n_layers"], p["n_heads"]) + 1
    want = n * forward_flops(**p) / (T4_PEAK * 0.35) / 60
    assert checks.reference_t4_minutes(**p, n_passes=n, utilisation=0.35) == pytest.approx(want, rel=1e-12)
    assert round(want, 1) == 7.6
