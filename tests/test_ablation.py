"""Ablations and overrides (minigate.ablation, minigate.overrides): chunking, perplexity and its bootstrap
interval, gate overrides and controls that touch exactly their target, and the batched sweep equal to the looped
one."""

import math

import pytest
import torch

from minigate import ModelConfig, Transformer
from minigate import ablation as ab
from minigate import overrides as ov
from minigate.evaluation import evaluate

GRANS = ["headwise", "elementwise"]
CONTEXT = 32  # the models' max_seq_len: chunks of 16 tokens fit, 33 do not


@pytest.fixture
def stream(tokens):
    return tokens(600, None, vocab=64)


@pytest.fixture
def model_for(tiny_deep):
    """model_for(gran, gate, seed) -> the three-layer tiny model (a 32-token context) with weights large enough that
    every override visibly moves the loss."""
    def make(gran="headwise", gate="G1", seed=0):
        torch.manual_seed(seed)
        model = Transformer(ModelConfig(**tiny_deep, max_seq_len=CONTEXT, gate=gate, gate_granularity=gran)).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.25)
        return model

    return make


def cached(model, hooks, chunks):
    """Activations seen *after* the override hooks (hooks attached earlier run first)."""
    with model.hooks(hooks):
        _, cache = model.run_with_cache(chunks[:, :-1])
    return cache


def overridden(model, hooks, chunks) -> dict[int, torch.Tensor]:
    """{layer: (head,) bool} where the gate differs from sigmoid(its own logits): what the hooks touched."""
    cache = cached(model, hooks, chunks)
    out = {}
    for L in range(model.cfg.n_layers):
        a = f"blocks.{L}.attn."
        diff = (cache[a + "hook_gate"] - torch.sigmoid(cache[a + "hook_gate_logits"])).abs()
        touched = diff.flatten(3).amax(dim=(0, 1, 3)) > 1e-6 if diff.dim() == 4 else diff.amax(dim=(0, 1)) > 1e-6
        if touched.any():
            out[L] = touched
    return out


# -- chunks and perplexity ----------------------------------------------------------------------------
def test_chunks_are_bos_plus_consecutive_windows(stream):
    c = ab.chunks(stream, 5, 16, bos_id=7)
    assert c.shape == (5, 17) and (c[:, 0] == 7).all()
    torch.testing.assert_close(c[:, 1:].flatten(), stream[:80])


def test_perplexity_is_exp_of_the_training_loops_evaluate(model_for, stream):
    model = model_for()
    c = ab.chunks(stream, 6, 16)
    r = ab.perplexity(model, c, batch_size=4)
    loss = evaluate(model, stream[:96], seq_len=16, batch_size=5)  # the same windows, computed independently
    assert r.ppl == pytest.approx(math.exp(loss), rel=1e-6)
    assert r.loss == pytest.approx(loss, rel=1e-6) and r.n_tokens == 96 and r.chunk_losses.shape == (6,)


def test_bootstrap_interval_contains_the_estimate_and_shrinks_with_more_chunks(model_for, stream):
    r = ab.perplexity(model_for(), ab.chunks(stream, 8, 16))
    assert r.ci[0] < r.ppl < r.ci[1]
    g = torch.Generator().manual_seed(1)
    few, many = torch.rand(10, generator=g, dtype=torch.float64), torch.rand(1000, generator=g, dtype=torch.float64)
    (a, b), (c, d) = ab._ppl_ci(few), ab._ppl_ci(many)
    assert a < math.exp(few.mean()) < b and c < math.exp(many.mean()) < d
    assert (d - c) < (b - a) / 4  # ~ 1/sqrt(n): 10x narrower expected


# -- overrides touch exactly their target ----------------------------------------------------------------
@pytest.mark.parametrize("gran", GRANS)
def test_each_override_touches_exactly_its_layer_and_head(gran, model_for, stream):
    model, c = model_for(gran), ab.chunks(stream, 3, 16)
    assert overridden(model, [], c) == {}
    assert set(overridden(model, ov.set_gates(model, 0.3), c)) == {0, 1, 2}
    assert set(overridden(model, ov.set_gates(model, 0.3, layers=[0, 2]), c)) == {0, 2}
    touched = overridden(model, ov.force_layer(model, 1, 1.0), c)
    assert set(touched) == {1} and touched[1].all()
    touched = overridden(model, ov.close_head(model, 1, 2), c)
    assert set(touched) == {1} and touched[1].tolist() == [False, False, True, False]


