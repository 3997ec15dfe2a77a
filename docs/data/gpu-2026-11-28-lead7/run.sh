#!/usr/bin/env bash
# Lead, issue 37/40: ResNet-50 N=32's suite (500 trials, 40 a workload) on one GPU (cores 0-15) then on every GPU
# (all cores), debug logs; then three default tunes on GPU 0. Binary: .gpu/tensortune (scripts/gpu-pack.sh).
cd "$(dirname "$0")/.."
L=$PWD/.gpu-lead B=$PWD/.gpu/tensortune
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,power.draw --format=csv,noheader; nproc; git log --oneline -1 2>/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
export RUST_LOG=info,tensortune_tracker::progress=debug,tensortune_tracker::jobs=debug
mkdir -p $OUT/r && cd $OUT/r
last=$(( $(nproc) - 1 ))
for run in ${RUNS:-one all}; do
  dev=cuda:all cores=0-$last; [ $run = one ] && dev=cuda:0 cores=0-15
  export XDG_CACHE_HOME=$PWD/cache-$run
  s=$(date +%s%N)
  timeout ${JOB_SECS:-150} taskset -c $cores $B --db $run.db tune --suite $L/resnet50-n32.json --total-trials ${TRIALS:-500} --trials 40 --device $dev --json $run.json > $run.log 2>&1
  echo "$run: rc $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms (device $dev, cores $cores) | $(grep 'trials in' $run.log | tail -1)"
  python3 - $run.log <<'PY'
import re, sys
text = re.sub(r'\x1b\[[0-9;]*m', '', open(sys.argv[1]).read())
ms = sorted(int(m) for m in re.findall(r'proposed off the lock .*?ms=(\d+)', text))
if ms: print(f"  proposals off the lock: {len(ms)}, ms median {ms[len(ms)//2]} p90 {ms[9*len(ms)//10]} max {ms[-1]}")
PY
done
python3 $L/dump.py *.db > records.csv && python3 $L/summary.py records.csv
cd $OUT && mkdir -p t && cd t
for i in 1 2 3; do
  export XDG_CACHE_HOME=$PWD/cache-t$i
  s=$(date +%s%N)
  $B --db t$i.db tune matmul --m 512 --n 64 --k 512 --trials 100 > t$i.log 2>&1
  echo "default tune $i: rc $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms | $(grep -m1 'best' t$i.log)"
done
python3 $L/dump.py t*.db > records-default.csv && python3 $L/summary.py records-default.csv | grep -v "^  worker"
cd $OUT && tar czf logs.tgz r/*.log r/*.json r/records.csv t/*.log t/records-default.csv 2>/dev/null; ls -la $OUT
# The CPU side alone (sim workers compile with NVRTC, time nothing): one tracker on cores 0-3 and the suite's job served to
# one sim worker (3 compile threads, cores 4-6), then to four (cores 4-15): does the tracker keep four pipelines fed?
[ -n "${SIM:-1}" ] || exit 0
cd $OUT && mkdir -p s && cd s
T=$PWD/../../tracker-bin; gunzip -c $L/../.gpu/tensortune-tracker.gz > $T 2>/dev/null || cp $L/../.gpu/tensortune-tracker $T; chmod +x $T
for n in 1 4; do
  export XDG_CACHE_HOME=$PWD/cache-$n
  taskset -c 0-3 $T serve --db sim$n.db --listen 127.0.0.1:717$n > tracker$n.log 2>&1 & tp=$!
  sleep 2
  pids=()
  for i in $(seq 1 $n); do
    c0=$(( 4 + 3 * (i - 1) )); taskset -c $c0-$(( c0 + 2 )) $B worker --tracker http://127.0.0.1:717$n --device sim --name sim$i --compile-threads 3 > worker$n-$i.log 2>&1 & pids+=($!)
  done
  sleep 1
  s=$(date +%s%N)
  timeout 120 taskset -c 0-3 $B --tracker http://127.0.0.1:717$n tune --suite $L/resnet50-n32.json --total-trials 500 --trials 40 --device sim > tune$n.log 2>&1
  echo "sim x$n: rc $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms | $(grep 'trials in' tune$n.log | tail -1)"
  kill ${pids[@]} $tp; wait 2>/dev/null
  python3 - tracker$n.log <<'PY'
import re, sys
text = re.sub(r'\x1b\[[0-9;]*m', '', open(sys.argv[1]).read())
ms = sorted(int(m) for m in re.findall(r'proposed off the lock .*?ms=(\d+)', text))
if ms: print(f"  proposals off the lock: {len(ms)}, ms median {ms[len(ms)//2]} p90 {ms[9*len(ms)//10]} max {ms[-1]}")
PY
done
python3 $L/dump.py sim*.db > records-sim.csv && python3 $L/summary.py records-sim.csv
cd $OUT && tar czf logs-sim.tgz s/*.log s/records-sim.csv; ls -la $OUT
