"""Lesson 03's GROW switch on a CUDA machine, in the foreground: the estimate from timed steps, then the three
`minigate train --preset code-gpu --variant V --set seed=N` runs the switch's background process runs (Grow.run), each
timed, then all three measured as the shipped models are (measure.measure_folder on the 75 held-out windows).

    python -m tests.gpu.grow --seed 0 --root /tmp/runs --json $OUT/grow.json [--set FIELD=VALUE ...]
    MINIGATE_PRECISION=fp16 python -m tests.gpu.grow ...   # a T4's arithmetic: "auto" picks fp16 + GradScaler

The JSON holds the estimate, the times, each model's row as data/seeds/<preset>.json keeps it (scripts/seeds.py's
`row`: the measures, corpus, precision, tokens/s) and the tracker's metrics: what the weights would tell, without them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from minigate import measure
from minigate.checkpoint import train_seconds
from minigate.presets import NAMES
from minigate.course.grow import Grow
from scripts.seeds import row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.gpu.grow", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default="runs")
    ap.add_argument("--json", required=True)
    ap.add_argument("--preset", help="default: the switch's own choice (code-gpu on CUDA)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--steps", type=int, help="shorter runs (a dry run of the plumbing)")
    args = ap.parse_args(argv)
    grow = Grow(seed=args.seed, preset=args.preset, root=args.root, steps=args.steps,
                sets=dict(s.split("=", 1) for s in args.set))
    out = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "preset": grow.preset,
           "seed": grow.seed, "estimate_minutes": grow.estimate()}
    print("estimate:", out["estimate_minutes"], flush=True)
    t0 = time.perf_counter()
    rc = grow.run()
    out["run_seconds"], out["rc"] = time.perf_counter() - t0, rc
    out["train_seconds"] = {}
    for v, name in NAMES.items():  # steps only, from the history (corpus build and evaluations excluded)
        out["train_seconds"][name] = train_seconds(*(json.loads((grow.folder(v) / f).read_text())
                                                     for f in ("history.json", "run.json")))
    if rc == 0:
        prose = measure.prose_windows()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        out["windows_sha256"] = measure.windows_digest(prose)  # scripts/seeds.py --rows checks it
        measured = grow.measure(prose, device)
        out["rows"] = [row(grow.seed, v, m, grow.folder(v)).record() for v, m in measured.items()]  # rows.Row's
        out["metrics"] = {name: h.get("metrics", []) for name, h in grow.histories().items()}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
