"""Bigram-Backcopy (Guo et al., 2024): trigger tokens are followed by the token before them, the rest
follow a sparse bigram chain. Usage: python research/bb.py GATE STEPS LAYERS LR THREADS [noqk]"""

import sys
import time

import torch
import torch.nn.functional as F

from minigate import ModelConfig, Transformer
from minigate.analysis import attention_sink, massive_activations

torch.set_num_threads(int(sys.argv[5]) if len(sys.argv) > 5 else 1)
V, NT = 64, 16  # tokens 1..V-1, bos=0; triggers = 1..NT


def make_bigram(seed=0, k=2):
    g = torch.Generator().manual_seed(seed)
    P = torch.zeros(V, V)
    for a in range(V):
        succ = torch.randperm(V - 1, generator=g)[:k] + 1
        P[a, succ] = torch.rand(k, generator=g) + 0.1
    return P / P.sum(1, keepdim=True)


P = make_bigram()


def gen(B, T, g):
    cdf = P.cumsum(1)
    cdf[:, -1] = 1.0
    x = torch.zeros(B, T, dtype=torch.long)
    x[:, 1] = torch.randint(NT + 1, V, (B,), generator=g)
    for t in range(2, T):
        prev, cur = x[:, t - 2], x[:, t - 1]
        u = torch.rand(B, 1, generator=g)
        nxt = torch.searchsorted(cdf[cur], u).squeeze(1).clamp(max=V - 1)
        trig = (cur >= 1) & (cur <= NT)
        x[:, t] = torch.where(trig, prev, nxt)
    return x


POOL = gen(50000, 64, torch.Generator().manual_seed(5))


def batch(B, T, g):
    return POOL[torch.randint(0, len(POOL), (B,), generator=g)]


QK = len(sys.argv) <= 6 or sys.argv[6] != "noqk"
gate = sys.argv[1]
steps = int(sys.argv[2])
layers = int(sys.argv[3])
lr = float(sys.argv[4])
kw = dict(gate="G1", gate_granularity=gate) if gate != "none" else {}
torch.manual_seed(0)
cfg = ModelConfig(
    vocab_size=V,
    d_model=64,
    n_layers=layers,
    n_heads=4,
    n_kv_heads=4,
    head_dim=16,
    d_ff=256,
    max_seq_len=64,
    qk_norm=QK,
    **kw,
)
m = Transformer(cfg)
# Plain AdamW, weight decay on every parameter (norms and embedding too), not train.make_optimizer:
# that is what the runs logged in docs/experiments.md used.
opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
g = torch.Generator().manual_seed(1)
ge = torch.Generator().manual_seed(99)
ev = batch(64, 64, ge)
t0 = time.time()
for s in range(1, steps + 1):
    for pg in opt.param_groups:
        pg["lr"] = lr * min(1, s / 100)
    x = batch(64, 64, g)
    loss = F.cross_entropy(m(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    if s % (steps // 5) == 0:
        m.eval()
        st = attention_sink(m, ev)
        ma = massive_activations(m, ev)
        gs = ""
        if gate != "none":
            _, c = m.run_with_cache(ev, names_filter=lambda n: n.endswith("hook_gate"))
            gs = " gate " + " ".join(f"{v.mean():.2f}" for v in c.values())
        m.train()
        per_layer = [round(v, 3) for v in st.per_layer.tolist()]
        print(
            f"{gate} step {s} loss {loss.item():.3f} F-Attn {st.f_attn:.3f} per-layer {per_layer} "
            f"max head {st.share.max():.2f} sinks {st.n_sink_heads} M-Act {ma.m_act:.1f} {gs} "
            f"t={time.time() - t0:.0f}s",
            flush=True,
        )
m.eval()
with torch.no_grad():
    lg = m(ev)[:, :-1]
    tgt = ev[:, 1:]
    cur = ev[:, :-1]
    trig = (cur >= 1) & (cur <= NT)
    trig[:, 0] = False
    acc = lg.argmax(-1) == tgt
    print(
        "trigger acc",
        acc[trig].float().mean().item(),
        "non-trigger acc",
        acc[~trig].float().mean().item(),
        "trigger frac",
        trig.float().mean().item(),
    )
    _, c = m.run_with_cache(ev, names_filter=lambda n: n.endswith("hook_pattern"))
    p = c["blocks.0.attn.hook_pattern"]  # b h q k
    tq = ((ev >= 1) & (ev <= NT))[:, 1:]
    T = p.shape[-1]
    idx = torch.arange(1, T)
    prevatt = p[:, :, idx, idx - 1]  # attention to previous token
    print(
        "prev-token attention at trigger queries per head",
        [round(prevatt[:, h][tq].mean().item(), 3) for h in range(p.shape[1])],
    )
    print(
        "prev-token attention at non-trigger queries",
        [round(prevatt[:, h][~tq].mean().item(), 3) for h in range(p.shape[1])],
    )
    print(
        "bos attention at non-trigger queries", [round(p[:, h, 1:, 0][~tq].mean().item(), 3) for h in range(p.shape[1])]
    )
