#!/usr/bin/env bash
# Call 3 (2026-11-29): the large suite tuned again (the burst vendor fix) and its export checked three
# times; then the lists and holds of both suites, from call 2's default tsvs and this call's large.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$OUT t0=$(date +%s)
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$root/card.txt" 2>&1
cat "$root/card.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
mkdir -p "$root/L" "$root/e"
OUT=$root/L ENERGY_TUNED_SUITES=large ENERGY_TUNED_PHASES="bench export" ENERGY_TUNED_BUDGET_S=${BUDGET_L:-215} \
  bash scripts/energy-tuned.sh 2>&1 | grep -v "^m\|^[0-9]*x"
tar -xzf "$FROM/energy-tuned.tar.gz" -C "$root/e" && rm -rf "$root/e/large" "$root/e/wave-tails" "$root/e"/default/gemm_check-*.log
tar -xzf "$root/L/energy-tuned.tar.gz" -C "$root/e" large
left=$((${BUDGET:-560} - ($(date +%s) - t0)))
echo "lists and holds: $left s"
OUT=$root/e ENERGY_TUNED_SUITES="default large" ENERGY_TUNED_PHASES="lists hold" ENERGY_TUNED_BUDGET_S=$left \
  bash scripts/energy-tuned.sh
