#!/usr/bin/env bash
# rec11 call 3: timing buffers 2 MiB-aligned (worker and gemm_check). Default tunes (wall, finalists' share),
# default suite bench + export, gemm_check: aligned 5 placements x3 (the bar), aligned 1 placement,
# packed 1 placement (as before), then TT_PLACE_DIAG=4 aligned (copies, 1 GiB more, history).
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD B=$PWD/.gpu-rec11 o=$OUT/r
mkdir -p "$o"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include PATH=/usr/local/cuda/bin:$PATH
{ date -u; cat "$B/VERSION"; pwd; uptime
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,clocks.sm,power.limit,temperature.gpu --format=csv; } >"$o/card.txt" 2>&1
cat "$o/card.txt"
nvcc -O2 -o "$o/gemm_check" "$B/gemm_check.c" -I"$R/bundle/c" -lcuda -lcublas -lcublasLt -lm -ldl >"$o/gemm_check-build.log" 2>&1 &
for i in 1 2; do
  d=$(mktemp -d /tmp/tune.XXXX)
  t0=$(date +%s%N)
  (cd "$d" && XDG_CACHE_HOME=$d/cache RUST_LOG=tensortune_tracker=debug,tensortune_worker=info "$B/tensortune" --db t.db \
    tune matmul --m 512 --n 64 --k 512 --device cuda:0 >"$o/tune-$i.log" 2>&1)
  echo "tune $i exit $? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  cp "$d/t.db" "$o/t$i.db"
done
python3 docs/data/gpu-2026-11-29-burst/shares.py "$o"/t*.db | sed 's/^.*job/job/' | tee "$o/shares.txt"
wait
d=$(mktemp -d /tmp/bench.XXXX)
t0=$(date +%s)
(cd "$d" && XDG_CACHE_HOME=$d/cache "$B/tensortune" --db tuned.db bench --suite "$R/suites/default.json" --trials 100 \
   --device cuda:0 --json "$o/default-bench.json" </dev/null >"$o/default-bench.log" 2>&1)
echo "bench exit $? in $(( $(date +%s) - t0 )) s"
"$B/tensortune" --db "$d/tuned.db" records export -o "$d/records.jsonl" </dev/null >/dev/null 2>&1
python3 "$B/finalists.py" "$d/records.jsonl" >"$o/default-finalists.tsv"
"$B/tensortune" --db "$d/tuned.db" export --suite "$R/suites/default.json" -o "$d/bundle" >"$o/default-export.log" 2>&1
python3 docs/data/gpu-2026-11-29-burst/shares.py "$d/tuned.db" | sed 's/^.*job/job/' >"$o/default-shares.txt"
for run in a5-1 a5-2 a5-3 a1 p1; do
  t0=$(date +%s)
  al=1; [ "${run:0:1}" = p ] && al=0
  TT_ALIGN=$al TT_PLACEMENTS=${run:1:1} timeout 100 "$o/gemm_check" "$d/bundle" 10 2 0 500 >"$o/gemm_check-$run.log" 2>&1
  echo "gemm_check $run exit $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$o/gemm_check-$run.log")"
done
TT_ALIGN=1 TT_PLACEMENTS=1 TT_PLACE_DIAG=4 timeout 100 "$o/gemm_check" "$d/bundle" 10 2 0 500 >"$o/gemm_check-diag.log" 2>&1
echo "diag exit $?"
grep "^diag" "$o/gemm_check-diag.log" | grep -v "4096x" | awk '{printf "%s %s %s %s %s %s\n", $2,$3,$5,$6,$8,$12}'
rm -f "$o/gemm_check"
cd "$OUT" && tar -czf rec11-call3.tgz r && rm -rf r
