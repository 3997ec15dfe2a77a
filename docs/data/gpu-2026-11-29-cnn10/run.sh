#!/usr/bin/env bash
# cnn10 (issue 36): v17 reads the residual C 16 bytes a thread. One device call: self-tests of the
# new paths (every element checked), one bench per layer of suites/cnn.json's N=32 residual layers
# and 3 controls without C, a table last; everything in $OUT/cnn10.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD T=$R/.gpu-cnn/tensortune W=$OUT/w START=$(date +%s)
mkdir -p "$W"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit,temperature.gpu --format=csv >"$W/card.txt" 2>&1
cat "$W/card.txt"; date -u | tee "$W/date.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); echo "== $name"; timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$W/steps.txt"; tail -${TAILN:-4} "$W/$name.log"; }
d=$(mktemp -d /tmp/cnn10.XXXX); cd "$d"
TAILN=26 step selftest-list 50 "$T" selftest --list "$R/.gpu-cnn/list.tsv" --no-baseline --json "$W/selftest-list.json"
i=0
for w in $(python3 -c "import json;print(' '.join(x['workload'] for x in json.load(open('$R/.gpu-cnn/suite.json'))['workloads']))"); do
  left=$(( 215 - ($(date +%s) - START) ))
  [ "$left" -lt 12 ] && { echo "bench: stopped before $w ($left s left)" | tee -a "$W/steps.txt"; break; }
  i=$((i + 1))
  python3 -c "import json,sys;json.dump({'name':'cnn10-$i','description':'one layer of suites/cnn.json','workloads':[{'workload':sys.argv[1]}]},open('s$i.json','w'))" "$w"
  TAILN=0 step bench-$i "$left" "$T" --db b$i.db bench --suite "s$i.json" --trials 100 --device cuda:0 --json "$W/bench-$i.json"
done
RES=$(python3 -c "import json;print(' '.join('--workload '+w['workload'] for w in json.load(open('$R/.gpu-cnn/suite.json'))['workloads'] if 'beta=1' in w['workload']))")
left=$(( 268 - ($(date +%s) - START) ))
[ "$left" -gt 10 ] && TAILN=12 step selftest-conv "$left" "$T" selftest --template wgmma_conv2d $RES --configs 3 --no-baseline --json "$W/selftest-conv.json"
cd "$R"
python3 .gpu-cnn/table.py "$W"/bench-*.json | tee "$W/table.txt"
cd "$OUT" && tar -czf cnn10.tgz w && rm -rf w && ls -la "$OUT"
