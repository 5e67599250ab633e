#!/usr/bin/env bash
# Runs on a CUDA machine that has torch but not the course's other packages (the remote GPU machine, with
# .gpu/ from tests/gpu/wheels.sh carried along). Each job's log and JSON go into $OUT/results.tar as the job ends (one
# file: the device tool brings back at most 8), its exit code and time into $OUT/steps.txt. Several steps run side by side
# (small models leave the GPU mostly idle), after one install and one tokenizing of the python-code corpus:
#   bash tests/gpu/on_device.sh check   every solutions notebook with CUDA + pytest -m gpu (tests/gpu/check.py)
#   bash tests/gpu/on_device.sh ship    train, measure and pack code-gpu-{baseline,headwise,elementwise}
#   bash tests/gpu/on_device.sh bench   python -m minigate.bench train on CUDA
#   bash tests/gpu/on_device.sh grow    lesson 03's GROW switch (code-gpu, SEED=0): estimate, train, measure
#   bash tests/gpu/on_device.sh t4      a T4's arithmetic (MINIGATE_PRECISION=fp16: fp16 with a GradScaler):
#                                       lesson 03's GPU path and the GROW switch (seed 0)
#   bash tests/gpu/on_device.sh seeds   code-gpu seeds 1 and 2 through the GROW switch (SEEDS="1 2")
#   bash tests/gpu/on_device.sh study   research/train_study.py's GPU points (m-gpu: 15.7M parameters, seeds 0-2, its
#                                       three variants), JOBS=6 at once; data/study/size.json comes back
#                                       as study.json, the runs' logs and histories as study.runs.tar
#   NOTEBOOKS="solutions/01_... solutions/02_..." bash tests/gpu/on_device.sh check     a few notebooks only
#   GROW_ARGS="--steps 20"  passed to python -m tests.gpu.grow (a dry run of the plumbing)
#   LIMIT=480 bash tests/gpu/on_device.sh check t4 seeds   every step stopped after LIMIT seconds (what it wrote stays)
#   GPU_DIR=.gpu-study ...   wheels and WikiText-2 from another folder than .gpu (a smaller one: what travels to the
#                            device is at most 64 MiB with the checkout; the study needs no notebook kernel)
set -uo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${GPU_DIR:-.gpu}"/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MINIGATE_CORPORA_DIR=$PWD/${GPU_DIR:-.gpu}/data HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export OUT=${OUT:-/tmp/out} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
RES=$(mktemp -d)  # each job's NAME.log and NAME.json, appended to $OUT/results.tar when it ends
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$SECONDS
job() {  # job NAME COMMAND...: COMMAND's output in NAME.log, its exit code and time in $OUT/steps.txt
  local name=$1; shift
  timeout -s TERM "${LIMIT:-3600}" "$@" > "$RES/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
  (cd "$RES" && flock .lock tar -rf "$OUT/results.tar" "$name".*)
}
step() {
  case "$1" in
    check) job gpu_check python3 tests/gpu/check.py --json "$RES/gpu_check.json" ${NOTEBOOKS:-} ;;
    ship)  job ship python3 -m tests.gpu.ship_code --runs /tmp/runs --ship data/checkpoints --pack "$OUT" ;;  # a tar per model, beside results.tar
    bench) job bench python3 -m minigate.bench train ;;
    grow)  job grow python3 -m tests.gpu.grow ${GROW_ARGS:-} --seed "${SEED:-0}" --root /tmp/runs --json "$RES/grow.json" ;;
    t4)    MINIGATE_PRECISION=fp16 job t4_lesson03 python3 tests/gpu/check.py --no-pytest --json "$RES/t4_lesson03.json" \
             solutions/03_training_tiny_models.ipynb &
           MINIGATE_PRECISION=fp16 job t4_grow python3 -m tests.gpu.grow ${GROW_ARGS:-} --seed 0 --root /tmp/runs-fp16 \
             --json "$RES/t4_grow.json" &
           wait ;;
    seeds) for s in ${SEEDS:-1 2}; do
             job "seed$s" python3 -m tests.gpu.grow ${GROW_ARGS:-} --seed "$s" --root /tmp/runs --json "$RES/seed$s.json" &
           done
           wait ;;
    study) job study bash -c "timeout -s TERM ${STUDY_LIMIT:-3300} python3 -m research.train_study run --only m-gpu \
             --jobs ${JOBS:-6} --threads 2; rc=\$?; cp data/study/size.json $RES/study.json
             tar -cf $RES/study.runs.tar runs/study/m-gpu-seed*/*.log runs/study/m-gpu-seed*/*/history.json; exit \$rc" ;;
    *) echo "usage: bash tests/gpu/on_device.sh check|ship|bench|grow|t4|seeds|study ..." >&2; return 2 ;;
  esac
}
[ $# -gt 0 ] || set -- check
for s in "$@"; do [ "$s" = check ] && { step check & }; done  # the notebooks and tests need no corpus: start now
if printf '%s\n' "$@" | grep -qvx check; then  # the corpus once, before the steps that train on it
  job corpus python3 -c "from minigate import data; data.encode_corpus('python-code', data.load_tokenizer())"
fi
for s in "$@"; do [ "$s" = check ] || step "$s" & done
wait
