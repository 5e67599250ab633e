"""Metrics on planted patterns, activations and gate values with known answers; bootstrap CIs; prompt sets."""

import re

import pytest
import torch

from minigate import ModelConfig, Transformer
from minigate.analysis import attention_sink, massive_activations, published_measures, uniform_first_token_share
from minigate.data import PROMPT_TYPES, get_tokenizer, load_prompts
from minigate.gate_analysis import compare_gates, gate_scores, gate_scores_by_type
from minigate.stats import bootstrap_ci, quantile



@pytest.fixture
def batch(tokens):
    return tokens(5, 12)


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


def test_all_mass_on_first_token_is_share_one_and_every_head_a_sink(tiny_deep, batch):
    model = Transformer(ModelConfig(**tiny_deep))
    with model.hooks(planted(all_on_first)):
        s = attention_sink(model, batch, batch_size=2)
    torch.testing.assert_close(s.share, torch.ones(3, 4))
    assert s.f_attn == pytest.approx(1.0) and s.sink_rate == 1.0 and s.n_sink_heads == 12


def test_uniform_causal_attention_gives_the_analytic_share(tiny_deep, batch):
    model = Transformer(ModelConfig(**tiny_deep))
    with model.hooks(planted(uniform_causal)):
        s = attention_sink(model, batch)
    expected = sum(1 / (i + 1) for i in range(12)) / 12
    assert uniform_first_token_share(12) == pytest.approx(expected)
    torch.testing.assert_close(s.share, torch.full((3, 4), expected))
    assert s.sink_rate == 0.0


def test_one_planted_sink_head(tiny_deep, tokens):
    def one_head(p):
        p = p.clone()
        p[:, 2] = all_on_first(p[:, 2])
        return p

    model = Transformer(ModelConfig(**tiny_deep))
    long = tokens(4, 40, seed=1)  # others near 1/40 * H_40
    with model.hooks([("blocks.1.attn.hook_pattern", lambda p, hook: one_head(p))]):
        s = attention_sink(model, long)
    assert s.share[1, 2] == pytest.approx(1.0) and s.n_sink_heads == 1
    assert s.sink_rate == pytest.approx(1 / 12)


def test_massive_activation_found_where_planted(tiny_deep, batch):
    model = Transformer(ModelConfig(**tiny_deep))

    calls = []

    def plant(x, hook):  # batches of 2: prompt 3 is row 1 of the second batch
        calls.append(1)
        x = x.clone()
        if len(calls) == 2:
            x[1, 7, 5] = -1000.0
        return x

    with model.hooks([("blocks.1.hook_resid_post", plant)]):
        a = massive_activations(model, batch, batch_size=2)
    assert a.max_abs[1] == 1000.0 and a.where[1].tolist() == [3, 7, 5]
    assert a.max_abs[0] < 100 and a.peak == pytest.approx(1000.0, abs=1.0)  # it rides the residual stream
    assert a.m_act == pytest.approx(a.max_abs.mean().item())


def test_peak_to_median_is_each_layers_largest_magnitude_over_its_median(tiny_deep, batch):
    """Sun et al.'s yardstick, from the measuring pass's own residual stream (residuals=True): a planted value 1000
    times the layer's typical magnitude gives 1000, across batches; a layer without one gives its own max / median over
    the whole residual stream; published_measures keeps the same stream."""
    model = Transformer(ModelConfig(**tiny_deep)).eval()
    resid, calls = {}, []

    def plant(x, hook):  # the last layer: every value 1 or -1, then one -1000 in the second batch of 2
        x = torch.where(torch.arange(x.numel()).reshape(x.shape) % 2 == 0, 1.0, -1.0)
        if len(calls) == 1:
            x[1, 7, 5] = -1000.0
        calls.append(1)
        return x

    with model.hooks([("blocks.2.hook_resid_post", plant)]):
        acts = massive_activations(model, batch, batch_size=2, residuals=True)
    ratio = acts.peak_to_median
    assert acts.resid.shape == (3, *batch.shape, model.cfg.d_model) and acts.max_abs[2].item() == 1000.0
    with model.hooks([(lambda n: n.endswith("hook_resid_post"), lambda x, hook: resid.setdefault(hook.layer, x))]):
        model(batch)
    assert ratio.shape == (3,) and ratio[2].item() == pytest.approx(1000.0)
    for layer in (0, 1):
        a = resid[layer].abs()
        assert ratio[layer].item() == pytest.approx((a.max() / a.median()).item(), rel=1e-5)
    kept = published_measures(model, batch, batch_size=2, residuals=True).act
    assert torch.allclose(kept.peak_to_median[:2], ratio[:2], rtol=1e-5)  # (its attention path: explicit)
    assert kept.per_window.shape == (batch.shape[0], 3)
    with pytest.raises(ValueError, match="measure with residuals=True"):
        _ = massive_activations(model, batch).peak_to_median


