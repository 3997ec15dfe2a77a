#!/usr/bin/env bash
# Lead, 2026-11-29 night: suites/cnn.json (ResNet-50's 52 fused conv layers) at 300 trials, vendor (cuDNN's fused
# conv-bias-activation) in the same run, one bench a layer (partial progress kept): even-numbered layers on GPU 0,
# odd on GPU 1, one database a GPU (a user's model job: later layers see earlier records). Binary: main cea6942 (M.xz).
set -uo pipefail
R=$PWD W=$OUT/w; mkdir -p "$W"; xz -dc "$R/.gpu-lead15/M.xz" > /tmp/M && chmod +x /tmp/M; T=/tmp/M
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv | tee "$W/card.txt"
date -u +%FT%TZ | tee -a "$W/card.txt"
end=$(( $(date +%s) + ${BUDGET:-540} ))
half() { local g=$1 d i=0 k left; d=$(mktemp -d /tmp/c$g.XXXX)
  python3 -c "
import json,sys
ws=json.load(open('suites/cnn.json'))['workloads']
for j,w in enumerate(ws):
    if j%2==int(sys.argv[1]): print(j+1, w['workload'])" "$g" > "$d/keys"
  while read -r i k; do left=$(( end - $(date +%s) )); [ $left -lt 20 ] && { echo "gpu $g stop before layer $i: $left s left" | tee -a "$W/g$g.log"; break; }
    python3 -c "import json,sys;json.dump({'name':'l','description':'cnn layer','workloads':[{'workload':sys.argv[2]}]},open(sys.argv[1],'w'))" "$d/s.json" "$k"
    (cd "$d" && XDG_CACHE_HOME=$d/c timeout $(( left < 60 ? left : 60 )) $T --db b.db bench --suite s.json --trials 300 --device cuda:$g --compile-threads 15 --json "$W/layer-$i.json" >>"$W/g$g.log" 2>&1; echo "gpu $g layer $i rc $? $k" | tee -a "$W/g$g.log")
  done < "$d/keys"; }
half 0 & half 1 & wait
date -u +%FT%TZ | tee -a "$W/card.txt"
python3 - "$W" <<'PY' | tee "$W/table.txt"
import json,glob,sys,os,re
rows=[]
for f in glob.glob(sys.argv[1]+'/layer-*.json'):
    i=int(re.search(r'layer-(\d+)',f).group(1))
    try: d=json.load(open(f))
    except Exception as e: print(i,'unreadable',e); continue
    for r in d['rows']:
        b=(r.get('job') or {}).get('workloads',[{}])[0].get('best') or {}
        rows.append((i,r['workload'],r.get('best_us'),r.get('vendor_us'),r.get('speedup'),r.get('wall_s'),b.get('template'),json.dumps(b.get('config',{}),separators=(',',':'))))
rows.sort()
ok=sum(1 for r in rows if r[4] and r[4]>=1.1)
for r in rows: print(f"{r[0]:2d} {r[1][7:]:90s} {r[2] or 0:9.2f} {r[3] or 0:9.2f} {r[4] or 0:6.3f} {r[5] or 0:5.1f}s {r[6]} {r[7]}")
print(f"{ok} of {len(rows)} >= 1.1x")
PY
cd "$OUT" && tar -czf cnn.tgz w && rm -rf w
