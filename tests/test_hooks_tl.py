"""TransformerLens conventions: hook names, layouts and places, the ActivationCache, run_with_cache's options,
hook points that fire for any PyTorch hook, and the fused attention path whenever the pattern is not asked for."""

import pytest
import torch
import torch.nn.functional as F
from einops import einsum, rearrange

import minigate
from minigate import ActivationCache, get_act_name
from minigate.attention import apply_rope, rope_cos_sin

B, T, H, K, D, d = 2, 10, 4, 2, 8, 32  # the tiny model's (conftest.py) sizes, on tokens() of (B, T)


def test_a_transformerlens_users_snippet(tiny_model, tokens):
    model = tiny_model(gate="G1", gate_granularity="headwise")
    logits, cache = model.run_with_cache(tokens())
    assert isinstance(cache, ActivationCache) and isinstance(cache, dict)
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]
    assert cache["pattern", -1] is cache["blocks.1.attn.hook_pattern"]
    assert cache["resid_post", 1] is cache["blocks.1.hook_resid_post"] and cache["embed", None] is cache["hook_embed"]
    assert cache["gate", 0].shape == (B, T, H)
    # q, k, v in TL's layout: (batch, pos, head_index, d_head); k, v with the kv heads
    assert cache["q", 0].shape == (B, T, H, D) and cache["rot_q", 0].shape == (B, T, H, D)
    assert cache["k", 0].shape == cache["v", 0].shape == cache["rot_k", 0].shape == (B, T, K, D)
    assert cache["attn_scores", 0].shape == cache["pattern", 0].shape == (B, H, T, T)
    with pytest.raises(KeyError, match="not in this cache"):
        cache["blocks.0.attn.hook_nothing"]
    assert "ActivationCache with keys" in repr(cache)


def test_hook_q_indexed_by_head_is_that_heads_query(tiny_model, tokens):
    """cache["blocks.0.attn.hook_q"][:, :, h] is head h: q_proj's rows of h (released G1 layout), then QK-norm."""
    for kw in (dict(gate="G1", gate_granularity="elementwise"), dict()):
        model = tiny_model(**kw)
        attn, cfg = model.blocks[0].attn, model.cfg
        _, cache = model.run_with_cache(tokens(), names_filter=lambda n: n.startswith("blocks.0."))
        x = model.blocks[0].attn_norm(cache["resid_pre", 0])  # (batch, pos, d_model)
        width = cfg.gate_width_per_head if cfg.released_g1 else 0
        rows_per_kv = cfg.group_size * (D + width)
        cos, sin = rope_cos_sin(T, D, cfg.rope_theta)
        for h in range(H):
            kv, i = divmod(h, cfg.group_size)  # head h = kv * group + i
            start = kv * rows_per_kv + i * D
            q_h = attn.q_norm(x @ attn.q_proj.weight[start:start + D].T)  # (batch, pos, d_head)
            torch.testing.assert_close(cache["blocks.0.attn.hook_q"][:, :, h], q_h)
            torch.testing.assert_close(cache["rot_q", 0][:, :, h], apply_rope(q_h, cos, sin))
        for kv in range(K):
            k_kv = attn.k_norm(x @ attn.k_proj.weight[kv * D:(kv + 1) * D].T)
            torch.testing.assert_close(cache["k", 0][:, :, kv], k_kv)
            torch.testing.assert_close(cache["v", 0][:, :, kv], x @ attn.v_proj.weight[kv * D:(kv + 1) * D].T)


