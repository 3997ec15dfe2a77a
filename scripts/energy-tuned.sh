#!/usr/bin/env bash
# Issue 39's bars on tuned kernels, on one GPU or two (`nvidia-h200`, `-x2`; ENERGY_TUNED_GPUS):
# the suites of ENERGY_TUNED_SUITES (names under suites/, "default large" unless set; a held-out
# suite as heldout/wave-tails), each through these phases, by priority:
#   bench  ENERGY_TUNED_TRIALS (100) model trials a workload, time objective, burst, finalists as
#          a user's job has them: the tuned winners (NAME-bench.json, NAME-records.jsonl);
#   cool   the winners of three workloads a suite (ENERGY_TUNED_ONLY_<NAME>; every workload of a
#          suite without such a list) timed from a cool
#          start, a process each (idle ENERGY_COOL_S, `selftest --samples 5 --energy`): the
#          burst records' reference;
#   export the suite's bundle and EXPORT_RUNS (3) runs of examples/bundle/gemm_check.c;
#   lists  those three workloads' ENERGY_TUNED_CANDIDATES (2) finalists (winner first) timed by
#          `selftest --list` in each regime, with energy: burst (cool start, the record's energy
#          window) and sustained (settled under the kernel by the records' rule, the vendor
#          settled beside it);
#   hold   the same winners held ENERGY_HOLD_S (30) s: the sustained times' reference;
#   rest   the lists of the suite's other workloads.
# One GPU runs each phase for every suite before the next; two run a suite each (two suites only). A step is
# skipped once less than its time is left of ENERGY_TUNED_BUDGET_S (460) s; then
# `scripts/energy-check.py tuned` prints the tables and the logs go into $OUT/energy-tuned.tar.gz.
# ENERGY_DEVICE=sim (no GPU) runs it all on the sim, without gemm_check: a dry run.
# Seen on an H200 (2026-11-28, 6653961; 2026-11-29, 6aa85d7): bench 43-63 s (default) and 62-107 s
# (large); a cool shot 9 s with its idle; gemm_check (two rounds) 20 s a run (default), 45-47 s
# (large); a workload's list 8-9 s burst, 15-17 s sustained; a hold about 38 s. All of it: about
# 1,100 s on one GPU, 550 s a GPU on two.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
BIN=${BIN:-.gpu}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
export TENSORTUNE_CUDA_INCLUDE=${TENSORTUNE_CUDA_INCLUDE:-/usr/local/cuda/include}
device=${ENERGY_DEVICE:-cuda:0} trials=${ENERGY_TUNED_TRIALS:-100} keep=${ENERGY_TUNED_CANDIDATES:-2}
hold_s=${ENERGY_HOLD_S:-30} cool_s=${ENERGY_COOL_S:-5} py=scripts/energy-check.py gpus=${ENERGY_TUNED_GPUS:-1}
t0=$(date +%s) deadline=$(($(date +%s) + ${ENERGY_TUNED_BUDGET_S:-460}))
ONLY_default=${ENERGY_TUNED_ONLY_default:-m4096n4096k4096/nn/f16 m4096n4096k4096/nn/bf16 m1000n1000k1024}
ONLY_large=${ENERGY_TUNED_ONLY_large:-m8192n8192k8192 m4096n14336k4096 m2048n5120k5120}
PHASES=${ENERGY_TUNED_PHASES:-bench cool export lists hold rest}
read -r -a SUITES <<<"${ENERGY_TUNED_SUITES:-default large}"
# A suite's folder under $OUT and the name of its files: the suite's file name (heldout/x -> x).
for suite in "${SUITES[@]}"; do
  test -f "suites/$suite.json" || { echo "energy-tuned: no suites/$suite.json (ENERGY_TUNED_SUITES)" >&2; exit 2; }
  mkdir -p "$OUT/$(basename "$suite")"
