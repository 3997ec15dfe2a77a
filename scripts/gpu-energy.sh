#!/usr/bin/env bash
# The energy step of scripts/gpu-check.sh (issue 39), sourced by it: `energy_step` uses its $BIN,
# $OUT, $LOGS, $SUMMARY, `say`, `since` and `table`. Run it as `scripts/gpu-check.sh energy`.

# Issue 39 (ENERGY_PARTS, default all; scripts/energy-check.py reads the results): counter = NVML's
# counter polled in a tight loop; repeat = the same ENERGY_TRIALS random configs of ENERGY_SHAPE
# twice and at 2K; suites = bench of each ENERGY_SUITES entry (a name under suites/ or a path to
# a suite file) in each regime, the same ENERGY_BENCH_TRIALS random configs (seed
# ENERGY_REGIME_SEED) in both, then each regime's winner in the other and the objectives' picks
# (`energy-check.py winners`); regimes = ENERGY_REGIME_TRIALS (6) random configs of each
# ENERGY_REGIME_SHAPES entry ("M N K DTYPE;") tuned burst and sustained, or with
# ENERGY_REGIME_SHAPES=suites the suites part's records (ENERGY_SUITE_REGIMES: burst sustained),
# then the same bench per ENERGY_OBJECTIVES entry (energy edp slow3 = --max-slowdown 3%) on the
# regime's database (the trials reused: the jobs' picks, `energy-check.py picks`);
# the ENERGY_REGIME_CONFIGS (6) fastest then timed cool (idle ENERGY_COOL_S, 5 samples, --energy) and
# held ENERGY_HOLD_S (30 s; 0: no hold) in `selftest` (ENERGY_REFS: which of "cool hold");
# objective = tune --objective time|energy in both regimes.
energy_step() {
  local parts=" ${ENERGY_PARTS:-counter repeat suites regimes objective} " shape=(${ENERGY_SHAPE:-4096 4096 4096})
  local py=scripts/energy-check.py run k n=0 regime objective suite key cfg start name suite_records=() pick
  local job=(--tuner random --finalists 0 --energy --no-transfer)
  [[ $parts == *" counter "* ]] && python3 $py counter "$OUT/nvml-counter.json" 2>&1 | tee -a "$SUMMARY"
  if [[ $parts == *" repeat "* ]]; then
    for run in a b long; do # fresh databases: nothing reused
      k=${shape[2]} start=$(date +%s.%N); [ "$run" = long ] && k=$((2 * k))
      timeout 900 "$BIN/tensortune" --db "$LOGS/energy-$run.db" tune matmul --m "${shape[0]}" --n "${shape[1]}" --k "$k" \
        "${job[@]}" --seed 1 --trials "${ENERGY_TRIALS:-12}" >"$LOGS/energy-$run.log" 2>&1
      say "energy run $run exit $? in $(since "$start") s"
      "$BIN/tensortune" --db "$LOGS/energy-$run.db" records export --ok-only -o "$OUT/energy-$run.jsonl" >/dev/null 2>&1
    done
    python3 $py repeat "$OUT"/energy-{a,b,long}.jsonl "$OUT/energy-repeat.json" | tee -a "$SUMMARY"
  fi
  [[ $parts == *" suites "* ]] && for suite in ${ENERGY_SUITES:-default large}; do
    name=$(basename "$suite" .json); [[ $suite == */* ]] || suite=suites/$suite.json
    for regime in ${ENERGY_SUITE_REGIMES:-burst sustained}; do # the same configs in each: a winner has a record in the other
      start=$(date +%s.%N)
      timeout "${ENERGY_BENCH_TIMEOUT:-2400}" "$BIN/tensortune" --db "$LOGS/$name-$regime.db" bench --suite "$suite" "${job[@]}" \
        --seed "${ENERGY_REGIME_SEED:-1}" --trials "${ENERGY_BENCH_TRIALS:-4}" --regime "$regime" \
        --json "$OUT/$name-$regime-bench.json" </dev/null >"$LOGS/$name-$regime-bench.log" 2>&1
      say "bench $name $regime exit $? in $(since "$start") s"
      table "$LOGS/$name-$regime-bench.log"
      "$BIN/tensortune" --db "$LOGS/$name-$regime.db" records export --ok-only -o "$OUT/$name-$regime.jsonl" </dev/null >/dev/null 2>&1
      suite_records+=("$OUT/$name-$regime.jsonl")
      for objective in ${ENERGY_OBJECTIVES-energy edp slow3}; do # the same trials, reused: the jobs' picks
        case $objective in slow3) pick=(--max-slowdown 3%) ;; *) pick=(--objective "$objective") ;; esac
        timeout 600 "$BIN/tensortune" --db "$LOGS/$name-$regime.db" bench --suite "$suite" "${job[@]}" "${pick[@]}" \
          --seed "${ENERGY_REGIME_SEED:-1}" --trials "${ENERGY_BENCH_TRIALS:-4}" --regime "$regime" \
          --json "$OUT/$name-$regime-$objective-bench.json" </dev/null >"$LOGS/$name-$regime-$objective-bench.log" 2>&1
        say "bench $name $regime $objective exit $?: $(grep -c ' 0 reused' "$LOGS/$name-$regime-$objective-bench.log") workloads measured afresh"
      done
    done
    [ -s "$OUT/$name-burst.jsonl" ] && [ -s "$OUT/$name-sustained.jsonl" ] &&
      python3 $py winners "$OUT/$name-burst.jsonl" "$OUT/$name-sustained.jsonl" "$OUT/$name-winners.json" | tee -a "$SUMMARY"
    python3 $py picks "$OUT" "$name" | tee -a "$SUMMARY"
  done
  if [[ $parts == *" regimes "* ]]; then
    local shapes="${ENERGY_REGIME_SHAPES:-4096 4096 4096 bf16;1024 1024 1024 f16}" records=()
    [ "$shapes" = suites ] && shapes="" records=("${suite_records[@]}")
    while IFS=' ' read -r -d ';' m nn kk dt; do
      [ -n "$m" ] || continue
      for regime in burst sustained; do
        n=$((n + 1)) start=$(date +%s.%N)
        timeout 600 "$BIN/tensortune" --db "$LOGS/regime-$n.db" tune matmul --m "$m" --n "$nn" --k "$kk" --dtype "$dt" \
          "${job[@]}" --seed "${ENERGY_REGIME_SEED:-1}" --trials "${ENERGY_REGIME_TRIALS:-6}" --regime "$regime" </dev/null >"$LOGS/regime-$n.log" 2>&1
        say "regime $m $nn $kk $dt $regime exit $? in $(since "$start") s"
        "$BIN/tensortune" --db "$LOGS/regime-$n.db" records export --ok-only -o "$OUT/regime-$n.jsonl" </dev/null >/dev/null 2>&1
        records+=("$OUT/regime-$n.jsonl")
      done
    done <<<"$shapes;"
    n=0
    while IFS=$'\t' read -r key template cfg; do
      local one=(selftest --workload "$key" --template "$template" --config "$cfg" --no-baseline); n=$((n + 1))
      [[ " ${ENERGY_REFS:-cool hold} " == *" cool "* ]] && sleep "${ENERGY_COOL_S:-5}" && # --energy: as a burst record, idle after the reference
        "$BIN/tensortune" "${one[@]}" --samples 5 --energy --json "$LOGS/cool-$n.json" </dev/null >"$LOGS/cool-$n.log" 2>&1
      [ "${ENERGY_HOLD_S:-30}" = 0 ] || [[ " ${ENERGY_REFS:-cool hold} " != *" hold "* ]] || timeout 300 "$BIN/tensortune" "${one[@]}" --samples 10 --energy \
        --hold "${ENERGY_HOLD_S:-30}" --json "$LOGS/hold-$n.json" </dev/null >"$LOGS/hold-$n.log" 2>&1
      say "regime config $n: selftest cool and held exit $?"
    done < <(python3 $py configs "${records[@]}" "${ENERGY_REGIME_CONFIGS:-6}")
    python3 $py regimes "${records[@]}" -- "$LOGS"/cool-*.json "$LOGS"/hold-*.json "$OUT/regimes.json" | tee -a "$SUMMARY"
  fi
  if [[ $parts == *" objective "* ]]; then # the energy objective's pick against the time's
    for run in burst,time burst,energy sustained,time sustained,energy; do
      regime=${run%,*} objective=${run#*,} start=$(date +%s.%N) name=energy-${run/,/-}
      timeout 1800 "$BIN/tensortune" --db "$LOGS/$name.db" tune matmul --m "${shape[0]}" --n "${shape[1]}" --k "${shape[2]}" \
        --trials "${ENERGY_TUNE_TRIALS:-60}" --regime "$regime" --objective "$objective" --energy --json "$OUT/$name.json" >"$LOGS/$name.log" 2>&1
      say "tune $regime $objective exit $? in $(since "$start") s"
      grep -E "tuned|best|vendor|energy|config" "$LOGS/$name.log" | tee -a "$SUMMARY"
    done
  fi
}
