#!/usr/bin/env bash
# Lead, 2026-11-29 ~16:35: block_m 32 and 48 beside the multiples of 16 (branch space13 6cf7b04, S2.xz) against the merged
# main (M.xz, d8aebb5): every new height self-tested (every element checked), the short swept workloads at 300 trials with
# both binaries in turn, the default suite at 100 trials and two default tunes with S2.
set -uo pipefail
R=$PWD W=$OUT/w
mkdir -p "$W"; xz -dc "$R/.gpu-lead13/S2.xz" > /tmp/S2 && xz -dc "$R/.gpu-lead12/M.xz" > /tmp/M && chmod +x /tmp/S2 /tmp/M
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$W/card.txt" 2>&1; cat "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
d=$(mktemp -d /tmp/s.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step selftest 120 /tmp/S2 selftest --list "$R/.gpu-lead13/newheights2.tsv" --no-baseline --json "$W/selftest.json"); tail -3 "$W/selftest.log"
for b in S2 M; do d=$(mktemp -d /tmp/b.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step short-$b 200 /tmp/$b --db b.db bench --suite "$R/.gpu-lead13/short2.json" --trials 300 --device cuda:0 --json "$W/short-$b.json"); grep -A16 "^workload" "$W/short-$b.log"; done
d=$(mktemp -d /tmp/b.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step default-S2 150 /tmp/S2 --db b.db bench --trials 100 --device cuda:0 --json "$W/default-S2.json"); grep -A11 "^workload" "$W/default-S2.log"
for i in 1 2; do d=$(mktemp -d /tmp/t.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step tune-S2-$i 30 /tmp/S2 --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep -h timeline "$W/tune-S2-$i.log"; done
cd "$OUT" && tar -czf vC.tgz w && rm -rf w && ls -la "$OUT"
