#!/usr/bin/env bash
# The product's checks on a GPU machine: a short driver of `tensortune` commands. Nothing is built
# there: scripts/gpu-pack.sh builds release binaries here and copies them into .gpu/ (carry it).
# Logs go to $OUT/logs/, packed into $OUT/logs.tar.gz at the end; JSON results go to $OUT; a short
# summary is printed last. The lab's diagnostics (A/B runs, ncu, sustained load) are in lab/.
#
#   scripts/gpu-check.sh STEP...
#     selftest   `tensortune selftest`: every template x input type x layout and conv path, a spread of
#                configs each (SELFTEST_CONFIGS, default 4), every output element checked;
#                SELFTEST_ARGS adds flags (e.g. "--template wgmma_gemm --dtype f16")
#     bench      `tensortune bench` of each suite of BENCH_SUITES (default: default large conv types
#                types-conv; held-out ones as heldout/NAME), BENCH_TRIALS each (default: 100 for
#                default, 300 for large and conv, 200 for types and types-conv); BENCH_ARGS adds flags;
#                $OUT/NAME-bench.json
#     throughput `tensortune bench --throughput` (cold cache), THROUGHPUT_TRIALS per workload (200)
#     scaling    bench --throughput on cuda:0, then on cuda:all (a machine with several GPUs)
#     tune       `tensortune tune` (embedded tracker + local worker) on 512x64x512 and 1024^3
#     cluster    a tracker and two workers on GPU 0 as separate processes, a 200-trial job; then one
#                worker on every GPU (cuda:all) and a 100-trial job
#     gputests   the tests CI leaves out: the worker's, which need a GPU (daemon and self-test on
#                cuda:0), and kernels' exhaustive NVRTC compile of one workload's every valid config
#                (on the many cores)
#     faults     a 50-trial job whose worker injects an out-of-bounds write and a hang (FAULTS, default
#                oob:5,hang:12): expects 1 launch_error, 1 timeout, the rest ok
#     sanitize   compute-sanitizer memcheck, racecheck and synccheck on each TEMPLATE KEY CONFIG line of
#                scripts/sanitize-cases.txt (SANITIZE_MATCH keeps the lines that contain it), each
#                kernel alone in `tensortune selftest --config ... --no-baseline`
#     export     bench of the default suite (database kept; EXPORT_DB: one tuned before), `tensortune export`,
#                examples/bundle/gemm_check.c run EXPORT_RUNS times: every element against cuBLAS, ours/vendor
#                (worker's pick, sample pairs from a cool start) against the record's
#     energy     issue 39 (ENERGY_PARTS: counter repeat suites regimes objective): NVML's counter, energy repeat and
#                2K, suites per regime, records against cool-start and held selftests, objective tunes (energy-check.py)
#     sweep      scripts/sweep.sh SWEEP_SUITE (default suites/sweeps/union-v14.json): ground truth for
#                the search, $OUT/sweep.jsonl.gz
#   CLOCKS=1 samples the SM clock, power and clock-event reasons every 200 ms into logs/clocks.csv.
#   DEADLINE=S skips the steps that would start S seconds after the script did.
set -uo pipefail
source "$(dirname "$0")/gpu-common.sh"
source "$(dirname "$0")/gpu-energy.sh"
# The table a bench or tune prints at its end.
table() { sed -n '/^suite/,$p' "$1" | tee -a "$SUMMARY"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >"$LOGS/nvidia-smi.txt" 2>&1
say "$(date -u +%FT%TZ) $(tail -1 "$LOGS/nvidia-smi.txt") commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

step_selftest() {
  timeout 1800 "$BIN/tensortune" selftest --configs "${SELFTEST_CONFIGS:-4}" --json "$OUT/selftest.json" ${SELFTEST_ARGS:-} \
    >"$LOGS/selftest.log" 2>&1
  say "selftest exit $?: $(grep '^total:' "$LOGS/selftest.log")"
  grep -v '^device\|^template \|^total' "$LOGS/selftest.log" | grep -v ' 0  $' | cut -c1-400 | head -30 | tee -a "$SUMMARY"
}

step_bench() {
  local suite name trials start
  for suite in ${BENCH_SUITES:-default large conv types types-conv}; do
    name=$(basename "$suite")
    case "$name" in default) trials=100 ;; large | conv) trials=300 ;; *) trials=200 ;; esac
    start=$(date +%s.%N)
    timeout 1500 "$BIN/tensortune" bench --suite "suites/$suite.json" --trials "${BENCH_TRIALS:-$trials}" ${BENCH_ARGS:-} \
      --json "$OUT/$name-bench.json" >"$LOGS/$name-bench.log" 2>&1
    say "bench $suite exit $? in $(since "$start") s"
    table "$LOGS/$name-bench.log"
  done
}

