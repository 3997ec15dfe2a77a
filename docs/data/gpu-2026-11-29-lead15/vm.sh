#!/usr/bin/env bash
# Lead, 2026-11-29 night: the merged main 8a19cf5 (P.xz: search17's local moves, search16's templates in contention, load15's report gathering in the
# daemon, the three-consumer register rule) against cea6942 (M.xz) on one GPU: default tunes alternating (5 s bar),
# the default suite at 100 trials with each (finalists' share, cfg/s), and three-consumer kernels of the self-test matrix.
set -uo pipefail
R=$PWD W=$OUT/w; mkdir -p "$W"; T0=$(date +%s)
for b in M P; do xz -dc "$R/.gpu-lead15/$b.xz" > /tmp/$b && chmod +x /tmp/$b; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms (t=$(( $(date +%s) - T0 )) s)"; }
for i in 1 2 3; do for b in P M; do t=$(mktemp -d /tmp/t.XXXX); (cd "$t" && XDG_CACHE_HOME=$t/c step tune-$b-$i 30 /tmp/$b --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep -h timeline "$W/tune-$b-$i.log"; done; done
for b in P M; do t=$(mktemp -d /tmp/d.XXXX); (cd "$t" && XDG_CACHE_HOME=$t/c step default-$b 120 /tmp/$b --db d.db bench --suite "$R/suites/default.json" --trials 100 --device cuda:0 --json "$W/default-$b.json"); grep -A14 "^workload" "$W/default-$b.log" | head -16; done
d=$(mktemp -d /tmp/s.XXXX); cd "$d"; export XDG_CACHE_HOME=$d/c
step self-gemm3 100 /tmp/P selftest --template wgmma_gemm --knob consumers:3 --configs 2 --no-baseline --json "$W/self-gemm3.json"; tail -3 "$W/self-gemm3.log"
step self-conv3 80 /tmp/P selftest --template wgmma_conv2d --knob consumers:3 --configs 2 --no-baseline --json "$W/self-conv3.json"; tail -3 "$W/self-conv3.log"
cd "$OUT" && tar -czf vm.tgz w && rm -rf w