@pytest.mark.parametrize("gran", GRANS)
def test_closed_head_silences_that_head_only(gran, model_for, stream):
    model, c = model_for(gran), ab.chunks(stream, 3, 16)
    clean, closed = cached(model, [], c), cached(model, ov.close_head(model, 1, 2), c)
    z = closed["blocks.1.attn.hook_z_gated"]
    assert z[:, :, 2].abs().max() == 0 and z[:, :, [0, 1, 3]].abs().min() > 0
    torch.testing.assert_close(z[:, :, [0, 1, 3]], clean["blocks.1.attn.hook_z_gated"][:, :, [0, 1, 3]])
    torch.testing.assert_close(closed["blocks.0.hook_attn_out"], clean["blocks.0.hook_attn_out"])  # upstream
    assert (closed["blocks.2.hook_attn_out"] - clean["blocks.2.hook_attn_out"]).abs().max() > 1e-3  # downstream


@pytest.mark.parametrize("gran", GRANS)
def test_all_gates_forced_open_equals_the_model_without_gate_rows(gran, model_for, stream, tiny_deep):
    gated, c = model_for(gran), ab.chunks(stream, 4, 16)
    plain = Transformer(ModelConfig(**tiny_deep, max_seq_len=CONTEXT)).eval()
    state, (H, K, D, d) = gated.state_dict(), (4, 2, 8, 32)
    for L in range(tiny_deep["n_layers"]):  # drop the gate rows from q_proj (grouped per kv head)
        w = state[f"blocks.{L}.attn.q_proj.weight"].view(K, -1, d)
        state[f"blocks.{L}.attn.q_proj.weight"] = w[:, : (H // K) * D].reshape(H * D, d)
    plain.load_state_dict(state)
    opened = ab.perplexity(gated, c, ov.set_gates(gated, 1.0), ci=False)
    torch.testing.assert_close(opened.chunk_losses, ab.perplexity(plain, c, ci=False).chunk_losses)
    assert abs(ab.perplexity(gated, c, ci=False).loss - opened.loss) > 1e-3  # the learned gate does matter


@pytest.mark.parametrize("gran", GRANS)
def test_mean_gates_are_the_clean_mean_at_every_position(gran, model_for, stream):
    model, c = model_for(gran), ab.chunks(stream, 4, 16)
    clean = cached(model, [], c)["blocks.1.attn.hook_gate"]
    gate = cached(model, ab.mean_gates(model, c), c)["blocks.1.attn.hook_gate"]
    expected = clean.mean(dim=(0, 1))  # (head,) or (head, d_head)
    torch.testing.assert_close(gate, expected.expand_as(gate), atol=1e-6, rtol=1e-6)


def test_controls_change_the_targeted_output_as_documented(model_for, stream):
    model, c = model_for(), ab.chunks(stream, 4, 16)
    clean = cached(model, [], c)
    a0, m1 = clean["blocks.0.hook_attn_out"], clean["blocks.1.hook_mlp_out"]
    torch.testing.assert_close(cached(model, ov.scale_output(model, 0, 3.0), c)["blocks.0.hook_attn_out"], 3 * a0)
    mean = cached(model, ab.mean_output(model, c, 1, "mlp"), c)["blocks.1.hook_mlp_out"]
    torch.testing.assert_close(mean, m1.mean(dim=(0, 1)).expand_as(mean), atol=1e-6, rtol=1e-5)
    fixed = cached(model, ab.fixed_norm(model, c, 1, "mlp"), c)["blocks.1.hook_mlp_out"]
    torch.testing.assert_close(fixed.norm(dim=-1), torch.full(fixed.shape[:2], m1.norm(dim=-1).mean().item()))
    torch.testing.assert_close(fixed / fixed.norm(dim=-1, keepdim=True), m1 / m1.norm(dim=-1, keepdim=True))
    s = ab.matched_scale(model, c, 0, 1.0)  # scaling the output by s matches the RMS of the forced-open output
    opened = cached(model, ov.force_layer(model, 0, 1.0), c)["blocks.0.hook_attn_out"]
    assert (s * a0).pow(2).mean().sqrt().item() == pytest.approx(opened.pow(2).mean().sqrt().item(), rel=1e-5)
    assert s > 1.2  # random-init gates sit near 0.5: opening them enlarges the output


# -- forbidding <bos> ------------------------------------------------------------------------------------
@pytest.mark.parametrize("gate, head", [("none", None), ("G1", None), ("G1", 2)])
def test_forbid_bos_zeroes_key_0_renormalises_and_touches_nothing_else(gate, head, model_for, stream):
    model, c = model_for(gate=gate), ab.chunks(stream, 3, 16)
    hooks = ov.forbid_bos(model, 1, head)
    assert [name for name, _ in hooks] == ["blocks.1.attn.hook_pattern"]
    clean, forbidden = cached(model, [], c), cached(model, hooks, c)
    torch.testing.assert_close(forbidden["blocks.0.attn.hook_pattern"], clean["blocks.0.attn.hook_pattern"])
    before, after = clean["blocks.1.attn.hook_pattern"], forbidden["blocks.1.attn.hook_pattern"]  # (b, head, q, k)
    heads = list(range(4)) if head is None else [head]
    others = [h for h in range(4) if h not in heads]
    torch.testing.assert_close(after[:, others], before[:, others])
    a, b = after[:, heads], before[:, heads]
    assert (a[:, :, 1:, 0] == 0).all() and (a[:, :, 0, 0] == 1).all()  # query 0 keeps its only key
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))
    torch.testing.assert_close(a[:, :, 1:, 1:], b[:, :, 1:, 1:] / (1 - b[:, :, 1:, :1]))  # the others, rescaled
    assert (forbidden["blocks.2.hook_attn_out"] - clean["blocks.2.hook_attn_out"]).abs().max() > 1e-3  # downstream
    every = ab.perplexity(model, c, sum((ov.forbid_bos(model, L) for L in range(3)), []), ci=False)
    assert every.loss != pytest.approx(ab.perplexity(model, c, ci=False).loss, abs=1e-4)