done
if [ "$gpus" != 1 ] && [ ${#SUITES[@]} != 2 ]; then
  echo "energy-tuned: two GPUs run two suites, not ${#SUITES[@]} (ENERGY_TUNED_SUITES)" >&2
  exit 2
fi
# Runs a step when NEED seconds are left (and cuts it at what is left): STEP NEED LOG CMD...
step() {
  local name=$1 need=$2 log=$3 left start
  shift 3
  left=$((deadline - $(date +%s)))
  if [ "$left" -lt "$need" ]; then
    echo "skipped $name: $left s left, needs $need" | tee -a "$log"
    return 1
  fi
  start=$(date +%s)
  timeout "$left" "$@" >>"$log" 2>&1
  echo "$name exit $? in $(($(date +%s) - start)) s (at $(($(date +%s) - t0)) s)"
}
if [ "$device" != sim ]; then
  nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,power.limit,temperature.gpu --format=csv >"$OUT/cards.txt" 2>&1
  cat "$OUT/cards.txt"
  nvidia-smi -q -d PERFORMANCE >"$OUT/perf-start.txt" 2>&1 # the clock event reasons, idle
  nvcc -O2 -o "$OUT/gemm_check" examples/bundle/gemm_check.c -Ibundle/c -lcuda -lcublas -lcublasLt -lm -ldl \
    >"$OUT/gemm_check-build.log" 2>&1 &
fi
echo "$(date -u +%FT%TZ) commit ${ENERGY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')} on $gpus GPU(s)"
wait_for_gemm_check() { while [ ! -x "$OUT/gemm_check" ] && pgrep -x nvcc >/dev/null; do sleep 1; done; }
# A list step of SUITE for the lists in FILES..., in both regimes.
lists() {
  local name=$1 d=$OUT/$1 list n
  shift
  local st=("$BIN/tensortune" selftest --device "$device")
  for list in "$@"; do
    n=$(basename "$list" .tsv)
    step "burst $n" 20 "$d/burst.log" "${st[@]}" --list "$list" --samples 10 --energy --json "$d/$name-burst-$n.json" </dev/null
    step "sustained $n" 30 "$d/sustained.log" "${st[@]}" --list "$list" --regime sustained --samples 10 \
      --json "$d/$name-sustained-$n.json" </dev/null
  done
}
# One phase of one suite: PHASE SUITE (its path under suites/, without .json).
phase() {
  local suite=$2 name n=0 key template cfg only
  name=$(basename "$2")
  local d=$OUT/$name
  only=ONLY_${name//-/_}
  local st=("$BIN/tensortune" selftest --device "$device")
  case $1 in
    bench)
      step "bench $name" 60 "$d/bench.log" "$BIN/tensortune" --db "$d/tuned.db" bench --suite "suites/$suite.json" \
        --trials "$trials" --device "$device" --json "$d/$name-bench.json" </dev/null
      "$BIN/tensortune" --db "$d/tuned.db" records export -o "$d/$name-records.jsonl" </dev/null >/dev/null 2>&1
      python3 $py finalists "$d/$name-bench.json" 1 ${!only:-} >"$d/refs.tsv"
      # The lists, a process each (what a deadline cuts keeps the others): a workload each for the
      # three (list-a*), four workloads each for the rest (list-b*).
      python3 $py finalists "$d/$name-bench.json" "$keep" >"$d/all.tsv"
      awk -F'\t' -v d="$d/list" -v only="${!only:-}" 'BEGIN { split(only, o, " ") }
        !($1 in file) { a = 0; for (i in o) if (index($1, o[i])) a = 1
          file[$1] = d "-" (a ? sprintf("a%02d", ++na) : sprintf("b%02d", int(nb / 4) + 1)) ".tsv"; nb += !a }
        { print > file[$1] }' "$d/all.tsv"
      ;;
    cool)
      while IFS=$'\t' read -r key template cfg; do
        n=$((n + 1))
        sleep "$cool_s" # a cool start: --energy idles again after the float64 reference
        step "cool $name $n" 15 "$d/cool-$n.log" "${st[@]}" --workload "$key" --template "$template" --config "$cfg" \
          --no-baseline --samples 5 --energy --json "$d/$name-cool-$n.json" </dev/null
      done <"$d/refs.tsv"
      ;;
    hold)
      while IFS=$'\t' read -r key template cfg; do
        n=$((n + 1))
        step "hold $name $n" $((hold_s + 8)) "$d/hold-$n.log" "${st[@]}" --workload "$key" --template "$template" \
          --config "$cfg" --no-baseline --samples 10 --energy --hold "$hold_s" --json "$d/$name-hold-$n.json" </dev/null
      done <"$d/refs.tsv"
      ;;
    export)
      [ "$device" = sim ] && return
      "$BIN/tensortune" --db "$d/tuned.db" export --suite "suites/$suite.json" -o "$d/bundle" >"$d/export.log" 2>&1
      echo "export $name exit $?"
      wait_for_gemm_check
      for run in $(seq "${EXPORT_RUNS:-3}"); do # separate processes; SAMPLES ROUNDS WARM_MS PAUSE_MS
        step "gemm_check $name $run" 25 "$d/gemm_check-$run.log" "$OUT/gemm_check" "$d/bundle" ${GEMM_CHECK:-10 2 0 500}
      done
      ;;
    lists) lists "$name" "$d"/list-a*.tsv ;;
    rest) lists "$name" "$d"/list-b*.tsv ;;
  esac
}
if [ "$gpus" = 1 ]; then
  for p in $PHASES; do
    for suite in "${SUITES[@]}"; do CUDA_VISIBLE_DEVICES=0 phase "$p" "$suite"; done
  done 2>&1 | tee "$OUT/run.log"
else
  for g in 0 1; do
    suite=${SUITES[$g]}
    (for p in $PHASES; do CUDA_VISIBLE_DEVICES=$g phase "$p" "$suite"; done) >"$OUT/run-$(basename "$suite").log" 2>&1 &
  done
  wait
  cat "$OUT"/run-*.log
fi
echo "all done in $(($(date +%s) - t0)) s"
[ "$device" = sim ] || nvidia-smi -q -d PERFORMANCE >"$OUT/perf-end.txt" 2>&1
names=()
for suite in "${SUITES[@]}"; do
  name=$(basename "$suite")
  names+=("$name")
  python3 $py tuned "$OUT/$name" "$name" | tee "$OUT/$name/$name-summary.txt"
done
rm -rf "$OUT/gemm_check" "$OUT"/*/tuned.db* "$OUT"/*/bundle
# One file comes back (the device tool returns at most 8 files from $OUT): the suites' folders and the
# logs, all in the tar.
tops=$(cd "$OUT" && ls ./*.txt ./*.log 2>/dev/null)
tar -czf "$OUT/energy-tuned.tar.gz" -C "$OUT" "${names[@]}" $tops &&
  (cd "$OUT" && rm -rf "${names[@]}" $tops)
