#!/usr/bin/env bash
# Ground truth for the search, on the GPU machine (binaries from scripts/gpu-pack.sh in .gpu/):
# every workload of SUITE (or the ones given by position) swept with the random tuner, no
# finalists: a uniform sample of TRIALS valid configs of its union space, the whole space where it
# is smaller. One GPU per workload at a time; every GPU of the machine works. Each workload is one
# job in a database of its own, so one cut short at WORKLOAD_TIMEOUT still exports what it measured.
#
#   scripts/sweep.sh SUITE [FIRST [COUNT]]     (workloads FIRST..FIRST+COUNT-1, 1-based)
#   TRIALS (3000), SAMPLES (5), SEED (1), WORKLOAD_TIMEOUT (seconds, 400)
#
# Writes $OUT/sweep.jsonl.gz (the records, `tensortune records export` lines, the card named in each
# record's device class) and $OUT/sweep-summary.txt (one line a workload: records, ok, best, vendor).
set -uo pipefail
suite=${1:?usage: scripts/sweep.sh SUITE [FIRST [COUNT]]}
first=${2:-1}
count=${3:-1000}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export TENSORTUNE_CUDA_INCLUDE=${TENSORTUNE_CUDA_INCLUDE:-/usr/local/cuda/include}
OUT=${OUT:-$(mktemp -d)}
BIN=$(pwd)/.gpu
work=$(mktemp -d /tmp/sweep.XXXXXX)
mapfile -t keys < <(grep -o '"workload": *"[^"]*"' "$suite" | sed 's/.*: *"//; s/"$//' | tail -n "+$first" | head -n "$count")
gpus=$(nvidia-smi -L | grep -c '^GPU')
cores=$(nproc)
threads=$(( cores / gpus > 1 ? cores / gpus - 1 : 1 ))
echo "sweep: ${#keys[@]} workloads on $gpus GPU(s), $threads compile threads each; $(nvidia-smi -L | head -1)"
# GPU g takes workloads g, g+gpus, ...: a background loop per GPU.
for ((g = 0; g < gpus; g++)); do
  (
    for ((i = g; i < ${#keys[@]}; i += gpus)); do
      key=${keys[$i]} name=$(echo "${keys[$i]}" | tr '/,=' '___')
      t0=$(date +%s)
      timeout "${WORKLOAD_TIMEOUT:-400}" "$BIN/tensortune" bench --suite "$suite" --filter "$key" --device "cuda:$g" \
        --compile-threads "$threads" --tuner random --seed "${SEED:-1}" --trials "${TRIALS:-3000}" --finalists 0 \
        --samples "${SAMPLES:-5}" --json "$work/$name.json" >"$work/$name.log" 2>&1
      echo "gpu $g exit $? in $(( $(date +%s) - t0 )) s: $key"
    done
  ) &
done
wait
: >"$work/all.jsonl"
for d in "$work"/*.db; do
  [ -e "$d" ] || continue
  "$BIN/tensortune" --db "$d" records export -o "${d%.db}.jsonl" >/dev/null 2>&1
  cat "${d%.db}.jsonl" >>"$work/all.jsonl"
done
gzip -c "$work/all.jsonl" >"$OUT/sweep.jsonl.gz"
python3 - "$work/all.jsonl" >"$OUT/sweep-summary.txt" <<'PY'
import json, sys, collections
by = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    by[r["workload"]].append(r)
for w, rs in by.items():
    ok = [r for r in rs if r.get("status") == "ok" and r.get("median_us")]
    best = min((r["median_us"] for r in ok), default=float("nan"))
    base = [r["baseline_us"] for r in ok if r.get("baseline_us")]
    vendor = sorted(base)[len(base) // 2] if base else float("nan")
    print(f"{len(rs):5d} records {len(ok):5d} ok  best {best:10.2f} us  vendor {vendor:10.2f} us  {vendor / best:5.2f}x  {w}")
PY
cat "$OUT/sweep-summary.txt"
tar czf "$OUT/sweep-logs.tar.gz" -C "$work" $(cd "$work" && ls *.log) 2>/dev/null
echo "sweep records: $(wc -l <"$work/all.jsonl")"
