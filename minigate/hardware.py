"""The machine a run trains on: which device, which precision, the CPU allocator and torch.compile; and the hardware
figures the course projects run times from, for machines learners use but the tests never see (T4_PEAK).

    device = pick_device("auto")                     # cuda, then mps, then cpu
    amp_dtype, use_scaler = pick_precision("auto", device)

train() calls these; `python -m minigate.bench train` measures what they choose, and lesson 07 projects a sweep's
run time on a T4 from T4_PEAK.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
import warnings

import torch

T4_PEAK = 65e12  # FLOP/s, a T4's fp16 tensor cores (NVIDIA's datasheet): projecting a sweep's time on a free Colab T4

PRECISIONS = {"fp32": (None, False), "bf16": (torch.bfloat16, False), "fp16": (torch.float16, True)}
# MINIGATE_PRECISION=fp16 (or bf16, fp32) makes precision "auto" pick that one: a T4's arithmetic (fp16 with a
# GradScaler) on a newer GPU, for a notebook or a `minigate train` run left unchanged (docs/gpu.md)
PRECISION_ENV = "MINIGATE_PRECISION"


def pick_device(name: str = "auto") -> torch.device:
    """"auto": cuda, then mps, then cpu; else the named device, checked to exist (a ValueError says why not)."""
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a torch device; use auto, cpu, cuda, cuda:1 or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: torch sees no CUDA GPU here (torch {torch.__version__}); use cpu, or "
                         "auto to take the best device there is")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: there are only {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not mps:
        raise ValueError(f"device {name!r}: Apple's MPS is not available here; use cpu or auto")
    return device


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware: AVX512-BF16 or AMX tiles (x86). Elsewhere bf16 matmuls
    are emulated and slower than fp32."""
    queries = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, q, lambda: False)() for q in queries)


def pick_precision(precision: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None for fp32, whether to use a GradScaler). "auto": on CUDA, bf16 from Ampere on and fp16
    with a GradScaler before (a T4); on a CPU, bf16 where it has native bf16 matrix units (cpu_has_native_bf16),
    else fp32; fp32 on anything else (mps). With MINIGATE_PRECISION set, "auto" is what it names."""
    named = f"precision={precision!r}"  # where the precision came from, for the errors
    if precision == "auto" and os.environ.get(PRECISION_ENV):
        precision = os.environ[PRECISION_ENV].strip().lower()
        named = f"{PRECISION_ENV}={precision}"
        if precision not in PRECISIONS:
            raise ValueError(f"{PRECISION_ENV}={precision!r} is not a precision; set it to one of "
                             f"{', '.join(PRECISIONS)}, or unset it")
    if precision == "auto":
        if device.type == "cuda":
            bf16 = torch.cuda.get_device_capability(device)[0] >= 8  # Ampere or newer; a T4 is 7.5
            return PRECISIONS["bf16" if bf16 else "fp16"]
        return PRECISIONS["bf16" if device.type == "cpu" and cpu_has_native_bf16() else "fp32"]
    if precision == "fp16" and device.type != "cuda":
        raise ValueError(f"{named} needs a CUDA GPU (it relies on a GradScaler); on {device.type} "
                         "use 'bf16' or 'fp32'")
    return PRECISIONS[precision]


def precision_name(amp_dtype: torch.dtype | None) -> str:
    """"fp32", "bf16" or "fp16": what pick_precision's autocast dtype computes in."""
    return next(name for name, (dtype, _) in PRECISIONS.items() if dtype == amp_dtype)


@functools.cache
def tune_cpu_allocator() -> bool:
    """Make glibc keep freed memory for reuse instead of handing it back to the kernel. A training step frees
    and re-allocates the same large tensors (logits, attention gradients); by default glibc maps each block
    over 128 KB afresh, and the kernel zeroes every new page on first touch: a quarter of a CPU step here
    (`python -m minigate.bench train` measures it). Process-wide and lasting (the process keeps its peak
    heap); Linux with glibc only. train() calls it on CPU. Returns whether the setting is in place."""
    if not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # mallopt parameters, <malloc.h>
    return all(libc.mallopt(k, v) == 1 for k, v in (  # mallopt returns 1 on success; once per process (cached)
        (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 64 << 20)))


class CompiledOrEager:
    """torch.compile(model), falling back to the model itself (one warning) if the first compiled call fails,
    e.g. on a GPU or platform whose compiler toolchain is missing."""

    def __init__(self, model):
        self.model, self.compiled, self.works = model, torch.compile(model), None

    def __call__(self, *args, **kwargs):
        if self.works is False:
            return self.model(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as e:
            if self.works:
                raise
            warnings.warn(f"torch.compile failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); "
                          "training goes on without it", stacklevel=2)
            self.works = False
            return self.model(*args, **kwargs)
        self.works = True
        return out
