# Sourced by scripts/gpu-check.sh and lab/gpu-lab.sh on the GPU machine: the CUDA toolkit on the
# paths, $OUT (the device tool's folder, or a fresh one) with logs/ and summary.txt in it, $BIN
# (the binaries scripts/gpu-pack.sh put in .gpu/), and `say` (print and add to the summary) and
# `since T0` (seconds since a `date +%s.%N`).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export TENSORTUNE_CUDA_INCLUDE=${TENSORTUNE_CUDA_INCLUDE:-/usr/local/cuda/include}
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$(mktemp -d)}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BIN=$(pwd)/.gpu
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# Samples UTC time, SM clock, board power, temperature and (where nvidia-smi knows the field) the
# clock-event reasons every $2 ms into the CSV $1, in the background; prints the sampler's pid.
sample_clocks() {
  local fields=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$fields --format=csv >/dev/null 2>&1 || fields=timestamp,clocks.sm,power.draw,temperature.gpu
  nvidia-smi --query-gpu=$fields --format=csv,noheader -lms "$2" >"$1" 2>&1 &
  echo $!
}

# Runs each step named in "$@" through the script's `dispatch` (a `case` of its steps), then packs
# the logs into $OUT/logs.tar.gz and prints the summary. CLOCKS=1 samples the clocks every 200 ms
# into logs/clocks.csv meanwhile; DEADLINE=S skips the steps that would start S seconds after the
# first did, so that one device call ends inside its limit with its logs packed.
run_steps() {
  local sampler= t0 step
  [ "${CLOCKS:-0}" = 1 ] && sampler=$(sample_clocks "$LOGS/clocks.csv" 200)
  t0=$(date +%s)
  for step in "$@"; do
    if [ -n "${DEADLINE:-}" ] && [ $(($(date +%s) - t0)) -gt "$DEADLINE" ]; then
      say "skipped $step: past DEADLINE=$DEADLINE s"
      continue
    fi
    dispatch "$step" || { echo "unknown step $step; the steps are listed at the top of $0" >&2; exit 2; }
  done
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
  echo "=== summary"
  cat "$SUMMARY"
}
