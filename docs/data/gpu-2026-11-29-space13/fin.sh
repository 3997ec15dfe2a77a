#!/usr/bin/env bash
# Lead, 2026-11-29 ~16:55: the merged main (cnn13's wgmma v19 hints + space13's heights; F.xz): cnn12's 27 C-by-TMA kernels
# (every element checked), configs shaped like the vendor's picks on the short swept workloads (ours and the vendor timed
# side by side), the 28x28 block end at 300 trials, m16n4096k4096 and conv n64h7w7c2048 at 300 trials, two default tunes.
set -uo pipefail
R=$PWD W=$OUT/w
mkdir -p "$W"; xz -dc "$R/.gpu-lead13/F.xz" > /tmp/F && chmod +x /tmp/F; T=/tmp/F
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$W/card.txt" 2>&1; cat "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
d=$(mktemp -d /tmp/s.XXXX); cd "$d"
XDG_CACHE_HOME=$d/c step c-by-tma 120 $T selftest --list "$R/.gpu-cnn12/list.tsv" --no-baseline --json "$W/c-by-tma.json"; tail -2 "$W/c-by-tma.log"
XDG_CACHE_HOME=$d/c step vendorlike 120 $T selftest --list "$R/.gpu-lead13/vendorlike.tsv" --json "$W/vendorlike.json"; tail -22 "$W/vendorlike.log"
W28=$(python3 -c "import json;print([w['workload'] for w in json.load(open('$R/suites/cnn.json'))['workloads'] if 'n32h28w28c128/k512' in w['workload'] and 'beta=1' in w['workload']][0])")
python3 -c "import json,sys;json.dump({'name':'fin','description':'28x28 128->512 block end N=32; m16n4096k4096; conv n64h7w7c2048','workloads':[{'workload':sys.argv[1]},{'workload':'matmul/m16n4096k4096/tn/bf16,f32,bf16/alpha=1,beta=0'},{'workload':'conv2d/n64h7w7c2048/k512r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16'}]},open('s.json','w'))" "$W28"
XDG_CACHE_HOME=$d/c step bench 150 $T --db r.db bench --suite s.json --trials 300 --device cuda:0 --json "$W/bench.json"; grep -A6 "^workload" "$W/bench.log"
for i in 1 2; do t=$(mktemp -d /tmp/t.XXXX); (cd "$t" && XDG_CACHE_HOME=$t/c step tune-$i 30 $T --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep -h timeline "$W/tune-$i.log"; done
cd "$OUT" && tar -czf fin.tgz w && rm -rf w && ls -la "$OUT"