def test_forbid_bos_rows_with_nothing_but_bos_stay_zero(model_for):
    pattern = torch.zeros(1, 2, 3, 3)
    pattern[..., 0] = 1.0  # every query on <bos> alone: nothing left to renormalise over
    (_, forbid), = ov.forbid_bos(model_for(), 0)
    out = forbid(pattern)
    assert not out.isnan().any() and (out[:, :, 1:] == 0).all() and (out[:, :, 0, 0] == 1).all()


# -- reading results --------------------------------------------------------------------------------------
def _ppl(loss: float) -> ab.Perplexity:
    losses = torch.tensor([loss - 0.1, loss + 0.1], dtype=torch.float64)
    return ab.Perplexity(ppl=math.exp(loss), chunk_losses=losses, ci=None, n_tokens=32)


def test_rank_layers_orders_exactly_the_named_layer_conditions_by_nats():
    results = {"learned": _ppl(3.0), "L0 open": _ppl(3.5), "L1 open": _ppl(5.0), "L10 open": _ppl(4.0),
               "L2 closed": _ppl(9.0), "L0H3 open": _ppl(12.0), "gates=0.5": _ppl(8.0), "L1 opened": _ppl(11.0)}
    ranked = ab.rank_layers(results)
    assert [L for L, _ in ranked] == [1, 10, 0]  # two-digit layers parsed; head and other conditions ignored
    assert [d for _, d in ranked] == pytest.approx([2.0, 1.0, 0.5])
    assert ab.rank_layers(results, "closed") == [(2, pytest.approx(6.0))]
    assert ab.rank_layers({"learned": _ppl(3.0)}) == []
    with pytest.raises(ValueError, match="'learned' entry"):
        ab.rank_layers({"L0 open": _ppl(3.0)})


