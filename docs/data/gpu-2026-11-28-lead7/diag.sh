#!/usr/bin/env bash
# Lead: why is the first tune in a fresh folder slower to compile? Default tunes in new and in the same folders,
# ResNet-50's suite (200 trials) twice, with top snapshots every second.
cd "$(dirname "$0")/.."
L=$PWD/.gpu-lead B=$PWD/.gpu/tensortune
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
export RUST_LOG=info,tensortune_worker::compiler=debug,tensortune_worker::compile_child=debug
nvidia-smi --query-gpu=name,uuid --format=csv,noheader; nproc; uptime
sample() { while :; do { date +%T.%N; top -b -n1 -w 220 | sed -n 1,5p; top -b -n1 -w 220 | sed -n 8,16p; } >> $1; sleep 1; done; }
run() { # NAME DIR ARGS...
  local name=$1 dir=$2; shift 2; mkdir -p $OUT/$dir; cd $OUT/$dir
  export XDG_CACHE_HOME=$PWD/cache-$name
  sample $OUT/top-$name.txt & sp=$!
  s=$(date +%s%N); $B --db $name.db "$@" > $name.log 2>&1; rc=$?
  kill $sp; wait $sp 2>/dev/null
  med=$(python3 -c "
import sqlite3;c=sqlite3.connect('$name.db');v=sorted(r[0] for r in c.execute('select compile_ms from records where remeasure=0'));print(f'compile ms median {v[len(v)//2]:.0f} min {v[0]:.0f} n {len(v)}')")
  echo "$name (folder $dir): rc $rc wall $(( ($(date +%s%N) - s) / 1000000 )) ms, $med, compile children $(grep -c 'compile process started\|spawn' $name.log)"
  cd $OUT
}
run t1 a tune matmul --m 512 --n 64 --k 512 --trials 100
run t2 b tune matmul --m 512 --n 64 --k 512 --trials 100
run t3 b tune matmul --m 512 --n 64 --k 512 --trials 100
run t4 c tune matmul --m 512 --n 64 --k 512 --trials 100
run t5 c tune matmul --m 512 --n 64 --k 512 --trials 100
run r1 d tune --suite $L/resnet50-n32.json --total-trials 200 --trials 40 --device cuda:0
run r2 d tune --suite $L/resnet50-n32.json --total-trials 200 --trials 40 --device cuda:0
uptime
tar czf $OUT/diag.tgz top-*.txt */*.log; ls $OUT