def test_empty_tokens_is_a_clear_error(tiny_deep):
    with pytest.raises(ValueError, match="non-empty"):
        attention_sink(Transformer(ModelConfig(**tiny_deep)), torch.zeros(0, 5, dtype=torch.long))


def test_sink_ci_over_prompts(tiny_deep, batch):
    model = Transformer(ModelConfig(**tiny_deep))
    with model.hooks(planted(all_on_first)):
        s = attention_sink(model, batch, batch_size=2)
    assert s.per_prompt.shape == (5, 3, 4)
    for k in ("f_attn", "sink_rate"):
        assert [v.item() for v in s.ci()[k]] == pytest.approx([1.0, 1.0, 1.0])
    s = attention_sink(model, batch, batch_size=2)  # untrained: the estimate is the plain F-Attn
    est, low, high = s.ci()["f_attn"]
    assert est.item() == pytest.approx(s.f_attn) and low <= est <= high


# -- gate anatomy on planted gate values ------------------------------------------------------------------
@pytest.fixture
def make_gated(tiny_deep):
    """make_gated(granularity, **fields) -> the three-layer tiny model with a G1 gate (or the gate fields given),
    seeded."""
    def make(granularity="headwise", **fields):
        torch.manual_seed(0)
        return Transformer(ModelConfig(**{**tiny_deep, "gate": "G1", "gate_granularity": granularity, **fields}))

    return make


def plant_gate(fn):
    """Replace every hook_gate by fn(gate, layer) (same shape)."""
    return [(lambda n: n.endswith("hook_gate"), lambda g, hook: fn(g, int(hook.name.split(".")[1])))]


def ids(*lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[0] + torch.randint(1, 50, (n - 1,), generator=g).tolist() for n in lengths]


V = torch.tensor([0.02, 0.05, 0.3, 0.5, 0.95])  # planted gate at positions 0..4, every layer and head


