#!/usr/bin/env bash
# Lead, 2026-11-29 ~08:45: the merged main (load10 tracker, cnn10 wgmma v17 with its register-budget rule, the lead's worker
# start/stop changes) on one H200: two default tunes in fresh folders, v17's hand-picked self-test list (every element checked),
# the fused keys' self-test on wgmma_gemm (3 configs each), one residual layer's bench. Everything in $OUT/final.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
R=$PWD T=$R/.gpu/tensortune W=$OUT/w
mkdir -p "$W"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$W/card.txt" 2>&1; cat "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
for i in 1 2; do
  d=$(mktemp -d /tmp/t.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step tune-$i 30 "$T" --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep timeline "$W/tune-$i.log"; tail -3 "$W/tune-$i.log"
done
d=$(mktemp -d /tmp/s.XXXX); cd "$d"
step selftest-list 90 "$T" selftest --list "$R/docs/data/gpu-2026-11-29-cnn10/list.tsv" --no-baseline --json "$W/selftest-list.json"; tail -6 "$W/selftest-list.log"
KEYS=$(grep -o '"matmul/[^"]*"' "$R/worker/tests/worker/fused_compile.rs" | tr -d '"' | sed 's/^/--workload /' | tr '\n' ' ')
step selftest-fused 150 "$T" selftest --template wgmma_gemm $KEYS --configs 3 --no-baseline --json "$W/selftest-fused.json"; tail -6 "$W/selftest-fused.log"
W28=$(python3 -c "import json;print([w['workload'] for w in json.load(open('$R/suites/cnn.json'))['workloads'] if 'n32h28w28c128/k512' in w['workload'] and 'beta=1' in w['workload']][0])")
python3 -c "import json,sys;json.dump({'name':'r28','description':'28x28 128->512 block end, N=32','workloads':[{'workload':sys.argv[1]}]},open('s.json','w'))" "$W28"
step bench-r28 80 "$T" --db b.db bench --suite s.json --trials 100 --device cuda:0 --json "$W/bench-r28.json"; tail -3 "$W/bench-r28.log"
cd "$OUT" && tar -czf final.tgz w && rm -rf w && ls -la "$OUT"
