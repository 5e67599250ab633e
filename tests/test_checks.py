"""The checks: the reference passes, each typical mistake fails with its own hint, a stub falls back."""

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from minigate import ModelConfig, Transformer
from minigate.course import checks
from minigate.course.checks.lesson01 import _attention
from minigate.course.checks.lesson02 import _split
from minigate.course.checks.lesson04 import _f_attn_m_act
from minigate.course.checks.lesson07 import _first_token_excess
from minigate.analysis import attention_sink, massive_activations
from minigate.attention import Attention, rope_cos_sin

REFERENCES = {
    checks.causal_attention: checks.reference_causal_attention,
    checks.g1_gate: checks.reference_g1_gate,
    checks.gated_output: checks.reference_gated_output,
    checks.split_q_proj: checks.reference_split_q_proj,
    checks.f_attn_m_act: checks.reference_f_attn_m_act,
    checks.first_token_excess: checks.reference_first_token_excess,
}


def _mistakes():
    """(check, wrong function, expected hint fragment) for every typical mistake of every check."""
    a, f, e = _attention, _f_attn_m_act, _first_token_excess
    return [
        (checks.causal_attention, lambda q, k, v: a(q, k, v, softmax_dim=-2), "softmax over the wrong axis"),
        (checks.causal_attention, lambda q, k, v: a(q, k, v, diagonal=-1), "tril(), not tril(-1)"),
        (checks.causal_attention, lambda q, k, v: a(q, k, v, diagonal=1), "not key i + 1"),
        (checks.causal_attention, lambda q, k, v: a(q, k, v, scale=False), "scale missing"),
        (checks.causal_attention, lambda q, k, v: a(q, k, v, causal=False), "no causal mask"),
        (checks.causal_attention, lambda q, k, v: a(q, k, v, kv_order="(g kv)"), "GQA heads mismatched"),
        (checks.g1_gate, lambda z, g: z * (g[..., None] if g.dim() == 3 else g), "not the logits"),
        (checks.g1_gate, lambda z, g: z * torch.sigmoid(g[:, :, None, :] if g.dim() == 3 else g), "(b, t, h, 1)"),
        (checks.g1_gate, lambda z, g: z * F.silu(g[..., None] if g.dim() == 3 else g), "not SiLU"),
        (checks.g1_gate, lambda z, g: z * torch.sigmoid(-(g[..., None] if g.dim() == 3 else g)), "sign flipped"),
        (checks.gated_output, lambda z, g, w: z.flatten(2) @ w.T, "the gate is missing"),
        (checks.gated_output, lambda z, g, w: (z.flatten(2) @ w.T) * torch.sigmoid(g.flatten(2)), "after o_proj"),
        (checks.split_q_proj, lambda *x: _split(*x, layout="per head"), "not per query head"),
        (checks.split_q_proj, lambda *x: _split(*x, layout="all queries first"), "not all at the end"),
        (checks.f_attn_m_act, lambda c, n: f(c, n, first_query=1), "query 0 included"),
        (checks.f_attn_m_act, lambda c, n: f(c, n, key_axis=False), "*to* key 0"),
        (checks.f_attn_m_act, lambda c, n: f(c, n, layer_stat="max"), "not the maximum over layers"),
        (checks.f_attn_m_act, lambda c, n: f(c, n, absolute=False), "absolute values"),
        (checks.first_token_excess, lambda p: e(p, uniform="1/T"), "not 1/T"),
        (checks.first_token_excess, lambda p: e(p, to_key=False), "*to* key 0"),
        (checks.first_token_excess, lambda p: e(p, subtract=False), "subtract what uniform causal attention gives"),
    ]


@pytest.mark.parametrize("check", REFERENCES, ids=lambda c: c.__name__)
def test_reference_passes_and_is_returned(check, capsys):
    ref = REFERENCES[check]
    assert check(ref) is ref
    out = capsys.readouterr().out
    assert checks.PASSED_RE.fullmatch(out.strip()) and out.startswith(f"✓ {check.__name__}: passed ("), out


@pytest.mark.parametrize("check, wrong, hint", _mistakes(), ids=lambda x: getattr(x, "__name__", None))
def test_each_typical_mistake_fails_with_its_own_hint(check, wrong, hint, capsys):
    with pytest.raises(AssertionError, match="✗"):
        check(wrong)
    out = capsys.readouterr().out
    assert hint in out and out.count("\n") == 1, out  # one line: the targeted hint, nothing generic


