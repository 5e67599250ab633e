"""Lesson 08's checks, prediction_spread and qwen3_next_q_proj: an answer in float32 passes; a model that ignores its
context has no spread, and the re-ordered weights make a minigate Attention compute what transformers'
Qwen3NextAttention computes. That the references pass and a stub falls back is tests/test_checks.py's, and that each
typical mistake earns its hint tests/test_check_mutations.py's, for every check."""

import pytest
import torch
from torch import nn

from minigate import ModelConfig, Transformer
from minigate.attention import Attention, rope_cos_sin
from minigate.course import checks


def test_a_float32_kl_passes():
    def fn(logits):
        log_p = logits.log_softmax(-1)
        log_mean = log_p.exp().mean((0, 1)).log()
        return (log_p.exp() * (log_p - log_mean)).sum(-1).mean().item()
    assert checks.prediction_spread(fn) is fn


def test_a_model_that_ignores_its_context_has_no_spread():
    """A model whose attention adds nothing predicts from the current token alone: one distribution per token, so
    windows of one repeated token have spread 0, and mixed tokens do not."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8,
                                    d_ff=32, max_seq_len=8)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.o_proj.weight.zero_()
        same = model(torch.full((3, 8), 5))
        mixed = model(torch.randint(0, 32, (3, 8)))
    assert checks.reference_prediction_spread(same) == pytest.approx(0, abs=1e-9)
    assert checks.reference_prediction_spread(mixed) > 1e-3  # small logits of a fresh model: a small spread


@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 2), (6, 3), (4, 1), (4, 4)])
def test_reordered_weights_reproduce_qwen3_next_attention(n_heads, n_kv_heads):
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    D, d_model, T = 8, 32, 7
    hf_cfg = Qwen3NextConfig(hidden_size=d_model, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                             head_dim=D, num_hidden_layers=4, vocab_size=64, attn_implementation="eager",
                             rope_theta=10000.0, partial_rotary_factor=1.0)  # minigate rotates every dimension
    torch.manual_seed(0)
    hf = Qwen3NextAttention(hf_cfg, layer_idx=3).eval()
    with torch.no_grad():
        for p in hf.parameters():
            nn.init.normal_(p, std=0.2)
    x = torch.randn(2, T, d_model)
    cos, sin = Qwen3NextRotaryEmbedding(hf_cfg)(x, torch.arange(T)[None])
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    model_cfg = ModelConfig(vocab_size=64, d_model=d_model, n_layers=1, n_heads=n_heads, n_kv_heads=n_kv_heads,
                            head_dim=D, norm_eps=hf_cfg.rms_norm_eps, gate="G1", gate_granularity="elementwise")
    attn = Attention(model_cfg).eval()
    sd = hf.state_dict()
    q_weight = checks.reference_qwen3_next_q_proj(sd["q_proj.weight"], n_heads, n_kv_heads, D)
    attn.load_state_dict({"q_proj.weight": q_weight,
                          "k_proj.weight": sd["k_proj.weight"], "v_proj.weight": sd["v_proj.weight"],
                          "o_proj.weight": sd["o_proj.weight"],
                          "q_norm.weight": sd["q_norm.weight"] + 1, "k_norm.weight": sd["k_norm.weight"] + 1})
    with torch.no_grad():
        want = hf(x, (cos, sin), attention_mask=mask)[0]
        got = attn(x, *rope_cos_sin(T, D, model_cfg.rope_theta))  # Attention returns one tensor
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
