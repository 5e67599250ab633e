"""Export an elementwise-gated minigate model to transformers' Qwen3-Next, which has the same G1 gate.

    minigate.export_qwen3_next(model, "runs/qwen3next", tokenizer="data/tokenizer.json")
    hf = transformers.Qwen3NextForCausalLM.from_pretrained("runs/qwen3next")   # same logits (1e-5, float32)

Qwen3-Next's full-attention layer multiplies each head's output by sigmoid(gate), the gate computed from the same
normed hidden state by extra rows of q_proj: the paper's elementwise G1 gate. Three things differ from a minigate
(official-format) checkpoint, and the export writes them:
- q_proj rows: Qwen3-Next interleaves them per query head, [q_h | gate_h] (its forward views q_proj's output as
  (..., n_heads, 2 * head_dim) and chunks it in two), where the released checkpoints group them per kv head,
  [q of the group's heads | gates of the group's heads];
- RMSNorm: Qwen3-Next computes x / rms(x) * (1 + w), so every norm weight is stored as w - 1;
- the config: every layer "full_attention" (no linear attention), num_experts 0 (the plain SwiGLU MLP), and RoPE
  over the whole head (partial_rotary_factor 1.0; Qwen3-Next's default rotates a quarter of it).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from einops import rearrange

from .model import Transformer
from .pretrained import to_official_state_dict, write_folder


def _check_exportable(model: Transformer) -> None:
    """A ValueError naming the first setting Qwen3-Next cannot express."""
    cfg = model.cfg
    needs = [("gate", "G1", "Qwen3-Next gates the attention output (G1) only"),
             ("gate_granularity", "elementwise", "Qwen3-Next's gate has one score per head dimension"),
             ("gate_head_specific", True, "Qwen3-Next has one gate per head (no shared gate)"),
             ("gate_activation", "sigmoid", "Qwen3-Next applies a sigmoid to the gate"),
             ("gate_mode", "multiplicative", "Qwen3-Next multiplies by the gate"),
             ("gate_layers", 0, "Qwen3-Next gates every full-attention layer"),
             ("gate_bias", 0.0, "Qwen3-Next's q_proj has no bias"),
             ("qk_norm", True, "Qwen3-Next always norms q and k"),
             ("sandwich_norm", False, "Qwen3-Next has no norm on the blocks' outputs")]
    for field, want, why in needs:
        if getattr(cfg, field) != want:
            raise ValueError(f"cannot export to Qwen3-Next: ModelConfig.{field}={getattr(cfg, field)!r}, it needs "
                             f"{want!r} ({why}); save it with minigate.save_pretrained instead")


def qwen3_next_config(model: Transformer) -> dict:
    """config.json for transformers' Qwen3NextConfig: full attention in every layer, no experts."""
    cfg = model.cfg
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, "partial_rotary_factor": 1.0}
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        **cfg.hf_sizes(),
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_parameters": rope,  # transformers 5.x
        "rope_theta": cfg.rope_theta, "partial_rotary_factor": 1.0,  # transformers 4.x
        "layer_types": ["full_attention"] * cfg.n_layers,
        "num_experts": 0,  # with no experts every layer builds the plain SwiGLU MLP (Qwen3NextMLP)
        "mlp_only_layers": list(range(cfg.n_layers)),  # the same, said a second way
        "decoder_sparse_step": 1,
    }


def qwen3_next_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The official-format weights with q_proj re-ordered per query head and every norm weight stored as w - 1."""
    cfg = model.cfg
    out = {}
    for name, w in to_official_state_dict(model).items():
        w = w.detach()
        if name.endswith("self_attn.q_proj.weight"):  # per kv head [q (g, D) | gate (g, D)] -> per head [q_h | gate_h]
            w = rearrange(w, "(kv two g d) c -> (kv g two d) c", kv=cfg.n_kv_heads, two=2, g=cfg.group_size)
        elif name.endswith("norm.weight"):  # input/post_attention layernorm, q_norm, k_norm, model.norm
            w = w - 1
        out[name] = w
    if cfg.tie_embeddings:
        out.pop("lm_head.weight", None)
    return out


def export_qwen3_next(model: Transformer, path: str | os.PathLike, dtype: torch.dtype | str | None = None,
                      tokenizer: str | os.PathLike | None = None) -> Path:
    """Write a folder that transformers.Qwen3NextForCausalLM loads and that computes this elementwise-gated G1 model
    (config.json and model.safetensors, `dtype` as in save_pretrained; `tokenizer`: a tokenizer.json to put beside
    them, with its tokenizer_config.json). Refuses, naming the setting, a model Qwen3-Next cannot express."""
    _check_exportable(model)
    return write_folder(path, qwen3_next_state_dict(model), qwen3_next_config(model), dtype, tokenizer)
