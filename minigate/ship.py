"""Train, measure and ship the natural-data checkpoints: data/checkpoints/code-* (CPU recipe) or code-gpu-* (GPU).

    python -m minigate.ship --preset code      # 2 CPU cores, about 35-40 minutes per model; resumes a run folder
    python -m minigate.ship --preset code-gpu  # a CUDA GPU only (docs/gpu.md)

1. `minigate train --preset P --variant V --out runs/P-V` for V in none, headwise, elementwise, one at a time
   (a folder with a checkpoint is resumed; a finished one is only measured).
2. Each model measured on held-out WikiText-2 prose at seq_len 512, prose none of them saw, with the paper's metric
   definitions: F-Attn and its excess over uniform attention, the largest head, sink rate, M-Act; plus the
   validation loss on held-out code.
3. Shipped as 16-bit safetensors with run.json, the tokenizer and a thinned history.json, measured again from the
   shipped files (the numbers a lesson reads), and checked against the recipe's bar (BARS, check_bar).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from .resources import DATA_DIR

NAMES = {"none": "baseline", "headwise": "headwise", "elementwise": "elementwise"}  # variant -> shipped suffix
PROSE_LEN = 512
# the bar each recipe's models must reach: baseline M-Act, and how far a gated loss may trail the baseline's
BARS = {"code": dict(m_act=20, loss_slack=0.02), "code-gpu": dict(m_act=100, loss_slack=1e-3)}


def prose_windows(tokenizer_path, limit: int | None = None) -> torch.Tensor:
    """Held-out WikiText-2 (the wikitext-2 corpus' validation articles) cut into <bos>-first windows of 512
    (batch, 512): all 75 of them, or the first `limit`."""
    from . import data

    tok = data.load_tokenizer(tokenizer_path)
    ids = data.encode(data.load_documents("wikitext-2")[1], tok)
    return torch.cat([x for x, _ in data.eval_batches(ids, 64, PROSE_LEN, 0)])[:limit]


def shipped_numbers(model, prose: torch.Tensor, history: dict) -> dict:
    """The numbers shipped with one model (its row of the README's table), measured on `prose` [batch, 512]."""
    from .analysis import attention_sink, massive_activations, uniform_first_token_share

    device = next(model.parameters()).device
    model = model.eval()
    with torch.no_grad():
        sink = attention_sink(model, prose.to(device), batch_size=8)
        act = massive_activations(model, prose.to(device), batch_size=8)
    uniform = uniform_first_token_share(PROSE_LEN)
    layer, head = divmod(int(sink.share.argmax()), sink.share.shape[1])
    return {"f_attn": sink.f_attn, "f_attn_excess": sink.f_attn - uniform, "uniform": uniform,
            "max_head": sink.share.max().item(), "max_head_at": [layer, head], "sink_rate": sink.sink_rate,
            "m_act": act.m_act, "m_act_per_layer": [round(v, 1) for v in act.max_abs.tolist()],
            "f_attn_per_layer": [round(v, 4) for v in sink.per_layer.tolist()],
            "val_loss_code": history["val_loss"][-1], "windows": prose.shape[0]}


def thin(history: dict, every: int = 10) -> dict:
    """Per-step lists kept every `every` steps (and the last); evaluations, spikes and metrics kept whole."""
    keep = [i for i, s in enumerate(history["step"]) if s % every == 0 or i == len(history["step"]) - 1]
    out = dict(history)
    for k in ("step", "lr", "loss", "grad_norm", "tokens_per_s"):
        out[k] = [history[k][i] for i in keep]
    out["info"] = dict(_portable(history.get("info", {})), thinned=f"per-step lists kept every {every} steps")
    return out


def _portable(run: dict) -> dict:
    """run.json (or history info) without a path of the machine that trained it."""
    run = dict(run)
    if run.get("tokenizer"):
        run["tokenizer"] = "data/tokenizer.json" if Path(run["tokenizer"]).name == "tokenizer.json" else "tokenizer"
    if "python_code" in run:
        roots = run["python_code"].get("roots", [])
        run["python_code"] = dict(run["python_code"], roots=["stdlib" if i == 0 else "site-packages"
                                                             for i, _ in enumerate(roots)])
    return run


def train_minutes(history: dict, run: dict) -> float:
    """Minutes of training (steps x tokens per step / tokens per second), from the unthinned history."""
    tokens = run["train"]["batch_size"] * run["train"]["seq_len"] * run["train"].get("grad_accum", 1)
    return sum(tokens / r for r in history["tokens_per_s"]) / 60


def ship_one(run_dir: Path, ship: Path, prose: torch.Tensor) -> dict:
    """Copy a finished run's model into `ship` (bf16 + run.json, tokenizer, thinned history); its measurements."""
    import minigate

    history = json.loads((run_dir / "history.json").read_text())
    run = json.loads((run_dir / "run.json").read_text())
    trained = shipped_numbers(minigate.from_pretrained(run_dir / "model"), prose, history)
    if ship.exists():
        shutil.rmtree(ship)
    minigate.save_pretrained(minigate.from_pretrained(run_dir / "model"), ship, dtype=torch.bfloat16)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (run_dir / "model" / f).exists():
            shutil.copyfile(run_dir / "model" / f, ship / f)
    (ship / "run.json").write_text(json.dumps(_portable(run), indent=2))
    (ship / "history.json").write_text(json.dumps(thin(history)))
    shipped = shipped_numbers(minigate.from_pretrained(ship), prose, history)
    return dict(shipped, f_attn_fp32=trained["f_attn"], m_act_fp32=trained["m_act"],
                minutes=train_minutes(history, run), steps=history["step"][-1])


def check_bar(rows: dict, preset: str) -> list[tuple[str, bool]]:
    """(claim, holds) for each line of the recipe's bar; rows are keyed by variant (none, headwise, elementwise)."""
    b, bar = rows["none"], BARS[preset]
    out = [("baseline F-Attn >= 0.03 above uniform", b["f_attn_excess"] >= 0.03),
           ("baseline has a head at >= 0.25", b["max_head"] >= 0.25),
           (f"baseline M-Act >= {bar['m_act']}", b["m_act"] >= bar["m_act"])]
    for g in ("headwise", "elementwise"):
        if g in rows:
            r = rows[g]
            out.append((f"{g}: excess F-Attn >= 3x smaller", r["f_attn_excess"] * 3 <= b["f_attn_excess"]))
            out.append((f"{g}: M-Act >= 3x smaller", r["m_act"] * 3 <= b["m_act"]))
            out.append((f"{g}: val loss <= baseline + {bar['loss_slack']:g}",
                        r["val_loss_code"] <= b["val_loss_code"] + bar["loss_slack"]))
    return out


def table(rows: dict, preset: str) -> str:
    """The README's markdown table of the shipped models."""
    lines = ["| model | F-Attn | above uniform | largest head (layer, head) | sink rate | M-Act | val loss (code) | "
             "train min |", "|---|---|---|---|---|---|---|---|"]
    for variant, r in rows.items():
        lines.append(f"| {preset}-{NAMES[variant]} | {r['f_attn']:.3f} | {r['f_attn_excess']:.3f} | "
                     f"{r['max_head']:.2f} ({r['max_head_at'][0]}, {r['max_head_at'][1]}) | {r['sink_rate']:.1%} | "
                     f"{r['m_act']:.0f} | {r['val_loss_code']:.3f} | {r['minutes']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(BARS), default="code")
    ap.add_argument("--runs", default="runs", help="run folders runs/<preset>-<variant> (resumed if present)")
    ap.add_argument("--ship", default=str(DATA_DIR / "checkpoints"), help="where the <preset>-* folders go")
    ap.add_argument("--variants", "--gates", dest="variants", nargs="*", default=list(NAMES), choices=list(NAMES))
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for training (CPU recipe)")
    ap.add_argument("--no-train", action="store_true", help="only measure and ship finished run folders")
    args = ap.parse_args(argv)
    if args.preset == "code-gpu" and not torch.cuda.is_available():
        print("minigate.ship: --preset code-gpu needs a CUDA GPU (the code-gpu-* checkpoints are GPU-trained)")
        return 2
    rows, prose = {}, None
    for variant in args.variants:
        run = Path(args.runs) / f"{args.preset}-{variant}"
        done = (run / "model" / "config.json").exists()
        if not done and args.no_train:
            print(f"minigate.ship: {run} has no finished model; train it, or leave out --no-train")
            return 2
        if not done:
            cmd = [sys.executable, "-m", "minigate.cli", "train", "--preset", args.preset, "--variant", variant,
                   "--out", str(run), "--quiet", "--threads", str(args.threads)]
            subprocess.run(cmd + (["--resume"] if (run / "checkpoint.pt").exists() else []), check=True)
        if prose is None:
            prose = prose_windows(run / "model" / "tokenizer.json")
        rows[variant] = ship_one(run, Path(args.ship) / f"{args.preset}-{NAMES[variant]}", prose)
    print(f"\nmeasured on held-out WikiText-2, T={PROSE_LEN} ({prose.shape[0]} windows; uniform attention gives "
          f"{next(iter(rows.values()))['uniform']:.4f}), from the shipped bf16 weights:\n{table(rows, args.preset)}")
    (Path(args.runs) / f"{args.preset}_measurements.json").write_text(json.dumps(rows, indent=2))
    if "none" not in rows:
        return 0
    bar = check_bar(rows, args.preset)
    for what, ok in bar:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    return 0 if all(ok for _, ok in bar) and all(math.isfinite(r["f_attn"]) for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
