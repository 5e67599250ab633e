"""Lesson 07's check, first_token_excess: its typical mistakes differ from the reference and from each other, and the
reference agrees with the package's F-Attn above uniform (attention_sink's per-head shares minus
uniform_first_token_share) on a real model. That the reference passes and a stub falls back is tests/test_checks.py's,
and that each typical mistake earns its own hint tests/test_check_mutations.py's, for every check."""

import torch

import minigate
from minigate.analysis import attention_sink, uniform_first_token_share
from minigate.course import checks
from minigate.course.checks import lesson07 as l7


def test_the_mistakes_differ_from_the_reference_and_from_each_other_on_some_case():
    """Every switch changes the answer, and no two switches give the same answer on every case (else the earlier
    hint would hide the later one)."""
    wrongs = [wrong for _, wrong, _ in l7.MISTAKES["first_token_excess"]]
    patterns = [l7._causal_patterns(0, 2, 3, 9, 2, 1), l7._causal_patterns(1, 4, 5, 12, 0, 3)]
    answers = [[f(p) for p in patterns] for f in [checks.reference_first_token_excess, *wrongs]]
    same = lambda a, b: all(x.shape == y.shape and torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))
    for i in range(len(answers)):
        for j in range(i):
            assert not same(answers[i], answers[j]), (i, j)


def test_a_uniform_head_has_zero_excess_and_a_sink_head_a_positive_one():
    p = l7._causal_patterns(0, 2, 3, 9, sink_head=2, uniform_head=1)
    e = checks.reference_first_token_excess(p)
    assert abs(e[1]) < 1e-6 and e[2] > 0.2  # float32 patterns


def test_reference_equals_the_package_share_above_uniform_on_a_model():
    """On a model's own patterns: attention_sink's per-head share minus uniform_first_token_share, query 0 included."""
    torch.manual_seed(0)
    model_cfg = minigate.ModelConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                                     d_ff=48)
    model = minigate.Transformer(model_cfg).eval()
    tokens = torch.randint(1, 60, (3, 11), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 0  # <bos>
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    ours = torch.stack([checks.reference_first_token_excess(cache["pattern", L]) for L in range(2)]).float()
    want = attention_sink(model, tokens).share - uniform_first_token_share(11)
    torch.testing.assert_close(ours, want, atol=1e-6, rtol=1e-5)
