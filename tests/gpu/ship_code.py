"""Train, measure and ship the GPU recipe's natural-data checkpoints data/checkpoints/code-gpu-*, then pack them.

On a CUDA machine, one command (about 5 minutes on an H100; a run folder that exists is resumed):

    python -m tests.gpu.ship_code --runs runs --ship data/checkpoints [--pack $OUT]

The work is `python -m scripts.ship --preset code-gpu` (train, measure on held-out WikiText-2 at T=512 with
minigate.measure, ship bf16, check the release's bar, ship.bar); `--pack` also writes one code-gpu-*.tar per model, to
bring them back.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

from minigate.course.release import SHIPPED_DIR
from minigate.presets import NAMES
from scripts import ship  # the release pipeline


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.gpu.ship_code", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--ship", default=str(SHIPPED_DIR))
    ap.add_argument("--pack", help="also write one code-gpu-*.tar per model here")
    ap.add_argument("--variants", nargs="*", default=list(NAMES))
    args = ap.parse_args(argv)
    rc = ship.main(["--preset", "code-gpu", "--runs", args.runs, "--ship", args.ship, "--variants", *args.variants])
    if args.pack and rc != 2:
        for variant in args.variants:
            name = f"code-gpu-{NAMES[variant]}"
            with tarfile.open(Path(args.pack) / f"{name}.tar", "w") as t:
                t.add(Path(args.ship) / name, arcname=name)
    return rc


if __name__ == "__main__":
    sys.exit(main())
