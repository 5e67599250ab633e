"""Loading the paper's checkpoint format: against transformers' Qwen3 and an independent reference."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import minigate
from minigate import ModelConfig, Transformer

# ---- 1. baseline layout against transformers.Qwen3ForCausalLM ---------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_transformers_qwen3_to_minigate(tmp_path, tied, tokens, tiny_hf):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    hf_cfg = Qwen3Config(**tiny_hf, rms_norm_eps=1e-6, tie_word_embeddings=tied, attn_implementation="eager")
    hf = Qwen3ForCausalLM(hf_cfg).eval()
    for p in hf.parameters():  # norms start at 1: perturb them so a missed norm weight shows
        p.data.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    ours = minigate.from_pretrained(tmp_path)
    assert ours.cfg.tie_embeddings == tied and ours.cfg.gate == "none"
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=1e-5)


def test_minigate_to_transformers_qwen3(tmp_path, tokens, tiny):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(1)
    ours = Transformer(ModelConfig(**tiny)).eval()
    for p in ours.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    minigate.save_pretrained(ours, tmp_path)
    hf = Qwen3ForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x), atol=1e-5, rtol=1e-5)


# ---- 2. gated layouts against a plain reference written from the layout description --------------------
def _rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):  # x: (head_dim,) at position pos; halves rotate together
    d = x.shape[0]
    out = torch.empty_like(x)
    for i in range(d // 2):
        a = pos / theta ** (2 * i / d)
        x1, x2 = x[i], x[i + d // 2]
        out[i] = x1 * math.cos(a) - x2 * math.sin(a)
        out[i + d // 2] = x2 * math.cos(a) + x1 * math.sin(a)
    return out


def reference_logits(w: dict, c: dict, tokens: torch.Tensor, order: str = "per_kv_group") -> torch.Tensor:
    """Loops over tokens, kv groups and heads; reads gate rows of q_proj in the given `order`:
    per_kv_group (official): for kv head j: [q of its g heads | gates of its g heads]
    per_head: for each head h: [q_h | gate_h]      all_q_first: [all queries | all gates]"""
    H, K, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    g, E = H // K, (1 if c.get("headwise_attn_output_gate") else D)
    gated = c.get("headwise_attn_output_gate") or c.get("elementwise_attn_output_gate")
    eps, theta, L = c["rms_norm_eps"], c["rope_theta"], c["num_hidden_layers"]
    out = []
    for seq in tokens:
        T = len(seq)
        x = torch.stack([w["model.embed_tokens.weight"][t] for t in seq])  # (T, d)
        for layer in range(L):
            p = f"model.layers.{layer}."
            h = _rms(x, w[p + "input_layernorm.weight"], eps)
            qg = h @ w[p + "self_attn.q_proj.weight"].T  # (T, rows)
            kk = h @ w[p + "self_attn.k_proj.weight"].T
            vv = h @ w[p + "self_attn.v_proj.weight"].T
            attn_out = torch.zeros(T, H * D)
            for j in range(K):
                for i in range(g):
                    head = j * g + i
                    if not gated or order == "all_q_first":
                        q_rows = slice(head * D, (head + 1) * D)
                        g_rows = slice(H * D + head * E, H * D + (head + 1) * E)
                    elif order == "per_kv_group":
                        base = j * g * (D + E)
                        q_rows = slice(base + i * D, base + (i + 1) * D)
                        g_rows = slice(base + g * D + i * E, base + g * D + (i + 1) * E)
                    else:  # per_head
                        base = head * (D + E)
                        q_rows, g_rows = slice(base, base + D), slice(base + D, base + D + E)
                    for t in range(T):
                        q = _rope(_rms(qg[t, q_rows], w[p + "self_attn.q_norm.weight"], eps), t, theta)
                        scores = []
                        for s in range(t + 1):
                            k = _rope(_rms(kk[s, j * D:(j + 1) * D], w[p + "self_attn.k_norm.weight"], eps), s, theta)
                            scores.append(float(q @ k) / math.sqrt(D))
                        probs = torch.softmax(torch.tensor(scores), 0)
                        z = sum(probs[s] * vv[s, j * D:(j + 1) * D] for s in range(t + 1))
                        if gated:
                            z = z * torch.sigmoid(qg[t, g_rows])  # a (1,) gate broadcasts over the head
                        attn_out[t, head * D:(head + 1) * D] = z
            x = x + attn_out @ w[p + "self_attn.o_proj.weight"].T
            h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
            mlp = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
            x = x + mlp @ w[p + "mlp.down_proj.weight"].T
        x = _rms(x, w["model.norm.weight"], eps)
        out.append(x @ w["model.embed_tokens.weight"].T)
    return torch.stack(out)


@pytest.fixture
def write_official_checkpoint(tiny_hf):
    """write_official_checkpoint(folder, granularity, seed) -> (weights, config): a random checkpoint of the tiny model
    written by hand in the released format (no minigate code involved)."""
    return lambda folder, granularity, seed=0: _official_checkpoint(tiny_hf, folder, granularity, seed)


def _official_checkpoint(fields, folder, granularity: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    c = dict(fields, rms_norm_eps=1e-6, rope_theta=10000.0, use_qk_norm=True, tie_word_embeddings=True,
             model_type="qwen3",
             headwise_attn_output_gate=granularity == "headwise",
             elementwise_attn_output_gate=granularity == "elementwise")
    H, K, D, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["hidden_size"]
    q_rows = H * D + {"headwise": H, "elementwise": H * D, "none": 0}[granularity]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], d), "model.norm.weight": (d,)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (q_rows, d), p + "self_attn.k_proj.weight": (K * D, d),
                       p + "self_attn.v_proj.weight": (K * D, d), p + "self_attn.o_proj.weight": (d, H * D),
                       p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
                       p + "mlp.gate_proj.weight": (c["intermediate_size"], d),
                       p + "mlp.up_proj.weight": (c["intermediate_size"], d),
                       p + "mlp.down_proj.weight": (d, c["intermediate_size"])})
    w = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            w[name] = 1 + 0.2 * torch.randn(shape, generator=g)
        else:
            w[name] = torch.randn(shape, generator=g) / math.sqrt(shape[1])
    folder.mkdir(parents=True, exist_ok=True)
    save_file(w, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(c))
    return w, c


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
def test_gated_checkpoint_matches_plain_reference(tmp_path, granularity, tokens, write_official_checkpoint):
    w, c = write_official_checkpoint(tmp_path, granularity)
    model = minigate.from_pretrained(tmp_path)
    assert model.cfg.gate == "G1" and model.cfg.gate_granularity == granularity
    x = tokens(2, 7)
    with torch.no_grad():
        ours = model(x)
    torch.testing.assert_close(ours, reference_logits(w, c, x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
@pytest.mark.parametrize("wrong_order", ["per_head", "all_q_first"])
def test_other_row_orders_would_be_caught(tmp_path, granularity, wrong_order, tokens, write_official_checkpoint):
    """The reference is sensitive to the row order: a loader using another order would fail above."""
    w, c = write_official_checkpoint(tmp_path, granularity)
    x = tokens(1, 6)
    with torch.no_grad():
        ours = minigate.from_pretrained(tmp_path)(x)
    assert (ours - reference_logits(w, c, x, order=wrong_order)).abs().max() > 1e-2


def test_save_load_roundtrip_every_variant(tmp_path, tokens):
    x = tokens()
    for i, kw in enumerate([dict(gate="G1", gate_granularity="headwise"), dict(gate="G2", gate_head_specific=False),
                            dict(gate="G5", gate_activation="silu", gate_mode="additive"),
                            dict(sandwich_norm=True, tie_embeddings=False)]):
        cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, **kw)
        m = Transformer(cfg).eval()
        minigate.save_pretrained(m, tmp_path / str(i))
        m2 = minigate.from_pretrained(tmp_path / str(i))
        assert m2.cfg == cfg
        torch.testing.assert_close(m2(x), m(x), atol=0, rtol=0)


# ---- clear errors ------------------------------------------------------------------------------------
def test_shape_mismatch_names_parameter_and_shapes(tmp_path, write_official_checkpoint):
    w, c = write_official_checkpoint(tmp_path, "headwise")
    c["headwise_attn_output_gate"], c["elementwise_attn_output_gate"] = False, True  # config lies
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match=r"q_proj.weight.*\(36, 32\).*\(64, 32\)"):
        minigate.from_pretrained(tmp_path)


def test_missing_and_unknown_keys(tmp_path, write_official_checkpoint):
    from safetensors.torch import load_file

    w, c = write_official_checkpoint(tmp_path, "none")
    w.pop("model.layers.1.mlp.up_proj.weight")
    save_file(w, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        minigate.from_pretrained(tmp_path)
    w = load_file(tmp_path / "model.safetensors")
    w["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    w["model.layers.1.mlp.up_proj.weight"] = torch.zeros(48, 32)
    save_file(w, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="q_proj.bias"):
        minigate.from_pretrained(tmp_path)


def test_pytorch_bin_and_sharded_safetensors(tmp_path, tokens, write_official_checkpoint):
    w, c = write_official_checkpoint(tmp_path / "a", "elementwise")
    ref = minigate.from_pretrained(tmp_path / "a")(tokens())
    (tmp_path / "b").mkdir()
    (tmp_path / "b/config.json").write_text(json.dumps(c))
    torch.save(w, tmp_path / "b/pytorch_model.bin")
    torch.testing.assert_close(minigate.from_pretrained(tmp_path / "b")(tokens()), ref, atol=0, rtol=0)
    (tmp_path / "c").mkdir()
    (tmp_path / "c/config.json").write_text(json.dumps(c))
    names = sorted(w)
    halves = {"m-1.safetensors": names[: len(names) // 2], "m-2.safetensors": names[len(names) // 2:]}
    for f, ns in halves.items():
        save_file({n: w[n] for n in ns}, tmp_path / "c" / f)
    index = {"weight_map": {n: f for f, ns in halves.items() for n in ns}}
    (tmp_path / "c/model.safetensors.index.json").write_text(json.dumps(index))
    torch.testing.assert_close(minigate.from_pretrained(tmp_path / "c")(tokens()), ref, atol=0, rtol=0)


def test_half_precision_load(tmp_path, tokens, write_official_checkpoint):
    write_official_checkpoint(tmp_path, "headwise")
    m = minigate.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    assert torch.isfinite(m(tokens()).float()).all()


def test_16_bit_save_halves_the_file_and_reloads_exactly(tmp_path):
    torch.manual_seed(0)
    model = minigate.Transformer(minigate.ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2,
                                                      head_dim=16, d_ff=64, gate="G1"))
    minigate.save_pretrained(model, tmp_path / "fp32")
    minigate.save_pretrained(model, tmp_path / "bf16", dtype=torch.bfloat16)
    size = lambda d: (tmp_path / d / "model.safetensors").stat().st_size
    assert size("bf16") < 0.55 * size("fp32")
    back = minigate.from_pretrained(tmp_path / "bf16")  # float32, holding the bf16 values exactly
    want = {k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()}
    assert all(torch.equal(back.state_dict()[k], v) for k, v in want.items())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the model itself is untouched


def test_offline_hub_gives_clear_error_quickly(monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.time()
    with pytest.raises(OSError, match="No network"):
        minigate.from_pretrained("QwQZh/gated_attention", subfolder="1B_gate_headwise")
    assert time.time() - t0 < 30


def test_missing_local_folder():
    with pytest.raises(FileNotFoundError, match="no folder"):
        minigate.from_pretrained("./does/not/exist")