def by_position(g, layer):  # g (batch, pos, head[, d_head])
    return V[: g.shape[1]].reshape(1, -1, *[1] * (g.dim() - 2)).expand_as(g).clone()


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
def test_planted_distribution_and_first_vs_rest(granularity, make_gated):
    model = make_gated(granularity)
    with model.hooks(plant_gate(by_position)):
        g = gate_scores(model, ids(5, 5, 5, 5), batch_size=3)
    d = g.distribution(bins=20)
    assert d.mean.item() == pytest.approx(0.364) and d.median.item() == pytest.approx(0.3)
    assert d.std.item() == pytest.approx(V.repeat(g.values.numel() // 5).std().item(), rel=1e-5)
    assert d.frac_closed.item() == pytest.approx(2 / 5) and d.frac_open.item() == pytest.approx(1 / 5)
    expected_hist = torch.zeros(20)
    expected_hist[[0, 1, 6, 10, 19]] = 0.2  # 0.02, 0.05, 0.3, 0.5, 0.95
    torch.testing.assert_close(d.hist, expected_hist)
    f = g.first_vs_rest()
    assert (f.first.item(), f.rest.item()) == pytest.approx((0.02, 0.45))
    assert f.ratio.item() == pytest.approx(0.02 / 0.45)
    f = g.first_vs_rest(ci=True)  # every prompt is alike, so every resample gives the same numbers
    assert [float(v) for k in ("first", "rest", "ratio") for v in f.ci[k]] == pytest.approx(
        [0.02, 0.02, 0.45, 0.45, 0.02 / 0.45, 0.02 / 0.45], rel=1e-5)
    torch.testing.assert_close(g.first_vs_rest(by_layer=True).first, torch.full((3,), 0.02))


def test_variable_length_prompts_pool_tokens_without_padding(make_gated):
    model = make_gated()
    with model.hooks(plant_gate(lambda g, layer: torch.arange(g.shape[1]).reshape(1, -1, 1).expand_as(g) / 10)):
        g = gate_scores(model, ids(2, 5, 3))
    assert g.values.shape == (10, 3, 4) and g.pos.tolist() == [0, 1, 0, 1, 2, 3, 4, 0, 1, 2]
    assert g.prompt.tolist() == [0, 0, 1, 1, 1, 1, 1, 2, 2, 2]
    d, f = g.distribution(), g.first_vs_rest()  # positions sum to 1 + 10 + 3 = 14 over 10 tokens
    assert d.mean.item() == pytest.approx(0.14) and f.first.item() == 0.0 and f.rest.item() == pytest.approx(0.2)
    est, low, high = g.layer_means(ci=True)  # the CI's estimate pools tokens too: prompts weigh by length
    torch.testing.assert_close(est, torch.full((3,), 0.14))


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
def test_batched_prompts_read_the_real_gate_of_each_prompt_alone(granularity, make_gated):
    model = make_gated(granularity)
    prompts = ids(4, 6, 4, 2, 6, 4, seed=1)
    g = gate_scores(model, prompts, layers=[2, 0], batch_size=2)
    assert g.layers == [2, 0] and g.tokens.tolist() == sum(prompts, [])
    for i, p in enumerate(prompts):
        _, cache = model.run_with_cache(torch.tensor([p]), names_filter=lambda n: n.endswith("hook_gate"))
        alone = torch.stack([cache["blocks.2.attn.hook_gate"][0], cache["blocks.0.attn.hook_gate"][0]], dim=1)
        torch.testing.assert_close(g.values[g.prompt == i], alone, rtol=1e-5, atol=1e-6)
        assert g.prompt_tokens(i).tolist() == p
    same = gate_scores(model, torch.tensor(ids(5, 5, 5)))  # a (batch, pos) tensor: rows are the units
    assert same.n_prompts == 3 and same.values.shape[0] == 15


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
def test_planted_layer_and_head_means_and_token_matrix(granularity, make_gated):
    def per_head(g, layer):  # (layer * 4 + head) / 20, plus (d - 3.5) / 100 per dim, which averages to 0
        out = (layer * 4 + torch.arange(4)) / 20
        if g.dim() == 4:
            out = out[:, None] + (torch.arange(8) - 3.5) / 100
        return out.expand_as(g).clone()

    model = make_gated(granularity)
    with model.hooks(plant_gate(per_head)):
        g = gate_scores(model, ids(3, 7, 5))
    expected = (torch.arange(3)[:, None] * 4 + torch.arange(4)) / 20  # (layer, head)
    torch.testing.assert_close(g.head_means(), expected)
    torch.testing.assert_close(g.layer_means(), expected.mean(1))
    torch.testing.assert_close(g.token_matrix(1, head=2), expected[:, 2].expand(7, 3))
    torch.testing.assert_close(g.token_matrix(2), expected.mean(1).expand(5, 3))
    torch.testing.assert_close(g.head_averaged().values.mean(0), expected)


def test_layer_quantiles(make_gated):
    model = make_gated()
    with model.hooks(plant_gate(lambda g, layer: torch.full_like(g, 0.05) if layer == 0 else torch.rand_like(g))):
        g = gate_scores(model, ids(6, 9))
    q = g.layer_quantiles(q=(0.1, 0.5, 0.9))
    assert q.shape == (3, 3)
    torch.testing.assert_close(q[0], torch.full((3,), 0.05))
    torch.testing.assert_close(q[2], torch.quantile(g.values[:, 2].flatten(), torch.tensor([0.1, 0.5, 0.9])))


def test_quantile_matches_torch_on_random_values():
    x = torch.randn(7, 33, 5)
    for dim in (0, 1, -1):
        for q in ([0.05, 0.5, 0.95], [0.0, 0.1, 0.3, 0.5, 0.7, 1.0]):  # a few by selection, many by sorting
            torch.testing.assert_close(quantile(x, q, dim=dim), torch.quantile(x, torch.tensor(q), dim=dim))
    torch.testing.assert_close(quantile(x, 0.3, dim=1), torch.quantile(x, 0.3, dim=1))


def test_dimension_classes_on_planted_elementwise_gates(make_gated):
    def dims(g, layer):  # g (batch, pos, head, d_head = 8)
        if layer == 2:
            return torch.full_like(g, 0.99)
        out = torch.full_like(g, 0.01)  # dims 0, 6, 7: always closed
        out[..., 1] = 0.99  # always open
        out[:, ::2, :, 2] = 0.99  # open on even positions only: input-dependent
        out[..., 3] = 0.5  # half open everywhere: input-dependent (neither class)
        out[..., 5] = 0.99
        out[0, 5, :, 4], out[0, 5, :, 5] = 0.99, 0.01  # one token of 48 breaks ranks: the 5% / 95% quantiles ignore it
        return out

    model = make_gated("elementwise")
    with model.hooks(plant_gate(dims)):
        g = gate_scores(model, ids(12, 12, 12, 12))
    c = g.dimension_classes()
    assert c.label.shape == (3, 4, 8)
    assert c.label[0, 0].tolist() == [0, 2, 1, 1, 0, 2, 0, 0] and (c.label[2] == 2).all()
    assert c.fractions == pytest.approx({"always_closed": 8 / 24, "input_dependent": 4 / 24, "always_open": 12 / 24})
    torch.testing.assert_close(c.per_layer, torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.0, 0.0, 1.0]]))
    with make_gated().hooks(plant_gate(lambda g, layer: torch.full_like(g, 0.01))) as hw:
        assert (gate_scores(hw, ids(4, 4)).dimension_classes().label == 0).all()  # headwise: (layer, head)