def test_attn_scores_are_scaled_masked_and_softmax_to_the_pattern(tiny_model, tokens):
    model = tiny_model()
    _, cache = model.run_with_cache(tokens(), names_filter=lambda n: n.startswith("blocks.1.attn."))
    q = rearrange(cache["rot_q", 1], "b t h d -> b h t d")
    k = rearrange(cache["rot_k", 1], "b t kv d -> b kv t d").repeat_interleave(H // K, dim=1)
    scores = cache["attn_scores", 1]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert torch.isneginf(scores[..., future]).all()  # as TransformerLens: masked entries are -inf
    torch.testing.assert_close(scores[..., ~future], (q @ k.transpose(-1, -2) / D ** 0.5)[..., ~future])
    torch.testing.assert_close(cache["pattern", 1], torch.softmax(scores, dim=-1))


def test_stack_activation_and_accumulated_resid(tiny_model, tokens):
    model = tiny_model()
    _, cache = model.run_with_cache(tokens())
    stacked = cache.stack_activation("pattern")
    assert stacked.shape == (2, B, H, T, T) and torch.equal(stacked[1], cache["pattern", 1])
    assert cache.stack_activation("resid_pre", 1).shape == (1, B, T, d)  # layers 0..layer-1
    resid, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"] and resid.shape == (3, B, T, d)
    assert torch.equal(resid[2], cache["resid_post", 1])
    _, labels = cache.accumulated_resid(layer=1, incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre"]
    assert cache.accumulated_resid(layer=1, incl_mid=True).shape == (3, B, T, d)


def test_remove_batch_dim_and_to(tiny_model, tokens):
    model = tiny_model(gate="G1")
    _, cache = model.run_with_cache(tokens(1), remove_batch_dim=True)
    assert cache["pattern", 0].shape == (H, T, T) and cache["q", 0].shape == (T, H, D)
    assert not cache.has_batch_dim and cache.remove_batch_dim() is cache  # a second call changes nothing
    assert cache["pattern", 0].shape == (H, T, T)
    _, batched = model.run_with_cache(tokens(2), names_filter="hook_embed")
    with pytest.raises(ValueError, match="batch size 1"):
        batched.remove_batch_dim()
    assert batched.to("cpu") is batched and batched["embed"].device.type == "cpu"
    assert torch.equal(batched["embed"], model.run_with_cache(tokens(2), device="cpu")[1]["hook_embed"])
    _, plain = model.run_with_cache(tokens(2), names_filter="hook_embed", return_cache_object=False)
    assert type(plain) is dict and list(plain) == ["hook_embed"]


def test_get_act_name(tiny_model):
    assert minigate.get_act_name is get_act_name
    assert get_act_name("pattern", 0) == "blocks.0.attn.hook_pattern"
    assert get_act_name("attn_scores", 2) == "blocks.2.attn.hook_attn_scores"
    for short in ("q", "k", "v", "rot_q", "rot_k", "z", "gate", "gate_logits", "z_gated"):
        assert get_act_name(short, 1) == f"blocks.1.attn.hook_{short}"
    for short in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"):
        assert get_act_name(short, 1) == f"blocks.1.hook_{short}"
    assert get_act_name("embed") == "hook_embed"
    assert get_act_name("attn", 0) == "blocks.0.attn.hook_pattern"  # TL's aliases
    assert get_act_name("blocks.0.attn.hook_z") == "blocks.0.attn.hook_z"  # a full name stays as it is
    model = tiny_model(gate="G1")
    assert {get_act_name(s, L) for s in ("q", "rot_k", "pattern", "gate", "z_gated", "resid_mid")
            for L in range(2)} <= set(model.hook_dict)


def test_unsupported_options_are_refused_by_name(tiny_model, tokens):
    model = tiny_model()
    for option, value in (("incl_bwd", True), ("pos_slice", 3)):
        with pytest.raises(ValueError, match=rf"run_with_cache\({option}="):
            model.run_with_cache(tokens(), **{option: value})


# ---- TransformerBridge's names for the G1 gate: hook_q_gate, and W_Q without the gate rows -------------------
Q_GATE, GATE_LOGITS = "blocks.0.attn.hook_q_gate", "blocks.0.attn.hook_gate_logits"


@pytest.mark.parametrize("gran", ["headwise", "elementwise"])
def test_hook_q_gate_is_the_gate_logits(gran, tiny_model, tokens):
    """TransformerBridge's hook_q_gate holds the gate before its sigmoid: here, hook_gate_logits under a second name."""
    model = tiny_model(gate="G1", gate_granularity=gran)
    _, cache = model.run_with_cache(tokens(), names_filter=[Q_GATE, GATE_LOGITS, "blocks.0.attn.hook_gate"])
    assert list(cache) == [GATE_LOGITS, Q_GATE, "blocks.0.attn.hook_gate"]
    assert cache[Q_GATE].shape == ((B, T, H) if gran == "headwise" else (B, T, H, D))
    assert torch.equal(cache[Q_GATE], cache[GATE_LOGITS]) and cache["q_gate", 0] is cache[Q_GATE]
    torch.testing.assert_close(torch.sigmoid(cache[Q_GATE]), cache["gate", 0])  # the logits, not the score
    _, alone = model.run_with_cache(tokens(), names_filter=Q_GATE)
    assert list(alone) == [Q_GATE] and torch.equal(alone[Q_GATE], cache[Q_GATE])
    # one name per point in hook_dict, in a full cache and for a filter function; the alias is in hook_aliases
    assert Q_GATE not in model.hook_dict and model.hook_aliases[Q_GATE] == GATE_LOGITS
    _, full = model.run_with_cache(tokens())
    assert GATE_LOGITS in full and not any(n.endswith("hook_q_gate") for n in full)
    with pytest.raises(ValueError, match="hook_aliases"):
        model.run_with_cache(tokens(), names_filter=lambda n: n.endswith("hook_q_gate"))
    assert not tiny_model().hook_aliases and not tiny_model(gate="G2").hook_aliases  # G1 layers only


@pytest.mark.parametrize("gran", ["headwise", "elementwise"])
def test_overriding_hook_q_gate_is_overriding_the_gate_logits(gran, tiny_model, tokens):
    model = tiny_model(gate="G1", gate_granularity=gran)
    shift = lambda logits, hook: logits + 1.5
    via_own = model.run_with_hooks(tokens(), fwd_hooks=[(GATE_LOGITS, shift)])
    assert (via_own - model(tokens())).abs().max() > 1e-3
    assert torch.equal(model.run_with_hooks(tokens(), fwd_hooks=[(Q_GATE, shift)]), via_own)
    # a list that names the point twice hooks it once ...
    assert torch.equal(model.run_with_hooks(tokens(), fwd_hooks=[([GATE_LOGITS, Q_GATE], shift)]), via_own)
    # ... and two hooks, one on each name, are two hooks on the one point
    twice = model.run_with_hooks(tokens(), fwd_hooks=[(GATE_LOGITS, shift), (GATE_LOGITS, shift)])
    assert torch.equal(model.run_with_hooks(tokens(), fwd_hooks=[(GATE_LOGITS, shift), (Q_GATE, shift)]), twice)
    assert (twice - via_own).abs().max() > 1e-3


@pytest.mark.parametrize("kw", [dict(gate="G1", gate_granularity="elementwise"),
                                dict(gate="G1", gate_granularity="headwise"), dict()])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_W_Q_is_the_query_rows_of_q_proj(kw, qk_norm, tiny_model, tokens):
    """W_Q (head, d_model, d_head), as TransformerLens lays it out, reproduces hook_q (before QK-norm) and leaves out
    the gate rows that q_proj also holds in G1 layers."""
    model = tiny_model(qk_norm=qk_norm, **kw)
    attn = model.blocks[0].attn
    W_Q = attn.W_Q
    assert W_Q.shape == (H, d, D) and W_Q.numel() == H * d * D
    assert attn.q_proj.weight.numel() == H * d * D + (H * attn.cfg.gate_width_per_head * d if kw else 0)
    _, cache = model.run_with_cache(tokens(), names_filter=["blocks.0.hook_resid_pre", "blocks.0.attn.hook_q"])
    x = model.blocks[0].attn_norm(cache["resid_pre", 0])
    q = einsum(x, W_Q, "batch pos d_model, head d_model d_head -> batch pos head d_head")
    torch.testing.assert_close(attn.q_norm(q), cache["q", 0])


# ---- patching the new hook points changes the forward ------------------------------------------------------
def test_zeroing_hook_v_zeroes_the_attention_output(tiny_model, tokens):
    model = tiny_model()
    out = {}
    model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.attn.hook_v", lambda v, hook: torch.zeros_like(v)),
                                              ("blocks.0.hook_attn_out", lambda a, hook: out.setdefault("a", a)),
                                              ("blocks.1.hook_attn_out", lambda a, hook: out.setdefault("b", a))])
    assert out["a"].abs().max() == 0 and out["b"].abs().max() > 0


