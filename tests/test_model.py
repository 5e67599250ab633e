"""The model: every gate variant, both attention paths, hook points, config validation."""

import itertools

import pytest
import torch

import minigate
from minigate import ModelConfig, Transformer
from minigate.config import GATE_ACTIVATIONS, GATE_GRANULARITIES, GATE_MODES, GATE_POSITIONS, ConfigError

def all_variants():
    for pos, gran, shared, act, mode in itertools.product(GATE_POSITIONS, GATE_GRANULARITIES, [False, True],
                                                          GATE_ACTIVATIONS, GATE_MODES):
        if pos == "none" and (gran, shared, act, mode) != ("elementwise", False, "sigmoid", "multiplicative"):
            continue  # the gate fields do nothing without a gate
        if pos == "G5" and (gran == "headwise" or shared):
            continue  # invalid, see test_invalid_configs
        yield dict(gate=pos, gate_granularity=gran, gate_head_specific=not shared, gate_activation=act,
                   gate_mode=mode)


VARIANTS = list(all_variants())
IDS = ["-".join(str(v) for v in kw.values()) for kw in VARIANTS]


def test_variant_count(tiny, tokens):
    """VARIANTS holds every gate config that ModelConfig accepts, each once, and one baseline: without a gate the
    gate fields build the same model. Counted from ModelConfig's own validation, not restated by hand."""
    fields = dict(gate=GATE_POSITIONS, gate_granularity=GATE_GRANULARITIES, gate_head_specific=[True, False],
                  gate_activation=GATE_ACTIVATIONS, gate_mode=GATE_MODES)
    valid = []
    for values in itertools.product(*fields.values()):
        kw = dict(zip(fields, values, strict=True))
        try:
            ModelConfig(**tiny, **kw)
        except ConfigError:
            continue
        valid.append(kw)
    gated = [kw for kw in valid if kw["gate"] != "none"]
    canon = lambda kws: sorted(tuple(sorted(kw.items())) for kw in kws)
    assert canon(kw for kw in VARIANTS if kw["gate"] != "none") == canon(gated)
    baselines = [kw for kw in valid if kw["gate"] == "none"]
    assert [kw for kw in VARIANTS if kw["gate"] == "none"][0] in baselines
    assert len(VARIANTS) == len(gated) + 1
    outputs = []
    for kw in baselines:
        torch.manual_seed(0)
        outputs.append(Transformer(ModelConfig(**tiny, **kw)).eval()(tokens()))
    assert all(torch.equal(out, outputs[0]) for out in outputs)  # so one baseline stands for all of them


@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_sdpa_path_equals_explicit_path(kw, tiny, tokens):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**tiny, **kw)).eval()
    with torch.no_grad():
        fast = model(tokens())
        explicit, patterns = model.run_with_cache(tokens(), names_filter=lambda n: n.endswith("hook_pattern"))
    assert len(patterns) == model.cfg.n_layers
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_explicit_path_gives_the_fused_paths_gradients(kw, tiny, tokens):
    """Training through a hooked pattern (the explicit path scales and masks its scores in place) gives the gradients
    of the fused path: the in-place steps break no backward."""
    grads = []
    for hooked in (False, True):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(**tiny, **kw))
        hooks = [(lambda n: n.endswith("hook_pattern"), lambda pattern, hook: pattern)] if hooked else []
        logits = model.run_with_hooks(tokens(), fwd_hooks=hooks)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens().flatten()).backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_forward_backward_and_gate_gets_gradient(kw, tiny, tokens):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**tiny, **kw))
    logits = model(tokens())
    assert logits.shape == (2, 10, tiny["vocab_size"])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens().flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    if kw["gate"] == "none":
        return
    if kw["gate"] == "G1" and kw["gate_head_specific"]:  # official layout: the gate rows of q_proj
        cfg = model.cfg
        w = model.blocks[0].attn.q_proj.weight.grad.view(cfg.n_kv_heads, -1, cfg.d_model)
        gate_grad = w[:, cfg.group_size * cfg.head_dim:]
    else:
        gate_grad = model.blocks[0].attn.gate_proj.weight.grad
    assert gate_grad.abs().sum() > 0


