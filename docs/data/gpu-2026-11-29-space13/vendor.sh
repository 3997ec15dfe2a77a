#!/usr/bin/env bash
# Lead, 2026-11-29 ~15:45: issue 35 item 6 — the swept workloads whose sampled best read under 0.98x the vendor, at 300
# trials with today's space (merged main d8aebb5 = .gpu-lead12/M.xz), the vendor's algorithm and every cuBLASLt candidate's
# time (worker debug log).
set -uo pipefail
R=$PWD W=$OUT/w
mkdir -p "$W"; xz -dc "$R/.gpu-lead12/M.xz" > /tmp/tt && chmod +x /tmp/tt; T=/tmp/tt
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TENSORTUNE_CUDA_INCLUDE=/usr/local/cuda/include
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv >"$W/card.txt" 2>&1; cat "$W/card.txt"
step() { local name=$1 lim=$2; shift 2; local t0=$(date +%s%N); timeout "$lim" "$@" >"$W/$name.log" 2>&1; echo "$name rc $? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
d=$(mktemp -d /tmp/b.XXXX); (cd "$d" && XDG_CACHE_HOME=$d/c RUST_LOG=tensortune_worker=debug step bench 480 "$T" --db b.db bench --suite "$R/.gpu-lead13/short.json" --trials 300 --device cuda:0 --json "$W/bench.json"; cp b.db "$W/" 2>/dev/null; "$T" --db b.db records export > "$W/records.jsonl" 2>/dev/null)
grep -v "DEBUG\|INFO" "$W/bench.log" | tail -30
grep "cuBLASLt candidate timed" "$W/bench.log" | head -3
cd "$OUT" && gzip -f w/records.jsonl; rm -f w/b.db; tar -czf vendor.tgz w && rm -rf w && ls -la "$OUT"
