#!/usr/bin/env bash
# Lead, 2026-11-30: main c265609+ (search18's prior offset and conv work columns): the default and
# large suites at 100 trials each from fresh folders (issue 35: within 2% of each shape's best known).
set -uo pipefail
R=$PWD W=$OUT/w; mkdir -p "$W" /tmp/b; T0=$(date +%s)
for f in .gpu-s/tensortune.xz; do n=$(basename "$f" .xz); xz -dc "$f" > /tmp/b/$n && chmod +x /tmp/b/$n; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms (t=$(( $(date +%s) - T0 )) s)"; }
for s in default large; do t=$(mktemp -d /tmp/d.XXXX); (cd "$t" && XDG_CACHE_HOME=$t/c step $s ${LIM:-280} /tmp/b/tensortune --db d.db bench --suite "$R/suites/$s.json" --trials 100 --device cuda:0 --json "$W/$s.json"); grep -A14 "^workload" "$W/$s.log" | head -16; done
cd "$OUT" && tar -czf g2.tgz w && rm -rf w
