#!/usr/bin/env bash
# GPU checks and benchmarks, run on the lent GPU machine by the `device` tool over a copy of the
# working tree. Nothing is built there: release binaries built on the dev machine are copied into
# .gpu/ (ignored by git, named in `carry`) by scripts/gpu-pack.sh. Full logs go to $OUT; a short
# table is printed last.
#
#   scripts/gpu-check.sh selftest      cuda backend alone: every dtype/layout, a spread of configs
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export TENSORTUNE_CUDA_INCLUDE=${TENSORTUNE_CUDA_INCLUDE:-/usr/local/cuda/include}
OUT=${OUT:-$(mktemp -d)}
BIN=.gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/nvidia-smi.txt"

for step in "$@"; do
  case "$step" in
    selftest)
      "$BIN/gpu_selftest" "${SELFTEST_CONFIGS:-8}" "${SELFTEST_SAMPLES:-5}" >"$OUT/selftest.log" 2>&1
      echo "selftest exit $?"
      grep -v ": Ok " "$OUT/selftest.log" | cut -c1-600 | head -60
      grep -c ": Ok " "$OUT/selftest.log"
      ;;
    *)
      echo "unknown step $step" >&2
      exit 2
      ;;
  esac
done
