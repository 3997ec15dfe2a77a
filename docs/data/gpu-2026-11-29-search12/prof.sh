#!/usr/bin/env bash
# Lead, 2026-11-29 ~13:20: where a default bench's wall goes, job by job (tracker and worker debug logs), beside the
# throughput bench on the same host. Binary: $1 (default .gpu/tensortune).
set -uo pipefail
R=$PWD T=${1:-$R/.gpu/tensortune} W=$OUT/w
mkdir -p "$W"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$W/card.txt" 2>&1; cat "$W/card.txt"; nproc
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
d=$(mktemp -d /tmp/thr.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step thr 60 "$T" --db t.db bench --throughput --trials 200 --device cuda:0 --json "$W/thr.json"); tail -4 "$W/thr.log"
d=$(mktemp -d /tmp/b.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c RUST_LOG=tensortune_tracker=debug,tensortune_worker=debug step bench 150 "$T" --db b.db bench --device cuda:0 --json "$W/bench.json"); grep -v "^\S*\s*\(DEBUG\|INFO\)" "$W/bench.log" | tail -13
d=$(mktemp -d /tmp/t.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c RUST_LOG=tensortune_tracker=debug,tensortune_worker=debug step tune 30 "$T" --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep timeline "$W/tune.log"
cd "$OUT" && tar -czf prof.tgz w && rm -rf w && ls -la "$OUT"
