#!/usr/bin/env bash
# Lead, 2026-11-30: default tunes of main (N: search18's prior offset, the nvrtc crate) against
# 2d3b469 (O: the session before), alternating, from fresh folders (issue 35's 5 s bar).
set -uo pipefail
R=$PWD W=$OUT/w; mkdir -p "$W" /tmp/b; T0=$(date +%s)
xz -dc .gpu-s/tensortune.xz > /tmp/b/N && xz -dc .gpu-s/old.xz > /tmp/b/O && chmod +x /tmp/b/N /tmp/b/O
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms (t=$(( $(date +%s) - T0 )) s)"; }
for i in 1 2 3 4; do for b in O N; do t=$(mktemp -d /tmp/t.XXXX); (cd "$t" && XDG_CACHE_HOME=$t/c step tune-$b-$i 30 /tmp/b/$b --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep -h timeline "$W/tune-$b-$i.log"; done; done
for b in N O; do t=$(mktemp -d /tmp/d.XXXX); (cd "$t" && XDG_CACHE_HOME=$t/c step default-$b 120 /tmp/b/$b --db d.db bench --suite "$R/suites/default.json" --trials 100 --device cuda:0 --json "$W/default-$b.json"); grep -A12 "^workload" "$W/default-$b.log" | head -12; done
cd "$OUT" && tar -czf g3.tgz w && rm -rf w
