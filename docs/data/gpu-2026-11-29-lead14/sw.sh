#!/usr/bin/env bash
# Lead, 2026-11-29 evening: the sweep of suites/sweeps/union-v19.json with the merged main's binary (074aba8's
# kernels; F.xz), workloads FIRST..FIRST+COUNT-1, one GPU a workload at a time.
set -uo pipefail
mkdir -p .gpu && xz -dc .gpu-lead14/F.xz > .gpu/tensortune && chmod +x .gpu/tensortune
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$OUT/card.txt"
TRIALS=3000 WORKLOAD_TIMEOUT=${WT:-90} scripts/sweep.sh suites/sweeps/union-v19.json "$1" "$2"
