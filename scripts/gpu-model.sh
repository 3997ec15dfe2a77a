#!/usr/bin/env bash
# Issue 37 on the GPU machine, from a folder $G that holds the `tensortune` binary, the Python
# package (python/) and the examples (examples/): the Python tests with torch and CUDA, then
# ResNet-50 (N=32) and BERT-base (batch 8, sequence 384) captured, tuned as one job each, exported,
# applied and timed against eager. Budgets come from the environment (small by default, so one
# device call stays inside a few minutes): R50_TRIALS, BERT_TRIALS, PER_WORKLOAD.
# Usage there: G=.gpu-model bash .gpu-model/scripts/gpu-model.sh   (results under $OUT)
set -uo pipefail
G=$(cd "${G:-.gpu-model}" && pwd)
OUT=${OUT:-$(mktemp -d)}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export TENSORTUNE_CUDA_INCLUDE=${TENSORTUNE_CUDA_INCLUDE:-/usr/local/cuda/include}
export PYTHONPATH=$G/python PYTHONUNBUFFERED=1 TENSORTUNE=$G/tensortune
work=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
date -u +%FT%TZ | tee -a "$OUT/gpu.txt"
(cd "$work" && timeout 120 python3 -m pytest -q "$G/python/tests" 2>&1) | tee "$OUT/pytest.log"
run() {
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  (cd "$work" && timeout "$secs" python3 "$@" --workdir "$work/$name" 2>&1) | tee "$OUT/$name.log"
  echo "$name: $((SECONDS - t0)) s wall" | tee -a "$OUT/gpu.txt"
}
run resnet50 "${R50_SECS:-220}" "$G/examples/resnet50.py" --batch 32 --total-trials "${R50_TRIALS:-300}" --trials "${PER_WORKLOAD:-40}"
run bert "${BERT_SECS:-120}" "$G/examples/bert.py" --batch 8 --total-trials "${BERT_TRIALS:-120}" --trials "${PER_WORKLOAD:-40}"
(cd "$work" && tar czf "$OUT/results.tar.gz" --exclude='*.db*' --exclude='*.cubin' --exclude='*.cu' resnet50 bert 2>/dev/null)
grep -h -A7 "interleaved, median" "$OUT"/resnet50.log "$OUT"/bert.log
