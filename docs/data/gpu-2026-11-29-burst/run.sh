#!/usr/bin/env bash
# Lead, 2026-11-29: burst finalists timed as trials from the full clock (no warm-up; idle while the cap holds the clock).
# Carry the release binary as .gpu/tensortune; OUT is the device tool's folder. SKIP_TUNES=1 skips the tunes, BUDGET the energy part.
# Default tunes in fresh folders (wall, finalists' share), the throughput bench, then energy-tuned.sh's
# bench, cool and export phases (burst record vs cool-start shots; exported kernels vs records).
cd "$(dirname "$0")/../../.."
R=$PWD L=$PWD/docs/data/gpu-2026-11-29-burst B=$PWD/.gpu/tensortune
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,clocks.max.sm,power.limit --format=csv,noheader > $OUT/card.txt; uptime
run() { # NAME ARGS... (a fresh folder each)
  local name=$1; shift; mkdir -p $OUT/$name; cd $OUT/$name; export XDG_CACHE_HOME=$PWD/cache
  s=$(date +%s%N); $B --db $name.db "$@" > $name.log 2>&1; rc=$?
  echo "$name: rc $rc wall $(( ($(date +%s%N) - s) / 1000000 )) ms"; cd $OUT
}
if [ -z "${SKIP_TUNES:-}" ]; then
run t1 tune matmul --m 512 --n 64 --k 512 --trials 100
run t2 tune matmul --m 512 --n 64 --k 512 --trials 100
run t3 tune matmul --m 512 --n 64 --k 512 --trials 100
run thr bench --throughput --trials 200 --json thr.json
tail -6 thr/thr.log
python3 $L/shares.py t1/t1.db t2/t2.db t3/t3.db
fi
cd $R
OUT=$OUT/energy ENERGY_TUNED_PHASES="bench cool export" ENERGY_TUNED_BUDGET_S=${BUDGET:-400} bash scripts/energy-tuned.sh 2>&1 | grep -v "^$" | tail -60
tar xzf $OUT/energy/energy-tuned.tar.gz -C $OUT/energy default/default-bench.json large/large-bench.json 2>/dev/null
cp $OUT/energy/default/default-bench.json $OUT/energy/large/large-bench.json $OUT/ 2>/dev/null
(cd $OUT && tar czf tunes.tgz t*/*.log thr/*.json 2>/dev/null; rm -rf t? thr)
cat $OUT/card.txt
