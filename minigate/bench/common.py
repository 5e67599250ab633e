"""What the benchmarks share: a timing helper that interleaves contenders so they share the machine's noise
and reports medians; transformers' Qwen3 with a minigate config's sizes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(fns: dict[str, Callable[[], None]], reps: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each fn, measured round-robin (a, b, c, a, b, c, ...)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def qwen3_twin(cfg):
    """transformers' Qwen3ForCausalLM with the sizes of a minigate ModelConfig (random init, SDPA attention)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        max_position_embeddings=cfg.max_seq_len, attn_implementation="sdpa"))
