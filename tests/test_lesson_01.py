"""Lesson 01's checks: causal_attention's step-by-step reference is PyTorch's fused attention, which the check refuses
in an answer; attention_with_null's reference agrees with a plain loop and with ordinary attention when the null key
is switched off. That the references pass and a stub falls back is tests/test_checks.py's, and that each typical
mistake earns its hint tests/test_check_mutations.py's, for every check."""

import math

import pytest
import torch

from minigate.course import checks
from minigate.course.checks.lesson01 import SDPA_HINT
from minigate.course.checks.lesson01 import _null_attention as N


@pytest.mark.parametrize("h, kv", [(4, 2), (3, 3), (6, 1)])
def test_the_causal_attention_reference_is_pytorchs_fused_attention(h, kv):
    g = torch.Generator().manual_seed(h)
    q = torch.randn(2, h, 7, 8, generator=g)
    k, v = torch.randn(2, kv, 7, 8, generator=g), torch.randn(2, kv, 7, 8, generator=g)
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(checks.reference_causal_attention(q, k, v), fused, atol=1e-6, rtol=1e-5)


def test_causal_attention_refuses_the_fused_kernel_only_inside_the_answer(capsys):
    """An answer that calls SDPA fails with its hint, whatever it computes; the refusal ends with the answer's call
    (the reference and the lesson's own SDPA cell still run), and the check hands back the learner's own function."""
    def fused(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    with pytest.raises(AssertionError, match="calls F.scaled_dot_product_attention"):
        checks.causal_attention(fused)
    assert SDPA_HINT in capsys.readouterr().out
    q = torch.randn(1, 2, 3, 4)
    assert fused(q, q, q).shape == (1, 2, 3, 4)  # no refusal left behind
    mine = lambda q, k, v: checks.reference_causal_attention(q, k, v).clone()
    assert checks.causal_attention(mine) is mine


def test_the_explicit_variant_without_mistakes_passes(capsys):
    checks.attention_with_null(N)
    assert "passed" in capsys.readouterr().out


def test_reference_equals_a_plain_loop():
    g = torch.Generator().manual_seed(0)
    scores, v = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 5, 2, generator=g)
    null = torch.randn(3, generator=g)
    out, w_null = checks.reference_attention_with_null(scores, v, null)
    for b in range(2):
        for h in range(3):
            for q in range(4):
                e = [math.exp(s) for s in scores[b, h, q].tolist()]
                z = sum(e) + math.exp(null[h].item())
                assert w_null[b, h, q].item() == pytest.approx(math.exp(null[h].item()) / z, rel=1e-5)
                for d in range(2):
                    want = sum(e[k] / z * v[b, h, k, d].item() for k in range(5))
                    assert out[b, h, q, d].item() == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_no_null_is_ordinary_attention_and_a_blind_query_outputs_zero():
    g = torch.Generator().manual_seed(1)
    scores, v = torch.randn(1, 2, 3, 3, generator=g), torch.randn(1, 2, 3, 4, generator=g)
    out, w_null = checks.reference_attention_with_null(scores, v, torch.full((2,), float("-inf")))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v)
    assert (w_null == 0).all()
    scores[:, :, 1] = float("-inf")  # query 1 may see nothing: all weight on the null key, output exactly 0
    out, w_null = checks.reference_attention_with_null(scores, v, torch.zeros(2))
    assert (out[:, :, 1] == 0).all() and (w_null[:, :, 1] == 1).all()