# -- bootstrap ------------------------------------------------------------------------------------------------
def test_bootstrap_contains_the_estimate_and_shrinks_with_more_units():
    gen = torch.Generator().manual_seed(0)
    widths = {}
    for n in (20, 500):
        x = 0.5 + 0.1 * torch.randn(n, generator=gen)
        est, low, high = bootstrap_ci(x)
        assert est.item() == pytest.approx(x.mean().item()) and low < est < high
        widths[n] = (high - low).item()
    assert widths[500] < widths[20] / 3  # about sqrt(25) = 5 times narrower


def test_bootstrap_covers_the_true_mean_about_95_percent_of_the_time():
    gen = torch.Generator().manual_seed(1)
    hits = 0
    for seed in range(1000):  # 0.934 here; a 90% interval would cover about 0.89 of the time
        est, low, high = bootstrap_ci(torch.randn(50, generator=gen), n_boot=400, seed=seed)
        hits += int(low <= 0.0 <= high)
    assert 0.915 <= hits / 1000 <= 0.97


def test_bootstrap_fast_mean_equals_the_general_path_and_weights_pool_tokens(tokens):
    x = torch.rand(30, 3, 2)
    fast, general = bootstrap_ci(x, seed=3), bootstrap_ci(x, stat=lambda t, dim: t.mean(dim), seed=3)
    for a, b in zip(fast, general, strict=True):
        torch.testing.assert_close(a, b)
    tokens = [torch.rand(int(n)) for n in torch.randint(1, 20, (25,))]  # prompts of 1..19 tokens
    means, counts = torch.stack([t.mean() for t in tokens]), torch.tensor([len(t) for t in tokens])
    est, low, high = bootstrap_ci(means, weights=counts)
    assert est.item() == pytest.approx(torch.cat(tokens).mean().item(), rel=1e-5)
    ratio = lambda t, dim: t[..., 0].sum(dim) / t[..., 1].sum(dim)  # noqa: E731  pooled mean of the resample
    pooled = bootstrap_ci(torch.stack([means * counts, counts], 1), stat=ratio)
    torch.testing.assert_close(torch.stack([low, high]), torch.stack(list(pooled[1:])))
    med = bootstrap_ci(x[:, 0, 0], stat=torch.median)
    assert med.estimate == x[:, 0, 0].median() and med.low <= med.estimate <= med.high


@pytest.mark.parametrize("kwargs, match", [(dict(values_per_unit=[1.0]), "at least 2 sequences"),
                                           (dict(values_per_unit=[1.0, 2.0], ci=95), "between 0 and 1"),
                                           (dict(values_per_unit=[1.0, 2.0], weights=[1, 1], stat=torch.median),
                                            "stat=torch.mean only")])
def test_bootstrap_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(**kwargs)


def test_gate_cis_resample_prompts_not_tokens(make_gated):
    model = make_gated()  # prompt b has gate b / 10 at every token: all the spread is between prompts
    with model.hooks(plant_gate(lambda g, layer: (torch.arange(g.shape[0]) / 10).reshape(-1, 1, 1).expand_as(g))):
        g = gate_scores(model, torch.tensor(ids(20, 20, 20, 20, 20)))
    est, low, high = g.layer_means(ci=True)
    torch.testing.assert_close(est, torch.full((3,), 0.2))
    assert ((high - low) > 0.1).all()  # tokens resampled would give about a third of this width
    d = g.distribution(ci=True)
    assert d.ci["mean"][0] < d.mean < d.ci["mean"][1]
    f = g.first_vs_rest(ci=0.9, n_boot=300)
    assert set(f.ci) == {"first", "rest", "ratio"} and f.ci["ratio"][0] <= f.ratio <= f.ci["ratio"][1]


