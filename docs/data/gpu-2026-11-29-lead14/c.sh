#!/usr/bin/env bash
# Lead, 2026-11-29 evening: wgmma v20 (block_n 192 over three consumers; N.xz, with union-v19's packs in the prior) against
# 074aba8's binary (F.xz): every element of 3-consumer kernels across the self-test matrix, compute-sanitizer on one, the
# vendor's kernels in our orientation (k2.py), 300-trial benches of the 192-wide workloads, default tunes (5 s bar).
set -uo pipefail
R=$PWD W=$OUT/w; mkdir -p "$W"; T0=$(date +%s)
for b in F N; do xz -dc "$R/.gpu-lead14/$b.xz" > /tmp/$b && chmod +x /tmp/$b; done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms (t=$(( $(date +%s) - T0 )) s)"; }
d=$(mktemp -d /tmp/c.XXXX); cd "$d"; export XDG_CACHE_HOME=$d/c
step self-gemm3 120 /tmp/N selftest --template wgmma_gemm --knob consumers:3 --configs 3 --no-baseline --json "$W/self-gemm3.json"; tail -4 "$W/self-gemm3.log"
step self-conv3 80 /tmp/N selftest --template wgmma_conv2d --knob consumers:3 --configs 3 --no-baseline --json "$W/self-conv3.json"; tail -4 "$W/self-conv3.log"
python3 "$R/.gpu-lead14/k2.py" > "$W/k2.txt" 2>&1; grep -v Warn "$W/k2.txt" | grep -v _warn
python3 -c "import json;json.dump({'name':'w192','description':'192-wide tiles','workloads':[{'workload':w} for w in ['matmul/m3000n3000k4096/nn/f16,f32,f32/alpha=1,beta=0','matmul/m2824n1720k1368/nn/f16,f32,f16/alpha=1,beta=0','matmul/m3072n3072k3072/tn/bf16,f32,bf16/alpha=1,beta=0']]},open('s.json','w'))"
for b in N F; do step bench-$b 100 /tmp/$b --db b-$b.db bench --suite s.json --trials 300 --device cuda:0 --json "$W/bench-$b.json"; grep -A4 "^workload" "$W/bench-$b.log"; done
for i in 1 2; do for b in N F; do t=$(mktemp -d /tmp/t.XXXX); (cd "$t" && XDG_CACHE_HOME=$t/c step tune-$b-$i 30 /tmp/$b --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep -h timeline "$W/tune-$b-$i.log"; done; done
CFG='{"block_m":192,"block_n":192,"cluster":2,"consumers":3,"persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0,"epilogue":"direct","raster":"n"}'
for tool in memcheck racecheck synccheck; do
  [ $(( $(date +%s) - T0 )) -gt 330 ] && { echo "skip sanitizer $tool: time"; continue; }
  step san-$tool 60 compute-sanitizer --tool $tool --print-limit 5 /tmp/N selftest --template wgmma_gemm --workload "matmul/m520n400k256/nn/f16,f32,f32/alpha=1,beta=0" --config "$CFG" --no-baseline; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|ok " "$W/san-$tool.log" | tail -3
done
cd "$OUT" && tar -czf c.tgz w && rm -rf w
