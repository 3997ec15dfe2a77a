#!/usr/bin/env bash
# cnn12, second call: the two residual layers closest to the bar after the first call (28x28
# 128->512 at 1.05x, 14x14 1024->2048 stride 2 at 1.14x) benched at issue 36's 300 trials with v18.
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD G=$R/.gpu-cnn12 W=$OUT/w START=$(date +%s)
mkdir -p "$W" /tmp/cnn12bin
gzip -dc "$G/tensortune-v18.gz" >/tmp/cnn12bin/t18 && chmod +x /tmp/cnn12bin/t18
T=/tmp/cnn12bin/t18
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit,temperature.gpu --format=csv >"$W/card.txt" 2>&1
cat "$W/card.txt"; date -u | tee "$W/date.txt"
d=$(mktemp -d /tmp/cnn12.XXXX); cd "$d"
i=0
for w in conv2d/n32h28w28c128/k512r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu conv2d/n32h14w14c1024/k2048r1s1/pad0x0,stride2x2,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu; do
  i=$((i + 1)); left=$(( 100 - ($(date +%s) - START) )); [ "$left" -lt 15 ] && break
  python3 -c "import json,sys;json.dump({'name':'cnn12-300-$i','description':'one layer of suites/cnn.json','workloads':[{'workload':sys.argv[1]}]},open('s$i.json','w'))" "$w"
  t0=$(date +%s); timeout "$left" "$T" --db b$i.db bench --suite s$i.json --trials 300 --device cuda:0 --json "$W/bench300-$i.json" >"$W/bench300-$i.log" 2>&1
  echo "bench300-$i rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$W/steps.txt"
done
cd "$R"; python3 "$G/table.py" "$W"/bench300-*.json | tee "$W/table300.txt"
cd "$OUT" && tar -czf cnn12b.tgz w && rm -rf w
