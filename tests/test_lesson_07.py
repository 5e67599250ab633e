"""Lesson 07's check, first_token_excess: the reference passes, each typical mistake earns its own hint, a stub falls
back to the reference; and the reference agrees with the package's F-Attn above uniform (attention_sink's per-head
shares minus uniform_first_token_share) on a real model."""

import pytest
import torch

import minigate
from minigate.analysis import attention_sink, uniform_first_token_share
from minigate.course import checks
from minigate.course.checks import lesson07 as l7

E = l7._first_token_excess


def test_reference_passes_and_is_returned(capsys):
    fn = lambda p: checks.reference_first_token_excess(p).float()
    assert checks.first_token_excess(fn) is fn
    assert "✓ first_token_excess: passed (3 cases)" in capsys.readouterr().out


@pytest.mark.parametrize("kw, hint", [
    (dict(subtract=False), "subtract what uniform causal attention gives"),
    (dict(order="uniform - share"), "not uniform minus share"),
    (dict(to_key=False), "*to* key 0"),
    (dict(head_mean=True), "one number per head"),
    (dict(head_mean="expand"), "each head's own number"),
    (dict(uniform="1/T"), "not 1/T"),
    (dict(uniform="1/i"), "not 1/i"),
    (dict(reduce="sum"), "do not sum it"),
    (dict(share_from=1, uniform_from=1), "query 0 included"),
    (dict(uniform_from=1), "the same queries as the head's share"),
    (dict(share_from=1), "the same queries as the uniform share"),
])
def test_each_mistake_gets_its_own_hint(kw, hint, capsys):
    with pytest.raises(AssertionError):
        checks.first_token_excess(lambda p: E(p, **kw))
    out = capsys.readouterr().out
    assert hint in out and out.count("\n") == 1, out


def test_the_mistakes_differ_from_the_reference_and_from_each_other_on_some_case():
    """Every switch changes the answer, and no two switches give the same answer on every case (else the earlier
    hint would hide the later one)."""
    switches = [dict(subtract=False), dict(order="uniform - share"), dict(to_key=False), dict(head_mean=True),
                dict(head_mean="expand"), dict(uniform="1/T"), dict(uniform="1/i"), dict(reduce="sum"),
                dict(share_from=1, uniform_from=1), dict(uniform_from=1), dict(share_from=1)]
    patterns = [l7._causal_patterns(0, 2, 3, 9, 2, 1), l7._causal_patterns(1, 4, 5, 12, 0, 3)]
    answers = [[E(p, **kw) for p in patterns] for kw in [{}, *switches]]
    same = lambda a, b: all(x.shape == y.shape and torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))
    for i in range(len(answers)):
        for j in range(i):
            assert not same(answers[i], answers[j]), (i, j)


def test_a_uniform_head_has_zero_excess_and_a_sink_head_a_positive_one():
    p = l7._causal_patterns(0, 2, 3, 9, sink_head=2, uniform_head=1)
    e = checks.reference_first_token_excess(p)
    assert abs(e[1]) < 1e-6 and e[2] > 0.2  # float32 patterns


def test_a_stub_falls_back_to_the_reference(capsys):
    def stub(pattern):
        raise NotImplementedError()
    assert checks.first_token_excess(stub) is checks.reference_first_token_excess
    assert "first_token_excess not implemented yet" in capsys.readouterr().out


def test_reference_equals_the_package_share_above_uniform_on_a_model():
    """On a model's own patterns: attention_sink's per-head share minus uniform_first_token_share, query 0 included."""
    torch.manual_seed(0)
    cfg = minigate.ModelConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48)
    model = minigate.Transformer(cfg).eval()
    tokens = torch.randint(1, 60, (3, 11), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 0  # <bos>
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    ours = torch.stack([checks.reference_first_token_excess(cache["pattern", L]) for L in range(2)]).float()
    want = attention_sink(model, tokens).share - uniform_first_token_share(11)
    torch.testing.assert_close(ours, want, atol=1e-6, rtol=1e-5)
