"""Ablation sweep time: the full published ablation set, batched vs looped, on a small model; and the
projected time of the same set for the paper's 1B model on a T4, from FLOPs.

The set (ablation.published_conditions): learned gates, gates = their mean, the 10-value constant
sweep (it holds the global 0 / 0.116 / 1 overrides), every layer forced open and closed, every head of
the first three layers closed. Batched: conditions stacked along the batch dimension, --max-batch rows
per forward (ablation.sweep). Looped: one hooked run per condition, --max-batch chunks per forward.
Both are timed in the same run, interleaved (bench.common.interleaved_medians), and checked to agree.

Default model: the `text` preset's sizes (the shipped text checkpoints' shape), G1 headwise, random
init; or --model PATH (minigate.from_pretrained). Token ids are random: the time does not depend on
the text.

What to expect on a CPU: stacking conditions saves no FLOPs, it only fills each forward pass. One CPU
thread reaches its full rate (~20 GFLOP/s here) once a pass holds a few thousand tokens, so the gain
is large only when one condition's chunks are few (1.5x at 4 chunks x 32 tokens, 1.1x at 16 x 128 on
the research-size model). On a GPU a small model's pass is launch-bound, so stacking should pay more
(not measured here: no GPU on the machines this was written on).

    python -m minigate.bench ablation [--model PATH] [--threads 1] [--chunks 16] [--len 128] [--reps 3]
"""

from __future__ import annotations

import argparse

import torch

from minigate import Transformer, from_pretrained
from minigate.ablation import (PUBLISHED_SETUP, chunks, forward_flops, n_published_conditions, published_conditions,
                               sweep)
from minigate.hardware import T4_PEAK
from minigate.bench.common import interleaved_medians
from minigate.presets import model_config

def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m minigate.bench ablation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a minigate / official checkpoint folder (default: random init)")
    ap.add_argument("--variant", default="headwise", choices=["headwise", "elementwise"], help="for random init")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=16, help="chunks per condition")
    ap.add_argument("--len", type=int, default=128, help="tokens per chunk")
    ap.add_argument("--max-batch", type=int, default=32, help="rows per forward pass, both contenders")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--utilisation", type=float, default=0.35, help="assumed T4 utilisation for the projection")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model = from_pretrained(args.model) if args.model else Transformer(model_config("text", args.variant))
    model.eval()
    cfg = model.cfg
    c = chunks(torch.randint(0, cfg.vocab_size, (args.chunks * args.len,)), args.chunks, args.len, model=model)
    conditions = published_conditions(model, c)
    assert len(conditions) == n_published_conditions(cfg.n_layers, cfg.n_heads)
    last = {}

    def run(batched):
        def fn():
            last[batched] = sweep(model, c, conditions, batched=batched, max_batch=args.max_batch, ci=False,
                                  progress=False)
        return fn

    med = interleaved_medians({"batched": run(True), "looped": run(False)}, reps=args.reps, warmup=1)
    diff = max((last[True][n].chunk_losses - last[False][n].chunk_losses).abs().max().item() for n in conditions)

    params = sum(p.numel() for p in model.parameters())
    tokens = len(conditions) * args.chunks * args.len
    flops = len(conditions) * forward_flops(params, cfg.n_layers, cfg.n_heads, cfg.head_dim, args.chunks, args.len)
    print(f"model: {args.model or 'random init, text preset sizes, G1 ' + args.variant}; {params / 1e6:.2f}M "
          f"params, {cfg.n_layers} layers x {cfg.n_heads} heads")
    print(f"published ablation set: {len(conditions)} conditions x {args.chunks} chunks x {args.len} tokens "
          f"({tokens:,} tokens); {args.threads} thread(s), max_batch {args.max_batch}, "
          f"median of {args.reps} interleaved reps")
    print(f"  looped   {med['looped']:8.2f} s   {tokens / med['looped']:9,.0f} tokens/s   "
          f"{flops / med['looped'] / 1e9:6.1f} GFLOP/s")
    print(f"  batched  {med['batched']:8.2f} s   {tokens / med['batched']:9,.0f} tokens/s   "
          f"{flops / med['batched'] / 1e9:6.1f} GFLOP/s")
    print(f"  looped / batched = {med['looped'] / med['batched']:.2f}x (target >= 3x); "
          f"max |loss difference| {diff:.1e} (must be < 1e-5)")

    p = PUBLISHED_SETUP
    n_1b = n_published_conditions(p["n_layers"], p["n_heads"])
    per_condition = forward_flops(p["params"], p["n_layers"], p["n_heads"], p["head_dim"], p["n_chunks"],
                                  p["chunk_len"])
    rate = T4_PEAK * args.utilisation
    total = (n_1b + 1) * per_condition  # + 1: the clean pass that measures the mean gates
    print(f"projection, the paper's 1B model on a T4: {n_1b} conditions (+1 pass measuring the mean gates) x "
          f"{p['n_chunks']} chunks x {p['chunk_len']} tokens")
    print(f"  assumptions: {p['params']:.1e} params; forward only, 2 FLOPs/param/token + causal attention "
          f"({per_condition / 1e12:.1f} TFLOP per condition); T4 fp16 peak {T4_PEAK / 1e12:.0f} TFLOP/s "
          f"at {args.utilisation:.0%} utilisation = {rate / 1e12:.1f} TFLOP/s")
    print(f"  projected: {total / rate:.0f} s ({total / rate / 60:.1f} min), batched or looped alike: "
          f"{p['n_chunks']} x {p['chunk_len']} tokens already fill a T4, and stacking saves no FLOPs")
    return med


if __name__ == "__main__":
    main()
