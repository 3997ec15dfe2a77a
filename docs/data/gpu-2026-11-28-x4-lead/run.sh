#!/usr/bin/env bash
# Lead, issue 37: ResNet-50 N=32's suite tuned (500 trials) on one GPU (16 cores) then on four (all cores), debug logs and records.
cd "$(dirname "$0")/.."
X=$PWD/.gpu-x4; mkdir -p .gpu && for b in ${BINS:-base}; do gunzip -c $X/$b.gz > .gpu/$b && chmod +x .gpu/$b; done
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,power.draw --format=csv,noheader; nproc
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
export RUST_LOG=info,tensortune_tracker::jobs=debug,tensortune_tracker::progress=debug,tensortune_tracker::dispatch=debug,tensortune_worker::daemon=debug,tensortune_worker::cuda=debug,tensortune_worker::child=debug
mkdir -p $OUT/x4 && cd $OUT/x4
T0=$(date +%s)
for run in ${RUNS:-base:one base:all}; do
  b=${run%%:*} d=${run##*:}; name=$b-$d
  dev=cuda:all; cores=0-$(( $(nproc) - 1 )); [ $d = one ] && dev=cuda:0 cores=0-15
  export XDG_CACHE_HOME=$PWD/cache-$name
  s=$(date +%s%N)
  timeout ${JOB_SECS:-150} taskset -c $cores $OLDPWD/.gpu/$b --db $name.db tune --suite $X/resnet50-n32.json --total-trials 500 --trials 40 --device $dev --json $name.json > $name.log 2>&1
  echo "$name: rc $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms (cores $cores) | $(grep 'trials in' $name.log)"
done
python3 $X/dump.py *.db > records.csv
python3 - <<'PY'
import csv, collections
rows = list(csv.DictReader(open("records.csv")))
for db in sorted({r["db"] for r in rows}):
    rs = [r for r in rows if r["db"] == db]
    trials = [r for r in rs if r["remeasure"] == "0"]
    t = sorted(float(r["record_s"]) for r in trials)
    fin = [float(r["record_s"]) for r in rs if r["remeasure"] == "1"]
    end = max(t + fin)
    print(f"{db}: trials {len(trials)} first {t[0]:.1f} s last {t[-1]:.1f} s ({len(t)/(t[-1]-t[0]):.1f}/s between), finalists {len(fin)} until {max(fin or [0]):.1f} s; {len(t)/end:.2f} trials/s over the job")
    by = collections.defaultdict(list)
    for r in trials: by[r["worker"]].append(r)
    for w, ws in sorted(by.items()):
        cm = sorted(float(r["compile_ms"]) for r in ws); mm = sorted(float(r["measure_ms"]) for r in ws)
        print(f"  worker {w}: {len(ws)} trials, {len({r['idx'] for r in ws})} workloads, compile ms median {cm[len(cm)//2]:.0f} p90 {cm[9*len(cm)//10]:.0f}, measure ms median {mm[len(mm)//2]:.0f} p90 {mm[9*len(mm)//10]:.0f} sum {sum(mm)/1e3:.1f} s")
PY
grep -c "workload resident" *.log
grep -h "tuners prepared" *.log | cut -c1-200
tar czf $OUT/x4.tgz *.log records.csv *.json
echo "script wall $(( $(date +%s) - T0 )) s"