@pytest.mark.parametrize("name", ["blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_rot_q",
                                  "blocks.0.attn.hook_rot_k"])
def test_patching_queries_or_keys_changes_the_logits(name, tiny_model, tokens):
    model = tiny_model(gate="G1")
    clean = model(tokens())
    patched = model.run_with_hooks(tokens(), fwd_hooks=[(name, lambda t, hook: t.flip(1))])  # positions reversed
    assert (patched - clean).abs().max() > 1e-3
    same = model.run_with_hooks(tokens(), fwd_hooks=[(name, lambda t, hook: t.clone())])
    torch.testing.assert_close(same, clean, atol=1e-5, rtol=1e-5)


def test_overriding_attn_scores_changes_the_pattern(tiny_model, tokens):
    model = tiny_model()

    def only_bos(scores, hook):  # every query may attend to key 0 only
        out = torch.full_like(scores, float("-inf"))
        out[..., 0] = 0.0
        return out

    _, cache = model.run_with_cache(tokens(), names_filter="blocks.0.attn.hook_pattern")
    with model.hooks([("blocks.0.attn.hook_attn_scores", only_bos)]):
        _, patched = model.run_with_cache(tokens(), names_filter=lambda n: n.startswith("blocks.0.attn."))
    expected = torch.zeros(B, H, T, T)
    expected[..., 0] = 1
    torch.testing.assert_close(patched["pattern", 0], expected)
    assert not torch.allclose(cache["pattern", 0], expected)
    v0 = patched["v", 0][:, 0]  # (batch, kv_head, d_head): every query now reads the first value
    torch.testing.assert_close(patched["z", 0], v0.repeat_interleave(H // K, dim=1)[:, None].expand(-1, T, -1, -1))


# ---- any PyTorch hook fires, and only what is asked for is computed ----------------------------------------
def _count_sdpa(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    return calls


@pytest.mark.parametrize("kind", ["forward_hook", "forward_pre_hook"])
@pytest.mark.parametrize("point", ["hook_pattern", "hook_attn_scores"])
def test_a_plain_pytorch_hook_on_the_pattern_fires(kind, point, monkeypatch, tiny_model, tokens):
    model = tiny_model()
    calls = _count_sdpa(monkeypatch)
    seen = []
    hp = model.hook_dict[f"blocks.0.attn.{point}"]
    if kind == "forward_hook":
        handle = hp.register_forward_hook(lambda module, inputs, output: seen.append(output.shape))
    else:
        handle = hp.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].shape))
    try:
        model(tokens())
    finally:
        handle.remove()
    assert seen == [(B, H, T, T)]
    assert len(calls) == 1  # layer 0 explicit, layer 1 fused
    model(tokens())
    assert len(calls) == 3 and seen == [(B, H, T, T)]  # hook removed: both layers fused again


