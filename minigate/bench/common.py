"""Shared timing helper: interleave contenders so they share the machine's noise, report medians."""

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
