"""Train, measure and ship the natural-data checkpoints: data/checkpoints/code-* (CPU recipe) or code-gpu-* (GPU).
The release pipeline of the course, outside the package (the library measures; this script ships).

    python -m scripts.ship --preset code      # 2 CPU cores, about 35-40 minutes per model; resumes a run folder
    python -m scripts.ship --preset code-moe --variants none elementwise  # the MoE pair of lesson 08
    python -m scripts.ship --preset code-gpu  # a CUDA GPU only (docs/gpu.md)
    python -m scripts.ship --preset code --measure  # measure the shipped models again; the READMEs and lessons follow

1. The preset's run for V in none, headwise, elementwise, one at a time, as `minigate train --preset P --variant V
   --out runs/P-seed0/NAME` does (minigate.runs.RunFolder: the folder GROW's seed 0 uses; a folder with a checkpoint
   is resumed, a finished one only measured; a run in minigate 0.1's runs/P-V is refused, naming the move).
2. Each model measured on held-out WikiText-2 prose at seq_len 512 with minigate.measure (the paper's metric
   definitions), plus the validation loss on held-out code.
3. Shipped as 16-bit safetensors with run.json, the tokenizer and a thinned history.json, measured again from the
   shipped files into measurements.json (the numbers a lesson reads), and checked against `bar` (below).
4. For the course's code models: the READMEs' tables and sentence are rewritten between their markers from the new
   measurements.json (scripts/readme.py), and the lessons that show them (solutions calling release.measure_*) run
   again, lessons/ rebuilt (--no-lessons: not).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from pathlib import Path

import torch

import minigate
from minigate import measure
from minigate.analysis import GU_LEN, SINK_THRESHOLD
from minigate.checkpoint import train_seconds
from minigate.course.prose import marker
from minigate.course.scorecard import EXCESS_MIN
from minigate.presets import NAMES
from minigate.course.release import SHIPPED_DIR
from minigate.run import execute, plan_run
from minigate.runfolder import read_run_json
from minigate.runs import RunFolder
from minigate.course import release
from scripts import readme

ROOT = readme.ROOT  # the course checkout
PRESETS = ("code", "code-gpu", "code-moe")
AIM = 3  # the separation first aimed for (excess F-Attn and M-Act), reported by report(), not required


def bar(rows: dict) -> list[tuple[str, bool]]:
    """(claim, holds) for each line of what a shipped trio or pair (rows keyed by variant) must show: a baseline with
    sink heads and a sink to remove (the scorecard's EXCESS_MIN above uniform), and gated twins with less of both,
    smaller massive activations and no worse validation loss. Every shipped preset meets it (tests/test_release.py).
    The course's first aim was 3x less excess and M-Act; `AIM` reports it without requiring it: the code models reach
    1.9x-4.5x."""
    b = rows["none"]
    out = [(f"baseline F-Attn >= {EXCESS_MIN} above uniform", b.f_attn_excess >= EXCESS_MIN),
           (f"baseline has sink heads at T={GU_LEN} (a head above {SINK_THRESHOLD})", b.sink_heads_64 > 0)]
    for g, r in rows.items():
        if g != "none":
            out += [(f"{g}: excess F-Attn >= 2x smaller", r.f_attn_excess * 2 <= b.f_attn_excess),
                    (f"{g}: M-Act >= 1.5x smaller", r.m_act * 1.5 <= b.m_act),
                    (f"{g}: fewer sink heads at T={GU_LEN}", r.sink_heads_64 < b.sink_heads_64),
                    (f"{g}: val loss <= baseline + 0.02", r.val_loss_code <= b.val_loss_code + 0.02)]
    return out


def thin(history: dict, every: int = 10) -> dict:
    """Per-step lists kept every `every` steps (and the last); evaluations, spikes and metrics kept whole."""
    keep = [i for i, s in enumerate(history["step"]) if s % every == 0 or i == len(history["step"]) - 1]
    out = dict(history)
    for k in ("step", "lr", "loss", "grad_norm", "tokens_per_s", "aux_loss"):
        if history.get(k):
            out[k] = [history[k][i] for i in keep]
    out["info"] = dict(portable(history.get("info", {})), thinned=f"per-step lists kept every {every} steps")
    return out


def portable(run_json: dict) -> dict:
    """run.json (or history info) without a path of the machine that trained it."""
    run_json = dict(run_json)
    if run_json.get("tokenizer"):
        name = Path(run_json["tokenizer"]).name
        run_json["tokenizer"] = "data/tokenizer.json" if name == "tokenizer.json" else "tokenizer"
    if "python_site" in run_json:  # python-code is read from pinned wheels: no folder of this machine to hide
        roots = run_json["python_site"].get("roots", [])
        run_json["python_site"] = dict(run_json["python_site"], roots=["stdlib" if i == 0 else "site-packages"
                                                                       for i, _ in enumerate(roots)])
    return run_json


def train_minutes(history: dict, run_json: dict) -> float:
    """Minutes of training, from the unthinned history (checkpoint.train_seconds)."""
    return train_seconds(history, run_json) / 60


def ship_one(run_dir: Path, ship: Path, prose: torch.Tensor) -> dict:
    """Copy a finished run's model into `ship` (bf16 + run.json, tokenizer, thinned history); its measurements
    (measurements.json's record) with the fp32 numbers, the training minutes and steps."""
    history = json.loads((run_dir / "history.json").read_text())
    run_json = read_run_json(run_dir)
    trained = measure.measure_folder(run_dir, prose)
    if ship.exists():
        shutil.rmtree(ship)
    minigate.save_pretrained(minigate.from_pretrained(run_dir / "model"), ship, dtype=torch.bfloat16)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (run_dir / "model" / f).exists():
            shutil.copyfile(run_dir / "model" / f, ship / f)
    (ship / "run.json").write_text(json.dumps(portable(run_json), indent=2))
    (ship / "history.json").write_text(json.dumps(thin(history)))
    shipped = measure.measure_folder(ship, prose)
    measure.write_measurements(ship, shipped, prose)
    return dict(shipped.record(), f_attn_fp32=trained.f_attn, m_act_fp32=trained.m_act,
                minutes=train_minutes(history, run_json), steps=history["step"][-1])


def shown_in(root: Path = ROOT, preset: str = "code") -> tuple[list[Path], list[Path]]:
    """(docs, lessons) that state a preset's shipped numbers: the READMEs that mark its table or sentence
    (scripts/readme.py's markers) and the solutions notebooks that measure its models (measure_preset,
    measure_shipped, or measure_model checked with check_measurement), naming the preset ("code") or a model
    ("code-baseline", f"code-{name}"; not "code-moe-...")."""
    docs = [p for p in (root / "README.md", root / "data" / "checkpoints" / "README.md")
            if p.is_file() and any(marker(kind, preset) in p.read_text() for kind in ("table", "effect", "headline"))]
    names = re.compile(rf'"{re.escape(preset)}(?:\\?"|-{{|-(?:{"|".join(NAMES.values())}))')  # \\?": JSON's \\"
    lessons = [p for p in sorted((root / "solutions").glob("0*.ipynb"))
               if re.search(r"measure_(?:preset|shipped)\(|check_measurement\(", p.read_text())
               and names.search(p.read_text())]
    return docs, lessons


def rerun_lessons(lessons: list[Path], rebuild: bool = True) -> None:
    """Execute each solutions notebook in place (as `make test` checks them), then rebuild lessons/ from them."""
    import nbformat
    from nbclient import NotebookClient

    from minigate.course.build import build

    for path in lessons:
        print(f"ship: running {path.name} ...", flush=True)
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=1800, record_timing=False, store_widget_state=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        nbformat.write(nb, path)
    if rebuild:
        build()


def bring_along(preset: str, ship: Path, no_lessons: bool) -> None:
    """After the course's code models were shipped or measured again: the READMEs' tables and sentence (between their
    markers) and the lessons that show them follow the new measurements.json. Only for the course's own folders."""
    if ship.resolve() != SHIPPED_DIR.resolve() or preset not in ("code", "code-moe"):
        return
    docs, lessons = shown_in(preset=preset)
    for doc in readme.update([preset], docs, kinds=("table", "effect", "headline")):
        print(f"ship: rewrote the generated text in {doc.name}")
    if preset == "code":
        print(f"ship: drew {readme.figure(release.shipped_rows(preset, ship)).relative_to(ROOT)}")
    if not no_lessons:
        rerun_lessons(lessons)


def report(rows: dict) -> bool:
    """Print bar's lines (PASS / FAIL) and the aim's (reported only); whether the bar holds."""
    holds = bar(rows)
    for what, ok in holds:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    for g, x in measure.ratios(rows).items():
        reached = all(v >= AIM for v in x.values())
        print(f"aim   {g}: {AIM}x less excess F-Attn and M-Act: {'reached' if reached else 'not reached'} "
              f"({x['f_attn_excess']:.1f}x, {x['m_act']:.1f}x; not required)")
    return all(ok for _, ok in holds) and all(math.isfinite(r.f_attn) for r in rows.values())


def train_variant(run: RunFolder, threads: int) -> None:
    """`minigate train --preset P --variant V --out runs/P-seed0/NAME [--resume]` (run.command(): the preset's own
    seed, 0), as a function call."""
    torch.set_num_threads(threads)
    execute(plan_run(run.preset, run.variant, run.path, resume=run.has_checkpoint), progress=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.ship", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=PRESETS, default="code")
    ap.add_argument("--runs", default="runs", help="the root of the run folders, RUNS/<preset>-seed0/<name> "
                    "(minigate.runs.RunFolder; resumed if present)")
    ap.add_argument("--ship", default=str(SHIPPED_DIR), help="where the <preset>-* folders go")
    ap.add_argument("--variants", nargs="*", default=list(NAMES), choices=list(NAMES))
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for training (CPU recipe)")
    ap.add_argument("--no-train", action="store_true", help="only measure and ship finished run folders")
    ap.add_argument("--measure", action="store_true",
                    help="only measure the shipped <preset>-* folders again: rewrite their measurements.json, the "
                         "READMEs' tables and sentence, and re-run the lessons that show them")
    ap.add_argument("--no-lessons", action="store_true", help="leave the lessons that show the numbers as they are")
    args = ap.parse_args(argv)
    ship = Path(args.ship)
    if args.preset == "code-gpu" and not torch.cuda.is_available():
        print("ship: --preset code-gpu needs a CUDA GPU (the code-gpu-* checkpoints are GPU-trained)")
        return 2
    prose = None
    if args.measure:  # one command brings the measurements, the READMEs and the lessons along
        for variant in [v for v in args.variants if v in release.shipped_variants(args.preset, ship)]:
            folder = ship / f"{args.preset}-{NAMES[variant]}"
            prose = measure.prose_windows(folder / "tokenizer.json") if prose is None else prose
            measure.write_measurements(folder, measure.measure_folder(folder, prose), prose)
        print(readme.table(release.shipped_rows(args.preset, ship), args.preset))
        bring_along(args.preset, ship, args.no_lessons)
        return 0
    records = {}
    for variant in args.variants:
        run = RunFolder(args.runs, args.preset, variant).check()  # seed 0, the preset's own
        run_dir = run.path
        if not run.finished and args.no_train:
            print(f"ship: {run_dir} has no finished model; train it, or leave out --no-train")
            return 2
        if not run.finished:
            train_variant(run, args.threads)
        if prose is None:
            prose = measure.prose_windows(run_dir / "model" / "tokenizer.json")
        records[variant] = ship_one(run_dir, ship / f"{args.preset}-{NAMES[variant]}", prose)
    rows = {v: r for v, r in release.shipped_rows(args.preset, ship).items() if v in records}
    print(f"\nmeasured on held-out WikiText-2, T={measure.PROSE_LEN} ({prose.shape[0]} windows), from the shipped "
          f"bf16 weights:\n{readme.table(rows, args.preset)}")
    (Path(args.runs) / f"{args.preset}_measurements.json").write_text(json.dumps(records, indent=2))
    bring_along(args.preset, ship, args.no_lessons)
    return 0 if "none" not in rows or report(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
