#!/usr/bin/env bash
# cnn13 (issue 36): wgmma v19 (C's TMA loads carry an L2 evict-first hint) against v18 (main's binary,
# .gpu-lead12/M.xz) in one run, A/B interleaved. Variants: 18 = v18; 19 = v19; 19d = v19 with
# TT_EXPERIMENT_D_EVICT_FIRST=1 (D's TMA store evict-first too, kernels with C by TMA only).
# 1. self-tests, every element checked: cnn12's 27 hand-picked C-by-TMA kernels with 19 and 19d.
# 2. the 28x28 128->512 block end's 4 best configs of cnn12, fixed, 20 samples each: 18 19 19d 19d 19 18.
# 3. its bench at 300 trials: 18 19 19d 19d 19 18; at 100 trials: 18 19 19d.
# 4. the other 6 N=32 residual layers at 100 trials: 18 19 19d each; 2 controls without C: 18 19.
# 5. compute-sanitizer (memcheck, racecheck, synccheck) on 2 C-by-TMA cases with 19d.
# Everything in $OUT/cnn13.tgz; tables last.
set -uo pipefail
R=$PWD G=$R/.gpu-cnn13 W=$OUT/w START=$(date +%s)
mkdir -p "$W" /tmp/c13
xz -dc "$R/.gpu-lead12/M.xz" >/tmp/c13/t18 && xz -dc "$G/tensortune-v19.xz" >/tmp/c13/t19 && chmod +x /tmp/c13/t*
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit,temperature.gpu --format=csv >"$W/card.txt" 2>&1
cat "$W/card.txt"; date -u | tee "$W/date.txt"
bin() { case $1 in 18) echo "env -u TT_EXPERIMENT_D_EVICT_FIRST /tmp/c13/t18";; 19) echo "env -u TT_EXPERIMENT_D_EVICT_FIRST /tmp/c13/t19";; 19d) echo "env TT_EXPERIMENT_D_EVICT_FIRST=1 /tmp/c13/t19";; esac; }
left() { echo $(( ${BUDGET:-500} - ($(date +%s) - START) )); }
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); [ "$lim" -lt 12 ] && { echo "$name skipped ($lim s left)" | tee -a "$W/steps.txt"; return; }
  timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( $(date +%s) - t0 )) s at $(( $(date +%s) - START ))" | tee -a "$W/steps.txt"; tail -${TAILN:-0} "$W/$name.log"; }
fresh() { local d; d=$(mktemp -d /tmp/c13r.XXXX); cd "$d"; export XDG_CACHE_HOME=$d/c; }
for v in 19 19d; do fresh; TAILN=14 step selftest-list-$v 60 $(bin $v) selftest --list "$G/list.tsv" --no-baseline --json "$W/selftest-list-$v.json"; done
for v in 18 19 19d 19d 19 18; do fresh; n=$(ls "$W" | grep -c "^fixed28-$v-") ; step fixed28-$v-$n 40 $(bin $v) selftest --list "$G/list28.tsv" --samples 20 --json "$W/fixed28-$v-$n.json"; done
bench() {  # variant trials index workload
  fresh; python3 -c "import json,sys;json.dump({'name':'cnn13-$3','description':'one layer of suites/cnn.json','workloads':[{'workload':sys.argv[1]}]},open('s.json','w'))" "$4"
  local n=$(ls "$W" | grep -c "^bench$2-$1-$3-.*json$"); step bench$2-$1-$3-$n $(left) $(bin $1) --db b.db bench --suite s.json --trials $2 --device cuda:0 --json "$W/bench$2-$1-$3-$n.json"
}
WS=($(python3 -c "import json;print(' '.join(x['workload'] for x in json.load(open('$G/suite.json'))['workloads']))"))
for v in 18 19 19d 19d 19 18; do bench $v 300 2 "${WS[1]}"; done
for v in 18 19 19d; do bench $v 100 2 "${WS[1]}"; done
for i in 1 3 4 5 6 7; do for v in 18 19 19d; do bench $v 100 $i "${WS[$((i - 1))]}"; done; done
for i in 8 10; do for v in 18 19; do bench $v 100 $i "${WS[$((i - 1))]}"; done; done
fresh
while read -r tpl key cfg; do
  m=$(( ${m:-0} + 1 )); run=(/tmp/c13/t19 selftest --template "$tpl" --workload "$key" --config "$cfg" --no-baseline --samples 1)
  echo "sanitize $m: $tpl $key $cfg" >>"$W/sanitize.txt"
  for tool in memcheck racecheck synccheck; do
    l=$(left); [ "$l" -lt 15 ] && { echo "  $tool skipped" >>"$W/sanitize.txt"; continue; }
    TT_EXPERIMENT_D_EVICT_FIRST=1 timeout $(( l < 60 ? l : 60 )) compute-sanitizer --tool $tool --print-limit 20 "${run[@]}" >"$W/san-$m-$tool.log" 2>&1
    echo "  $tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$W/san-$m-$tool.log" | tr '\n' ' ') $(grep -m1 ': ok \|: wrong' "$W/san-$m-$tool.log" | sed 's/.*}: //')" >>"$W/sanitize.txt"
  done
done <"$G/san.txt"
cat "$W/sanitize.txt"
cd "$R"; python3 "$G/report.py" "$W" | tee "$W/report.txt"
cd "$OUT" && tar -czf cnn13.tgz w && rm -rf w && ls -la "$OUT"
