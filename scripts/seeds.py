"""Measure a recipe's seeds with the shipped protocol and record every (seed, variant) row in data/seeds/<preset>.json.

    python -m scripts.seeds --preset code --runs 1=runs/code-seed1/{name} --runs 2=runs/code-seed2/{name}
    python -m scripts.seeds --preset code-gpu --rows research/gpu/code-gpu-seed*.json   # measured on a GPU
    python -m scripts.seeds --preset code --rows data/seeds/code.json   # seed 0 again, the other seeds as recorded

Seed 0 is the shipped trio (data/checkpoints/<preset>-*: its measurements.json, run.json and history). Each further
seed is three finished `minigate train` folders, {name} standing for baseline, headwise and elementwise: lesson 03's
GROW switch writes runs/<preset>-seed<N>/<name> (minigate.runs.RunFolder, the one layout of a preset's runs). Each is
measured with measure.measure_folder on the 75 held-out windows (the shipped models' windows: the SHA-256 is checked),
from the run's own fp32 weights. The seeds' weights are not shipped; a row carries what tells the runs apart: the
corpus (python-code's lock and contents SHA-256: the same bytes on every machine since the corpus comes from pinned
wheels; rows from before name their machine's Python), the
precision and the training speed. --rows takes rows
measured elsewhere, by the same protocol: what tests/gpu/grow.py brings back from a GPU machine (a recipe with no
shipped trio, code-gpu, has no seed 0 of its own: its rows all come that way), or a seeds file written before, whose
seeds are kept where no shipped model or --runs folder measures them again. Every row is a minigate.rows.Row, read
(and checked) with rows.read_rows and written with rows.write_rows; a file from before the stored sink-head counts, or
a run.json from before `precision_used`, is refused with the one-line migration to apply.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

from minigate import data, measure, runs
from minigate.course.prose import marker
from minigate.presets import NAMES
from minigate.course.release import SEEDS_DIR, SHIPPED_DIR
from minigate.rows import Row, read_rows, write_rows
from minigate.runfolder import read_run_json
from minigate.course import release
from scripts import readme


def run_facts(run_json: dict, history: dict, where: Path) -> dict:
    """What a row records of the run itself: corpus, precision, speed."""
    corpus = run_json.get("python_code", {})
    precision = run_json.get("precision_used") or run_json["train"]["precision"]
    if precision == "auto":
        raise ValueError(f"{where}/run.json says precision 'auto' and not which one the run used: a run from before "
                         "run.json recorded it, when auto was fp32 on any CPU; add \"precision_used\": \"fp32\" to it")
    return {"corpus_sha256": corpus.get("sha256"), "corpus_files": corpus.get("files"),
            **({"corpus_lock": corpus["lock_sha256"]} if "lock_sha256" in corpus else {"python": corpus.get("python")}),
            "precision": precision,
            "tokens_per_s": round(statistics.median(history["tokens_per_s"]))}


def row(seed: int, variant: str, measured: measure.Measurement, folder: Path) -> Row:
    """A seed's row (rows.Row): the model as measured, with its run's corpus, precision and speed."""
    history = json.loads((folder / "history.json").read_text())
    return Row.of(measured, seed=seed, variant=variant, **run_facts(read_run_json(folder), history, folder))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="code")
    ap.add_argument("--runs", action="append", default=[], metavar="SEED=PATTERN",
                    help="a seed and its run folders, {name} for baseline / headwise / elementwise")
    ap.add_argument("--rows", nargs="*", default=[], metavar="JSON",
                    help="tests/gpu/grow.py outputs (their rows, measured on that machine) or a seeds file")
    ap.add_argument("--out", help="default: data/seeds/<preset>.json")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    shipped_tokenizer = SHIPPED_DIR / f"{args.preset}-baseline" / "tokenizer.json"
    prose = measure.prose_windows(shipped_tokenizer if shipped_tokenizer.is_file() else data.DEFAULT_TOKENIZER)
    digest = measure.windows_digest(prose)
    rows = []
    for variant, name in NAMES.items():  # seed 0: the shipped trio, as its measurements.json holds it
        folder = SHIPPED_DIR / f"{args.preset}-{name}"
        if not (folder / measure.MEASUREMENTS).is_file():
            continue
        stored = release.stored(folder.name)
        if stored["protocol"]["windows_sha256"] != digest:
            raise ValueError(f"{folder.name} was measured on other windows: set MINIGATE_CORPORA_DIR to the "
                             "WikiText-2 copy it was measured on, or measure it again (python -m scripts.ship "
                             "--measure)")
        rows.append(row(0, variant, read_rows(folder / measure.MEASUREMENTS).rows[0], folder))
    for spec in args.runs:
        seed, pattern = spec.split("=", 1)
        for variant, name in NAMES.items():
            folder = Path(pattern.format(name=name))
            if not runs.finished(folder):
                print(f"seeds: {folder} is not finished; leaving seed {seed} {name} out", file=sys.stderr)
                continue
            recorded = read_run_json(folder)["train"]["seed"]
            if recorded != int(seed):
                raise ValueError(f"{folder} is seed {recorded} (its run.json), not {seed}: pass --runs "
                                 f"{recorded}={pattern}")
            measured = measure.measure_folder(folder, prose, name=f"seed{seed}-{name}")
            rows.append(row(int(seed), variant, measured, folder))
            print(f"seeds: seed {seed} {name}: {rows[-1].sink_heads_64} sink heads at T=64, strongest "
                  f"{rows[-1].max_head_64:.2f}, excess {rows[-1].f_attn_excess:.3f}, M-Act {rows[-1].m_act:.0f}",
                  flush=True)
    for path in args.rows:
        got = read_rows(path)  # every row checked (rows.read_rows)
        header = got.header
        if header.get("preset") != args.preset:
            raise ValueError(f"{path} holds {header.get('preset')} runs, not {args.preset}: pass --preset "
                             f"{header.get('preset')}, or leave the file out")
        sha = header.get("windows_sha256") or (got.protocol or {}).get("windows_sha256", digest)
        if sha != digest:
            raise ValueError(f"{path} was measured on other windows: set MINIGATE_CORPORA_DIR to the WikiText-2 copy "
                             "its rows were measured on, or leave the file out")
        measured = {(r.seed, r.variant) for r in rows}  # measured here: they replace a stored row
        rows += [dataclasses.replace(r, device=header["device"]) if "device" in header else r
                 for r in got.rows if (r.seed, r.variant) not in measured]
    rows.sort(key=lambda r: (r.seed, list(NAMES).index(r.variant)))
    out = Path(args.out or SEEDS_DIR / f"{args.preset}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    shipped = any(r.seed == 0 and r.device is None for r in rows)
    protocol = dict(measure.PROTOCOL, windows=prose.shape[0], windows_sha256=digest, weights="each run's own weights"
                    + (" (seed 0: the shipped 16-bit weights)" if shipped else ""))
    write_rows(out, rows, preset=args.preset, protocol=protocol)
    print(f"seeds: {len(rows)} rows -> {out}")
    if not args.out:
        for doc in readme.update([args.preset], [d for d in readme.DOCS if marker("seeds", args.preset)
                                                 in d.read_text()], kinds=("seeds", "seedline")):
            print(f"seeds: rewrote the seeds' sentence in {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
