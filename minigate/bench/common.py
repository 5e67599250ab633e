"""What the benchmarks share: a timing helper that interleaves contenders so they share the machine's noise
and reports medians; this machine's matmul rate; transformers' Qwen3 with a minigate config's sizes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


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

    return Qwen3ForCausalLM(Qwen3Config(**cfg.hf_sizes(), attn_implementation="sdpa"))


def matmul_rate(dtype: torch.dtype = torch.float32, n: int = 1024, seconds: float = 1.5, device="cpu") -> float:
    """FLOP/s of an n x n by n x n matmul in `dtype` on `device` (CPU: torch's current thread count), repeated for
    `seconds` after one warm-up call."""
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b
    sync()
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ b
        calls += 1
        sync()
    return 2 * n**3 * calls / (time.perf_counter() - t0)


def best_matmul_rate(dtype: torch.dtype, device="cpu", sizes=(256, 512, 1024, 2048), seconds: float = 0.5) -> tuple:
    """(the best FLOP/s over square matmuls of these sizes, the size that reached it): what this machine can do in
    `dtype` at most, the yardstick of a training run's achieved FLOP/s."""
    return max((matmul_rate(dtype, n, seconds, device), n) for n in sizes)
