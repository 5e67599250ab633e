"""Forward+backward step time on CPU: minigate baseline vs G1 headwise vs G1 elementwise vs
transformers' Qwen3ForCausalLM with the same sizes. Targets: gate overhead <= 1.05x baseline;
minigate no slower than transformers.

    python -m minigate.bench model [--threads 2] [--reps 15] [--batch 8] [--seq 256]
"""

from __future__ import annotations

import argparse

import torch

from minigate import ModelConfig, Transformer
from minigate.bench.common import interleaved_medians, qwen3_twin

SIZES = dict(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32, d_ff=768)


def step_fn(model, tokens, logits_of):
    def step():
        model.zero_grad(set_to_none=True)
        logits = logits_of(model, tokens)
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return step


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m minigate.bench model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = torch.randint(0, SIZES["vocab_size"], (args.batch, args.seq))
    ours = lambda m, t: m(t)  # noqa: E731
    theirs = lambda m, t: m(t).logits  # noqa: E731
    models = {
        "baseline": (Transformer(ModelConfig(**SIZES)), ours),
        "G1 headwise": (Transformer(ModelConfig(**SIZES, gate="G1", gate_granularity="headwise")), ours),
        "G1 elementwise": (Transformer(ModelConfig(**SIZES, gate="G1", gate_granularity="elementwise")), ours),
        "transformers Qwen3": (qwen3_twin(ModelConfig(**SIZES)), theirs),
    }
    med = interleaved_medians({k: step_fn(m, tokens, f) for k, (m, f) in models.items()}, reps=args.reps)
    print(f"forward+backward, batch {args.batch} x {args.seq}, {args.threads} threads, "
          f"median of {args.reps} interleaved reps; {SIZES}")
    base = med["baseline"]
    for name, t in med.items():
        n = sum(p.numel() for p in models[name][0].parameters())
        print(f"  {name:20s} {t * 1000:8.1f} ms   {t / base:5.3f}x baseline   params {n / 1e6:.2f}M")
    print(f"transformers / minigate baseline: {med['transformers Qwen3'] / base:.3f}x "
          "(>1 means minigate is faster)")
    return med


if __name__ == "__main__":
    main()
