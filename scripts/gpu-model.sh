#!/usr/bin/env bash
# Issue 37 on the GPU machine, from a folder $G that holds the `tensortune` binary, the Python
# package (python/), the examples (examples/) and this script. Steps (STEPS, in order):
#   pytest    the Python tests with torch and CUDA
#   bert      BERT-base (batch 8, sequence 384): eager profiled, captured, tuned, applied, timed
#   compile   ResNet-50 N=32: eager against torch.compile alone (fills the Inductor cache)
#   smoke     ResNet-50 N=1 against torch.compile in COMPILE_MODE (default: default), quickly
#   r50-1     ResNet-50 N=32 tuned from nothing on GPU 0 (its cores only: CORES_1), timed
#   r50-all   the same job on every GPU (cuda:all), timed with torch.compile in the same rounds
#   r50-n1    ResNet-50 N=1 tuned from nothing on GPU 0 (N1_TRIALS), against eager
#   r50-prof  r50-1 with every graph profiled (eager, torch.compile in COMPILE_MODE, tuned and each
#             --variant in VARIANTS), the outputs against the float32 model, the bundle kept
#   r50-reuse ResNet-50 N=32 from the tuned workdir in R50_REUSE (a kept bundle; no tuning), profiled
#   bert-reuse  BERT likewise from BERT_REUSE
# "a&b+c" runs a beside b then c (on different GPUs, GPU_<step>, and cores, CORES_<step>), then
# waits for both. Budgets from the environment: R50_TRIALS, BERT_TRIALS, PER_WORKLOAD.
# Each tune starts with an empty cubin cache (XDG_CACHE_HOME per step); Inductor's cache
# (TORCHINDUCTOR_CACHE_DIR) is shared, so `r50-all` compiles what `compile` compiled warm.
# A step's workdir (suite, tune.json, bundle with its cubins; no database) is kept in
# $OUT/<step>-workdir.tar.gz for the r50-prof, r50-1 and bert steps, for a later *-reuse.
# Usage there: G=.gpu-model2 STEPS="pytest bert" bash .gpu-model2/scripts/gpu-model.sh
set -uo pipefail
G=$(cd "${G:-.gpu-model2}" && pwd)
OUT=${OUT:-$(mktemp -d)}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export TENSORTUNE_CUDA_INCLUDE=${TENSORTUNE_CUDA_INCLUDE:-/usr/local/cuda/include}
export PYTHONPATH=$G/python PYTHONUNBUFFERED=1 TENSORTUNE=$G/tensortune
work=$(mktemp -d)
export TORCHINDUCTOR_CACHE_DIR=$work/inductor
R50_TRIALS=${R50_TRIALS:-600} PER_WORKLOAD=${PER_WORKLOAD:-40}
{
  nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,driver_version --format=csv
  nproc
  python3 -c 'import torch, triton, transformers, torchvision; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, "torchvision", torchvision.__version__, "cudnn", torch.backends.cudnn.version())'
  date -u +%FT%TZ
} 2>&1 | tee "$OUT/gpu.txt"

