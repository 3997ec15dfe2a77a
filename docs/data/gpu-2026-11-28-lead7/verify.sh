#!/usr/bin/env bash
# Lead: the compile processes' directory fix (5a2493d) and off-lock proposals (083d51b) on one H200: default tunes each in a
# fresh folder, ResNet-50's suite (500 trials) in a fresh folder, the default suite's 100-trial bench (finalists' share).
cd "$(dirname "$0")/.."
L=$PWD/.gpu-lead B=$PWD/.gpu/tensortune
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
export RUST_LOG=info,tensortune_tracker::progress=debug,tensortune_worker::compiler=debug
nvidia-smi --query-gpu=name,uuid --format=csv,noheader; nproc; uptime; git log --oneline -1 2>/dev/null
med() { python3 -c "
import sqlite3;c=sqlite3.connect('$1');v=sorted(r[0] for r in c.execute('select compile_ms from records where remeasure=0 and compile_ms>0'));print(f'compile ms median {v[len(v)//2]:.0f} n {len(v)}')"; }
run() { # NAME ARGS... (a fresh folder each)
  local name=$1; shift; mkdir -p $OUT/$name; cd $OUT/$name; export XDG_CACHE_HOME=$PWD/cache
  s=$(date +%s%N); $B --db $name.db "$@" > $name.log 2>&1; rc=$?
  echo "$name: rc $rc wall $(( ($(date +%s%N) - s) / 1000000 )) ms, $(med $name.db)"; cd $OUT
}
run t1 tune matmul --m 512 --n 64 --k 512 --trials 100
run t2 tune matmul --m 512 --n 64 --k 512 --trials 100
run t3 tune matmul --m 512 --n 64 --k 512 --trials 100
run r1 tune --suite $L/resnet50-n32.json --total-trials 500 --trials 40 --device cuda:0 --json r1.json
grep -h "trials in" r1/r1.log | tail -1
mkdir -p $OUT/b && cd $OUT/b && XDG_CACHE_HOME=$PWD/cache timeout 200 $B --db bench.db bench --suite $L/../suites/default.json --trials 100 --json default-100.json > bench.log 2>&1 2>&1 || true
cd $OUT/b && cp $L/../suites/default.json . 2>/dev/null; cd $OUT
python3 $L/shares.py t1/t1.db t2/t2.db t3/t3.db b/bench.db
python3 $L/dump.py t1/t1.db t2/t2.db t3/t3.db r1/r1.db > records.csv; python3 $L/summary.py records.csv | grep -v "^  worker"
tar czf $OUT/verify.tgz */*.log */*.json records.csv 2>/dev/null; ls $OUT