step_throughput() {
  timeout 900 "$BIN/tensortune" bench --throughput --trials "${THROUGHPUT_TRIALS:-200}" --json "$OUT/throughput.json" \
    >"$LOGS/throughput.log" 2>&1
  say "throughput exit $?"
  table "$LOGS/throughput.log"
}

# Measurement throughput on one GPU, then on every GPU of the machine, same suite and trials, cold
# cache, finalists off so the wall time is tuning alone.
step_scaling() {
  local dev
  for dev in cuda:0 cuda:all; do
    timeout 900 "$BIN/tensortune" bench --throughput --trials "${SCALING_TRIALS:-400}" --finalists 0 --device "$dev" \
      --json "$OUT/scaling-${dev/:/-}.json" >"$LOGS/scaling-${dev/:/-}.log" 2>&1
    say "scaling $dev exit $?"
    table "$LOGS/scaling-${dev/:/-}.log"
  done
}

step_tune() {
  local shape name start
  for shape in "512 64 512" "1024 1024 1024"; do
    set -- $shape
    name="tune_$1x$2x$3" start=$(date +%s.%N)
    timeout 900 "$BIN/tensortune" --db "$LOGS/tune.db" tune matmul --m "$1" --n "$2" --k "$3" --trials "${TUNE_TRIALS:-100}" \
      --json "$OUT/$name.json" >"$LOGS/$name.log" 2>&1
    say "$name exit $? in $(since "$start") s"
    grep -E "trials|best|vendor|check|config" "$LOGS/$name.log" | tee -a "$SUMMARY"
  done
}

# Starts a tracker on port $1 with database $2 in the background; sets TRACKER_PID and URL.
start_tracker() {
  URL=http://127.0.0.1:$1
  "$BIN/tensortune-tracker" --listen "127.0.0.1:$1" --db "$2" >"$2.log" 2>&1 &
  TRACKER_PID=$!
  sleep 1
}

# Waits until the tracker at $URL lists at least $1 online workers (60 s at most).
wait_workers() {
  for _ in $(seq 1 60); do
    [ "$("$BIN/tensortune" --tracker "$URL" workers 2>/dev/null | grep -c online)" -ge "$1" ] && return 0
    sleep 1
  done
  say "fewer than $1 workers came online"
  return 1
}

