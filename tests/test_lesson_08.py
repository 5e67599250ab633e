"""Lesson 08's new checks, loss_spikes and qwen3_next_q_proj: the reference passes, a stub falls back to the reference;
the spike reference is what train() records, and the re-ordered weights make a minigate Attention compute what
transformers' Qwen3NextAttention computes. That each typical mistake earns its hint is tests/test_check_mutations.py's,
for every check."""

import pytest
import torch
from torch import nn

from minigate import ModelConfig, Transformer
from minigate.attention import Attention, rope_cos_sin
from minigate.course import checks
from minigate.data import copy_task
from minigate.presets import TrainConfig
from minigate.train import train


def test_loss_spikes_reference_passes_and_is_returned(capsys):
    fn = lambda losses, factor, window: list(checks.reference_loss_spikes(losses, factor, window))
    assert checks.loss_spikes(fn) is fn
    assert "✓ loss_spikes: passed (5 cases)" in capsys.readouterr().out


def test_a_plain_loop_passes():
    def fn(losses, factor, window):
        return [i + 1 for i in range(window, len(losses)) if losses[i] > factor * sum(losses[i - window:i]) / window]
    assert checks.loss_spikes(fn) is fn


def test_loss_spikes_stub_falls_back_to_the_reference(capsys):
    def stub(losses, factor, window):
        raise NotImplementedError()
    assert checks.loss_spikes(stub) is checks.reference_loss_spikes
    assert "loss_spikes not implemented yet" in capsys.readouterr().out


def test_loss_spikes_reference_is_what_train_records():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=130, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8,
                                    d_ff=32, max_seq_len=16))
    rows = copy_task(256, seq_len=16, seed=1)
    cfg = TrainConfig(steps=60, batch_size=4, seq_len=16, lr=3e-2, warmup_steps=2, eval_every=60, eval_batches=1,
                      spike_factor=1.02, spike_window=5)  # a low bar, so that some steps count as spikes
    history = train(model, rows, rows[:8], cfg, progress=False)
    assert history.spikes, "the test needs some spikes"
    assert checks.reference_loss_spikes(history.loss, cfg.spike_factor, cfg.spike_window) == history.spikes


def test_qwen3_next_q_proj_reference_passes(capsys):
    fn = lambda *a: checks.reference_qwen3_next_q_proj(*a).clone()
    assert checks.qwen3_next_q_proj(fn) is fn
    assert "✓ qwen3_next_q_proj: passed (4 cases)" in capsys.readouterr().out


def test_qwen3_next_q_proj_stub_falls_back_to_the_reference(capsys):
    def stub(weight, n_heads, n_kv_heads, head_dim):
        raise NotImplementedError()
    assert checks.qwen3_next_q_proj(stub) is checks.reference_qwen3_next_q_proj
    assert "qwen3_next_q_proj not implemented yet" in capsys.readouterr().out


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
    cfg = ModelConfig(vocab_size=64, d_model=d_model, n_layers=1, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=D,
                      norm_eps=hf_cfg.rms_norm_eps, gate="G1", gate_granularity="elementwise")
    attn = Attention(cfg).eval()
    sd = hf.state_dict()
    q_weight = checks.reference_qwen3_next_q_proj(sd["q_proj.weight"], n_heads, n_kv_heads, D)
    attn.load_state_dict({"q_proj.weight": q_weight,
                          "k_proj.weight": sd["k_proj.weight"], "v_proj.weight": sd["v_proj.weight"],
                          "o_proj.weight": sd["o_proj.weight"],
                          "q_norm.weight": sd["q_norm.weight"] + 1, "k_norm.weight": sd["k_norm.weight"] + 1})
    with torch.no_grad():
        want = hf(x, (cos, sin), attention_mask=mask)[0]
        got = attn(x, *rope_cos_sin(T, D, cfg.rope_theta))  # Attention returns one tensor
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
