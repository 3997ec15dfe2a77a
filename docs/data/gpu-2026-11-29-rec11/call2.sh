#!/usr/bin/env bash
# rec11 call 2 (issue 39's export bar with placements): TUNES default tunes of f16 512x64x512 (issue 35's
# wall, finalists' share), then for each suite of SUITES: bench (100 trials), export, gemm_check
# RUNS runs with the default placements (5) and one with TT_PLACEMENTS=1.
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD B=$PWD/.gpu-rec11 o=$OUT/r
mkdir -p "$o"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include PATH=/usr/local/cuda/bin:$PATH
{ date -u; cat "$B/VERSION"; pwd; uptime
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,clocks.sm,power.limit,temperature.gpu --format=csv; } >"$o/card.txt" 2>&1
cat "$o/card.txt"
nvcc -O2 -o "$o/gemm_check" "$B/gemm_check.c" -I"$R/bundle/c" -lcuda -lcublas -lcublasLt -lm -ldl >"$o/gemm_check-build.log" 2>&1 &
for i in $(seq "${TUNES:-2}"); do
  d=$(mktemp -d /tmp/tune.XXXX)
  t0=$(date +%s%N)
  (cd "$d" && XDG_CACHE_HOME=$d/cache RUST_LOG=tensortune_tracker=debug,tensortune_worker=info "$B/tensortune" --db t.db \
    tune matmul --m 512 --n 64 --k 512 --device cuda:0 >"$o/tune-$i.log" 2>&1)
  echo "tune $i exit $? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  cp "$d/t.db" "$o/t$i.db"
done
ls "$o"/t*.db >/dev/null 2>&1 && python3 docs/data/gpu-2026-11-29-burst/shares.py "$o"/t*.db | sed 's/^.*job/job/' | tee "$o/shares.txt"
wait
for suite in ${SUITES:-default}; do
  d=$(mktemp -d /tmp/bench.XXXX)
  t0=$(date +%s)
  (cd "$d" && XDG_CACHE_HOME=$d/cache "$B/tensortune" --db tuned.db bench --suite "$R/suites/$suite.json" --trials 100 \
     --device cuda:0 --json "$o/$suite-bench.json" </dev/null >"$o/$suite-bench.log" 2>&1)
  echo "bench $suite exit $? in $(( $(date +%s) - t0 )) s"
  "$B/tensortune" --db "$d/tuned.db" records export -o "$d/records.jsonl" </dev/null >/dev/null 2>&1
  python3 "$B/finalists.py" "$d/records.jsonl" >"$o/$suite-finalists.tsv"
  "$B/tensortune" --db "$d/tuned.db" export --suite "$R/suites/$suite.json" -o "$d/bundle" >"$o/$suite-export.log" 2>&1
  python3 docs/data/gpu-2026-11-29-burst/shares.py "$d/tuned.db" | sed 's/^.*job/job/' >"$o/$suite-shares.txt"
  extra=""; [ "$suite" = default ] && extra=p1
  for run in $(seq "${RUNS:-3}") $extra; do
    t0=$(date +%s)
    p=5; [ "$run" = p1 ] && p=1
    TT_PLACEMENTS=$p timeout 120 "$o/gemm_check" "$d/bundle" 10 2 0 500 >"$o/$suite-gemm_check-$run.log" 2>&1
    echo "gemm_check $suite $run exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$o/$suite-gemm_check-$run.log")"
  done
done
rm -f "$o/gemm_check"
cd "$OUT" && tar -czf rec11-call2.tgz r && rm -rf r
