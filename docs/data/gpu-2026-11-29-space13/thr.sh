#!/usr/bin/env bash
# Lead, 2026-11-29 ~17:40: the merged main (074aba8, F.xz): the default bench at 100 trials beside the throughput bench (issue
# 35's cfg/s bar, with v19's larger space), same machine, order default, throughput, default.
set -uo pipefail
R=$PWD W=$OUT/w
mkdir -p "$W"; xz -dc "$R/.gpu-lead13/F.xz" > /tmp/F && chmod +x /tmp/F; T=/tmp/F
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$W/card.txt" 2>&1; cat "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
d=$(mktemp -d /tmp/b.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step bench1 150 $T --db b.db bench --trials 100 --device cuda:0 --json "$W/bench1.json"); grep -A11 "^workload" "$W/bench1.log"
d=$(mktemp -d /tmp/thr.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step thr 90 $T --db t.db bench --throughput --trials 200 --device cuda:0 --json "$W/thr.json"); grep -A12 "^workload" "$W/thr.log"
d=$(mktemp -d /tmp/b.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step bench2 150 $T --db b.db bench --trials 100 --device cuda:0 --json "$W/bench2.json"); grep -A11 "^workload" "$W/bench2.log"
cd "$OUT" && tar -czf thr.tgz w && rm -rf w && ls -la "$OUT"
