"""Variable-length marked copy: the copy preset without any need to count positions.

A row is <bos>, a_1..a_L (L random: 4 + a geometric number, so the separator is equally likely after
every symbol and its position carries no information), <sep>, then the random part again shifted into
b = a + N, repeated with separators until the row is full. The copy offset L + 1 changes from row to
row, so it must be found by content (an induction head), not by a fixed RoPE offset, and no head
needs <bos> as a position counter. A token's own range (a or b) still says whether there is anything
to copy. Everything else is the `copy` preset (2 layers, d64, 4 x 16, 5000 steps of 32 rows).

    python -m research.vl gate=none|headwise|elementwise [seed=0] [steps=5000] [p=0.05] [T=64] [B=32] [threads=2]
        [task=vl|copy] [first=bos|random] [FIELD=VALUE ...]

task=copy runs the shipped `copy` preset's fixed-length task (data.copy_task) through the same measurements.
first=random puts one of 16 filler ids at position 0 instead of <bos> (the paper's packed documents have no
fixed first token). Any other FIELD=VALUE sets a ModelConfig or TrainConfig field (qk_norm=0, weight_decay=0.5,
n_layers=4, ...).
"""
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from minigate import Transformer
from minigate.analysis import attention_sink, massive_activations, sink_tracker
from minigate.data import copy_task
from minigate.presets import PRESETS, model_config
from minigate.train import train

args = dict(a.split("=") for a in sys.argv[1:])
task = args.pop("task", "vl")
gate, seed, steps = args.get("gate", "none"), int(args.get("seed", 0)), int(args.get("steps", 5000))
p, N, T, B = float(args.get("p", 0.05)), 64, int(args.get("T", 64)), int(args.get("B", 32))
torch.set_num_threads(int(args.get("threads", 2)))
SEP = 2 * N + 1


def rows(n: int, seed: int) -> torch.Tensor:
    """(n, T + 1) rows and a mask (n, T + 1) that is True from the separator on (queries with something to copy).

    The same task as data.induction_task(n_first=0), which came later, but not the same draws: the lengths come
    from torch's global RNG (seeded below) and the symbols row by row. The runs logged in docs/experiments.md
    (sections 8 and on) used these rows, so this generator stays to reproduce them."""
    g = torch.Generator().manual_seed(seed)
    out, copy = torch.zeros(n, T + 1, dtype=torch.long), torch.zeros(n, T + 1, dtype=torch.bool)
    lengths = 4 + torch.distributions.Geometric(probs=torch.tensor(p)).sample((n,)).long()  # uses torch's RNG
    lengths = lengths.clamp(max=T - 8)
    for i, L in enumerate(lengths.tolist()):
        a = torch.randint(1, N + 1, (L,), generator=g)
        seq = [0, *a.tolist(), SEP]
        while len(seq) < T + 1:
            seq += [*(a + N).tolist(), SEP]
        out[i] = torch.tensor(seq[: T + 1])
        copy[i, L + 1:] = True  # the separator and everything after it: queries with something to fetch
    return out, copy


