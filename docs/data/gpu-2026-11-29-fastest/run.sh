#!/usr/bin/env bash
# Lead's device call wrapper (session of 2026-11-29 04:00): PHASES, SUITES, BUDGET from the env;
# FROM=dir of an earlier call's energy-tuned.tar.gz to resume lists/holds from its tsvs; TUNES=1
# adds three default tunes of f16 512x64x512 first (issue 35's 5 s bar), each in a fresh folder.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$OUT
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$root/card.txt" 2>&1
cat "$root/card.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
if [ "${TUNES:-0}" = 1 ]; then
  for i in 1 2 3; do
    d=$(mktemp -d /tmp/tune.XXXX)
    t0=$(date +%s.%N)
    (cd "$d" && "$OLDPWD/.gpu/tensortune" --db t.db tune matmul --m 512 --n 64 --k 512 \
      --device cuda:0 >"$root/tune-$i.log" 2>&1)
    echo "tune $i exit $? wall $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }") s"
  done
fi
mkdir -p "$root/e"
if [ -n "${FROM:-}" ]; then tar -xzf "$FROM/energy-tuned.tar.gz" -C "$root/e" && rm -f "$root/e"/*/gemm_check-*.log; fi
OUT=$root/e ENERGY_TUNED_SUITES="${SUITES:-default large}" ENERGY_TUNED_PHASES="${PHASES:-bench cool export}" \
  ENERGY_TUNED_BUDGET_S=${BUDGET:-520} ENERGY_COMMIT=$(git rev-parse --short HEAD) bash scripts/energy-tuned.sh
ls -la "$root" "$root/e"