def test_attention_computes_only_the_released_gate(tiny):
    """Attention has no SiLU, additive, shared or biased gate: the study gates are GatePositionAttention's."""
    from minigate.attention import Attention, GatePositionAttention

    for kw in (dict(gate_mode="additive"), dict(gate_activation="silu"), dict(gate_head_specific=False),
               dict(gate_bias=-2.0), dict(gate="G2")):
        cfg = ModelConfig(**tiny, **{"gate": "G1", **kw})
        assert not cfg.released_g1
        with pytest.raises(ValueError, match="GatePositionAttention"):
            Attention(cfg)
        assert type(Transformer(cfg).blocks[0].attn) is GatePositionAttention
    for cfg in (ModelConfig(**tiny), ModelConfig(**tiny, gate="G1", gate_granularity="headwise")):
        assert type(Transformer(cfg).blocks[0].attn) is Attention


@pytest.mark.parametrize("gran,E", [("headwise", 1), ("elementwise", 8)])
def test_gate_parameter_count(gran, E, tiny):
    base = Transformer(ModelConfig(**tiny)).num_params()
    m = Transformer(ModelConfig(**tiny, gate="G1", gate_granularity=gran))
    assert m.num_params() - base == m.num_params(gate_only=True) == 2 * 4 * E * 32
    for kw in (dict(gate_layers=1), dict(gate_layers=1, gate_bias=-2.0), dict(gate="G2"), dict(gate="G5"),
               dict(gate_head_specific=False)):  # only the layers that have a gate count, bias included
        kw = {"gate": "G1", "gate_granularity": gran, **kw}
        if kw["gate"] == "G5":
            kw["gate_granularity"] = "elementwise"
        m = Transformer(ModelConfig(**tiny, **kw))
        assert m.num_params() - base == m.num_params(gate_only=True) > 0, kw


