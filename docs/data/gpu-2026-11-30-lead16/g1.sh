#!/usr/bin/env bash
# Lead, 2026-11-30: main c265609+ (the compile tests moved to kernels/tests/compile, the GPU
# self-tests to the worker's gpu_selftest; search18's prior offset): the tests CI leaves out on a
# GPU (both binaries, --ignored), then three default tunes from fresh folders (issue 35's 5 s bar).
set -uo pipefail
R=$PWD W=$OUT/w; mkdir -p "$W" /tmp/b; T0=$(date +%s)
for f in .gpu-s/*.xz; do n=$(basename "$f" .xz); xz -dc "$f" > /tmp/b/$n && chmod +x /tmp/b/$n; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms (t=$(( $(date +%s) - T0 )) s)"; }
d=$(mktemp -d /tmp/g.XXXX)
(cd "$R/worker" && XDG_CACHE_HOME=$d/c TENSORTUNE_WORKER_BIN=/tmp/b/tensortune-worker step gputests 300 /tmp/b/worker-gpu-tests --ignored --nocapture --test-threads 1)
grep -E '^test |test result' "$W/gputests.log"
(cd "$R/kernels" && step compile-tests 300 /tmp/b/compile-tests --ignored --nocapture)
grep -E '^test |test result|kernels' "$W/compile-tests.log" | tail -5
for i in 1 2 3; do t=$(mktemp -d /tmp/t.XXXX); (cd "$t" && XDG_CACHE_HOME=$t/c step tune-$i 30 /tmp/b/tensortune --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep -h -E 'timeline|best|vendor' "$W/tune-$i.log" | head -4; done
cd "$OUT" && tar -czf g1.tgz w && rm -rf w
