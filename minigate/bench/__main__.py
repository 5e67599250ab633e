"""python -m minigate.bench NAME [options]: run one benchmark (see minigate/bench/NAME.py)."""

import importlib
import sys

BENCHES = ("model", "train", "ablation", "ddp")

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHES:
        sys.exit(f"usage: python -m minigate.bench {{{','.join(BENCHES)}}} [--help]")
    importlib.import_module(f"minigate.bench.{sys.argv[1]}").main(sys.argv[2:])