def test_per_type_stats_read_each_types_own_prompts(make_gated):
    model = make_gated(vocab_size=4096)
    tok = get_tokenizer()
    current = {}
    model.register_forward_pre_hook(lambda m, args: current.update(tokens=args[0]))
    by_id = lambda g, layer: (current["tokens"] / 4096).reshape(*current["tokens"].shape, 1).expand_as(g)  # noqa: E731
    prompts = load_prompts()
    with model.hooks(plant_gate(by_id)):
        table = compare_gates(gate_scores_by_type(model, prompts, tokenizer=tok, batch_size=64), ci=True)
    assert list(table) == list(PROMPT_TYPES)
    for kind, rows in prompts.items():
        token_ids = torch.tensor([i for p in rows for i in [tok.bos_id] + tok.encode(p)])
        assert table[kind]["n_prompts"] == len(rows) and table[kind]["n_tokens"] == len(token_ids)
        assert table[kind]["mean"] == pytest.approx(token_ids.double().mean().item() / 4096, rel=1e-5)
        assert table[kind]["first"] == 0.0 and table[kind]["mean_low"] < table[kind]["mean"] < table[kind]["mean_high"]


@pytest.mark.parametrize("call, match", [
    (lambda gated: gate_scores(gated(gate="none"), ids(3)),
     r"reads the paper's G1 gate.*no gate \(gate='none'\); load a headwise"),
    (lambda gated: gate_scores(gated(gate="G3"), ids(3)), "G1"),
    (lambda gated: gate_scores(gated(), []), "prompt set is empty"),
    (lambda gated: gate_scores_by_type(gated(), {}), "prompt set is empty"),
    (lambda gated: gate_scores_by_type(gated(), {"code": []}), "type 'code' is empty"),
    (lambda gated: gate_scores(gated(), ids(3), layers=[3]), "layer 3 is out of range.*3 layers"),
    (lambda gated: gate_scores(gated(), ids(3)).token_matrix(0, head=4), "head 4 is out of range.*4 heads"),
    (lambda gated: gate_scores(gated(), ids(3)).token_matrix(1), "prompt 1 is out of range"),
    (lambda gated: gate_scores(gated(), ["some text"]), "tokenizer="),
    (lambda gated: gate_scores(gated(), [[0, 99]]), "prompt 0 hold token id 99, but the model's vocab_size is"),
    (lambda gated: gate_scores(gated(), [[0, 5], [-2, 3]]), "prompt 1 hold token id -2, "),  # the negative id
    (lambda gated: load_prompts("poetry"), "unknown prompt type 'poetry'"),
])
def test_clear_errors(call, match, make_gated):
    with pytest.raises(ValueError, match=match):
        call(make_gated)


# -- the prompt sets ------------------------------------------------------------------------------------------
def test_prompt_sets_have_50_unique_prompts_per_type():
    prompts = load_prompts()
    assert tuple(prompts) == PROMPT_TYPES
    everything = [p for rows in prompts.values() for p in rows]
    assert len(everything) == len(set(everything))  # unique within and across types
    for kind, rows in prompts.items():
        assert len(rows) >= 50 and all(isinstance(p, str) and p.strip() == p and p for p in rows), kind
    for p in prompts["code"]:
        compile(p, "<prompt>", "exec")  # every code prompt is valid Python
    for kind in ("factual", "technical", "conversational"):  # 1-3 sentences each
        assert all(1 <= len(re.findall(r"[.!?](?=\s|$)", p)) <= 3 for p in prompts[kind]), kind
    assert load_prompts("code") == {"code": prompts["code"]}


def test_sink_tracker_also_measures_the_first_64_positions(tiny_deep, tokens):
    from minigate.analysis import TRACKED, sink_tracker

    torch.manual_seed(0)
    model = Transformer(ModelConfig(**tiny_deep, max_seq_len=96)).eval()
    long = tokens(3, 96, seed=1)
    out = sink_tracker(long)(1, model, None)
    short = attention_sink(model, long[:, :64])  # causal: the first 64 queries see only the first 64 keys
    assert out["f_attn_64"] == pytest.approx(short.f_attn)
    assert out["max_head_64"] == pytest.approx(short.share.max().item())
    assert out["f_attn"] == pytest.approx(attention_sink(model, long).f_attn)
    assert out["f_attn_64"] != pytest.approx(out["f_attn"])  # shorter windows: more on the first token
    assert "f_attn_64" not in sink_tracker(long[:, :64])(1, model, None)
    assert set(out) == set(TRACKED) and all(isinstance(out[k], (float, list)) for k in out if k != "sink_heads_64")
    assert out["sink_heads_64"] == short.n_sink_heads and type(out["sink_heads_64"]) is int  # a count