@pytest.mark.parametrize("kind", ["forward_hook", "forward_pre_hook"])
def test_a_global_module_hook_keeps_the_fused_path(kind, monkeypatch, tiny_model, tokens):
    """A global module hook (a profiler's) sees every module that runs, but does not switch the attention to the
    explicit O(T²) path: only minigate's own hook points decide (issue 22)."""
    model = tiny_model(gate="G1")
    calls = _count_sdpa(monkeypatch)
    seen = []
    nn_module = torch.nn.modules.module
    if kind == "forward_hook":
        handle = nn_module.register_module_forward_hook(lambda module, inputs, output: seen.append(module))
    else:
        handle = nn_module.register_module_forward_pre_hook(lambda module, inputs: seen.append(module))
    try:
        model(tokens())
    finally:
        handle.remove()
    assert len(calls) == 2  # both layers fused
    names = [m.name for m in seen if isinstance(m, minigate.hooks.HookPoint)]
    assert "blocks.0.attn.hook_z" in names and "blocks.1.hook_resid_post" in names  # it saw the model run
    assert not any(n.endswith(("hook_pattern", "hook_attn_scores")) for n in names)


def test_a_global_module_hook_sees_the_pattern_when_it_is_hooked(monkeypatch, tiny_model, tokens):
    """The way for a global hook to see a pattern: hook that hook_pattern (a no-op hook is enough)."""
    model = tiny_model()
    calls = _count_sdpa(monkeypatch)
    seen = []

    def record(module, inputs, output):
        if isinstance(module, minigate.hooks.HookPoint) and module.name.endswith("hook_pattern"):
            seen.append((module.name, tuple(output.shape)))

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        model.run_with_hooks(tokens(), fwd_hooks=[("blocks.1.attn.hook_pattern", lambda t, hook: None)])
    finally:
        handle.remove()
    assert seen == [("blocks.1.attn.hook_pattern", (B, H, T, T))]
    assert len(calls) == 1  # layer 0 fused, layer 1 explicit


def test_cache_without_the_pattern_keeps_the_fused_path(monkeypatch, tiny_model, tokens):
    model = tiny_model(gate="G1")
    calls = _count_sdpa(monkeypatch)
    _, cache = model.run_with_cache(tokens(), names_filter=lambda n: n.endswith("hook_resid_post"))
    assert list(cache) == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert len(calls) == 2  # both layers fused
    _, cache = model.run_with_cache(tokens(), names_filter=lambda n: "hook_q" in n or "hook_z" in n)
    assert len(calls) == 4
    _, cache = model.run_with_cache(tokens())  # no filter: everything, as TransformerLens, so the explicit path
    assert len(calls) == 4 and cache["pattern", 1].shape == (B, H, T, T)
    _, cache = model.run_with_cache(tokens(), names_filter="blocks.1.attn.hook_attn_scores")
    assert len(calls) == 5  # layer 0 fused, layer 1 explicit