# ---- hooks -----------------------------------------------------------------------------------------
def test_cache_names_and_shapes(tiny, tokens):
    cfg = ModelConfig(**tiny, gate="G1", gate_granularity="elementwise")
    _, cache = Transformer(cfg).run_with_cache(tokens(2, 10))
    B, T, H, K, D, d = 2, 10, 4, 2, 8, 32
    expect = {"hook_embed": (B, T, d)}
    for L in range(2):
        b = f"blocks.{L}."
        expect.update({b + "hook_resid_pre": (B, T, d), b + "hook_attn_out": (B, T, d),
                       b + "hook_resid_mid": (B, T, d), b + "hook_mlp_out": (B, T, d),
                       b + "hook_resid_post": (B, T, d), b + "attn.hook_q": (B, T, H, D),
                       b + "attn.hook_k": (B, T, K, D), b + "attn.hook_v": (B, T, K, D),
                       b + "attn.hook_rot_q": (B, T, H, D), b + "attn.hook_rot_k": (B, T, K, D),
                       b + "attn.hook_attn_scores": (B, H, T, T),
                       b + "attn.hook_pattern": (B, H, T, T), b + "attn.hook_z": (B, T, H, D),
                       b + "attn.hook_gate_logits": (B, T, H, D), b + "attn.hook_gate": (B, T, H, D),
                       b + "attn.hook_z_gated": (B, T, H, D)})
    assert {k: tuple(v.shape) for k, v in cache.items()} == expect
    # a pattern is a causal probability distribution over keys
    pat = cache["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(pat.sum(-1), torch.ones(B, H, T))
    assert pat.triu(1).abs().max() == 0
    # the gate is the sigmoid of its logits, and z_gated = z * gate
    a = "blocks.1.attn."
    torch.testing.assert_close(cache[a + "hook_gate"], torch.sigmoid(cache[a + "hook_gate_logits"]))
    torch.testing.assert_close(cache[a + "hook_z_gated"], cache[a + "hook_z"] * cache[a + "hook_gate"])


def test_headwise_gate_hook_shape_and_baseline_has_no_gate_hooks(tiny, tokens):
    _, cache = Transformer(ModelConfig(**tiny, gate="G1", gate_granularity="headwise")).run_with_cache(
        tokens(), names_filter=lambda n: "gate" in n)
    assert {tuple(v.shape) for k, v in cache.items() if k.endswith("hook_gate")} == {(2, 10, 4)}
    base = Transformer(ModelConfig(**tiny))
    assert not [n for n in base.hook_dict if "gate" in n]


@pytest.mark.parametrize("gran", ["headwise", "elementwise"])
def test_gate_forced_to_one_equals_ungated_model(gran, tiny, tokens):
    torch.manual_seed(0)
    gated = Transformer(ModelConfig(**tiny, gate="G1", gate_granularity=gran)).eval()
    plain = Transformer(ModelConfig(**tiny)).eval()
    state = gated.state_dict()
    H, K, D = 4, 2, 8
    for L in range(2):  # drop the gate rows from q_proj: the rest is a baseline model
        w = state[f"blocks.{L}.attn.q_proj.weight"].view(K, -1, 32)
        state[f"blocks.{L}.attn.q_proj.weight"] = w[:, : (H // K) * D].reshape(H * D, 32)
    plain.load_state_dict(state)
    open_all = gated.run_with_hooks(tokens(), fwd_hooks=[(lambda n: n.endswith("hook_gate"),
                                                          lambda g, hook: torch.ones_like(g))])
    torch.testing.assert_close(open_all, plain(tokens()), atol=1e-5, rtol=1e-5)
    assert (gated(tokens()) - plain(tokens())).abs().max() > 1e-3  # the learned gate does matter


def test_gate_forced_to_zero_removes_attention(tiny, tokens):
    model = Transformer(ModelConfig(**tiny, gate="G1", gate_granularity="headwise"))
    cache = {}

    def save(t, hook):
        cache[hook.name] = t

    model.run_with_hooks(tokens(), fwd_hooks=[("blocks.1.attn.hook_gate", lambda g, hook: torch.zeros_like(g)),
                                              (lambda n: n.endswith("hook_attn_out"), save)])
    assert cache["blocks.1.hook_attn_out"].abs().max() == 0
    assert cache["blocks.0.hook_attn_out"].abs().max() > 0  # only the targeted layer


def test_hook_on_pattern_selects_explicit_path_and_can_replace_it(tiny, tokens):
    model = Transformer(ModelConfig(**tiny)).eval()
    seen = []
    model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: seen.append(p))])
    assert len(seen) == 1 and seen[0].shape == (2, 4, 10, 10)

    def first_token_only(p, hook):
        out = torch.zeros_like(p)
        out[..., 0] = 1
        return out

    cache = {}
    model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.attn.hook_pattern", first_token_only),
                                              ("blocks.0.attn.hook_z", lambda z, hook: cache.setdefault("z", z)),
                                              ("blocks.0.attn.hook_v", lambda v, hook: cache.setdefault("v", v))])
    v0 = cache["v"][:, 0]  # (batch, kv_head, d_head): every query now reads the first value
    expected = v0.repeat_interleave(2, dim=1)[:, None].expand(-1, 10, -1, -1)
    torch.testing.assert_close(cache["z"], expected)


def test_hooks_removed_after_exception(tiny, tokens):
    model = Transformer(ModelConfig(**tiny, gate="G1"))

    def boom(t, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.attn.hook_gate", boom)])
    assert not any(hp.active for hp in model.hook_dict.values())
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())
    model(tokens())  # runs clean


def test_unknown_hook_name_is_a_clear_error(tiny, tokens):
    model = Transformer(ModelConfig(**tiny))
    with pytest.raises(KeyError, match="hook_dict"):
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.attn.hook_gate", lambda t, h: t)])


def test_generate_is_deterministic_with_temperature_zero(tiny, tokens):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**tiny))
    out = model.generate(tokens(1, 4), max_new_tokens=5, temperature=0)
    assert out.shape == (1, 9) and torch.equal(out[:, :4], tokens(1, 4))
    assert torch.equal(out, model.generate(tokens(1, 4), max_new_tokens=5, temperature=0))
    # greedy: each new token is the argmax of the model's prediction
    assert out[0, 4] == model(out[:, :4])[0, -1].argmax()
    sampled = model.generate(tokens(1, 4), 5, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (1, 9)


# ---- config validation -----------------------------------------------------------------------------
@pytest.mark.parametrize("kw,field,hint", [
    (dict(n_heads=6, n_kv_heads=4), "n_kv_heads", r"divisible.*\[1, 2, 3, 6\]"),
    (dict(gate="G6"), "gate", "allowed"),
    (dict(gate="after_softmax"), "gate", "G1"),
    (dict(gate="G5", gate_granularity="headwise"), "gate_granularity", "elementwise"),
    (dict(gate="G5", gate_head_specific=False), "gate_head_specific", "G5"),
    (dict(head_dim=7), "head_dim", "RoPE"),
    (dict(gate_activation="tanh"), "gate_activation", "sigmoid"),
    (dict(gate_mode="mul"), "gate_mode", "multiplicative"),
    (dict(gate_granularity="channel"), "gate_granularity", "headwise"),
    (dict(d_model=0), "d_model", "positive"),
])
def test_invalid_configs(kw, field, hint, tiny):
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}") as e:
        ModelConfig(**{**tiny, **kw})
    assert e.match(hint)


