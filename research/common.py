"""What the synthetic research scripts share: their flags, the tiny model, training through minigate's train(),
and the report printed while they train.

The recipe: AdamW (0.9, 0.95) with weight decay on the Linear matrices (train.make_optimizer), linear warmup
over the first 100 steps to a constant lr (min_lr_ratio=1.0), clipping 1.0, fp32 on the CPU, the batches
drawn by train()'s sampler from a fixed pool of rows.
"""

import argparse
import time

import torch

from minigate import ModelConfig, Transformer
from minigate.analysis import attention_sink, massive_activations
from minigate.presets import VARIANTS, TrainConfig
from minigate.train import train


def parser(description: str, layers: int = 1, steps: int = 1000, batch: int = 64) -> argparse.ArgumentParser:
    """The flags every script takes; a script adds its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--variant", default="none", choices=tuple(VARIANTS), help="none (baseline), or a G1 gate")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.1, help="weight decay")
    ap.add_argument("--no-qk-norm", action="store_true")
    ap.add_argument("--T", type=int, default=64, help="tokens per row, the first included")
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="the model's initial weights")
    ap.add_argument("--threads", type=int, default=1)
    return ap


def build_model(args, vocab_size: int) -> Transformer:
    torch.set_num_threads(args.threads)
    gate = VARIANTS[args.variant]
    torch.manual_seed(args.seed)
    return Transformer(ModelConfig(vocab_size=vocab_size, d_model=args.d_model, n_layers=args.layers,
                                   n_heads=args.heads, n_kv_heads=args.heads, head_dim=args.head_dim,
                                   d_ff=4 * args.d_model, max_seq_len=args.T, qk_norm=not args.no_qk_norm, **gate))


def fit(model, rows: torch.Tensor, probe: torch.Tensor, args, report) -> None:
    """Train on `rows` (n, T) through minigate's train(), validating on `probe`; `report(step, model, loss)`
    prints a line six times during the run."""
    steps = args.steps
    cfg = TrainConfig(steps=steps, batch_size=args.batch, seq_len=rows.shape[1] - 1, lr=args.lr, min_lr_ratio=1.0,
                      warmup_steps=min(100, steps - 1), weight_decay=args.wd, eval_every=max(1, steps // 6),
                      eval_batches=0, ckpt_every=0, seed=1, device="cpu", precision="fp32")
    t0 = time.time()

    def callback(step, model, history):
        report(step, model, history.loss[-1], time.time() - t0)

    train(model, rows, probe, cfg, callback=callback, progress=False)
    model.eval()


def sink_line(model, probe: torch.Tensor) -> str:
    """F-Attn, its per-layer values, sink heads, the largest head's share and M-Act on the probe rows."""
    st, ma = attention_sink(model, probe), massive_activations(model, probe)
    per_layer = [round(v, 3) for v in st.per_layer.tolist()]
    return (f"F-Attn {st.f_attn:.3f} layers {per_layer} sinks {st.n_sink_heads}/{st.share.numel()} "
            f"max {st.share.max():.2f} M-Act {ma.m_act:.1f} peak {ma.peak:.0f}")


def gate_means(model, probe: torch.Tensor, masks: list[torch.Tensor]) -> str:
    """Each gated layer's mean gate score where each mask (row, pos) is True, as a/b/..; "" without a gate."""
    if model.cfg.gate == "none":
        return ""
    _, cache = model.run_with_cache(probe, names_filter=lambda n: n.endswith("hook_gate"))
    return " gate " + " ".join("/".join(f"{g[m].mean():.2f}" for m in masks) for g in cache.values())
