#!/usr/bin/env bash
# Lead, 2026-11-29 ~14:55: the merged main (d8aebb5: wgmma v18, load12's tracker, the tiled prior fit) on one H200: three
# default tunes in fresh folders, the default bench beside the throughput bench, v18's hand-picked self-test list of cnn12
# (every element checked), the 28x28 128->512 block end's bench. Binary: .gpu-lead12/M.xz.
set -uo pipefail
R=$PWD W=$OUT/w
mkdir -p "$W"; xz -dc "$R/.gpu-lead12/M.xz" > /tmp/tt && chmod +x /tmp/tt; T=/tmp/tt
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$W/card.txt" 2>&1; cat "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
for i in 1 2 3; do d=$(mktemp -d /tmp/t.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step tune-$i 30 "$T" --db t.db tune matmul --m 512 --n 64 --k 512 --device cuda:0); grep -h timeline "$W/tune-$i.log"; done
d=$(mktemp -d /tmp/b.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step bench 150 "$T" --db b.db bench --device cuda:0 --json "$W/bench.json"); grep -A11 "^workload" "$W/bench.log"
d=$(mktemp -d /tmp/thr.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c step thr 60 "$T" --db t.db bench --throughput --trials 200 --device cuda:0 --json "$W/thr.json"); grep -A2 "^workload" "$W/thr.log"
d=$(mktemp -d /tmp/s.XXXX); cd "$d"
step selftest-list 120 "$T" selftest --list "$R/.gpu-cnn12/list.tsv" --no-baseline --json "$W/selftest-list.json"; tail -4 "$W/selftest-list.log"
W28=$(python3 -c "import json;print([w['workload'] for w in json.load(open('$R/suites/cnn.json'))['workloads'] if 'n32h28w28c128/k512' in w['workload'] and 'beta=1' in w['workload']][0])")
python3 -c "import json,sys;json.dump({'name':'r28','description':'28x28 128->512 block end, N=32','workloads':[{'workload':sys.argv[1]}]},open('s.json','w'))" "$W28"
step bench-r28 80 "$T" --db r.db bench --suite s.json --trials 100 --device cuda:0 --json "$W/bench-r28.json"; grep -A1 "^workload" "$W/bench-r28.log"
cd "$OUT" && tar -czf final.tgz w && rm -rf w && ls -la "$OUT"
