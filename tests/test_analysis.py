"""Metrics on planted patterns and activations with known answers."""

import pytest
import torch

from minigate import ModelConfig, Transformer
from minigate.analysis import attention_sink, massive_activations, uniform_first_token_share

TINY = dict(vocab_size=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48)
TOKENS = torch.randint(0, 50, (5, 12), generator=torch.Generator().manual_seed(0))


def planted(pattern_fn):
    return [(lambda n: n.endswith("hook_pattern"), lambda p, hook: pattern_fn(p))]


def all_on_first(p):
    out = torch.zeros_like(p)
    out[..., 0] = 1
    return out


def uniform_causal(p):
    T = p.shape[-1]
    causal = torch.ones(T, T).tril()
    return (causal / causal.sum(-1, keepdim=True)).expand_as(p)


def test_all_mass_on_first_token_is_share_one_and_every_head_a_sink():
    model = Transformer(ModelConfig(**TINY))
    with model.hooks(planted(all_on_first)):
        s = attention_sink(model, TOKENS, batch_size=2)
    torch.testing.assert_close(s.share, torch.ones(3, 4))
    assert s.f_attn == pytest.approx(1.0) and s.sink_rate == 1.0 and s.n_sink_heads == 12


def test_uniform_causal_attention_gives_the_analytic_share():
    model = Transformer(ModelConfig(**TINY))
    with model.hooks(planted(uniform_causal)):
        s = attention_sink(model, TOKENS)
    expected = sum(1 / (i + 1) for i in range(12)) / 12
    assert uniform_first_token_share(12) == pytest.approx(expected)
    torch.testing.assert_close(s.share, torch.full((3, 4), expected))
    assert s.sink_rate == 0.0


def test_one_planted_sink_head():
    def one_head(p):
        p = p.clone()
        p[:, 2] = all_on_first(p[:, 2])
        return p

    model = Transformer(ModelConfig(**TINY))
    long = torch.randint(0, 50, (4, 40), generator=torch.Generator().manual_seed(1))  # others near 1/40 * H_40
    with model.hooks([("blocks.1.attn.hook_pattern", lambda p, hook: one_head(p))]):
        s = attention_sink(model, long)
    assert s.share[1, 2] == pytest.approx(1.0) and s.n_sink_heads == 1
    assert s.sink_rate == pytest.approx(1 / 12)


def test_massive_activation_found_where_planted():
    model = Transformer(ModelConfig(**TINY))

    calls = []

    def plant(x, hook):  # batches of 2: prompt 3 is row 1 of the second batch
        calls.append(1)
        x = x.clone()
        if len(calls) == 2:
            x[1, 7, 5] = -1000.0
        return x

    with model.hooks([("blocks.1.hook_resid_post", plant)]):
        a = massive_activations(model, TOKENS, batch_size=2)
    assert a.max_abs[1] == 1000.0 and a.where[1].tolist() == [3, 7, 5]
    assert a.max_abs[0] < 100 and a.peak == pytest.approx(1000.0, abs=1.0)  # it rides the residual stream
    assert a.m_act == pytest.approx(a.max_abs.mean().item())


def test_empty_tokens_is_a_clear_error():
    with pytest.raises(ValueError, match="non-empty"):
        attention_sink(Transformer(ModelConfig(**TINY)), torch.zeros(0, 5, dtype=torch.long))
