"""Training the scaling study: the `code` recipe at other model sizes and training lengths, over seeds, each model
measured as the shipped ones are (measure.measure_folder: 75 held-out WikiText-2 windows, T=512 and Gu et al.'s
T=64). One JSON per axis, data/study/<axis>.json, with rows like data/seeds/code.json's.

    python -m research.train_study plan                 # every point, seed and variant, and what is done
    python -m research.train_study run [--only 2x] [--seeds 1]  # train and measure what is missing, in order
    python -m research.train_study measure              # measure the finished runs again, rewrite the JSON files
    python -m research.train_study run --only m-gpu --jobs 6   # on a GPU: its points, six trainings at once

A GPU point (`GPU`: `m-gpu`, the `code-gpu` recipe with a larger model) trains only where CUDA is; on the lent GPU
machine `bash tests/gpu/on_device.sh study` runs it and brings back data/study/size.json (docs/gpu.md). Its rows
keep their GPU's name, and `measure` elsewhere keeps them as they are (their runs are not there). `--deadline S`
starts no training the longest finished one says would end more than S seconds after the start.

Each model is `minigate train --preset code --variant V --set seed=S` with its point's overrides (`code-gpu` for a GPU
point), into runs/study/<point>-seed<S>/<name> (minigate.runs.RunFolder, the layout of every preset's runs; `--resume`
when a checkpoint is there, so a stopped queue continues; a seed folder in minigate 0.1's runs/study/<point>/seed<S>
is refused, naming the move). Every run trains in bf16 with torch.compile (`python -m minigate.bench train` on a CPU
with native bf16: compiled bf16 1.18x bf16 eager end to end over the `code` preset) on `--threads` threads (2 by
default; the study ran two queues at 1 thread each, `--seeds` or `--only` apart), on the python-code corpus: a row
records the corpus, the precision, the CPU and the speed, so a seed's three models can be checked to share them.
The study's stored rows read python-code before it was pinned to wheels (data/python-code.lock.json): this Python's
stdlib and site-packages, a corpus of each machine's own (8,697 files; their SHA-256 is in each row). A run now reads
the pinned corpus, the same on every machine, so a new row's corpus differs from the stored ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from minigate import measure
from minigate.checkpoint import train_seconds
from minigate.presets import NAMES, TrainConfig
from minigate.pretrained import from_pretrained
from minigate.course.release import SHIPPED_DIR
from minigate.rows import Row, read_rows, write_rows
from minigate.runs import FINISHED, RESUMABLE, RunFolder, finished
from minigate.course import release
from scripts.seeds import row

ROOT = Path(__file__).resolve().parents[1]

RUNS = ROOT / "runs" / "study"
OUT = ROOT / "data" / "study"
# point -> (axis, `--set` overrides of the code preset, what it is). The code recipe reads 11.9 tokens per parameter
# (16.4M tokens, 1.38M parameters); the sizes keep that ratio, the lengths multiply the tokens.
POINTS = {
    "xs": ("size", dict(d_model=64, head_dim=16, d_ff=192, steps=1400), "0.48M parameters, 5.7M tokens"),
    "2x": ("length", dict(steps=8000), "the code model, 32.8M tokens"),
    "4x": ("length", dict(steps=16000), "the code model, 65.5M tokens"),
    "l": ("size", dict(d_model=192, n_layers=6, n_heads=6, n_kv_heads=6, head_dim=32, d_ff=576, steps=10600),
          "3.7M parameters, 43.4M tokens"),
    # the GPU recipe's size axis: code-gpu (6.2M parameters, data/seeds/code-gpu.json) 2.5x wider-and-deeper, at its
    # 49.2M tokens (the 15.7M model of docs/gpu.md's first GPU runs, then one seed)
    "m-gpu": ("size", dict(d_model=384, n_layers=8, n_heads=6, n_kv_heads=6, head_dim=64, d_ff=1024),
              "15.7M parameters, 49.2M tokens (a GPU)"),
}
PRESET = {"m-gpu": "code-gpu"}  # a point's preset, when not `code`
GPU = {"m-gpu"}  # points that train on a GPU only: `run` skips them on a machine without CUDA
TRAIN = dict(precision="bf16", compile="true")  # every study run
TRACKER = ("sink_rate_64", "f_attn_excess", "m_act")  # what a row keeps of the run's tracker (8 prose windows)
# the queue, in order: (point, seed, variants). Length first (seed 0's trio), then the cheap size, then the rest
QUEUE = [("2x", 0, ("none", "elementwise", "headwise")), ("xs", 0, NAMES), ("xs", 1, NAMES),
         ("xs", 2, NAMES), ("2x", 1, NAMES), ("2x", 2, NAMES),
         ("4x", 0, ("none", "elementwise")), ("l", 0, ("none", "elementwise")),
         *[("m-gpu", s, NAMES) for s in (0, 1, 2)]]


def run_folder(point: str, seed: int, variant: str) -> RunFolder:
    """A study run (runs.RunFolder): RUNS/<point>-seed<S>/<name>, training the point's preset."""
    return RunFolder(RUNS, PRESET.get(point, "code"), variant, seed, point=point)


