"""Train, measure and ship the natural-data checkpoints: data/checkpoints/code-* (CPU recipe) or code-gpu-* (GPU).

    python -m minigate.ship --preset code      # 2 CPU cores, about 35-40 minutes per model; resumes a run folder
    python -m minigate.ship --preset code-moe --variants none elementwise  # the MoE pair of lesson 08
    python -m minigate.ship --preset code-gpu  # a CUDA GPU only (docs/gpu.md)
    python -m minigate.ship --preset code --measure  # measure the shipped models again; the READMEs and lessons follow

1. `minigate train --preset P --variant V --out runs/P-V` for V in none, headwise, elementwise, one at a time
   (a folder with a checkpoint is resumed; a finished one is only measured).
2. Each model measured on held-out WikiText-2 prose at seq_len 512, prose none of them saw, with the paper's metric
   definitions: F-Attn and its excess over uniform attention, the largest head, sink rate, M-Act; plus the
   validation loss on held-out code.
3. Shipped as 16-bit safetensors with run.json, the tokenizer and a thinned history.json, measured again from the
   shipped files into measurements.json (the numbers a lesson reads), and checked against the recipe's bar (BARS,
   check_bar).
4. For the course's code models: the READMEs' table and sentence are rewritten from the new measurements.json, and
   the lessons that show them (solutions calling ship.measure_*) run again, lessons/ rebuilt (--no-lessons: not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from .resources import DATA_DIR

NAMES = {"none": "baseline", "headwise": "headwise", "elementwise": "elementwise"}  # variant -> shipped suffix
PROSE_LEN = 512
MEASUREMENTS = "measurements.json"  # beside each shipped checkpoint: the one source of its numbers
PROTOCOL = {"prose": "held-out WikiText-2 (the wikitext-2 corpus' validation articles), <bos>-first windows",
            "seq_len": PROSE_LEN, "gu_seq_len": 64, "sink_threshold": 0.3, "function": "analysis.published_measures",
            "weights": "the shipped 16-bit weights", "val_loss_code": "the run's last validation loss, held-out code"}
# the bar each recipe's models must reach: baseline M-Act, and how far a gated loss may trail the baseline's
BARS = {"code": dict(m_act=20, loss_slack=0.02), "code-gpu": dict(m_act=100, loss_slack=1e-3),
        "code-moe": dict(m_act=20, loss_slack=0.02)}


def prose_windows(tokenizer_path, limit: int | None = None) -> torch.Tensor:
    """Held-out WikiText-2 (the wikitext-2 corpus' validation articles) cut into <bos>-first windows of 512
    (batch, 512): all 75 of them, or the first `limit`."""
    from . import data

    tok = data.load_tokenizer(tokenizer_path)
    ids = data.encode(data.load_documents("wikitext-2")[1], tok)
    return torch.cat([x for x, _ in data.eval_batches(ids, 64, PROSE_LEN, 0)])[:limit]


def shipped_numbers(model, prose: torch.Tensor, history: dict, stats: bool = False) -> dict:
    """The numbers shipped with one model (its row of the README's table), measured on `prose` [batch, 512] with
    analysis.published_measures: the paper's F-Attn, its excess over uniform, the largest head and sink rate at
    T=512, Gu et al.'s sink rate at T=64 (the windows' first 64 tokens), M-Act; and the final validation loss.
    stats=True adds the SinkStats and ActivationStats behind them ("sink", "act"), for plots."""
    from .analysis import published_measures

    model = model.eval()
    with torch.no_grad():
        m = published_measures(model, prose.to(next(model.parameters()).device), batch_size=8)
    return {"f_attn": m["f_attn"], "f_attn_excess": m["f_attn_excess"], "uniform": m["uniform"],
            "max_head": m["max_head_share"], "max_head_at": m["max_head_at"], "sink_rate": m["sink_rate"],
            "sink_rate_64": m["sink_rate_64"], "max_head_64": m["max_head_share_64"], "m_act": m["m_act"],
            "m_act_per_layer": [round(v, 1) for v in m["m_act_per_layer"]],
            "f_attn_per_layer": [round(v, 4) for v in m["share_per_layer"]],
            "val_loss_code": history["val_loss"][-1], "windows": prose.shape[0],
            **({"sink": m["sink"], "act": m["act"]} if stats else {})}


def windows_digest(windows: torch.Tensor) -> str:
    """SHA-256 of a (batch, T) tensor of token ids: whether a lesson measures on the windows the numbers came from."""
    return hashlib.sha256(windows.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def _measure(folder: Path, prose: torch.Tensor, device="cpu", stats: bool = False) -> dict:
    """shipped_numbers of the checkpoint in `folder` (its weights and history.json) on `prose`."""
    import minigate

    history = json.loads((folder / "history.json").read_text())
    return shipped_numbers(minigate.from_pretrained(folder, device=device), prose, history, stats)


def measure_folder(folder: Path, prose: torch.Tensor) -> dict:
    """Measure a shipped checkpoint folder on `prose` and write its measurements.json (protocol and numbers)."""
    row = _measure(folder, prose)
    protocol = dict(PROTOCOL, windows=prose.shape[0], windows_sha256=windows_digest(prose))
    record = {"name": folder.name, "protocol": protocol, **row}
    (folder / MEASUREMENTS).write_text(json.dumps(record, indent=2) + "\n")
    return row


def measure_shipped(name: str, device="cpu", prose: torch.Tensor | None = None) -> dict:
    """Measure a shipped model again, as `--measure` did, and check the numbers against its measurements.json:
    on the same windows (same SHA-256) every number must agree to 1e-4 (1e-3 off the CPU; an AssertionError names
    the one that does not); on other windows (another WikiText-2 copy) the result says so in "same_windows".
    Returns the new row, with the SinkStats and ActivationStats behind it ("sink", "act") for plots.
    `prose`: the windows from prose_windows, when the caller has them already."""
    folder = DATA_DIR / "checkpoints" / name
    stored = json.loads((folder / MEASUREMENTS).read_text())
    prose = prose_windows(folder / "tokenizer.json") if prose is None else prose
    row = _measure(folder, prose, device, stats=True)
    row["same_windows"] = windows_digest(prose) == stored["protocol"]["windows_sha256"]
    tol = 1e-4 if str(device) == "cpu" else 1e-3
    if row["same_windows"]:
        for key in ("f_attn", "f_attn_excess", "max_head", "sink_rate", "sink_rate_64", "max_head_64", "m_act"):
            assert abs(row[key] - stored[key]) <= tol * max(1.0, abs(stored[key])), (
                f"{name}: {key} {row[key]} here, {stored[key]} in {MEASUREMENTS}: measure again with "
                "python -m minigate.ship --measure")
    return row


def shipped_variants(preset: str, ship: Path = DATA_DIR / "checkpoints") -> list[str]:
    """The variants of a preset that are shipped (a folder with measurements.json), in NAMES order: all three for
    the code models, none and elementwise for the code-moe pair."""
    return [v for v, name in NAMES.items() if (Path(ship) / f"{preset}-{name}" / MEASUREMENTS).is_file()]


def measure_preset(preset: str = "code", device="cpu", prose: torch.Tensor | None = None) -> dict:
    """{variant: row} of a preset's shipped models, each measured again with measure_shipped on the windows its
    measurements.json records (and checked against it): what a lesson prints about the shipped models.
    `prose`: the windows from prose_windows, when the caller has them already."""
    if prose is None:
        prose = prose_windows(DATA_DIR / "checkpoints" / f"{preset}-baseline" / "tokenizer.json")
    return {v: measure_shipped(f"{preset}-{NAMES[v]}", device, prose) for v in shipped_variants(preset)}


def ratios(rows: dict) -> dict:
    """{gated variant: {"f_attn_excess": x, "m_act": x}}: how many times smaller than the baseline's each gated
    model's F-Attn excess over uniform and M-Act are (rows keyed by variant): the ratios the course states."""
    b = rows["none"]
    return {v: {k: b[k] / r[k] for k in ("f_attn_excess", "m_act")} for v, r in rows.items() if v != "none"}


def thin(history: dict, every: int = 10) -> dict:
    """Per-step lists kept every `every` steps (and the last); evaluations, spikes and metrics kept whole."""
    keep = [i for i, s in enumerate(history["step"]) if s % every == 0 or i == len(history["step"]) - 1]
    out = dict(history)
    for k in ("step", "lr", "loss", "grad_norm", "tokens_per_s", "aux_loss"):
        if history.get(k):
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
    shipped = measure_folder(ship, prose)
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
    """The README's markdown table of the shipped models (rows keyed by variant, as measurements.json holds them)."""
    lines = ["| model | F-Attn | above uniform | largest head (layer, head) | sink heads, T=512 | sink heads, "
             "T=64 (Gu) | M-Act | val loss (code) |", "|---|---|---|---|---|---|---|---|"]
    for variant, r in rows.items():
        lines.append(f"| {preset}-{NAMES[variant]} | {r['f_attn']:.3f} | {r['f_attn_excess']:.3f} | "
                     f"{r['max_head']:.2f} ({r['max_head_at'][0]}, {r['max_head_at'][1]}) | {r['sink_rate']:.1%} | "
                     f"{r['sink_rate_64']:.1%} | {r['m_act']:.0f} | {r['val_loss_code']:.3f} |")
    return "\n".join(lines)


def effect_summary(rows: dict) -> str:
    """The sentence the READMEs state about a preset's shipped models, from their measurements (rows by variant)."""
    b, h, e = rows["none"], rows["headwise"], rows["elementwise"]
    x = ratios(rows)
    return (f"By Gu et al.'s protocol (windows of 64 tokens; a sink head puts more than 0.3 of its attention on the "
            f"first token) {b['sink_rate_64']:.1%} of the baseline's heads are sink heads, against "
            f"{h['sink_rate_64']:.1%} (headwise) and {e['sink_rate_64']:.1%} (elementwise); over 512 tokens its "
            f"largest head puts {b['max_head']:.2f} on the first token. The gated models have "
            f"{x['headwise']['f_attn_excess']:.1f}x (headwise) and {x['elementwise']['f_attn_excess']:.1f}x "
            f"(elementwise) less first-token attention above uniform (F-Attn at T=512) and "
            f"{x['headwise']['m_act']:.1f}x and {x['elementwise']['m_act']:.1f}x smaller massive activations (M-Act).")


def shipped_rows(preset: str, ship: Path = DATA_DIR / "checkpoints") -> dict:
    """{variant: measurements.json} of a preset's shipped models, in NAMES order."""
    return {v: json.loads((Path(ship) / f"{preset}-{NAMES[v]}" / MEASUREMENTS).read_text())
            for v in shipped_variants(preset, ship)}


def shown_in(root: Path = DATA_DIR.parent, preset: str = "code") -> tuple[list[Path], list[Path]]:
    """(docs, lessons) that state a preset's shipped numbers: the READMEs that hold its table or sentence (those that
    exist: an installed package has none) and the solutions notebooks that measure its models with measure_preset or
    measure_shipped, naming the preset ("code") or a model ("code-baseline", f"code-{name}"; not "code-moe-...")."""
    docs = [p for p in (root / "README.md", root / "data" / "checkpoints" / "README.md")
            if p.is_file() and (f"| {preset}-baseline |" in p.read_text()  # a row of the preset's table
                                or preset == "code" and "By Gu et al.'s protocol" in p.read_text())]  # its sentence
    names = re.compile(rf'"{re.escape(preset)}(?:\\?"|-{{|-(?:{"|".join(NAMES.values())}))')  # \\?": JSON's \\"
    lessons = [p for p in sorted((root / "solutions").glob("0*.ipynb"))
               if re.search(r"ship\.measure_(?:preset|shipped)\(", p.read_text()) and names.search(p.read_text())]
    return docs, lessons


def update_docs(old: dict, new: dict, preset: str, docs: list[Path]) -> list[Path]:
    """Where a doc states the table or the sentence generated from the `old` rows (keyed by variant), put the ones
    generated from `new` instead; returns the docs that changed. A ValueError names a doc that states neither (edited
    by hand: put ship.table / ship.effect_summary's text back, then measure again)."""
    changed = []
    for doc in docs:
        text = doc.read_text()
        pairs = [(table(old, preset), table(new, preset))]
        if set(old) == set(new) == set(NAMES):  # the sentence compares all three
            pairs.append((effect_summary(old), effect_summary(new)))
        if not any(before in text for before, _ in pairs):
            raise ValueError(f"{doc} states neither the table nor the sentence of the stored measurements: put "
                             "ship.table / ship.effect_summary's text back, then measure again")
        for before, after in pairs:
            text = text.replace(before, after)
        if text != doc.read_text():
            doc.write_text(text)
            changed.append(doc)
    return changed


def rerun_lessons(lessons: list[Path], rebuild: bool = True) -> None:
    """Execute each solutions notebook in place (as `make test` checks them), then rebuild lessons/ from them."""
    import nbformat
    from nbclient import NotebookClient

    for path in lessons:
        print(f"minigate.ship: running {path.name} ...", flush=True)
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=1800, record_timing=False, store_widget_state=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        nbformat.write(nb, path)
    if rebuild:  # a command, as training is: the library imports no course code
        subprocess.run([sys.executable, "-m", "minigate.course", "build"], check=True)


def _bring_along(old: dict | None, rows: dict, args) -> None:
    """After the course's code models were shipped or measured again: the READMEs' table and sentence, and the lessons
    that show them, follow the new measurements.json (`old`: the rows before, None where there were none)."""
    course = Path(args.ship).resolve() == (DATA_DIR / "checkpoints").resolve()  # not a copy elsewhere
    if old is None or not course or args.preset not in ("code", "code-moe") or set(rows) != set(old):
        return
    docs, lessons = shown_in(preset=args.preset)
    for doc in update_docs(old, shipped_rows(args.preset, Path(args.ship)), args.preset, docs):
        print(f"minigate.ship: rewrote the table and the sentence in {doc.name}")
    if not args.no_lessons:
        rerun_lessons(lessons)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(BARS), default="code")
    ap.add_argument("--runs", default="runs", help="run folders runs/<preset>-<variant> (resumed if present)")
    ap.add_argument("--ship", default=str(DATA_DIR / "checkpoints"), help="where the <preset>-* folders go")
    ap.add_argument("--variants", "--gates", dest="variants", nargs="*", default=list(NAMES), choices=list(NAMES))
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for training (CPU recipe)")
    ap.add_argument("--no-train", action="store_true", help="only measure and ship finished run folders")
    ap.add_argument("--measure", action="store_true",
                    help="only measure the shipped <preset>-* folders again: rewrite their measurements.json, the "
                         "READMEs' table and sentence, and re-run the lessons that show them")
    ap.add_argument("--no-lessons", action="store_true", help="leave the lessons that show the numbers as they are")
    args = ap.parse_args(argv)
    if args.preset == "code-gpu" and not torch.cuda.is_available():
        print("minigate.ship: --preset code-gpu needs a CUDA GPU (the code-gpu-* checkpoints are GPU-trained)")
        return 2
    rows, prose = {}, None
    if args.measure:  # one command brings the measurements, the READMEs and the lessons along
        old = shipped_rows(args.preset, Path(args.ship))
        args.variants = [v for v in args.variants if v in old]
        for variant in args.variants:
            folder = Path(args.ship) / f"{args.preset}-{NAMES[variant]}"
            prose = prose_windows(folder / "tokenizer.json") if prose is None else prose
            rows[variant] = measure_folder(folder, prose)
        print(table(rows, args.preset))
        _bring_along(old, rows, args)
        return 0
    old = shipped_rows(args.preset, Path(args.ship)) or None
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
    _bring_along(old, rows, args)
    if "none" not in rows:
        return 0
    bar = check_bar(rows, args.preset)
    for what, ok in bar:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    return 0 if all(ok for _, ok in bar) and all(math.isfinite(r["f_attn"]) for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