def test_hf_config_roundtrip_and_official_keys(tiny):
    cfg = ModelConfig(**tiny, gate="G1", gate_granularity="headwise")
    d = cfg.to_hf_config()
    assert d["headwise_attn_output_gate"] and not d["elementwise_attn_output_gate"]
    assert ModelConfig.from_hf_config(d) == cfg
    official = {k: v for k, v in d.items() if k != "minigate"}  # as the released config.json has it
    assert ModelConfig.from_hf_config(official) == cfg
    silu = ModelConfig(**tiny, gate="G1", gate_activation="silu")  # not the official gate: no official flag
    assert not silu.to_hf_config()["elementwise_attn_output_gate"]
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf_config({"vocab_size": 3})


def test_gate_bias_starts_the_gate_at_its_sigmoid_and_round_trips(tmp_path, tiny_model, tokens):
    model = tiny_model(gate="G1", gate_granularity="headwise", gate_bias=-2.0)
    cfg, x = model.cfg, tokens(2, 12)
    logits, cache = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_gate"))
    for g in cache.values():  # x W is tiny at init, so the gate starts near sigmoid(-2) = 0.119
        assert abs(g.mean().item() - torch.sigmoid(torch.tensor(-2.0)).item()) < 0.01
    assert [n for n, p in model.named_parameters() if p.dim() == 1 and "gate_bias" in n] == [
        "blocks.0.attn.gate_bias", "blocks.1.attn.gate_bias"]  # 1-d: no weight decay
    minigate.save_pretrained(model, tmp_path)
    assert torch.allclose(minigate.from_pretrained(tmp_path)(x), logits, atol=1e-6)
    unbiased = Transformer(ModelConfig(**{**cfg.to_dict(), "gate_bias": 0.0})).eval()
    unbiased.load_state_dict({k: v for k, v in model.state_dict().items() if "gate_bias" not in k})
    _, c0 = unbiased.run_with_cache(x, names_filter="blocks.0.attn.hook_gate_logits")
    _, c1 = model.run_with_cache(x, names_filter="blocks.0.attn.hook_gate_logits")
    assert torch.allclose(c1["blocks.0.attn.hook_gate_logits"], c0["blocks.0.attn.hook_gate_logits"] - 2.0, atol=1e-6)


def test_gate_layers_gates_only_the_first_layers(tmp_path, tiny_deep, tokens):
    from minigate import ablation, gate_analysis

    torch.manual_seed(0)
    model = Transformer(ModelConfig(**tiny_deep, gate="G1", gate_granularity="headwise", gate_layers=1)).eval()
    assert "blocks.0.attn.hook_gate" in model.hook_dict and "blocks.1.attn.hook_gate" not in model.hook_dict
    assert model.blocks[1].attn.q_proj.weight.shape[0] == 4 * 8  # no gate rows past layer 0
    x = tokens(2, 12)
    minigate.save_pretrained(model, tmp_path)
    assert torch.allclose(minigate.from_pretrained(tmp_path)(x), model(x), atol=1e-6)
    assert [name for name, _ in ablation.set_gates(model, 0.0)] == ["blocks.0.attn.hook_gate"]
    assert gate_analysis.gate_scores(model, x).layers == [0]
    with pytest.raises(ValueError, match="layer 2 has no gate: gate_layers=1 gates layers 0..0 only"):
        ablation.force_layer(model, 2, 1.0)
    with pytest.raises(ValueError, match="must be between 0 \\(every layer\\) and n_layers=3"):
        ModelConfig(n_layers=3, gate="G1", gate_layers=4)
    with pytest.raises(ValueError, match="gate_layers and gate_bias need a gate"):
        ModelConfig(gate_bias=-2.0)
