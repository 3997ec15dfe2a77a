#!/usr/bin/env bash
# cnn12 (issue 36): wgmma v18 loads the residual C by TMA (its own tensor map, a ring per consumer
# filled by the producer warpgroup). One device call: self-tests of the new path (every element
# checked; their times are 3-sample figures), one bench per layer of suites/cnn.json's 7 N=32
# residual layers and 3 controls without C with v18, the 7 residual layers again with v17's
# binary (cnn10's, eafd643) in the same run, a random-config self-test, tables last.
# Everything in $OUT/cnn12.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD G=$R/.gpu-cnn12 W=$OUT/w START=$(date +%s)
mkdir -p "$W" /tmp/cnn12bin
gzip -dc "$G/tensortune-v18.gz" >/tmp/cnn12bin/t18 && gzip -dc "$G/tensortune-v17.gz" >/tmp/cnn12bin/t17 && chmod +x /tmp/cnn12bin/t*
T=/tmp/cnn12bin/t18 T17=/tmp/cnn12bin/t17
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit,temperature.gpu --format=csv >"$W/card.txt" 2>&1
cat "$W/card.txt"; date -u | tee "$W/date.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); echo "== $name"; timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$W/steps.txt"; tail -${TAILN:-4} "$W/$name.log"; }
d=$(mktemp -d /tmp/cnn12.XXXX); cd "$d"
TAILN=40 step selftest-list 120 "$T" selftest --list "$G/list.tsv" --no-baseline --json "$W/selftest-list.json"
WS=$(python3 -c "import json;print(' '.join(x['workload'] for x in json.load(open('$G/suite.json'))['workloads']))")
bench() {  # tag binary index workload
  local left=$(( ${BUDGET:-420} - ($(date +%s) - START) ))
  [ "$left" -lt 14 ] && { echo "bench: stopped before $1-$3 ($left s left)" | tee -a "$W/steps.txt"; return; }
  python3 -c "import json,sys;json.dump({'name':'cnn12-$1-$3','description':'one layer of suites/cnn.json','workloads':[{'workload':sys.argv[1]}]},open('s-$1-$3.json','w'))" "$4"
  TAILN=0 step bench$1-$3 "$left" "$2" --db b$1-$3.db bench --suite "s-$1-$3.json" --trials 100 --device cuda:0 --json "$W/bench$1-$3.json"
}
i=0; for w in $WS; do i=$((i + 1)); bench 18 "$T" $i "$w"; done
i=0; for w in $WS; do i=$((i + 1)); case "$w" in *beta=1*) bench 17 "$T17" $i "$w";; esac; done
RES=$(python3 -c "import json;print(' '.join('--workload '+w['workload'] for w in json.load(open('$G/suite.json'))['workloads'] if 'beta=1' in w['workload']))")
left=$(( ${BUDGET:-420} + 40 - ($(date +%s) - START) ))
[ "$left" -gt 10 ] && TAILN=12 step selftest-conv "$left" "$T" selftest --template wgmma_conv2d $RES --configs 3 --no-baseline --json "$W/selftest-conv.json"
cd "$R"
for v in 18 17; do
  f=(); for i in $(seq 1 12); do [ -s "$W/bench$v-$i.json" ] && f+=("$W/bench$v-$i.json"); done
  echo "== v$v"; [ ${#f[@]} -gt 0 ] && python3 "$G/table.py" "${f[@]}" | tee "$W/table$v.txt"
done
cd "$OUT" && tar -czf cnn12.tgz w && rm -rf w && ls -la "$OUT"
