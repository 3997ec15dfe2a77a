#!/usr/bin/env bash
# Issue 39's whole-suite run on a machine of four GPUs, a `scripts/gpu-check.sh` per GPU at once
# (CUDA_VISIBLE_DEVICES, OUT=$OUT/gN): GPU 0 the default suite in bursts, then its cool-start
# references and the export check on that database; GPU 1 the default suite sustained and its
# 30-second holds; GPUs 2 and 3 the large suite alike. Each reference runs on the GPU that measured
# the records it is compared with. Then the winners and the jobs' picks per suite, the logs packed
# into $OUT/energy-x4.tar.gz. ENERGY_BENCH_TRIALS (2) random configs per workload (seed 1).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export ENERGY_BENCH_TRIALS=${ENERGY_BENCH_TRIALS:-2} ENERGY_REGIME_SHAPES=suites ENERGY_PARTS="suites regimes"
export ENERGY_REGIME_CONFIGS=3 ENERGY_HOLD_S=${ENERGY_HOLD_S:-30} ENERGY_BENCH_TIMEOUT=${ENERGY_BENCH_TIMEOUT:-420}
small="m4096n4096k4096/nn/f16 m4096n4096k4096/nn/bf16 m1000n1000k1024" big="m4096n14336k4096 m8192n8192k8192 m2048n5120k5120"
one() { # GPU SUITE REGIME REFS WORKLOADS STEP...
  local gpu=$1 suite=$2 regime=$3 refs=$4 only=$5
  shift 5
  CUDA_VISIBLE_DEVICES=$gpu OUT=$OUT/g$gpu ENERGY_SUITES=$suite ENERGY_SUITE_REGIMES=$regime ENERGY_REFS=$refs \
    ENERGY_REGIME_WORKLOADS=$only scripts/gpu-check.sh "$@" >"$OUT/g$gpu.log" 2>&1
}
t0=$(date +%s)
EXPORT_DB=$OUT/g0/logs/default-burst.db EXPORT_RUNS=${EXPORT_RUNS:-3} GEMM_CHECK=${GEMM_CHECK:-10 2 0 1000} \
  one 0 default burst cool "$small" energy export &
one 1 default sustained hold "$small" energy &
one 2 large burst cool "$big" energy &
one 3 large sustained hold "$big" energy &
wait
echo "all four done in $(($(date +%s) - t0)) s"
mkdir -p "$OUT/all"
for g in 0 1 2 3; do
  echo "=== GPU $g" && sed -n '/^=== summary/,$p' "$OUT/g$g.log"
  cp "$OUT"/g$g/*.jsonl "$OUT"/g$g/*-bench.json "$OUT/all/" 2>/dev/null
done
for name in default large; do
  python3 scripts/energy-check.py winners "$OUT/all/$name-burst.jsonl" "$OUT/all/$name-sustained.jsonl" "$OUT/all/$name-winners.json"
  python3 scripts/energy-check.py picks "$OUT/all" "$name"
done
tar -czf "$OUT/energy-x4.tar.gz" -C "$OUT" all g0 g1 g2 g3 g0.log g1.log g2.log g3.log && rm -rf "$OUT"/all "$OUT"/g?
