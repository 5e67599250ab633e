"""Marked induction copy: first half random tokens from A = 1..N, second half copies the first half
shifted into B = N+1..2N. The query token's own range says whether there is anything to retrieve."""

import sys
import time

import torch
import torch.nn.functional as F

from minigate import ModelConfig, Transformer
from minigate.analysis import attention_sink, massive_activations
from minigate.train import TrainConfig, make_optimizer

args = dict(a.split("=") for a in sys.argv[1:])
gate = args.get("gate", "none")
steps = int(args.get("steps", 1000))
layers = int(args.get("layers", 2))
lr = float(args.get("lr", 3e-3))
QK = args.get("qk", "1") == "1"
T = int(args.get("T", 64))
wd = float(args.get("wd", 0.1))
heads = int(args.get("heads", 4))
hd = int(args.get("hd", 16))
d = int(args.get("d", 64))
N = int(args.get("N", 64))
pcopy = float(args.get("pcopy", 1.0))
B = int(args.get("B", 32))
torch.set_num_threads(int(args.get("threads", 1)))
H = int((T - 1) * float(args.get("frac", 0.5)))  # random part; the rest copies its start
USE_BOS = args.get("bos", "1") == "1"
SEP = args.get("sep", "0") == "1"


def batch(n, g):
    # Not data.copy_task: the runs logged in docs/experiments.md section 3 used this layout (no separator unless
    # sep=1, the copy starting after H = (T - 1) * frac symbols, an optional random first token) and these draws.
    a = torch.randint(1, N + 1, (n, H), generator=g)
    first = torch.zeros(n, 1, dtype=torch.long) if USE_BOS else torch.randint(1, N + 1, (n, 1), generator=g)
    if SEP:  # a separator token marks where the copy starts: no position counting needed
        b = a[:, : T - 2 - H] + N
        x = torch.cat([first, a, torch.full((n, 1), 2 * N + 1), b], 1)[:, :T]
    else:
        b = a[:, : T - 1 - H] + N
        x = torch.cat([first, a, b], 1)[:, :T]
    return x


EV = batch(64, torch.Generator().manual_seed(99))
kw = dict(gate="G1", gate_granularity=gate) if gate != "none" else {}
torch.manual_seed(int(args.get("seed", 0)))
cfg = ModelConfig(
    vocab_size=2 * N + 2,
    d_model=d,
    n_layers=layers,
    n_heads=heads,
    n_kv_heads=heads,
    head_dim=hd,
    d_ff=4 * d,
    max_seq_len=T,
    qk_norm=QK,
    **kw,
)
m = Transformer(cfg)
# AdamW with weight decay on the Linear matrices only, as train() does; the schedule below is this script's own
opt = make_optimizer(m, TrainConfig(lr=lr, weight_decay=wd, betas=(0.9, 0.95)), torch.device("cpu"))
g = torch.Generator().manual_seed(1)
t0 = time.time()
GBIAS = float(args.get("gbias", 0))  # a fixed offset on the gate logits (gate starts near sigmoid(GBIAS))
gate_bias = [(lambda n: n.endswith("hook_gate_logits"), lambda x, hook: x + GBIAS)] if GBIAS and gate != "none" else []


def report(s, loss):
    m.eval()
    st = attention_sink(m, EV)
    ma = massive_activations(m, EV)
    with torch.no_grad():
        lg = m(EV)[:, :-1]
        tgt = EV[:, 1:]
        acc = (lg.argmax(-1) == tgt)[:, H + 1 :].float().mean().item()
    gs = ""
    if gate != "none":
        _, c = m.run_with_cache(EV, names_filter=lambda n: n.endswith("hook_gate"))
        gs = " gate(A/B) " + " ".join(f"{v[:, 1 : H + 1].mean():.2f}/{v[:, H + 1 :].mean():.2f}" for v in c.values())
    m.train()
    per_layer = [round(v, 3) for v in st.per_layer.tolist()]
    print(
        f"{gate} step {s} loss {loss:.3f} copy-acc {acc:.2f} F-Attn {st.f_attn:.3f} layers {per_layer} "
        f"sinks {st.n_sink_heads}/{st.share.numel()} max {st.share.max():.2f} M-Act {ma.m_act:.1f} "
        f"peak {ma.peak:.0f}{gs} t={time.time() - t0:.0f}s",
        flush=True,
    )


with m.hooks(gate_bias):  # the gate-logit offset (gbias=) stays on for training and every measurement
    for s in range(1, steps + 1):
        for pg in opt.param_groups:
            pg["lr"] = lr * min(1, s / 100)
        x = batch(B, g)
        loss = F.cross_entropy(m(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if s % max(1, steps // 5) == 0:
            report(s, loss.item())
    m.eval()
    print((attention_sink(m, EV).share * 100).round().int().tolist())
    if gate != "none":
        _, c = m.run_with_cache(EV, names_filter=lambda n: n.endswith("hook_gate") or n.endswith("hook_pattern"))
        for L in range(layers):
            gt = c[f"blocks.{L}.attn.hook_gate"]  # b t h [d]
            if gt.dim() == 4:
                gt = gt.mean(-1)
            pat = c[f"blocks.{L}.attn.hook_pattern"]  # b h q k
            print(
                f"L{L} gate on A per head",
                [round(v, 2) for v in gt[:, 1 : H + 1].mean((0, 1)).tolist()],
                "on B",
                [round(v, 2) for v in gt[:, H + 1 :].mean((0, 1)).tolist()],
                "bos-attn from A",
                [round(v, 2) for v in pat[:, :, 1 : H + 1, 0].mean((0, 2)).tolist()],
            )
