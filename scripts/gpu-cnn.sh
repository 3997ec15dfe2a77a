#!/usr/bin/env bash
# Issues 36/37, the CNN part, on the GPU machine, from a folder $G that holds the `tensortune`
# binary, the Python package (python/), the examples (examples/), suites/cnn.json and this
# script: the self-test of every conv2d epilogue path (every element checked), `bench` of
# suites/cnn.json against cuDNN, the Python tests with torch, and ResNet-50 captured with batch
# norm, add and ReLU folded into its conv keys, tuned, exported, applied and timed against eager.
# Budgets from the environment: CNN_TRIALS (per workload of the suite), R50_TRIALS, PER_WORKLOAD;
# ResNet-50's job starts from the bench's database (its N=32 layers are the suite's).
# Usage there: G=.gpu-convepi bash .gpu-convepi/scripts/gpu-cnn.sh   (results under $OUT)
set -uo pipefail
G=$(cd "${G:-.gpu-convepi}" && pwd)
OUT=${OUT:-$(mktemp -d)}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export TENSORTUNE_CUDA_INCLUDE=${TENSORTUNE_CUDA_INCLUDE:-/usr/local/cuda/include}
export PYTHONPATH=$G/python PYTHONUNBUFFERED=1 TENSORTUNE=$G/tensortune
work=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
date -u +%FT%TZ | tee -a "$OUT/gpu.txt"
step() {
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  (cd "$work" && timeout "$secs" "$@" 2>&1) > "$OUT/$name.log"
  echo "$name: rc $? in $((SECONDS - t0)) s" | tee -a "$OUT/gpu.txt"
}
# The self-test's conv epilogue layers (worker/src/selftest.rs, conv_fused_matrix) and two of
# suites/cnn.json's: each load path, ragged channels, every part of the epilogue.
keys=()
for k in n2h14w14c64/k96r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/epi=bias+relu \
  n2h14w14c64/k96r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu \
  n2h10w11c64/k40r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu \
  n3h9w9c16/k40r3s3/pad1x1,stride2x2,dil1x1/nhwc/bf16,f32,bf16/beta=1,epi=bias \
  n1h13w17c32/k48r1s3/pad0x1,stride1x1,dil1x1/nhwc/f16,f32,f32/epi=scale+bias+gelu \
  n2h12w9c32/k32r3s1/pad1x0,stride1x2,dil1x1/nhwc/f16,f32,f16/beta=1 \
  n32h28w28c512/k1024r1s1/pad0x0,stride2x2,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu \
  n32h14w14c256/k256r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16/epi=bias+relu; do
  keys+=(--workload "conv2d/$k")
done
step selftest "${SELFTEST_SECS:-90}" "$G/tensortune" selftest --template wgmma_conv2d --configs 3 "${keys[@]}"
step bench "${BENCH_SECS:-200}" "$G/tensortune" --db "$work/cnn.db" bench --suite "$G/suites/cnn.json" \
  --trials "${CNN_TRIALS:-16}" --json "$OUT/cnn-bench.json"
# ResNet-50's job starts from the bench's records (the same keys at N=32): export takes the best.
mkdir -p "$work/resnet50"
for f in "$work"/cnn.db*; do [ -e "$f" ] && cp "$f" "$work/resnet50/tune.db${f#"$work"/cnn.db}"; done
step pytest 90 python3 -m pytest -q -p no:cacheprovider "$G/python/tests"
step resnet50 "${R50_SECS:-240}" python3 "$G/examples/resnet50.py" --batch 32 --total-trials "${R50_TRIALS:-400}" \
  --trials "${PER_WORKLOAD:-24}" --workdir "$work/resnet50"
(cd "$work" && tar czf "$OUT/results.tar.gz" --exclude='*.db*' --exclude='*.cubin' --exclude='*.cu' resnet50 2>/dev/null)
tail -n 25 "$OUT/selftest.log"; tail -n 70 "$OUT/bench.log"; tail -n 15 "$OUT/pytest.log"; tail -n 12 "$OUT/resnet50.log"
cat "$OUT/gpu.txt"