def test_rank_layers_on_a_sweep_is_the_log_perplexity_ratio(model_for, stream):
    model, c = model_for("elementwise"), ab.chunks(stream, 4, 16)
    results = ab.sweep(model, c, {"learned": [], **ab.layer_conditions(model)}, ci=False, progress=False)
    ranked = ab.rank_layers(results, "closed")
    want = sorted(((L, math.log(results[f"L{L} closed"].ppl / results["learned"].ppl)) for L in range(3)),
                  key=lambda pair: -pair[1])
    assert [L for L, _ in ranked] == [L for L, _ in want]
    assert [d for _, d in ranked] == pytest.approx([d for _, d in want], abs=1e-9)


# -- the batched sweep ------------------------------------------------------------------------------------
@pytest.mark.parametrize("gran", GRANS)
def test_batched_sweep_equals_looped_sweep_for_every_condition_kind(gran, model_for, stream):
    model, c = model_for(gran), ab.chunks(stream, 5, 16)
    stats = ab.activation_moments(model, c)
    conds = {**ab.published_conditions(model, c, first_layers=2, stats=stats),
             **ab.control_conditions(model, c, layers=[1], stats=stats),
             "L0H1+L2H3 closed": ov.close_head(model, 0, 1) + ov.close_head(model, 2, 3),  # two edits, two layers
             "L1 half": [("blocks.1.attn.hook_gate", lambda g, hook: g / 2)]}  # not an Edit: looped
    forwards = []
    count = [("hook_embed", lambda x, hook: forwards.append(x.shape[0]))]
    with model.hooks(count):
        batched = ab.sweep(model, c, conds, max_batch=7, progress=False)  # 7 rows: passes straddle conditions
    n_stacked = len(conds) - 1
    assert forwards[: math.ceil(n_stacked * 5 / 7)] == [7] * (n_stacked * 5 // 7) + [n_stacked * 5 % 7]
    with model.hooks(count):
        looped = ab.sweep(model, c, conds, batched=False, max_batch=7, progress=False)
    learned = looped["learned"].chunk_losses
    for name in conds:
        torch.testing.assert_close(batched[name].chunk_losses, looped[name].chunk_losses, atol=1e-5, rtol=0)
        assert batched[name].ppl == pytest.approx(looped[name].ppl, rel=1e-5)
        if name != "learned":
            assert (looped[name].chunk_losses - learned).abs().max() > 1e-4, name  # every condition does something


# -- bad requests -----------------------------------------------------------------------------------------
def test_bad_requests_name_the_fix(model_for, stream):
    gated, plain = model_for(), model_for(gate="none")
    c = ab.chunks(stream, 2, 16)
    for make in (lambda: ov.set_gates(plain, 0.1), lambda: ov.close_head(plain, 0, 0),
                 lambda: ab.mean_gates(plain, c), lambda: ab.published_conditions(plain, c)):
        with pytest.raises(ValueError, match=r"no gate \(gate='none'\).*gate='G1'.*the controls"):
            make()
    assert ab.control_conditions(plain, c, layers=[0])  # the controls need no gate
    for bad in (3, -1):
        with pytest.raises(ValueError, match=r"layer .* out of range: the model has 3 layers, use 0\.\.2"):
            ov.force_layer(gated, bad, 1.0)
    with pytest.raises(ValueError, match=r"head 4 is out of range.*use 0\.\.3"):
        ov.close_head(gated, 0, 4)
    with pytest.raises(ValueError, match=r"head 4 is out of range.*use 0\.\.3"):
        ov.forbid_bos(plain, 0, 4)
    with pytest.raises(ValueError, match=r"layer 3 is out of range"):
        ov.forbid_bos(plain, 3)
    with pytest.raises(ValueError, match="trained for max_seq_len=32.*use chunk_len <= 32"):
        ab.chunks(stream, 2, 33, model=gated)
    with pytest.raises(ValueError, match="max_seq_len=32"):
        ab.perplexity(gated, ab.chunks(stream, 2, 40))
    with pytest.raises(ValueError, match="600 tokens, too few.*use n_chunks <= 37"):
        ab.chunks(stream, 50, 16)
    with pytest.raises(ValueError, match="component='resid'"):
        ov.scale_output(gated, 0, 2.0, "resid")
    with pytest.raises(ValueError, match="list of \\(hook name, fn\\) pairs"):
        ab.sweep(gated, c, {"oops": 0.1})
    with pytest.raises(ValueError, match="no conditions"):
        ab.sweep(gated, c, {})
