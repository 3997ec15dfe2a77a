#!/usr/bin/env bash
# rec11 call 1 (issue 39's export bar, diagnosis): default suite bench (100 trials), export, gemm_check
# three plain runs (the bar) and one run with TT_PLACE_DIAG=6 (what moves a kernel's time in one process).
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD B=$PWD/.gpu-rec11 o=$OUT/r
mkdir -p "$o"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include PATH=/usr/local/cuda/bin:$PATH
{ date -u; cat "$B/VERSION"; pwd; git log --oneline -1 2>/dev/null; uptime
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,clocks.sm,power.limit,temperature.gpu --format=csv; } >"$o/card.txt" 2>&1
cat "$o/card.txt"
nvcc -O2 -o "$o/gemm_check" "$B/gemm_check.c" -I"$R/bundle/c" -lcuda -lcublas -lcublasLt -lm -ldl >"$o/gemm_check-build.log" 2>&1 &
d=$(mktemp -d /tmp/bench.XXXX)
t0=$(date +%s)
(cd "$d" && XDG_CACHE_HOME=$d/cache "$B/tensortune" --db tuned.db bench --suite "$R/suites/default.json" --trials 100 \
   --device cuda:0 --json "$o/default-bench.json" </dev/null >"$o/bench.log" 2>&1)
echo "bench exit $? in $(( $(date +%s) - t0 )) s"
"$B/tensortune" --db "$d/tuned.db" records export -o "$o/default-records.jsonl" </dev/null >/dev/null 2>&1
"$B/tensortune" --db "$d/tuned.db" export --suite "$R/suites/default.json" -o "$d/bundle" >"$o/export.log" 2>&1
echo "export exit $?"
wait
# p1-*: one placement (the check as before); p5-*: five placements (module and small buffers copied)
for run in p1-1 p5-1 p1-2 p5-2 p1-3; do
  t0=$(date +%s)
  TT_PLACEMENTS=${run:1:1} timeout 60 "$o/gemm_check" "$d/bundle" 10 2 0 500 >"$o/gemm_check-$run.log" 2>&1
  echo "gemm_check $run exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$o/gemm_check-$run.log")"
done
t0=$(date +%s)
TT_PLACEMENTS=1 TT_PLACE_DIAG=6 timeout 150 "$o/gemm_check" "$d/bundle" 10 2 0 500 >"$o/gemm_check-diag.log" 2>&1
echo "gemm_check diag exit $? in $(( $(date +%s) - t0 )) s"
grep "^diag" "$o/gemm_check-diag.log" | cut -c6-100

rm -f "$o/gemm_check"
cd "$OUT" && tar -czf rec11-call1.tgz r && rm -rf r