def copy_rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed-length copy task (separator after T // 2 symbols), with the same mask as rows()."""
    out = copy_task(n, T, N, seed)
    copy = torch.zeros_like(out, dtype=torch.bool)
    copy[:, T // 2 + 1:] = True
    return out, copy


if task == "copy":
    rows = copy_rows  # noqa: F811
FIRST = args.get("first", "bos")  # "random": no <bos>; position 0 holds one of 16 filler ids instead
N_FILL = 16


def first_token(r: torch.Tensor, seed: int) -> torch.Tensor:
    if FIRST == "random":  # ids 2N + 2 .. 2N + 17: never copied, never predicted from context
        r[:, 0] = torch.randint(2 * N + 2, 2 * N + 2 + N_FILL, (len(r),), generator=torch.Generator().manual_seed(seed))
    return r


torch.manual_seed(1000 + seed)  # the lengths
train_rows = first_token(rows(40_000, 1)[0], 11)
val_rows = first_token(rows(512, 2)[0], 12)
probe, probe_copy = rows(256, 3)
probe = first_token(probe, 13)
x_probe = probe[:, :T]

preset = PRESETS["copy"]
cfg = dataclasses.replace(preset.train, steps=steps, seed=seed, seq_len=T, batch_size=B)
mcfg = dataclasses.replace(model_config("copy", gate), max_seq_len=T,
                           vocab_size=2 * N + 2 + (N_FILL if FIRST == "random" else 0))
known = ("gate", "seed", "steps", "p", "T", "B", "threads", "out", "first")
over = {"model": {}, "train": {}}  # FIELD=VALUE overrides, applied together (n_heads and n_kv_heads, say)
for name, value in ((k, v) for k, v in args.items() if k not in known):
    target = mcfg if hasattr(mcfg, name) else cfg
    kind = type(getattr(target, name))  # AttributeError: no such ModelConfig or TrainConfig field
    over["model" if target is mcfg else "train"][name] = value in ("1", "true", "True") if kind is bool else kind(value)
mcfg, cfg = dataclasses.replace(mcfg, **over["model"]), dataclasses.replace(cfg, **over["train"])
torch.manual_seed(seed)
model = Transformer(mcfg)
tag = "".join(f"-{k}{v}" for k, v in args.items() if k not in known) + (f"-{steps}" if steps != 5000 else "")
tag += "-nobos" if FIRST == "random" else ""
out = Path(args.get("out", f"runs/{task}-{gate}-s{seed}{tag}"))  # resumes if it holds a checkpoint
t0 = time.time()
hist = train(model, train_rows, val_rows, cfg, out_dir=out, resume=(out / "checkpoint.pt").exists(),
             progress=False, callback=sink_tracker(x_probe[:64]))
model.eval()

# -- measure on 256 held-out rows ---------------------------------------------------------------------------
sink, act = attention_sink(model, x_probe), massive_activations(model, x_probe)
q_copy = probe_copy[:, :T]  # (row, pos): the query token is in the copy part
_, cache = model.run_with_cache(x_probe, names_filter=lambda n: n.endswith(("hook_pattern", "hook_gate")))
logits = model(x_probe)
pred = logits.argmax(-1)
y = probe[:, 1:]
copy_target = probe_copy[:, 1:] & (y != SEP)
acc = (pred == y)[copy_target].float().mean().item()
overrides = {k: v for k, v in args.items() if k not in known}
res = dict(task=task, overrides=overrides, gate=gate, seed=seed, steps=steps, p=p, T=T, B=B,
           minutes=(time.time() - t0) / 60,
           val_loss=hist.val_loss[-1], f_attn=sink.f_attn, per_layer=sink.per_layer.tolist(), n_sink=sink.n_sink_heads,
           share=sink.share.tolist(), m_act=act.m_act, peak=act.peak, copy_acc=acc, heads=[])
rand = ~q_copy
rand[:, 0] = False
lengths = probe_copy.float().argmax(1) - 1  # (row,): L, the random part's length
pos = torch.arange(T)
target = pos[None, :] - lengths[:, None]  # (row, query): the token after the previous occurrence (offset L)
ind_mask = q_copy & (target >= 1)
for L in range(model.cfg.n_layers):
    pat = cache[f"blocks.{L}.attn.hook_pattern"][..., 0]  # (row, head, query): attention on <bos>
    for h in range(model.cfg.n_heads):
        full = cache[f"blocks.{L}.attn.hook_pattern"][:, h]  # (row, query, key)
        on_target = full.gather(-1, target.clamp(min=0)[..., None])[..., 0]  # (row, query)
        row = dict(layer=L, head=h, bos_rand=pat[:, h][rand].mean().item(), bos_copy=pat[:, h][q_copy].mean().item(),
                   induction=on_target[ind_mask].mean().item())
        if gate != "none":
            gt = cache[f"blocks.{L}.attn.hook_gate"]  # (row, pos, head[, d_head])
            gt = gt[:, :, h] if gt.dim() == 3 else gt[:, :, h].mean(-1)
            row.update(gate_rand=gt[rand].mean().item(), gate_copy=gt[q_copy].mean().item())
        res["heads"].append(row)
print(json.dumps({k: v for k, v in res.items() if k not in ("heads", "share")}))
for r in res["heads"]:
    print("  L{layer} H{head}: bos on random {bos_rand:.2f}, on copy {bos_copy:.2f}, "
          "induction {induction:.2f}".format(**r)
          + ("; gate random {gate_rand:.2f}, copy {gate_copy:.2f}".format(**r) if "gate_rand" in r else ""))
(out / "result.json").write_text(json.dumps(res, indent=1))