# A job through a tracker of its own: $1 name, $2 port, $3 trials, $4 workers to wait for, then the
# workers' --device and --name pairs.
cluster_job() {
  local name=$1 port=$2 trials=$3 want=$4 pids=() start
  shift 4
  start_tracker "$port" "$LOGS/$name.db"
  while [ $# -ge 2 ]; do
    NO_COLOR=1 "$BIN/tensortune-worker" --tracker "$URL" --device "$1" --name "$2" --compile-threads 8 \
      >"$LOGS/$name-worker-$2.log" 2>&1 &
    pids+=($!)
    shift 2
  done
  wait_workers "$want"
  start=$(date +%s.%N)
  timeout 900 "$BIN/tensortune" --tracker "$URL" tune matmul --m 1024 --n 1024 --k 1024 --trials "$trials" \
    --json "$OUT/$name.json" >"$LOGS/$name.log" 2>&1
  say "$name job exit $? in $(since "$start") s"
  grep -E "trials|best|vendor|check" "$LOGS/$name.log" | tee -a "$SUMMARY"
  "$BIN/tensortune" --tracker "$URL" workers | tee -a "$SUMMARY"
  kill "${pids[@]}" "$TRACKER_PID"
  wait "${pids[@]}" "$TRACKER_PID" 2>/dev/null
}

step_cluster() {
  cluster_job cluster 7171 200 2 cuda:0 gpu0-a cuda:0 gpu0-b
  cluster_job multigpu 7173 100 "$(nvidia-smi -L | grep -c '^GPU')" cuda:all all
}

step_gputests() {
  TENSORTUNE_WORKER_BIN="$BIN/tensortune-worker" timeout 1200 "$BIN/worker-gpu-tests" --ignored --nocapture --test-threads 1 \
    >"$LOGS/gputests.log" 2>&1
  say "gputests exit $?: $(grep 'test result' "$LOGS/gputests.log")"
  timeout 1200 "$BIN/compile-tests" --ignored --nocapture >"$LOGS/compile-tests.log" 2>&1
  say "compile-tests exit $?: $(grep 'test result' "$LOGS/compile-tests.log")"
}

step_faults() {
  local faults=${FAULTS:-oob:5,hang:12} worker start records="$LOGS/faults-records.jsonl"
  start_tracker 7172 "$LOGS/faults.db"
  NO_COLOR=1 TENSORTUNE_INJECT_FAULTS=$faults "$BIN/tensortune-worker" --tracker "$URL" --device cuda:0 --name faults \
    --compile-threads 8 --measure-timeout-secs 10 >"$LOGS/faults-worker.log" 2>&1 &
  worker=$!
  wait_workers 1
  start=$(date +%s.%N)
  timeout 600 "$BIN/tensortune" --tracker "$URL" tune matmul --m 512 --n 64 --k 512 --trials 50 --finalists 0 \
    --json "$OUT/faults.json" >"$LOGS/faults.log" 2>&1
  say "faults job ($faults) exit $? in $(since "$start") s"
  "$BIN/tensortune" --tracker "$URL" records export -o "$records" >/dev/null 2>&1
  local launch hung other verdict=FAIL
  launch=$(grep -c '"status":"launch_error"' "$records")
  hung=$(grep -c '"status":"timeout"' "$records")
  other=$(grep -v '"status":"ok"' "$records" | grep -vc '"status":"launch_error"\|"status":"timeout"')
  [ "$launch" = 1 ] && [ "$hung" = 1 ] && [ "$other" = 0 ] && verdict=PASS
  say "faults $verdict: $launch launch_error, $hung timeout, $other other failures of $(wc -l <"$records") records" \
    "(expected 1, 1, 0); $(grep -c 'started a fresh measuring child' "$LOGS/faults-worker.log") child restarts"
  kill "$worker" "$TRACKER_PID"
  wait "$worker" "$TRACKER_PID" 2>/dev/null
}

step_sanitize() {
  local template key cfg n=0 tool log
  while read -r template key cfg; do
    [[ -z "$template" || "$template" == \#* ]] && continue
    [[ "$template $key $cfg" == *"${SANITIZE_MATCH:-}"* ]] || continue
    n=$((n + 1))
    local run=("$BIN/tensortune" selftest --template "$template" --workload "$key" --config "$cfg" --no-baseline --samples 1)
    say "sanitize $n: $template $key: $(timeout 60 "${run[@]}" 2>&1 | grep -m1 ': [a-z_]* ' | sed 's/.*}: //' | cut -c1-160)"
    for tool in memcheck racecheck synccheck; do
      log="$LOGS/sanitize-$n-$tool.log"
      timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool $tool --print-limit 20 "${run[@]}" >"$log" 2>&1
      say "  $tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tr '\n' ' ')"
      grep -E "Error|Race|Invalid|hazard" "$log" | head -4 | tee -a "$SUMMARY"
    done
  done <scripts/sanitize-cases.txt
}

step_export() {
  local db=${EXPORT_DB:-} run
  [ -n "$db" ] || timeout 1500 "$BIN/tensortune" bench --trials "${BENCH_TRIALS:-100}" ${EXPORT_ARGS:-} --json "$LOGS/export-bench.json" \
    >"$LOGS/export-bench.log" 2>&1
  # bench names its database after --json and says which; EXPORT_DB: a database tuned before, no bench.
  [ -n "$db" ] || { say "export: bench exit $?"; table "$LOGS/export-bench.log"; db=$(sed -n 's/^bench database: //p' "$LOGS/export-bench.log" | head -1); }
  "$BIN/tensortune" --db "$db" export --suite suites/default.json -o "$LOGS/bundle" >"$LOGS/export.log" 2>&1
  say "export exit $?"
  tee -a "$SUMMARY" <"$LOGS/export.log"
  nvcc -O2 -o "$LOGS/gemm_check" examples/bundle/gemm_check.c -Ibundle/c -lcuda -lcublas -lcublasLt -lm -ldl \
    >"$LOGS/gemm_check-build.log" 2>&1
  say "gemm_check build exit $?"
  for run in $(seq "${EXPORT_RUNS:-1}"); do # separate processes; GEMM_CHECK: SAMPLES ROUNDS WARM_MS PAUSE_MS
    timeout 900 "$LOGS/gemm_check" "$LOGS/bundle" ${GEMM_CHECK:-10 2 0 500} >"$LOGS/gemm_check-$run.log" 2>&1
    say "gemm_check run $run exit $?"
    grep -v '^round' "$LOGS/gemm_check-$run.log" | tee -a "$SUMMARY"
  done
  rm -f "$LOGS/gemm_check"
}

# Issue 39: scripts/gpu-energy.sh (its header lists the ENERGY_* settings).
step_energy() { energy_step; }

step_sweep() {
  OUT="$OUT" timeout 3000 scripts/sweep.sh "${SWEEP_SUITE:-suites/sweeps/union-v14.json}" ${SWEEP_RANGE:-} \
    >"$LOGS/sweep.log" 2>&1
  say "sweep exit $?"
  tail -30 "$LOGS/sweep.log" | tee -a "$SUMMARY"
}

# Runs one step; fails for a name that is not a step.
dispatch() {
  case "$1" in
    selftest | bench | throughput | scaling | tune | cluster | gputests | faults | sanitize | export | energy | sweep) "step_$1" || true ;;
    *) return 1 ;;
  esac
}

run_steps "$@"
