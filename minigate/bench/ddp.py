"""Data-parallel training against one process on the same machine: `minigate train` in one process with N
threads, against `torchrun --nproc_per_node N` (DDP, one thread per process: gloo on CPU), the same preset, seed
and global batch.

Contenders take turns (round-robin, a fresh run folder each); each reports its median training tokens/s (the
history's per-step rates, the first 5 steps dropped) and the whole command's wall time (start-up, data and
evaluation included). Prints the ratios, this machine's fp32 matmul rate (torch, 1024 x 1024, N threads), and the
largest loss difference between the two runs' curves.

    python -m minigate.bench ddp [--preset ci] [--nproc 2] [--steps 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from minigate.bench.common import matmul_rate


def matmul_gflops(threads: int, dtype=torch.float32, n: int = 1024, seconds: float = 1.5) -> float:
    """fp32 (or `dtype`) matmul rate of this machine in GFLOP/s, n x n, on `threads` torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return matmul_rate(dtype, n, seconds) / 1e9
    finally:
        torch.set_num_threads(before)


def command(name: str, preset: str, nproc: int, steps: int, out: Path) -> tuple[list[str], dict]:
    """The command line and environment of one contender."""
    args = ["train", "--preset", preset, "--variant", "headwise", "--quiet", "--out", str(out),
            "--set", f"steps={steps}", "--set", f"eval_every={steps}", "--set", f"ckpt_every={steps}"]
    if name == "one process":
        return ([sys.executable, "-m", "minigate.cli", *args, "--threads", str(nproc)],
                dict(os.environ, OMP_NUM_THREADS=str(nproc)))
    return ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
             "-m", "minigate.cli", *args], dict(os.environ, OMP_NUM_THREADS="1"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="ci")
    ap.add_argument("--nproc", type=int, default=2, help="processes of the DDP run; threads of the single process")
    ap.add_argument("--steps", type=int, default=100, help="steps per run (the preset's warmup must be shorter)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    names = ("one process", f"torchrun, {args.nproc} processes")
    rates = {n: [] for n in names}
    walls = {n: [] for n in names}
    losses = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, name in enumerate(names):
                out = Path(tmp) / f"run{r}-{i}"
                cmd, env = command(name, args.preset, args.nproc, args.steps, out)
                t0 = time.perf_counter()
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{name} failed:\n{done.stderr[-2000:]}")
                walls[name].append(time.perf_counter() - t0)
                history = json.loads((out / "history.json").read_text())
                rates[name].append(statistics.median(history["tokens_per_s"][5:]))
                losses[name] = history["loss"]
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {rates[n][-1]:,.0f} tokens/s" for n in names),
                  flush=True)
    gflops = matmul_gflops(args.nproc)
    one, ddp = names
    tok = {n: statistics.median(v) for n, v in rates.items()}
    wall = {n: statistics.median(v) for n, v in walls.items()}
    diff = max(abs(a - b) for a, b in zip(losses[one], losses[ddp], strict=True))
    print(f"\n{args.preset} preset, {args.steps} steps, {args.rounds} rounds; this machine: fp32 matmul "
          f"{gflops:.0f} GFLOP/s on {args.nproc} threads ({os.cpu_count()} cores seen)")
    for n in names:
        print(f"  {n:24s} {tok[n]:10,.0f} training tokens/s (median)   {wall[n]:6.1f} s per command")
    print(f"  {ddp} / one process: {tok[ddp] / tok[one]:.2f}x the training tokens/s, "
          f"{wall[one] / wall[ddp]:.2f}x the speed end to end")
    print(f"  largest difference between the two loss curves: {diff:.2g}")


if __name__ == "__main__":
    main()
