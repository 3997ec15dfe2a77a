#!/usr/bin/env bash
# Lead, 2026-11-29 evening: the union-v19 sweep's workloads whose sampled best read under 0.98x the vendor, at 300 trials
# with the vendor in the same run (bench prints the algorithm cuBLASLt/cuDNN ran), two a GPU (F.xz: 074aba8's kernels).
set -uo pipefail
R=$PWD W=$OUT/w; mkdir -p "$W"; xz -dc "$R/.gpu-lead14/F.xz" > /tmp/F && chmod +x /tmp/F; T=/tmp/F
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$W/card.txt"
suite() { python3 -c "import json,sys;json.dump({'name':'v','description':'under 0.98x in union-v19','workloads':[{'workload':w} for w in sys.argv[2:]]},open(sys.argv[1],'w'))" "$@"; }
run() { local g=$1; shift; local d; d=$(mktemp -d /tmp/v.XXXX); suite "$d/s.json" "$@"
  (cd "$d" && XDG_CACHE_HOME=$d/c timeout 280 $T --db b.db bench --suite s.json --trials 300 --device cuda:$g --compile-threads 15 --json "$W/bench-$g.json" >"$W/bench-$g.log" 2>&1; echo "gpu $g rc $?"); }
run 0 "matmul/m2824n1720k1368/nn/f16,f32,f16/alpha=1,beta=0" "matmul/m1536n1536k6144/nt/bf16,f32,bf16/alpha=1,beta=0" &
run 1 "matmul/m3072n3072k3072/tn/bf16,f32,bf16/alpha=1,beta=0" "conv2d/n8h20w20c160/k320r5s5/pad2x2,stride1x1,dil1x1/nhwc/f16,f32,f16" &
wait
grep -h -A4 "^workload" "$W"/bench-*.log
cd "$OUT" && tar -czf v.tgz w && rm -rf w