def folder(point: str, seed: int, variant: str) -> Path:
    return run_folder(point, seed, variant).path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def train(point: str, seed: int, variant: str, threads: int) -> int:
    """One run, to the end (resumed where a checkpoint is). The wall seconds of each invocation add up in wall_s,
    written every minute while it trains: an invocation that ends with the machine still counts up to its last
    minute."""
    run = run_folder(point, seed, variant).check()
    cmd = run.command("--threads", str(threads), "--quiet", sets={**POINTS[point][1], **TRAIN})
    run.path.mkdir(parents=True, exist_ok=True)
    side = sidecar(point, seed, variant)
    done = json.loads(side.read_text()) if side.is_file() else {"wall_s": 0.0, "cpus": []}
    before, t0 = done["wall_s"], time.time()
    done["cpus"] = sorted(set(done["cpus"]) | {cpu_name()})
    if point in GPU:
        import torch

        done["gpu"] = torch.cuda.get_device_name(0)
    with open(run.log, "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while True:
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                rc = None
            done["wall_s"] = before + time.time() - t0
            side.write_text(json.dumps(done))
            if rc is not None:
                return rc


def sidecar(point: str, seed: int, variant: str) -> Path:
    """What the queue records beside a run folder: the wall seconds of its invocations and the CPUs they ran on."""
    return run_folder(point, seed, variant).base / f"{NAMES[variant]}.study.json"


def measured_row(point: str, seed: int, variant: str, prose, device="cpu") -> Row:
    """A study row (rows.Row): the model measured as the shipped ones are, with its run's facts, size and tracker."""
    path = folder(point, seed, variant)
    got = measure.measure_folder(path, prose, device=device, name=f"{point}-seed{seed}-{NAMES[variant]}")
    run = json.loads((path / "run.json").read_text())
    history = json.loads((path / "history.json").read_text())
    side = json.loads(sidecar(point, seed, variant).read_text()) if sidecar(point, seed, variant).is_file() else {}
    t = TrainConfig(**run["train"])
    return dataclasses.replace(
        row(seed, variant, got, path), point=point, params=from_pretrained(path / "model").num_params(),
        tokens=t.steps * t.tokens_per_step, steps=t.steps, cpus=side.get("cpus"), gpu=side.get("gpu"),
        wall_s=round(side["wall_s"]) if "wall_s" in side else None, train_s=round(train_seconds(history, run)),
        tracker=[{k: m[k] for k in ("step", *TRACKER) if k in m} for m in history["metrics"]])


def write(rows: list[Row], prose) -> list[Path]:
    """data/study/<axis>.json for each axis that has rows (rows.write_rows)."""
    protocol = dict(measure.PROTOCOL, windows=prose.shape[0], windows_sha256=measure.windows_digest(prose),
                    weights="each run's own fp32 weights")
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    for axis in sorted({a for a, _, _ in POINTS.values()}):
        mine = [r for r in rows if POINTS[r.point][0] == axis]
        if not mine:
            continue
        points = {p: {"preset": PRESET.get(p, "code"), "sets": {**s, **TRAIN}, "about": about}
                  for p, (a, s, about) in POINTS.items() if a == axis}
        written.append(write_rows(OUT / f"{axis}.json", mine, axis=axis, protocol=protocol, points=points))
    return written


def stored_rows() -> list[Row]:
    return [r for p in sorted(OUT.glob("*.json")) for r in read_rows(p).rows]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m research.train_study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("plan", "run", "measure"))
    ap.add_argument("--only", nargs="*", help="points to take (default: the whole queue)")
    ap.add_argument("--seeds", nargs="*", type=int, help="seeds to take (default: all); two processes at one thread "
                    "each take different points or seeds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=1, help="trainings at once (a GPU: small models leave it mostly idle)")
    ap.add_argument("--deadline", type=float, help="seconds: start no training that the longest one finished so far "
                    "says would end after it (a GPU lent for minutes)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    queue = [(p, s, v) for p, s, vs in QUEUE for v in vs
             if (not args.only or p in args.only) and (args.seeds is None or s in args.seeds)]
    for q in queue:  # a seed folder in minigate 0.1's layout: a one-line ValueError naming the move
        run_folder(*q).check()
    if args.what == "plan":
        rows = {(r.point, r.seed, r.variant): r for r in stored_rows()}
        for p, s, v in queue:
            state = {FINISHED: "done", RESUMABLE: "resumable"}.get(run_folder(p, s, v).state()) or (
                "measured" if (p, s, v) in rows else "to do")
            if (p, s, v) in rows and rows[p, s, v].gpu:
                state += f" on {rows[p, s, v].gpu}"
            print(f"{p:5s} seed {s} {NAMES[v]:12s} {state:10s} {POINTS[p][2]}")
        return 0
    if args.what == "run" and not cuda and any(p in GPU for p, _, _ in queue):
        print(f"(no CUDA here: skipping the GPU points {sorted({p for p, _, _ in queue if p in GPU})})", flush=True)
        queue = [q for q in queue if q[0] not in GPU]
    prose = measure.prose_windows(SHIPPED_DIR / "code-baseline" / "tokenizer.json")
    if measure.windows_digest(prose) != release.stored("code-baseline")["protocol"]["windows_sha256"]:
        raise ValueError("these are not the shipped models' windows: set MINIGATE_CORPORA_DIR to the WikiText-2 copy "
                         "they came from")
    key = lambda r: (r.point, r.seed, r.variant)  # noqa: E731
    # run: what was measured before is kept; measure: measured again where its run is here (a GPU point's is not)
    skip = {key(r) for r in stored_rows()} if args.what == "run" else set()
    mine = {}  # the rows this process measured

    def measured(p, s, v):
        if finished(folder(p, s, v)) and (p, s, v) not in skip | set(mine):
            r = mine[p, s, v] = measured_row(p, s, v, prose, "cuda" if cuda else "cpu")
            print(f"{time.strftime('%H:%M:%S')} {p} seed {s} {v}: {r.sink_rate_64:.3f} sink rate at T=64, excess "
                  f"{r.f_attn_excess:.4f}, M-Act {r.m_act:.1f}, loss {r.val_loss_code:.3f}, {r.wall_s} s", flush=True)
            # the files as they are now (another process may have measured again meanwhile), with this one's rows
            kept = {key(r): r for r in stored_rows()}
            if args.what == "measure":
                kept = {k: r for k, r in kept.items() if not finished(folder(*k))}
            write(list({**kept, **mine}.values()), prose)

    if args.what == "measure":
        for q in queue:
            measured(*q)
        return 0
    todo = [q for q in queue if not finished(folder(*q))]
    for q in queue:  # finished before: measured now if it never was
        if q not in todo:
            measured(*q)
    took, t0 = [], time.time()  # seconds each training took
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # `--jobs` trainings at once, each a process of its own
        running = {}  # future -> ((point, seed, variant), its start)
        while todo or running:
            while todo and len(running) < args.jobs and (
                    args.deadline is None or not took or time.time() - t0 + max(took) < args.deadline):
                q = todo.pop(0)
                print(f"{time.strftime('%H:%M:%S')} training {q[0]} seed {q[1]} {q[2]}", flush=True)
                running[pool.submit(train, *q, args.threads)] = (q, time.time())
            if todo and not running:  # the deadline leaves no room for what is left
                print(f"stopping before {len(todo)} runs: the longest took {max(took):.0f} s, {args.deadline:.0f} s "
                      f"allowed from the start", flush=True)
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                q, start = running.pop(future)
                took.append(time.time() - start)
                rc = future.result()  # train() raising (not the run failing: that is an exit code) raises here
                if rc:
                    print(f"{q[0]} seed {q[1]} {q[2]}: minigate train exited with {rc}; see its log", flush=True)
                    return rc  # once the trainings running beside it have ended, as before
                measured(*q)
    return 0


if __name__ == "__main__":
    sys.exit(main())
