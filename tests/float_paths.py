"""The notebooks under several float paths of this CPU: `make test-cpus`.

A laptop, Colab and a CI server add the same numbers in different orders (vector width, kernel choice), and training
amplifies the difference. torch's ATen and Intel's MKL each pick their kernels from the CPU, and both can be told to
use a narrower set, so one x86 machine can run the lessons as another would:

    python tests/float_paths.py                      # every solutions/ notebook under each path below
    python tests/float_paths.py --paths default avx2 solutions/08_beyond_the_paper.ipynb
    python tests/float_paths.py --show               # the path this process runs (what `make test` prints)
    python tests/float_paths.py --other              # VAR=VALUE ... forcing the next narrower path (make test's)

Each run is strict nbval, as `make test`; a path the CPU cannot run (AVX-512 on an AVX2 machine) is skipped, saying
so. Prints the path each run used (`torch.backends.cpu.get_cpu_capability()`) and a summary; exit 1 if any failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = {  # name: environment that forces it (set before Python starts: the notebooks' kernels inherit it)
    "native": {},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}
RANK = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}  # ATen's capabilities on x86, narrowest first
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", str(ROOT / "lessons" / "nbval_sanitize.cfg"),
         "-p", "no:cacheprovider", "-q"]


def describe() -> str:
    """The float path of this process, in one line."""
    import torch

    mkl = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "the CPU's own")
    return f"float path: ATen {torch.backends.cpu.get_cpu_capability()}, MKL instructions {mkl}"


def capability(env: dict) -> str:
    """The ATen capability a fresh Python process gets under `env`."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    return out.stdout.strip() or "?"


def other(native: str) -> dict:
    """The environment of the next narrower path than `native` (AVX-512 -> AVX2 -> SSE4.2): a path other than the
    machine's own that runs at much the same speed where it can (ATen's default kernels take twice as long)."""
    return PATHS["avx2"] if RANK.get(native.upper(), 0) > RANK["AVX2"] else PATHS["default"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", help="default: every solutions/NN_*.ipynb")
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    ap.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers of one thread each, as make test")
    ap.add_argument("--show", action="store_true", help="print this process's float path and exit")
    ap.add_argument("--other", action="store_true", help="print VAR=VALUE ... forcing another path than this CPU's own")
    args = ap.parse_args(argv)
    if args.show:
        print(describe())
        return 0
    if args.other:
        print(" ".join(f"{k}={v}" for k, v in other(capability({})).items()))
        return 0
    notebooks = args.notebooks or sorted(str(p) for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    native = capability({})
    rows = []
    # one token cache for every run: the corpora are tokenized once, the float paths differ only in arithmetic
    with tempfile.TemporaryDirectory(prefix="minigate-cache-") as cache:
        for name in args.paths:
            env = {**PATHS[name], "MINIGATE_CACHE_DIR": os.environ.get("MINIGATE_CACHE_DIR", cache)}
            got = capability(env)
            wanted = PATHS[name].get("ATEN_CPU_CAPABILITY", native).upper()
            if RANK.get(wanted, -1) > RANK.get(native, -1):
                print(f"\n== {name}: skipped, this CPU's widest path is {native}", flush=True)
                rows.append((name, got, "skipped", 0.0))
                continue
            forced = " ".join(f"{k}={v}" for k, v in PATHS[name].items()) or "(nothing forced)"
            print(f"\n== {name}: {forced} -> ATen {got}", flush=True)
            t0 = time.time()
            workers = ["-n", str(args.jobs), "--dist", "loadfile"] if args.jobs > 1 else []
            rc = subprocess.call([sys.executable, "-m", "pytest", *workers, *NBVAL, *notebooks], cwd=ROOT,
                                 env={**os.environ, **env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
            rows.append((name, got, "passed" if rc == 0 else f"FAILED (pytest exit {rc})", time.time() - t0))
    print("\n| path | ATen capability | notebooks | time |\n|---|---|---|---|")
    for name, got, result, seconds in rows:
        print(f"| {name} | {got} | {result} | {seconds:.0f} s |")
    return 0 if all(r[2] in ("passed", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
