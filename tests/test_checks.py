"""The checks: every exercise's reference passes and a stub falls back to it (one test for all of them), an
unrecognised wrong answer gets the generic hint, and the references agree with the package. Each lesson's own check
tests are tests/test_lesson_NN.py's; that each typical mistake fails with its own hint is
tests/test_check_mutations.py's, for every check."""

import pytest
import torch
from einops import rearrange
from torch import nn

from minigate import ModelConfig, Transformer
from minigate.analysis import attention_sink, massive_activations
from minigate.attention import Attention, rope_cos_sin
from minigate.course import checks
from minigate.course.checks.lesson06 import RECORDED

# the checks whose answers are numbers: a wrong one by 1% gets the generic hint
NUMERIC = {
    checks.causal_attention: checks.reference_causal_attention,
    checks.g1_gate: checks.reference_g1_gate,
    checks.nonlinear_share: checks.reference_nonlinear_share,
    checks.split_q_proj: checks.reference_split_q_proj,
    checks.bos_share_by_part: checks.reference_bos_share_by_part,
    checks.first_token_excess: checks.reference_first_token_excess,
}


@pytest.mark.parametrize("name", checks.EXERCISES)
def test_the_reference_passes_and_is_returned(name, capsys):
    """What a learner's correct answer gets: the check passes (a prediction is recorded) and hands the function
    back, in the line grading reads."""
    check, ref = getattr(checks, name), getattr(checks, f"reference_{name}")
    assert check(ref) is ref
    out = capsys.readouterr().out
    verdict = RECORDED if name == "predict_bos_cost" else "passed ("
    assert checks.PASSED_RE.fullmatch(out.strip()) and out.startswith(f"✓ {name}: {verdict}"), out


@pytest.mark.parametrize("name", checks.EXERCISES)
def test_a_stub_gets_the_reference_and_a_notice(name, capsys):
    """An untouched exercise (its `raise NotImplementedError()`) falls back to the reference, with the notice the
    build stores in lessons/."""
    def stub(*args, **kwargs):
        raise NotImplementedError()

    assert getattr(checks, name)(stub) is getattr(checks, f"reference_{name}")
    assert capsys.readouterr().out == checks.not_implemented_notice(name) + "\n"


@pytest.mark.parametrize("check", NUMERIC, ids=lambda c: c.__name__)
def test_an_unrecognised_wrong_answer_fails_with_a_generic_hint(check, capsys):
    """The check compares with its own reference, never with the learner's output (ARENA's bug)."""
    ref = NUMERIC[check]

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


def test_bos_share_by_part_gives_f_attn_and_locate_massive_m_act_as_the_package_does():
    """Lesson 04: F-Attn is the mean of bos_share_by_part's row 0, M-Act the mean of locate_massive's values."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                                    d_ff=48)).eval()
    tokens = torch.randint(0, 50, (4, 9))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    shares = checks.reference_bos_share_by_part(cache, 3, 4)
    assert shares.shape == (3, 3, 4)
    sink = attention_sink(model, tokens)
    assert torch.allclose(shares[:, 0], sink.share, atol=1e-6)
    assert shares[:, 0].mean().item() == pytest.approx(sink.f_attn, rel=1e-5)
    values, where = checks.reference_locate_massive(cache, 3)  # the same places as the package finds
    acts = massive_activations(model, tokens)
    assert torch.allclose(values, acts.max_abs, rtol=1e-5) and torch.equal(where, acts.where)
    assert values.mean().item() == pytest.approx(acts.m_act, rel=1e-5)


def test_a_not_implemented_error_from_a_library_is_a_failed_case_not_a_stub(capsys):
    """Only the stub's own `raise NotImplementedError` falls back to the reference; the same error raised inside
    something the learner's function calls (einops' einsum refuses a grouped output axis) is the learner's failed
    case, named as such."""
    from einops import einsum

    def grouped(q, k, v):
        return einsum(q, k, "b h i d, b h j d -> (b h) i j")

    with pytest.raises(AssertionError, match="raised NotImplementedError.* inside a library it calls"):
        checks.causal_attention(grouped)
    assert checks.not_implemented_notice("causal_attention") not in capsys.readouterr().out


def test_sink_head_interval_counts_as_attention_sink_and_its_hooks_leave_no_trace():
    """Lesson 03: the reference counts each model's sink heads as the package's attention_sink(...).n_sink_heads does,
    on models with random weights (no hook) and on the check's models, whose hook on the scores stays on through
    run_with_cache and run_with_hooks."""
    from minigate.course.checks import lesson03 as l3

    tokens = l3._tokens(0, 4, 12)
    plain = [l3._tracker_model(seed) for seed in range(4)]  # weights of 0.3: heads spread around the threshold
    counts, mean, low, high = checks.reference_sink_head_interval(plain, tokens)
    assert counts == [attention_sink(m, tokens).n_sink_heads for m in plain] and low <= mean <= high
    hooked = l3._sink_model(["Smuq", "qqqS"])
    for _ in range(2):  # the same every time: run_with_cache removes only its own hooks
        share = attention_sink(hooked, tokens).share
        assert checks.reference_sink_head_interval([hooked, hooked], tokens)[0] == [3, 3]
    assert share[0, 0] > 0.98 and share[1, :3].max() < 0.09 and 0.41 < share[0, 1] < 0.43
