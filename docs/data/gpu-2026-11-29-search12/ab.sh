#!/usr/bin/env bash
# Lead, 2026-11-29: A/B of the prior model's fit (A: column-wise histograms, B: forust's tiled fill), A is 0c01ac9's release (the tune path the same as 9a01bdd's but for the tracker store), B 9a01bdd + the tiled fill:
# default tunes of f16 512x64x512 in fresh folders, the default bench (tracker debug log: "tuners prepared" per job)
# and the throughput bench, in the order A B B A. Binaries: .gpu-lead12/{A,B}.xz.
set -uo pipefail
R=$PWD W=$OUT/w
mkdir -p "$W"
for b in A B; do xz -dc "$R/.gpu-lead12/$b.xz" > /tmp/tt-$b && chmod +x /tmp/tt-$b; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$W/card.txt" 2>&1; cat "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
tune() { local b=$1 i=$2; local d=$(mktemp -d /tmp/t.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c RUST_LOG=tensortune_tracker=debug step tune-$b$i 30 /tmp/tt-$b --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); echo "  $(grep -h timeline "$W/tune-$b$i.log") | $(grep -ho 'tuners prepared.*' "$W/tune-$b$i.log" | sed 's/\x1b\[[0-9;]*m//g')"; }
for i in 1 2; do tune A $i; tune B $i; done
bench() { local b=$1 i=$2; local d=$(mktemp -d /tmp/b.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c RUST_LOG=tensortune_tracker=debug step bench-$b$i 150 /tmp/tt-$b --db b.db bench --device cuda:0 --json "$W/bench-$b$i.json"); grep -ho 'tuners prepared.*ms=[0-9]*' "$W/bench-$b$i.log" | sed 's/\x1b\[[0-9;]*m//g' | grep -o 'ms=[0-9]*' | tr '\n' ' '; echo; grep -A11 "^workload" "$W/bench-$b$i.log"
  d=$(mktemp -d /tmp/thr.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step thr-$b$i 60 /tmp/tt-$b --db t.db bench --throughput --trials 200 --device cuda:0 --json "$W/thr-$b$i.json"); grep -A2 "^workload" "$W/thr-$b$i.log"; }
bench A 1; bench B 1; bench B 2; bench A 2
for i in 3; do tune B $i; tune A $i; done
cd "$OUT" && tar -czf ab.tgz w && rm -rf w && ls -la "$OUT"
