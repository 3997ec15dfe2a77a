#!/usr/bin/env bash
# Lead's device call wrapper (session of 2026-11-29 06:40): PHASES, SUITES, BUDGET from the env (scripts/energy-tuned.sh);
# ONLY_LARGE / ONLY_DEFAULT: the workloads of the lists-a/cool/hold phases. TUNES=N adds N default tunes of f16 512x64x512
# first (issue 35's 5 s bar), each in a fresh folder with the tracker's debug log (space and prior build times).
# THR=1 adds `bench --throughput --trials 200`. Everything comes back in $OUT/all.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$OUT R=$PWD
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$root/card.txt" 2>&1
cat "$root/card.txt"; uptime
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$root/tunes"
for i in $(seq "${TUNES:-0}"); do
  d=$(mktemp -d /tmp/tune.XXXX)
  t0=$(date +%s%N)
  (cd "$d" && XDG_CACHE_HOME=$d/cache RUST_LOG=tensortune_tracker=debug,tensortune_worker=info "$R/.gpu/tensortune" --db t.db \
    tune matmul --m 512 --n 64 --k 512 --device cuda:0 >"$root/tunes/tune-$i.log" 2>&1)
  echo "tune $i exit $? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  grep -h "timeline" "$root/tunes/tune-$i.log"
  cp "$d/t.db" "$root/tunes/t$i.db"
done
[ -n "$(ls "$root"/tunes/*.db 2>/dev/null)" ] && python3 docs/data/gpu-2026-11-29-burst/shares.py "$root"/tunes/*.db
if [ "${THR:-0}" = 1 ]; then
  d=$(mktemp -d /tmp/thr.XXXX)
  (cd "$d" && XDG_CACHE_HOME=$d/cache "$R/.gpu/tensortune" --db t.db bench --throughput --trials 200 --device cuda:0 \
     --json "$root/tunes/thr.json" >"$root/tunes/thr.log" 2>&1)
  tail -4 "$root/tunes/thr.log"
fi
mkdir -p "$root/e"
[ -n "${ONLY_LARGE:-}" ] && export ENERGY_TUNED_ONLY_large=$ONLY_LARGE
[ -n "${ONLY_DEFAULT:-}" ] && export ENERGY_TUNED_ONLY_default=$ONLY_DEFAULT
OUT=$root/e ENERGY_TUNED_SUITES="${SUITES:-default large}" ENERGY_TUNED_PHASES="${PHASES:-bench cool export}" \
  ENERGY_TUNED_BUDGET_S=${BUDGET:-520} ENERGY_COMMIT=$(git rev-parse --short HEAD) bash scripts/energy-tuned.sh 2>&1 | grep -v '^$' | tail -80
cd "$root" && tar -czf all.tgz card.txt tunes e && rm -rf tunes e
ls -la "$root"
