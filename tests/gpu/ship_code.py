"""Train, measure and ship the GPU recipe's natural-data checkpoints
data/checkpoints/code-gpu-{baseline,headwise,elementwise}.

On a CUDA machine, one command (about 5 minutes on an H100; a run folder that exists is resumed):

    python tests/gpu/ship_code.py --runs runs --ship data/checkpoints [--pack $OUT]

1. `minigate train --preset code-gpu --gate G --out runs/code-gpu-G` for G in none, headwise, elementwise.
2. Each model measured on held-out WikiText-2 prose at seq_len 512 (prose the models never saw; the paper's
   metric definitions): F-Attn and its excess over uniform attention, the largest head, sink rate, M-Act,
   and the validation loss on held-out code.
3. Shipped as 16-bit safetensors with run.json, tokenizer.json and a thinned history.json, then measured
   again from the shipped files (the numbers a lesson will read), and checked against issue 14's bar.
Refuses to run without CUDA: these names are for GPU-trained weights only.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"none": "code-gpu-baseline", "headwise": "code-gpu-headwise", "elementwise": "code-gpu-elementwise"}
PROSE_LEN = 512


def prose_windows(tokenizer_path: Path) -> torch.Tensor:
    """Held-out WikiText-2 (the wikitext-2 corpus' validation articles) cut into <bos>-first windows of 512."""
    from minigate import data

    tok = data.load_tokenizer(tokenizer_path)
    ids = data.encode(data.load_documents("wikitext-2")[1], tok)
    return torch.cat([x for x, _ in data.eval_batches(ids, 64, PROSE_LEN, 0)])


def measure(model, prose: torch.Tensor, history: dict) -> dict:
    from minigate.analysis import attention_sink, massive_activations, uniform_first_token_share

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    with torch.no_grad():
        sink = attention_sink(model, prose.to(device), batch_size=8)
        act = massive_activations(model, prose.to(device), batch_size=8)
    uniform = uniform_first_token_share(PROSE_LEN)
    return {"f_attn": sink.f_attn, "f_attn_excess": sink.f_attn - uniform, "uniform": uniform,
            "max_head": sink.share.max().item(), "sink_rate": sink.sink_rate, "m_act": act.m_act,
            "m_act_per_layer": [round(v, 1) for v in act.max_abs.tolist()],
            "f_attn_per_layer": [round(v, 4) for v in sink.per_layer.tolist()],
            "val_loss_code": history["val_loss"][-1], "windows": prose.shape[0]}


def thin(history: dict, every: int = 10) -> dict:
    """Per-step lists kept every `every` steps (and the last); evaluations, spikes and metrics kept whole."""
    keep = [i for i, s in enumerate(history["step"]) if s % every == 0 or i == len(history["step"]) - 1]
    out = dict(history)
    for k in ("step", "lr", "loss", "grad_norm", "tokens_per_s"):
        out[k] = [history[k][i] for i in keep]
    out["info"] = dict(history.get("info", {}), thinned=f"per-step lists kept every {every} steps")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="runs", help="run folders (resumed if present)")
    ap.add_argument("--ship", default=str(ROOT / "data" / "checkpoints"), help="where code-gpu-* folders go")
    ap.add_argument("--pack", help="also write one code-gpu-*.tar per model here (to bring them back)")
    ap.add_argument("--gates", nargs="*", default=list(SHIPPED))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("ship_code: needs a CUDA GPU (the code-gpu-* checkpoints are GPU-trained by definition)")
        return 2
    import minigate

    rows = {}
    for gate in args.gates:
        run = Path(args.runs) / f"code-gpu-{gate}"
        cmd = [sys.executable, "-m", "minigate.cli", "train", "--preset", "code-gpu", "--gate", gate, "--out", str(run),
               "--quiet"]
        if (run / "checkpoint.pt").exists() and not (run / "model" / "config.json").exists():
            cmd.append("--resume")
        if not (run / "model" / "config.json").exists():
            subprocess.run(cmd, check=True, cwd=ROOT)
        history = json.loads((run / "history.json").read_text())
        prose = prose_windows(run / "model" / "tokenizer.json")
        trained = measure(minigate.from_pretrained(run / "model"), prose, history)
        ship = Path(args.ship) / SHIPPED[gate]
        if ship.exists():
            shutil.rmtree(ship)
        minigate.save_pretrained(minigate.from_pretrained(run / "model"), ship, dtype=torch.bfloat16)
        for f in ("run.json", "tokenizer.json"):
            shutil.copyfile(run / "model" / f, ship / f)
        (ship / "history.json").write_text(json.dumps(thin(history)))
        shipped = measure(minigate.from_pretrained(ship), prose, history)
        rows[gate] = dict(shipped, f_attn_fp32=trained["f_attn"], m_act_fp32=trained["m_act"],
                          minutes=sum(1 / r for r in history["tokens_per_s"]) * 32 * 512 / 60,
                          gpu=torch.cuda.get_device_name())
        if args.pack:
            with tarfile.open(Path(args.pack) / f"{SHIPPED[gate]}.tar", "w") as t:
                t.add(ship, arcname=SHIPPED[gate])
    print(f"\nmeasured on held-out WikiText-2, T={PROSE_LEN} ({prose.shape[0]} windows; uniform attention "
          f"gives {rows[args.gates[0]]['uniform']:.4f}), from the shipped bf16 weights:")
    print("| model | F-Attn | above uniform | largest head | sink rate | M-Act | val loss (code) | train min |")
    print("|---|---|---|---|---|---|---|---|")
    for gate, r in rows.items():
        print(f"| {SHIPPED[gate]} | {r['f_attn']:.3f} | {r['f_attn_excess']:.3f} | {r['max_head']:.2f} | "
              f"{r['sink_rate']:.1%} | {r['m_act']:.0f} | {r['val_loss_code']:.3f} | {r['minutes']:.1f} |")
    (Path(args.pack or args.runs) / "code_measurements.json").write_text(json.dumps(rows, indent=2))
    if set(rows) != set(SHIPPED):
        return 0
    b, bar = rows["none"], []
    bar.append(("baseline F-Attn >= 0.03 above uniform", b["f_attn_excess"] >= 0.03))
    bar.append(("baseline has a head at >= 0.25", b["max_head"] >= 0.25))
    bar.append(("baseline M-Act >= 100", b["m_act"] >= 100))
    for g in ("headwise", "elementwise"):
        r = rows[g]
        bar.append((f"{g}: excess F-Attn >= 3x smaller", r["f_attn_excess"] * 3 <= b["f_attn_excess"]))
        bar.append((f"{g}: M-Act >= 3x smaller", r["m_act"] * 3 <= b["m_act"]))
        bar.append((f"{g}: val loss no worse", r["val_loss_code"] <= b["val_loss_code"] + 1e-3))
    for what, ok in bar:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    return 0 if all(ok for _, ok in bar) and all(math.isfinite(r["f_attn"]) for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
