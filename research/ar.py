"""Associative recall with marked queries: pair tokens (k,v) define bindings; a query token q_k is
followed by v. Relevance of the retrieval head is decided by the query token itself."""

import random
import sys
import time

import torch
import torch.nn.functional as F

from minigate import ModelConfig, Transformer
from minigate.analysis import attention_sink, massive_activations

args = dict(a.split("=") for a in sys.argv[1:])
gate = args.get("gate", "none")
steps = int(args.get("steps", 1000))
layers = int(args.get("layers", 1))
lr = float(args.get("lr", 3e-3))
QK = args.get("qk", "1") == "1"
T = int(args.get("T", 64))
wd = float(args.get("wd", 0.1))
heads = int(args.get("heads", 4))
hd = int(args.get("hd", 16))
d = int(args.get("d", 64))
torch.set_num_threads(int(args.get("threads", 1)))
NK, NV, NF = 16, 16, 32
BOS = 0
PAIR0 = 1
Q0 = PAIR0 + NK * NV
VAL0 = Q0 + NK
F0 = VAL0 + NV
VOCAB = F0 + NF


def seq(rng):
    s = [BOS]
    defined = {}
    keys = list(range(NK))
    rng.shuffle(keys)
    while len(s) < T:
        r = rng.random()
        if r < 0.25 and keys:
            k = keys.pop()
            v = rng.randrange(NV)
            defined[k] = v
            s.append(PAIR0 + k * NV + v)
        elif r < 0.45 and defined and len(s) < T - 1:
            k = rng.choice(list(defined))
            s += [Q0 + k, VAL0 + defined[k]]
        else:
            s.append(F0 + rng.randrange(NF))
    return s[:T]


rng = random.Random(5)
POOL = torch.tensor([seq(rng) for _ in range(30000)])
EV = torch.tensor([seq(random.Random(99 + i)) for i in range(64)])
kw = dict(gate="G1", gate_granularity=gate) if gate != "none" else {}
torch.manual_seed(0)
cfg = ModelConfig(
    vocab_size=VOCAB,
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
# Plain AdamW, weight decay on every parameter (norms and embedding too), not train.make_optimizer:
# that is what the runs logged in docs/experiments.md used.
opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd, betas=(0.9, 0.95))
g = torch.Generator().manual_seed(1)
t0 = time.time()


def report(s, loss):
    m.eval()
    st = attention_sink(m, EV)
    ma = massive_activations(m, EV)
    with torch.no_grad():
        lg = m(EV)[:, :-1]
        tgt = EV[:, 1:]
        isq = (EV[:, :-1] >= Q0) & (EV[:, :-1] < VAL0)
        acc = (lg.argmax(-1) == tgt)[isq].float().mean().item()
    gs = ""
    if gate != "none":
        _, c = m.run_with_cache(EV, names_filter=lambda n: n.endswith("hook_gate"))
        qmask = (EV >= Q0) & (EV < VAL0)
        gs = " gate(q/other) " + " ".join(f"{v[qmask].mean():.2f}/{v[~qmask].mean():.2f}" for v in c.values())
    m.train()
    per_layer = [round(v, 3) for v in st.per_layer.tolist()]
    print(
        f"{gate} step {s} loss {loss:.3f} recall-acc {acc:.2f} F-Attn {st.f_attn:.3f} layers {per_layer} "
        f"heads>0.3 {st.n_sink_heads} max {st.share.max():.2f} M-Act {ma.m_act:.1f}{gs} t={time.time() - t0:.0f}s",
        flush=True,
    )


for s in range(1, steps + 1):
    for pg in opt.param_groups:
        pg["lr"] = lr * min(1, s / 100)
    x = POOL[torch.randint(0, len(POOL), (64,), generator=g)]
    loss = F.cross_entropy(m(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    if s % max(1, steps // 6) == 0:
        report(s, loss.item())
if "share" in args:
    m.eval()
    print((attention_sink(m, EV).share * 100).round().int())