@pytest.mark.parametrize("check", REFERENCES, ids=lambda c: c.__name__)
def test_a_stub_gets_the_reference_and_a_notice(check, capsys):
    def stub(*args):
        raise NotImplementedError()

    assert check(stub) is REFERENCES[check]
    assert capsys.readouterr().out == checks.not_implemented_notice(check.__name__) + "\n"


@pytest.mark.parametrize("check", REFERENCES, ids=lambda c: c.__name__)
def test_an_unrecognised_wrong_answer_fails_with_a_generic_hint(check, capsys):
    """The check compares with its own reference, never with the learner's output (ARENA's bug)."""
    ref = REFERENCES[check]

    def off(*args):
        out = ref(*args)
        return tuple(x * 1.01 for x in out) if isinstance(out, tuple) else out * 1.01

    with pytest.raises(AssertionError, match="max |difference|"):
        check(off)
    assert "max |difference|" in capsys.readouterr().out


def test_wrong_shape_is_named():
    with pytest.raises(AssertionError, match=r"expected shape \(2, 4, 6, 8\), got \(2, 6, 4, 8\)"):
        checks.causal_attention(lambda q, k, v: checks.reference_causal_attention(q, k, v).transpose(1, 2))


def test_split_reference_matches_the_model_layout():
    """reference_split_q_proj agrees with what Attention.forward does to q_proj's rows."""
    for gran in ("headwise", "elementwise"):
        cfg = ModelConfig(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, gate="G1",
                          gate_granularity=gran, qk_norm=False)
        attn = Attention(cfg)
        x = torch.randn(1, 5, 32)
        _, cache = _run_attention(attn, x)
        q, gates = checks.reference_split_q_proj(attn.q_proj(x), 4, 2, 8, gran)
        cos, sin = rope_cos_sin(5, 8, cfg.rope_theta)
        from minigate.attention import apply_rope
        # hooks hold (batch, pos, head, d_head) as TransformerLens does; the exercise returns (batch, head, pos, d_head)
        torch.testing.assert_close(q, rearrange(cache["q"], "b t h d -> b h t d"))
        torch.testing.assert_close(apply_rope(q, cos, sin), rearrange(cache["rot_q"], "b t h d -> b h t d"))
        torch.testing.assert_close(gates, cache["gate_logits"])


def _run_attention(attn: nn.Module, x):
    cache = {}
    attn.hook_q.register_forward_hook(lambda m, i, o: cache.__setitem__("q", o))
    attn.hook_rot_q.register_forward_hook(lambda m, i, o: cache.__setitem__("rot_q", o))
    attn.hook_gate_logits.register_forward_hook(lambda m, i, o: cache.__setitem__("gate_logits", o))
    cos, sin = rope_cos_sin(x.shape[1], attn.cfg.head_dim, attn.cfg.rope_theta)
    return attn(x, cos, sin), cache


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
def test_gate_only_param_count_is_what_the_gate_adds(granularity):
    """Lesson 02 counts the gate with num_params(gate_only=True): d_model inputs x (one row per head, or per head
    dimension) per layer, the difference from a baseline of the same size."""
    shape = dict(vocab_size=50, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48)
    gated = Transformer(ModelConfig(gate="G1", gate_granularity=granularity, **shape))
    rows = 4 * (1 if granularity == "headwise" else 8)
    assert gated.num_params(gate_only=True) == gated.num_params() - Transformer(ModelConfig(**shape)).num_params() \
        == 2 * 48 * rows


def test_f_attn_m_act_reference_matches_analysis():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                                    d_ff=48)).eval()
    tokens = torch.randint(0, 50, (4, 9))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    f_attn, m_act = checks.reference_f_attn_m_act(cache, 3)
    assert f_attn == pytest.approx(attention_sink(model, tokens).f_attn, rel=1e-5)
    assert m_act == pytest.approx(massive_activations(model, tokens).m_act, rel=1e-5)
    values, where = checks.reference_locate_massive(cache, 3)  # the same places as the package finds
    acts = massive_activations(model, tokens)
    assert torch.allclose(values, acts.max_abs, rtol=1e-5) and torch.equal(where, acts.where)
