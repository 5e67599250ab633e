"""The GPU check: every solutions notebook executed with CUDA, plus the package's GPU tests. One command:

    python tests/gpu/check.py                 # or: make gpu-check
    python tests/gpu/check.py --json out.json --parallel 4 solutions/03_training_tiny_models.ipynb

Reports per notebook: passed or the error (cell and last line), wall time, and the device it used (peak CUDA
memory, read from the notebook's own kernel after its last cell). Then `pytest -m gpu tests/gpu`. Exit 0 when
all passed; without CUDA it says so and exits 0 having run nothing (CPU runs are what CI does).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import json, torch\nprint('GPU-CHECK ' + json.dumps({'cuda': torch.cuda.is_available(), "
         "'device': torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', "
         "'peak_mib': round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else 0}))")


def run_notebook(path: str, timeout: int) -> dict:
    """Execute one notebook top to bottom in its own kernel (cwd: its folder), then the device probe."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    where = {"metadata": {"path": str(Path(path).parent)}}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources=where)
    t0, row = time.time(), {"notebook": Path(path).name, "ok": True, "error": ""}
    try:
        client.execute()
    except CellExecutionError as e:
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        errors = [any(o.get("output_type") == "error" for o in c.get("outputs", [])) for c in nb.cells]
        failed = (i for i, e in enumerate(errors) if e)
        cell = next(failed, "?")
        row.update(ok=False, error=f"cell {cell}: {lines[-1] if lines else type(e).__name__}")
    except Exception as e:  # a timeout or a dead kernel
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        row.update(ok=False, error=f"{type(e).__name__}: {first}")
    row["seconds"] = round(time.time() - t0, 1)
    probe = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []) if o.get("output_type") == "stream")
    row.update(json.loads(probe.split("GPU-CHECK ", 1)[1]) if "GPU-CHECK " in probe else {"device": "?"})
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", help="default: every solutions/NN_*.ipynb")
    ap.add_argument("--parallel", type=int, default=4, help="notebooks at once (they share the GPU well)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--no-pytest", action="store_true", help="only the notebooks")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("GPU check: no CUDA GPU here (torch.cuda.is_available() is False); nothing run. "
              "On a CPU machine `make test` is the check.")
        return 0
    notebooks = args.notebooks or sorted(str(p) for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    print(f"GPU check on {torch.cuda.get_device_name()} (torch {torch.__version__}), {len(notebooks)} notebooks, "
          f"{args.parallel} at a time", flush=True)
    t0 = time.time()
    with ProcessPoolExecutor(args.parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = list(pool.map(run_notebook, notebooks, [args.timeout] * len(notebooks)))
    print("\n| notebook | result | time | device | peak GPU memory |\n|---|---|---|---|---|")
    for r in rows:
        result = "passed" if r["ok"] else f"FAILED: {r['error']}"
        print(f"| {r['notebook']} | {result} | {r['seconds']:.0f} s | {r.get('device', '?')} | "
              f"{r.get('peak_mib', 0)} MiB |")
    print(f"notebooks: {sum(r['ok'] for r in rows)} of {len(rows)} passed in {time.time() - t0:.0f} s", flush=True)
    code = 0 if all(r["ok"] for r in rows) else 1
    pytest_rc = None
    if not args.no_pytest:
        pytest_rc = subprocess.call([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                                     str(ROOT / "tests" / "gpu")], cwd=ROOT)
        code = code or pytest_rc
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "notebooks": rows,
                                               "pytest_exit_code": pytest_rc}, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
