#!/usr/bin/env bash
# Lead, 2026-11-29 night: the 8 suites/cnn.json layers under 1.1x at 300 trials (cnn.sh), at 1000 trials, vendor in the
# same run: is the miss the search's (300 trials short) or the space's? 4 layers a GPU, one database a GPU. M.xz = cea6942.
set -uo pipefail
R=$PWD W=$OUT/w; mkdir -p "$W"; xz -dc "$R/.gpu-lead15/M.xz" > /tmp/M && chmod +x /tmp/M; T=/tmp/M
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$W/card.txt"
end=$(( $(date +%s) + ${BUDGET:-330} ))
half() { local g=$1 d i k left; d=$(mktemp -d /tmp/c$g.XXXX); shift
  for i in "$@"; do left=$(( end - $(date +%s) )); [ $left -lt 20 ] && { echo "gpu $g stop before layer $i" | tee -a "$W/g$g.log"; break; }
    k=$(python3 -c "import json,sys;print(json.load(open('suites/cnn.json'))['workloads'][int(sys.argv[1])-1]['workload'])" $i)
    python3 -c "import json,sys;json.dump({'name':'l','description':'cnn layer','workloads':[{'workload':sys.argv[2]}]},open(sys.argv[1],'w'))" "$d/s.json" "$k"
    (cd "$d" && XDG_CACHE_HOME=$d/c timeout $(( left < 100 ? left : 100 )) $T --db b.db bench --suite s.json --trials 1000 --device cuda:$g --compile-threads 15 --json "$W/layer-$i.json" >>"$W/g$g.log" 2>&1; echo "gpu $g layer $i rc $? $k" | tee -a "$W/g$g.log")
  done; }
half 0 20 18 23 48 & half 1 51 44 13 35 & wait
python3 - "$W" <<'PY' | tee "$W/table.txt"
import json,glob,sys,re
for f in sorted(glob.glob(sys.argv[1]+'/layer-*.json'), key=lambda p:int(re.search(r'layer-(\d+)',p).group(1))):
    i=int(re.search(r'layer-(\d+)',f).group(1)); d=json.load(open(f))
    for r in d['rows']:
        b=(r.get('job') or {}).get('workloads',[{}])[0].get('best') or {}
        print(f"{i:2d} {r['workload'][7:]:88s} {r['best_us']:8.2f} {r['vendor_us']:8.2f} {r['speedup']:6.3f} {r['wall_s']:5.1f}s {b.get('template')} {json.dumps(b.get('config',{}),separators=(',',':'))}")
PY
cd "$OUT" && tar -czf deep.tgz w && rm -rf w