# step NAME SECS COMMAND...: runs COMMAND in $work/NAME on GPU_NAME (default 0) and cores CORES_NAME
# (default all), its own cubin cache; log in $OUT/NAME.log, wall in gpu.txt.
step() {
  local name=$1 secs=$2; shift 2
  local var=${name//-/_} t0=$SECONDS
  local gpu cores
  gpu=$(eval echo "\${GPU_$var:-}") cores=$(eval echo "\${CORES_$var:-}")
  mkdir -p "$work/$name" "$work/cache-$name"
  (
    cd "$work/$name" || exit 1
    [ -n "$gpu" ] && export CUDA_VISIBLE_DEVICES=$gpu
    export XDG_CACHE_HOME=$work/cache-$name
    if [ -n "$cores" ]; then timeout "$secs" taskset -c "$cores" "$@"; else timeout "$secs" "$@"; fi
  ) > "$OUT/$name.log" 2>&1
  echo "$name: rc $? in $((SECONDS - t0)) s (gpu ${gpu:-all}, cores ${cores:-all})" | tee -a "$OUT/gpu.txt"
}

run_step() {
  local r50=("$G/examples/resnet50.py" --batch 32 --total-trials "$R50_TRIALS" --trials "$PER_WORKLOAD")
  case $1 in
    pytest) step pytest 120 python3 -m pytest -q -p no:cacheprovider "$G/python/tests" ;;
    bert) step bert "${BERT_SECS:-240}" python3 "$G/examples/bert.py" --batch 8 --profile --reference ${BERT_VARIANTS:-} ${BERT_FLAGS:-} \
      --total-trials "${BERT_TRIALS:-300}" --trials 100 --workdir "$work/bert/run" ;;
    compile) step compile "${COMPILE_SECS:-420}" python3 "$G/examples/resnet50.py" --batch 32 --compile-only \
      --workdir "$work/compile/run" ;;
    smoke) step smoke "${SMOKE_SECS:-150}" python3 "$G/examples/resnet50.py" --batch 1 --compile-only \
      --compile-mode "${COMPILE_MODE:-default}" --rounds 5 --workdir "$work/smoke/run" ;;
    r50-1) step r50-1 "${R50_1_SECS:-400}" python3 "${r50[@]}" --device cuda:0 --workdir "$work/r50-1/run" ;;
    r50-prof) step r50-prof "${R50_PROF_SECS:-420}" python3 "${r50[@]}" --device cuda:0 --profile --reference \
      --compare-compile --compile-mode "${COMPILE_MODE:-default}" ${VARIANTS:-} --workdir "$work/r50-prof/run" ;;
    r50-reuse) mkdir -p "$work/r50-reuse/run" && cp -r "$R50_REUSE"/. "$work/r50-reuse/run/" &&
      step r50-reuse "${R50_REUSE_SECS:-300}" python3 "${r50[@]}" --skip-tune --profile --reference ${VARIANTS:-} \
      ${R50_REUSE_FLAGS:-} --workdir "$work/r50-reuse/run" ;;
    bert-reuse) mkdir -p "$work/bert-reuse/run" && cp -r "$BERT_REUSE"/. "$work/bert-reuse/run/" &&
      step bert-reuse "${BERT_SECS:-240}" python3 "$G/examples/bert.py" --batch 8 --skip-tune --profile --reference \
      ${BERT_VARIANTS:-} ${BERT_FLAGS:-} --workdir "$work/bert-reuse/run" ;;
    r50-n1) step r50-n1 "${R50_N1_SECS:-240}" python3 "$G/examples/resnet50.py" --batch 1 --total-trials "${N1_TRIALS:-300}" \
      --trials "$PER_WORKLOAD" --device cuda:0 --workdir "$work/r50-n1/run" ;;
    r50-all) step r50-all "${R50_ALL_SECS:-300}" python3 "${r50[@]}" --device cuda:all --compare-compile \
      --workdir "$work/r50-all/run" ;;
    *) echo "unknown step $1" >&2 ;;
  esac
}

# STEPS: words run in order; "a&b+c" (no spaces) runs a beside b-then-c.
for group in ${STEPS:-pytest bert}; do
  pids=()
  for branch in ${group//&/ }; do
    (for s in ${branch//+/ }; do run_step "$s"; done) &
    pids+=($!)
  done
  wait "${pids[@]}"
done
# Where each tuning job's wall went (per GPU worker, trials and finalists), from its database.
for s in r50-1 r50-all r50-n1 r50-prof; do
  [ -f "$work/$s/run/tune.db" ] && { echo "=== $s"; python3 "$G/scripts/model-timeline.py" "$work/$s/run/tune.db"; } \
    >> "$OUT/timelines.txt" 2>&1
done
for s in r50-prof r50-1 bert; do
  [ -d "$work/$s/run/bundle" ] && tar czf "$OUT/$s-workdir.tar.gz" -C "$work/$s/run" --exclude='*.db*' --exclude='*.cu' .
done
(cd "$work" && tar czf "$OUT/results.tar.gz" --exclude='*.db*' --exclude='*.cubin' --exclude='*.cu' \
  --exclude='inductor' --exclude='cache-*' . 2>/dev/null)
for f in "$OUT"/*.log; do
  echo "=== $f"
  grep -E -A12 "interleaved, median|one eager forward|one replay of|torch.compile: first|against the float32|^model |trials in|passed|failed|Error|error:" "$f" | head -150
done
cat "$OUT/gpu.txt" "$OUT/timelines.txt" 2>/dev/null
