#!/usr/bin/env bash
# Runs on a CUDA machine that has torch but not the course's other packages (the remote GPU machine, with
# .gpu/ from tests/gpu/wheels.sh carried along). Writes logs and results into $OUT.
#   bash tests/gpu/on_device.sh check   every solutions notebook with CUDA + pytest -m gpu (tests/gpu/check.py)
#   bash tests/gpu/on_device.sh ship    train, measure and pack code-gpu-{baseline,headwise,elementwise}
#   bash tests/gpu/on_device.sh bench   python -m minigate.bench train on CUDA
#   bash tests/gpu/on_device.sh grow    lesson 03's GROW switch (code-gpu, SEED=0): estimate, train, measure
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MINIGATE_CORPORA_DIR=$PWD/.gpu/data HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
case "${1:-check}" in
  check) python3 tests/gpu/check.py --json "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log" ;;
  ship)  python3 tests/gpu/ship_code.py --runs /tmp/runs --ship data/checkpoints --pack "$OUT" 2>&1 | tee "$OUT/ship.log" ;;
  bench) python3 -m minigate.bench train 2>&1 | tee "$OUT/bench.log" ;;
  grow)  python3 tests/gpu/grow.py --seed "${SEED:-0}" --root /tmp/runs --json "$OUT/grow.json" 2>&1 | tee "$OUT/grow.log" ;;
  *) echo "usage: bash tests/gpu/on_device.sh check|ship|bench|grow" >&2; exit 2 ;;
esac
