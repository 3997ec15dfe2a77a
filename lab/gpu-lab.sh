#!/usr/bin/env bash
# Lab: the diagnostics that built the templates (A/B timings, sustained load, ncu, instruction mix,
# memory roofline, cluster occupancy), apart from the product's checks in scripts/gpu-check.sh.
# lab/README.md says what each is for and when it was last useful. Run on the lent GPU machine
# over a copy of the working tree, with the binaries scripts/gpu-pack.sh put in .gpu/ (the lab ones
# with GPU_PACK_LAB=1). Logs go to $OUT/logs.tar.gz, a short summary is printed last.
#
#   lab/gpu-lab.sh STEP...
#     ab         run_one on each KEY CONFIG line of AB_FILE (AB_TEMPLATE, default wgmma_gemm), the vendor
#                timed beside each; AB_BINS="run_one run_one_old" compares two builds in ABBA order
#     abwin      step ab on the winners of a bench JSON (ABWIN_JSON) of template AB_TEMPLATE
#     sustain    ours alone, then ours and the vendor's pick alternating, under sustained load, with the
#                clock and power sampled (SUSTAIN_FILE, default lab/inputs/ab-wgmma-sustain-pick.txt)
#     hot        each kernel alone under sustained load (HOT_FILE, default lab/inputs/hot-14336.txt:
#                KEY CONFIG for ours, KEY CONFIG gemmex|lt:N for a vendor algorithm alone), held for
#                HOT_REPEAT x HOT_SAMPLES samples: the late time, clock, NVML power and energy per launch;
#                HOT_NAMES=1 names each vendor algorithm's kernels; HOT_TIMEOUT (120 s) per line
#     diag       each KEY CONFIG of DIAG_FILE (default lab/inputs/diag-14336.txt) and every cuBLAS
#                candidate of its baseline under ncu (duration, DRAM bytes, L2 traffic and hit rate,
#                clock); DIAG_VENDOR=first|0; NCU_EXTRA adds metrics (lab/inputs/diag-l2.txt)
#     convdiag   a bench of CDIAG_SUITE (required), then each best kernel and cuDNN's under ncu
#     instmix    executed instructions by opcode (ncu) of each KEY CONFIG of INSTMIX_FILE
#                (lab/inputs/instmix-14336.txt), with INSTMIX_VENDOR=1 of the vendor kernels too
#     vendorkern the cuBLAS kernels run_one's baseline launches for VENDOR_KEYS (ncu: name, grid, block,
#                cluster, shared memory, duration)
#     profile    ncu sections of one kernel (PROFILE_KEY, PROFILE_CONFIG, TT_TEMPLATE; PROFILE_SOURCE=1
#                adds the stall sampling by SASS line, PROFILE_VENDOR=1 the vendor kernel's sections)
#     sass       instruction mix of the three largest cubins of the worker's cache (cuobjdump)
#     compile    NVRTC throughput: threads in one process, and several processes (compile_bench)
#     repeat     a small and a large config, each timed in two run_one processes, warm and with the L2
#                flushed: the relative difference of the medians (and flushed vs warm)
#     cudnn      the cuDNN baseline alone (cudnn_check): the conv suite's shapes x types, its algorithm
#                and cross-check; and a run without cuDNN
#     membw      the memory roofline of a streaming layer (lab/membw.cu, nvcc): MEMBW_SIZES read/write MB
#     clusters   how many clusters of 1-8 blocks run at once, and a launch of one wave of them, empty and
#                with only our kernels' meetings (CLUSTERS_SHAPES, "KiB threads" pairs)
#     splitpairs wgmma's K splits of single blocks and of multicast pairs, and stream-K of whole shares
#                (SPLITPAIRS_KNOB=stream_k:1), on long-K GEMMs and deep-K conv layers: `tensortune
#                selftest --knob persistent:0`, SPLITPAIRS_CONFIGS per workload, splits counted by kind
#     regstore   the epilogue that stores from registers: `tensortune selftest --knob epilogue:direct`
#                over every output width, ragged tiles, beta != 0 and a K split; then memcheck on two
#     exportdiag the export check of gpu-check.sh with its variants: EXPORT_RUNS (WARM_MS:PAUSE_MS[:FLAGS]
#                per gemm_check run), EXPORT_RUNONE=N (the bundle's first N kernels through run_one),
#                EXPORT_DIAG=1 (nsys and ncu of the same kernels in gemm_check and in run_one)
#   CLOCKS=1 (any steps) samples the SM clock, power and clock-event reasons every 200 ms: logs/clocks.csv
set -uo pipefail
source "$(dirname "$0")/../scripts/gpu-common.sh"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >"$LOGS/nvidia-smi.txt" 2>&1
say "$(date -u +%FT%TZ) $(tail -1 "$LOGS/nvidia-smi.txt")"

step_sass() {
  local cache=${XDG_CACHE_HOME:-$HOME/.cache}/tensortune/cubin
  local n=0
  for f in $(ls -S "$cache"/*.cubin 2>/dev/null | head -3); do
    cuobjdump -sass "$f" >"$LOGS/sass-$n.txt" 2>&1
    say "$(basename "$f"): $(grep -oE '^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9]+' "$LOGS/sass-$n.txt" | awk '{print $2}' | sort | uniq -c | sort -rn | head -8 | tr -s ' \n' ' ')"
    n=$((n + 1))
  done
}

step_compile() {
  local key="matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0"
  for t in 1 4 8 16; do
    "$BIN/compile_bench" "$key" 48 $t 2>&1 | tee -a "$SUMMARY"
  done
  local start=$(date +%s.%N)
  for p in 0 1 2 3; do "$BIN/compile_bench" "$key" 24 4 $((100 + p * 24)) >"$LOGS/compile-proc-$p.log" 2>&1 & done
  wait
  say "4 processes x 4 threads: 96 kernels in $(since "$start") s"
}

step_profile() {
  local key=${PROFILE_KEY:-"matmul/m4096n4096k4096/nn/f16,f32,f32/alpha=1,beta=0"}
  local cfg=${PROFILE_CONFIG:-'{"block_k":64,"block_m":128,"block_n":256,"frag":"m16n16k16","skew":1,"split_k":1,"split_reduce":"workspace","stages":3,"swizzle":1,"warps_k":1,"warps_m":2,"warps_n":4,"min_blocks":1}'}
  "$BIN/run_one" "$key" "$cfg" 10 3 2>&1 | tee -a "$SUMMARY"
  timeout 300 ncu --clock-control none --kernel-name regex:tt_w --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
    "$BIN/run_one" "$key" "$cfg" 3 1 >"$LOGS/ncu.txt" 2>&1
  say "ncu exit $?"
  if [ -n "${PROFILE_SOURCE:-}" ]; then
    # Where the warps stall, by SASS instruction (the top lines of the source-counters table).
    timeout 300 ncu --clock-control none --kernel-name regex:tt_w --launch-skip 1 --launch-count 1 \
      --section SourceCounters --section InstructionStats --print-details all \
      "$BIN/run_one" "$key" "$cfg" 3 1 >"$LOGS/ncu-source.txt" 2>&1
    say "ncu source exit $?"
    grep -iE -A14 "Warp Stall Sampling|stall" "$LOGS/ncu-source.txt" | head -60 | tee -a "$SUMMARY"
  fi
  grep -E "stalled" "$LOGS/ncu.txt" | sort -k3 -n -r | head -12 | tee -a "$SUMMARY"
  grep -E "Throughput|Duration|Pipe|Stall|Warp Cycles|Issued|Occupancy|Bank|L2 Hit|L1/TEX Hit|Registers|Eligible|Active Warps|SM Frequency|Memory \[%\]|Compute \(SM\)" "$LOGS/ncu.txt" | head -60 | tee -a "$SUMMARY"
  # PROFILE_VENDOR=1: the same sections of the vendor kernel run_one times beside ours (cuBLAS's
  # nvjet/xmma kernels), for a side-by-side reading.
  if [ -n "${PROFILE_VENDOR:-}" ]; then
    timeout 300 ncu --clock-control none --kernel-name regex:'^(nvjet|sm90_xmma|cutlass)' --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
      "$BIN/run_one" "$key" "$cfg" 3 1 >"$LOGS/ncu-vendor.txt" 2>&1
    say "ncu vendor exit $?: $(grep -m1 -E '^  [a-z_]*(nvjet|xmma|cutlass)' "$LOGS/ncu-vendor.txt" | cut -c1-120)"
    grep -E "stalled" "$LOGS/ncu-vendor.txt" | sort -k3 -n -r | head -12 | tee -a "$SUMMARY"
    grep -E "Throughput|Duration|Pipe|Stall|Warp Cycles|Issued|Occupancy|Bank|L2 Hit|L1/TEX Hit|Registers|Eligible|Active Warps|SM Frequency|Memory \[%\]|Compute \(SM\)" "$LOGS/ncu-vendor.txt" | head -60 | tee -a "$SUMMARY"
  fi
}

step_repeat() {
  local small_key="matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0"
  local small_cfg='{"block_k":64,"block_m":32,"block_n":32,"frag":"m16n16k16","min_blocks":1,"skew":1,"split_k":8,"split_reduce":"workspace","stages":1,"swizzle":1,"warps_k":4,"warps_m":1,"warps_n":2}'
  local large_key="matmul/m4096n4096k4096/nn/f16,f32,f32/alpha=1,beta=0"
  local large_cfg='{"block_k":64,"block_m":128,"block_n":256,"frag":"m16n16k16","min_blocks":1,"skew":1,"split_k":1,"split_reduce":"workspace","stages":3,"swizzle":1,"warps_k":1,"warps_m":2,"warps_n":4}'
  # Prints "MEDIAN VENDOR" of one run_one process.
  once() {
    "$BIN/run_one" "$1" "$2" "${REPEAT_SAMPLES:-10}" 1 "$3" 2>&1 | tee -a "$LOGS/repeat.log" \
      | sed -n 's/.* median \([0-9.]*\) us .* vendor Some(\([0-9.]*\)).*/\1 \2/p' | tail -1
  }
  for which in small large; do
    local key cfg
    if [ $which = small ]; then key=$small_key cfg=$small_cfg; else key=$large_key cfg=$large_cfg; fi
    local warm=""
    for mode in warm flush; do
      local a b
      read -r a va <<<"$(once "$key" "$cfg" $mode)"
      read -r b vb <<<"$(once "$key" "$cfg" $mode)"
      say "repeat $which $mode: $a us then $b us: $(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%+.2f%%", 100 * (b - a) / a; else print "n/a" }'); vendor $va then $vb us"
      [ $mode = warm ] && warm=$a
      [ $mode = flush ] && say "repeat $which flushed / warm: $(awk -v w="$warm" -v f="$a" 'BEGIN { if (w > 0) printf "%.2fx", f / w; else print "n/a" }')"
    done
  done
}

step_cudnn() {
  RUST_LOG=tensortune_worker=debug timeout 600 "$BIN/cudnn_check" "${CUDNN_SAMPLES:-10}" warm \
    >"$LOGS/cudnn.txt" 2>"$LOGS/cudnn.log"
  say "cudnn exit $?"
  tail -39 "$LOGS/cudnn.txt" | tee -a "$SUMMARY"
  TENSORTUNE_CUDNN_LIB=/nonexistent timeout 120 "$BIN/cudnn_check" 3 warm 2>/dev/null | tail -1 | tee -a "$SUMMARY"
}

# A/B timings of hand-picked configs (AB_FILE: KEY CONFIG per line), each in its own run_one process with the vendor timed beside it, so each line's ratio is
# taken at the clock of its moment.
step_ab() {
  local file=${AB_FILE:?AB_FILE names a file of KEY CONFIG lines (lab/inputs/)}
  # AB_BINS: run_one binaries in .gpu/ to compare (each config runs through each in turn, twice
  # over in ABBA order when there are two, so a drifting clock falls on both alike).
  local bins=(${AB_BINS:-run_one})
  local order=("${bins[@]}")
  [ "${#bins[@]}" -eq 2 ] && order=("${bins[0]}" "${bins[1]}" "${bins[1]}" "${bins[0]}")
  say "ab: $(grep -vc '^#' "$file") configs from $file, binaries ${order[*]}"
  grep -v '^#' "$file" | while read -r key cfg; do
    local bin
    for bin in "${order[@]}"; do
      local line
      line=$(TT_TEMPLATE=${AB_TEMPLATE:-wgmma_gemm} RUST_BACKTRACE=0 timeout 60 "$BIN/$bin" "$key" "$cfg" "${AB_SAMPLES:-10}" 1 2>&1 |
        grep -v '^ *$' | grep -m1 -E ' (Ok|[A-Z][A-Za-z]*) median |^Error' || echo "no result")
      local us vendor
      us=$(echo "$line" | sed -n 's/.*median \([0-9.]*\) us.*/\1/p')
      vendor=$(echo "$line" | sed -n 's/.*vendor Some(\([0-9.]*\)).*/\1/p')
      local ratio=$(awk -v a="$vendor" -v b="$us" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b; else print "-" }')
      say "ab $ratio $(echo "$line" | grep -o 'Ok\|[A-Z][a-z]*Error\|Timeout\|Mismatch' | head -1) [$bin] $(echo "$key" | cut -d/ -f2-4) $cfg :: $(echo "$line" | cut -c1-220)"
    done
  done
}

# The winners of a bench (ABWIN_JSON, a `tensortune bench --json` file written earlier in the same
# call) whose template is AB_TEMPLATE (default wgmma_conv2d), through step_ab's binaries: e.g. a
# held-out suite tuned by the current binary, then each winner timed by the old and new binaries
# in ABBA order.
step_abwin() {
  local json=${ABWIN_JSON:?ABWIN_JSON names a bench JSON} list="$LOGS/abwin.txt"
  python3 - "$json" "${AB_TEMPLATE:-wgmma_conv2d}" >"$list" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
for row in rows:
    for w in row["job"]["workloads"]:
        best = w.get("best") or {}
        if best.get("template") == sys.argv[2]:
            print(w["workload"], json.dumps(best["config"], separators=(",", ":"), sort_keys=True))
PY
  say "abwin: $(wc -l <"$list") winners of $json"
  AB_FILE="$list" AB_TEMPLATE=${AB_TEMPLATE:-wgmma_conv2d} step_ab
}

# Sustained load: for each KEY CONFIG of SUSTAIN_FILE (default lab/inputs/ab-wgmma-sustain-pick.txt, a
# wgmma_gemm config a line), ours alone for SUSTAIN_REPEAT measurements of SUSTAIN_SAMPLES samples
# (each sample at least 1 ms of launches), then ours and the vendor's pick alternating as often, in one
# process each, with the SM clock and board power sampled every 100 ms. A short burst on a cool GPU
# runs at full clock; a GPU kept busy runs under its power cap, where what each kernel costs in
# energy decides its clock. Prints per config: ours alone (median us, clock, power), and the
# alternating pairs (median us of each, the median of their ratios, vendor / ours).
# SUSTAIN_VENDOR=gemmex|lt:N alternates with that vendor algorithm instead of run_one's pick.
# SUSTAIN_MODES (default "alone alternate") picks the runs.
step_sustain() {
  local file=${SUSTAIN_FILE:-lab/inputs/ab-wgmma-sustain-pick.txt} n=0
  local sampler
  sampler=$(sample_clocks "$LOGS/sustain-power.csv" 100)
  grep -v '^#' "$file" | while read -r key cfg; do
    n=$((n + 1))
    for mode in ${SUSTAIN_MODES:-alone alternate}; do
      local env=(TT_TEMPLATE=${SUSTAIN_TEMPLATE:-wgmma_gemm} RUST_BACKTRACE=0)
      [ $mode = alone ] && env+=(TT_NO_BASELINE=1)
      [ $mode = alternate ] && env+=(TT_ALTERNATE=1)
      [ $mode = alternate ] && [ -n "${SUSTAIN_VENDOR:-}" ] && env+=(TT_VENDOR=$SUSTAIN_VENDOR)
      local t0=$(date +%s%3N)
      env "${env[@]}" timeout 300 "$BIN/run_one" "$key" "$cfg" "${SUSTAIN_SAMPLES:-20}" "${SUSTAIN_REPEAT:-8}" \
        >"$LOGS/sustain-$n-$mode.log" 2>&1
      local t1=$(date +%s%3N)
      say "sustain $n $mode $(echo "$key" | cut -d/ -f2-4) $cfg"
      python3 - "$LOGS/sustain-$n-$mode.log" "$LOGS/sustain-power.csv" "$t0" "$t1" <<'PY' | tee -a "$SUMMARY"
import re, sys, statistics as st, datetime
log, csv, t0, t1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = []
for line in open(log):
    m = re.search(r" median ([0-9.]+) us .* vendor (Some\(([0-9.]+)\)|None) clock (\d+) MHz", line)
    if m:
        rows.append((float(m.group(1)), float(m.group(3)) if m.group(3) else None, int(m.group(4))))
    elif "median" not in line and line.strip():
        print("   ", line.strip()[:200])
power = []
for line in open(csv):
    p = [x.strip() for x in line.split(",")]
    try:
        t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp() * 1000
        if t0 + 1000 <= t <= t1:
            power.append((float(p[1].split()[0]), float(p[2].split()[0])))
    except (ValueError, IndexError):
        pass
if not rows:
    print("   no measurement")
    sys.exit()
later = rows[1:] or rows  # the first measurement starts from whatever state the GPU was in
ours = [r[0] for r in later]
clk = [r[2] for r in later]
line = "   ours %9.2f us (min %9.2f, max %9.2f), clock %4.0f MHz" % (st.median(ours), min(ours), max(ours), st.median(clk))
if power:
    line += ", sampled %4.0f MHz %3.0f W (%d samples)" % (st.mean(p[0] for p in power), st.mean(p[1] for p in power), len(power))
pairs = [(r[0], r[1]) for r in later if r[1]]
if pairs:
    line += "; vendor %9.2f us, vendor/ours %.3f (pairs %s)" % (
        st.median(p[1] for p in pairs), st.median(p[1] / p[0] for p in pairs), " ".join("%.3f" % (p[1] / p[0]) for p in pairs))
print(line)
PY
    done
  done
  kill $sampler 2>/dev/null
}

# Each kernel alone under sustained load: for each line of HOT_FILE (KEY CONFIG, ours; or KEY
# CONFIG VENDOR, that vendor algorithm alone, CONFIG only compiled: gemmex or lt:N for a matmul,
# fastest for any workload, picked on the first measurement and held after; HOT_TEMPLATE names
# the template of ours, default wgmma_gemm, wgmma_conv2d for conv lines), one run_one process that
# holds the kernel on the GPU for HOT_REPEAT (default 10) measurements of HOT_SAMPLES (default 400)
# samples, each of at least 1 ms of launches (a measurement of a large GEMM lasts about a second:
# NVML's energy counter moves in steps of about 100 ms). The first two measurements are left out (the GPU
# comes from whatever ran before); the rest give the median time, the NVML clock, the board's mean
# power over each measurement (its energy counter) and so the energy per launch. Under the power
# cap, a kernel's sustained time is its energy per launch over the cap: this ranks kernels as a
# long job sees them, where a short burst on a cool GPU ranks them by cycles. HOT_NAMES=1 also
# names the kernels each vendor line launches (vendor_kernels, its first four launches).
step_hot() {
  local file=${HOT_FILE:-lab/inputs/hot-14336.txt} n=0
  grep -v '^#' "$file" | while read -r key cfg vendor; do
    [ -z "$key" ] && continue
    n=$((n + 1))
    local env=(TT_TEMPLATE=${HOT_TEMPLATE:-wgmma_gemm} RUST_BACKTRACE=0 TT_NO_BASELINE=1)
    [ -n "$vendor" ] && env+=(TT_VENDOR=$vendor)
    env "${env[@]}" timeout "${HOT_TIMEOUT:-120}" "$BIN/run_one" "$key" "$cfg" "${HOT_SAMPLES:-400}" "${HOT_REPEAT:-10}" \
      >"$LOGS/hot-$n.log" 2>&1
    local what=${vendor:-ours $cfg}
    python3 - "$LOGS/hot-$n.log" "$n" "$(echo "$key" | cut -d/ -f2-4)" "$what" <<'PY' | tee -a "$SUMMARY"
import re, sys, statistics as st
log, n, shape, what = sys.argv[1:5]
rows = []
for line in open(log):
    m = re.search(r"^(\d+) .* median ([0-9.]+) us .* clock (\d+) MHz.* energy (\d+) mJ", line)
    if m and float(m.group(2)) > 0:
        rows.append((int(m.group(1)), float(m.group(2)), int(m.group(3)), int(m.group(4))))
    elif "median" not in line and line.strip():
        print("   ", line.strip()[:200])
late = rows[2:]
if len(late) < 2:
    print("hot %s %s %s: too few measurements (%d)" % (n, shape, what, len(rows)))
    sys.exit()
us = st.median(r[1] for r in late)
# Mean power from the energy counter over the late repeats (wall time between their ends).
w = (late[-1][3] - late[0][3]) / (late[-1][0] - late[0][0])
print("hot %-2s %-22s %9.2f us (min %9.2f, max %9.2f)  %4.0f MHz  %4.0f W  %6.1f mJ/launch  %s"
      % (n, shape, us, min(r[1] for r in late), max(r[1] for r in late), st.median(r[2] for r in late), w, w * us / 1e3, what[:150]))
PY
    if [ -n "$vendor" ] && [ "${HOT_NAMES:-0}" = 1 ]; then
      vendor_kernels "$LOGS/hot-$n-names.csv" 4 TT_TEMPLATE="${HOT_TEMPLATE:-wgmma_gemm}" TT_NO_BASELINE=1 TT_VENDOR="$vendor"
    fi
  done
}

step_clusters() {
  local shapes=(${CLUSTERS_SHAPES:-150 384 100 256}) i
  [ -x "$BIN/clusters" ] || { say "clusters: no $BIN/clusters (scripts/gpu-pack.sh packs it)"; return; }
  for ((i = 0; i + 1 < ${#shapes[@]}; i += 2)); do
    timeout 120 "$BIN/clusters" "${shapes[i]}" "${shapes[i + 1]}" 2>&1 | tee -a "$SUMMARY"
  done
}

# The memory roofline of a streaming layer: lab/membw.cu built with nvcc, reading and writing
# MEMBW_SIZES ("READ_MB WRITE_MB" pairs, default the conv suite's N=32 56x56 256->64 and 64->128
# 1x1 layers' bytes) with 16-byte accesses, warm, by each of its kernels (see its header).
step_membw() {
  nvcc -O3 -arch=sm_90 -o "$LOGS/membw" lab/membw.cu >"$LOGS/membw-build.log" 2>&1 || { say "membw: nvcc failed: $(head -5 "$LOGS/membw-build.log")"; return; }
  local sizes=${MEMBW_SIZES:-"51.38 12.85 12.85 25.69"}
  set -- $sizes
  while [ $# -ge 2 ]; do
    "$LOGS/membw" "$1" "$2" 2>&1 | tee -a "$SUMMARY"
    shift 2
  done
}

# splitpairs_run NAME TEMPLATE KEY...: gpu_selftest of TEMPLATE on the keys, its failures and
# how many of the checked kernels split (single blocks or pairs) or ran stream-K.
splitpairs_run() {
  local name=$1 template=$2 log="$LOGS/splitpairs-$1.log" args=()
  shift 2
  for key in "$@"; do args+=(--workload "$key"); done
  timeout 900 "$BIN/tensortune" selftest --template "$template" --knob "${SPLITPAIRS_KNOB:-persistent:0}" \
    --configs "${SPLITPAIRS_CONFIGS:-12}" --verbose "${args[@]}" >"$log" 2>&1
  say "splitpairs $name exit $?: $(grep '^total:' "$log")"
  grep -v ": ok " "$log" | grep -v "^device\|^total\|^skipped" | grep ': [a-z_]* ' | cut -c1-300 | head -20 | tee -a "$SUMMARY"
  say "$name splits ok: $(grep ': ok ' "$log" | grep -c '_cl1_.*_ks[0-9]') single," \
    "$(grep ': ok ' "$log" | grep -c '_cl2_.*_ks[0-9]') in pairs;" \
    "stream-K ok: $(grep ': ok ' "$log" | grep -c '_perssk_')"
}

step_splitpairs() {
  local keys=() t l
  for t in f16,f32,f32 f16,f32,f16 f16,f16,f16 bf16,f32,f32 bf16,f32,bf16 i8,i32,i32; do
    for l in nn nt tn tt; do
      keys+=("matmul/m512n1000k4096/$l/$t/alpha=1,beta=0" "matmul/m1000n504k4096/$l/$t/alpha=2,beta=-1")
    done
  done
  splitpairs_run gemm wgmma_gemm "${keys[@]}"
  keys=()
  for t in f16,f32,f16 bf16,f32,bf16 i8,i32,i32; do keys+=("conv2d/n1h14w14c256/k256r3s3/pad1x1,stride1x1,dil1x1/nhwc/$t"); done
  keys+=("conv2d/n1h14w14c96/k256r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f32"
    "conv2d/n2h14w14c1024/k256r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16"
    "conv2d/n1h28w28c128/k128r3s3/pad1x1,stride2x2,dil1x1/nhwc/f16,f32,f32"
    "conv2d/n1h28w28c512/k512r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16")
  splitpairs_run conv wgmma_conv2d "${keys[@]}"
}

step_regstore() {
  local keys="matmul/m1000n1000k1024/nn/f16,f32,f32/alpha=1,beta=0.5 matmul/m1000n1160k512/tn/f16,f32,f16/alpha=2,beta=-1 matmul/m1004n1000k512/tn/f16,f32,f16/alpha=1,beta=0 matmul/m512n384k512/tt/f16,f16,f16/alpha=1,beta=0 matmul/m512n384k512/tt/f16,f16,f16/alpha=0.5,beta=-1 matmul/m760n512k512/nt/bf16,f32,bf16/alpha=1,beta=0 matmul/m1000n1000k1024/tn/i8,i32,i32/alpha=1,beta=0 matmul/m512n512k8192/nn/f16,f32,f16/alpha=1,beta=0 matmul/m1002n520k256/tn/f16,f32,f32/alpha=1,beta=0"
  local args=() key
  for key in $keys; do args+=(--workload "$key"); done
  timeout 300 "$BIN/tensortune" selftest --template wgmma_gemm --knob epilogue:direct --configs "${REGSTORE_CONFIGS:-4}" \
    "${args[@]}" >"$LOGS/regstore-check.log" 2>&1
  say "regstore check exit $?: $(grep '^total:' "$LOGS/regstore-check.log")"
  grep -v "^device\|^total" "$LOGS/regstore-check.log" | grep ': [a-z_]* ' | cut -c1-400 | head -20 | tee -a "$SUMMARY"
  local cases=(
    'matmul/m2000n2320k512/tn/f16,f32,f16/alpha=2,beta=-1 {"block_m":128,"block_n":128,"cluster":1,"consumers":2,"epilogue":"direct","persistent":1,"producer":"warpgroup","raster_group":4,"schedule":"pingpong","stages":4,"stream_k":0}'
    'matmul/m504n520k8200/nn/f16,f32,f32/alpha=1,beta=0.5 {"block_m":128,"block_n":128,"cluster":1,"consumers":2,"epilogue":"direct","persistent":0,"producer":"warpgroup","raster_group":1,"schedule":"cooperative","stages":4,"stream_k":0}'
  )
  local n=0
  for c in "${cases[@]}"; do
    local key=${c%% *} cfg=${c#* } log
    n=$((n + 1))
    log="$LOGS/regstore-memcheck-$n.log"
    say "regstore $key: $(TT_TEMPLATE=wgmma_gemm TT_NO_BASELINE=1 timeout 60 "$BIN/run_one" "$key" "$cfg" 3 1 2>&1 | tail -1 | cut -c1-160)"
    TT_TEMPLATE=wgmma_gemm TT_NO_BASELINE=1 timeout 120 compute-sanitizer --tool memcheck --print-limit 20 \
      "$BIN/run_one" "$key" "$cfg" 1 1 warm >"$log" 2>&1
    say "  memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$log")"
  done
}

step_exportdiag() {
  local suite=${EXPORT_SUITE:-suites/default.json}
  timeout 1500 "$BIN/tensortune" bench --suite "$suite" --trials "${BENCH_TRIALS:-100}" --json "$LOGS/export-bench.json" \
    >"$LOGS/export-bench.log" 2>&1
  say "export: bench exit $?"
  sed -n '/^suite/,$p' "$LOGS/export-bench.log" | tee -a "$SUMMARY"
  # bench names its database after --json (with a suffix when that file exists) and says which.
  local db
  db=$(sed -n 's/^bench database: //p' "$LOGS/export-bench.log" | head -1)
  "$BIN/tensortune" --db "$db" export --suite "$suite" -o "$LOGS/bundle" >"$LOGS/export.log" 2>&1
  say "export exit $?"
  tee -a "$SUMMARY" <"$LOGS/export.log"
  nvcc -O2 -o "$LOGS/gemm_check" examples/bundle/gemm_check.c -Ibundle/c -lcuda -lcublas -lm -ldl \
    >"$LOGS/gemm_check-build.log" 2>&1
  say "gemm_check build exit $?"
  head -20 "$LOGS/gemm_check-build.log" | tee -a "$SUMMARY"
  # EXPORT_RUNS: one gemm_check run per WARM_MS:PAUSE_MS[:FLAGS] entry (warm-up before each
  # measurement, idle pause before each kernel's rounds). FLAGS, comma-separated: `noblas` runs it
  # with TT_NO_BLAS=1 (no cuBLAS in the process, nothing checked), `only=S` with TT_ONLY=S (only
  # the kernels matching S loaded), `keep` with TT_KEEP=1 (all checked first, every buffer held
  # until all are timed), `extra=N` and `pieces=P` with TT_EXTRA_MB=N TT_EXTRA_PIECES=P.
  local run warm pause flags f log
  for run in ${EXPORT_RUNS:-0:2000}; do
    IFS=: read -r warm pause flags <<<"$run"
    local env=(TT_NO_BLAS=0)
    for f in ${flags//,/ }; do
      case "$f" in
        noblas) env+=(TT_NO_BLAS=1) ;;
        only=*) env+=("TT_ONLY=${f#only=}") ;;
        keep) env+=(TT_KEEP=1) ;;
        extra=*) env+=("TT_EXTRA_MB=${f#extra=}") ;;
        pieces=*) env+=("TT_EXTRA_PIECES=${f#pieces=}") ;;
      esac
    done
    log="$LOGS/gemm_check-$warm-$pause-${flags//[^a-z0-9]/_}.log"
    env "${env[@]}" timeout 900 "$LOGS/gemm_check" "$LOGS/bundle" "${EXPORT_SAMPLES:-10}" "${EXPORT_ROUNDS:-1}" \
      "$warm" "$pause" >"$log" 2>&1
    say "gemm_check (warm-up $warm ms, pause $pause ms, ${flags:-no flags}) exit $?"
    tee -a "$SUMMARY" <"$log"
  done
  # EXPORT_RUNONE=N: the first N kernels of the bundle timed again through the worker's own path
  # (run_one: NVRTC compile, cudarc launch, the worker's timing), for comparison with gemm_check.
  if [ "${EXPORT_RUNONE:-0}" -gt 0 ]; then
    python3 - "$LOGS/bundle/manifest.json" "${EXPORT_RUNONE}" >"$LOGS/runone.txt" <<'PY'
import json, sys
for k in json.load(open(sys.argv[1]))["kernels"][: int(sys.argv[2])]:
    print(k["template"], k["workload_key"], json.dumps(k["config"], separators=(",", ":")), sep="\t")
PY
    local tmpl key cfg
    while IFS=$'\t' read -r tmpl key cfg; do
      TT_TEMPLATE=$tmpl timeout 120 "$BIN/run_one" "$key" "$cfg" 10 3 2>&1 | grep -v '^ *$' | cut -c1-300 | tail -4 | tee -a "$SUMMARY"
    done <"$LOGS/runone.txt"
  fi
  [ -n "${EXPORT_DIAG:-}" ] && export_diag
  rm -f "$LOGS/gemm_check"
}

# EXPORT_DIAG=1 (after `export`): where a small kernel's time differs between gemm_check and the
# worker. The same kernels run under Nsight Systems (every kernel's start and duration inside the
# replayed graphs: a kernel's own time apart from the gaps between launches) and Nsight Compute
# (duration, cycles, instructions, registers, shared memory, L2 sectors of a few launches), once in
# gemm_check (no cuBLAS) and once in run_one (the worker's path).
export_diag() {
  python3 - "$LOGS/bundle/manifest.json" 2 >"$LOGS/diag.txt" <<'PY'
import json, sys
for k in json.load(open(sys.argv[1]))["kernels"][: int(sys.argv[2])]:
    print(k["template"], k["workload_key"], json.dumps(k["config"], separators=(",", ":")), k["name"], sep="\t")
PY
  local metrics=gpu__time_duration.sum,sm__cycles_elapsed.max,smsp__inst_executed.sum,launch__registers_per_thread
  metrics+=,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static,launch__grid_size,launch__block_size
  metrics+=,lts__t_sectors.sum,dram__bytes_read.sum,smsp__cycles_active.avg,sm__warps_active.avg.pct_of_peak_sustained_active
  say "nsys: $(command -v nsys || echo absent), ncu: $(command -v ncu || echo absent)"
  if command -v nsys >/dev/null; then
    TT_NO_BLAS=1 timeout 300 nsys profile --trace=cuda --cuda-graph-trace=node --force-overwrite true -o "$LOGS/nsys-gc" \
      "$LOGS/gemm_check" "$LOGS/bundle" 10 1 0 500 >"$LOGS/nsys-gc.log" 2>&1
    say "nsys gemm_check exit $?"
    local i=0 tmpl key cfg name
    while IFS=$'\t' read -r tmpl key cfg name; do
      i=$((i + 1))
      TT_TEMPLATE=$tmpl timeout 300 nsys profile --trace=cuda --cuda-graph-trace=node --force-overwrite true \
        -o "$LOGS/nsys-r$i" "$BIN/run_one" "$key" "$cfg" 10 1 >"$LOGS/nsys-r$i.log" 2>&1
      say "nsys run_one $i exit $?: $(grep -o 'median [0-9.]* us' "$LOGS/nsys-r$i.log" | tail -1)"
    done <"$LOGS/diag.txt"
    for rep in "$LOGS"/nsys-*.nsys-rep; do
      nsys stats --report cuda_gpu_trace --format csv --force-export true -o "${rep%.nsys-rep}" "$rep" >/dev/null 2>&1
    done
    python3 - "$LOGS"/nsys-*cuda_gpu_trace.csv <<'PY' 2>&1 | tee -a "$SUMMARY"
import csv, statistics, sys
for path in sys.argv[1:]:
    rows = [r for r in csv.DictReader(open(path)) if r.get("Name", "").startswith("tt_")]
    by = {}
    for r in rows:
        by.setdefault(r["Name"], []).append((int(r["Start (ns)"]), int(r["Duration (ns)"])))
    for name, ks in by.items():
        ks.sort()
        durs = [d for _, d in ks]
        gaps = [b[0] - (a[0] + a[1]) for a, b in zip(ks, ks[1:]) if b[0] - (a[0] + a[1]) < 5000]
        print("%s %s: %d launches, duration median %.0f ns, gap median %.0f ns, period median %.0f ns" % (
            path.rsplit("/", 1)[-1].split("_cuda")[0], name[:60], len(ks), statistics.median(durs),
            statistics.median(gaps) if gaps else -1, statistics.median(durs) + (statistics.median(gaps) if gaps else 0)))
PY
    rm -f "$LOGS"/nsys-*.nsys-rep "$LOGS"/nsys-*.sqlite
  fi
  if command -v ncu >/dev/null; then
    local i=0 tmpl key cfg name
    while IFS=$'\t' read -r tmpl key cfg name; do
      i=$((i + 1))
      TT_NO_BLAS=1 timeout 300 ncu --clock-control none --kernel-name "$name" --launch-skip 40 --launch-count 3 \
        --metrics "$metrics" --csv "$LOGS/gemm_check" "$LOGS/bundle" 3 1 0 0 >"$LOGS/ncu-gc$i.csv" 2>&1
      say "ncu gemm_check $i exit $?"
      TT_TEMPLATE=$tmpl timeout 300 ncu --clock-control none --kernel-name "$name" --launch-skip 40 --launch-count 3 \
        --metrics "$metrics" --csv "$BIN/run_one" "$key" "$cfg" 3 1 >"$LOGS/ncu-r$i.csv" 2>&1
      say "ncu run_one $i exit $?"
    done <"$LOGS/diag.txt"
    for f in "$LOGS"/ncu-*.csv; do
      say "== $(basename "$f")"
      grep '"tt_' "$f" | awk -F'","' '{ print $(NF-2) " = " $NF }' | sed 's/"//g' | sort | uniq -c | cut -c1-160 | tee -a "$SUMMARY"
    done
  fi
}

# The vendor's kernel for each workload of VENDOR_KEYS (default: the large suite's shapes where
# wgmma_gemm is furthest behind): run_one's baseline under Nsight Compute, which names the cuBLAS
# kernel it launched (tile size, stream-K "segment_k", cluster) with its grid, block, cluster and
# shared memory. Our config (VENDOR_CONFIG) is only there to give run_one something to compare.
# vendor_kernels LOG COUNT [VAR=VALUE...]: run_one on $key $cfg under ncu (TT_TEMPLATE wgmma_gemm
# unless given), the first COUNT vendor kernels it launches (CUBLAS_KERNELS) into LOG; prints each
# kernel's name, launches and launch shape (grid, block, cluster, shared memory, registers), then
# ncu's exit status.
vendor_kernels() {
  local log=$1 count=$2
  shift 2
  env TT_TEMPLATE=wgmma_gemm "$@" timeout 300 ncu --clock-control none --kernel-name regex:"$CUBLAS_KERNELS" \
    --launch-skip 0 --launch-count "$count" --csv \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__cluster_dim_x,launch__cluster_dim_y,launch__shared_mem_per_block_dynamic,launch__registers_per_thread \
    "$BIN/run_one" "$key" "$cfg" 3 1 >"$log" 2>&1
  local status=$?
  python3 - "$log" <<'PY' 2>&1 | tee -a "$SUMMARY"
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10 and r[0] != "ID"]
by = collections.defaultdict(dict)
for r in rows:
    by[(r[0], r[4])][r[-3]] = r[-1]
seen = collections.OrderedDict()
for (i, name), m in by.items():
    seen.setdefault(name, []).append(m)
for name, ms in seen.items():
    m = ms[-1]
    print("  %s x%d: %s" % (name[:150], len(ms), ", ".join("%s=%s" % (k.replace("launch__", ""), v) for k, v in sorted(m.items()))))
PY
  say "  (ncu exit $status)"
}

step_vendorkern() {
  local keys=${VENDOR_KEYS:-"matmul/m2048n5120k5120/nt/bf16,f32,f32/alpha=1,beta=0 matmul/m4096n14336k4096/nn/f16,f32,f32/alpha=1,beta=0 matmul/m8192n8192k8192/nn/f16,f32,f32/alpha=1,beta=0"}
  local cfg=${VENDOR_CONFIG:-'{"block_m":256,"block_n":128,"cluster":2,"consumers":2,"epilogue":"tma","persistent":1,"producer":"warpgroup","raster_group":8,"schedule":"cooperative","stages":4,"stream_k":0}'}
  local key n=0
  for key in $keys; do
    n=$((n + 1))
    say "vendor kernels of $key:"
    vendor_kernels "$LOGS/vendorkern-$n.csv" 40
  done
}

# The vendor libraries' kernel names, as ncu's --kernel-name regexes (cuDNN's pick may be a GEMM
# kernel of cuBLAS's family, e.g. nvjet_sm90_*, which sm90 matches).
CUBLAS_KERNELS='^(sm90|sm80|cutlass|nvjet|xmma|gemm|Kernel)'
CUDNN_KERNELS='xmma|cutlass|cudnn|implicit|fprop|nhwc|sm90|sm80'

# ncu_pair NAME KEY TEMPLATE CONFIG VENDOR_REGEX: ours and the vendor's kernels for one KEY/CONFIG
# under ncu, each in a process of its own: ours alone (a few launches), then the vendor's (every
# candidate the baseline times, and the chosen one's replays; VENDOR_REGEX names them, empty skips
# them): duration, DRAM bytes and throughput, L2 traffic and hit rate, clock, grid. One line a
# kernel name, at its fastest launch; NCU_EXTRA (ncu metric names, comma-separated) adds metrics,
# printed on a second line in millions. Logs: logs/NAME*.csv.
ncu_pair() {
  local name=$1 key=$2 tmpl=$3 cfg=$4 vendor_regex=$5
  local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,lts__t_bytes.sum,sm__cycles_elapsed.avg.per_second,launch__grid_size${NCU_EXTRA:+,$NCU_EXTRA}
  TT_NO_BASELINE=1 TT_TEMPLATE=$tmpl timeout 200 ncu --clock-control none --kernel-name regex:'^tt_(w|simt|mma)' \
    --launch-skip 1 --launch-count 3 --csv --metrics "$metrics" "$BIN/run_one" "$key" "$cfg" 2 1 >"$LOGS/$name.csv" 2>&1
  : >"$LOGS/$name-vendor.csv"
  [ -n "$vendor_regex" ] && TT_TEMPLATE=$tmpl timeout 200 ncu --clock-control none --kernel-name regex:"$vendor_regex" \
    --launch-skip 0 --launch-count 60 --csv --metrics "$metrics" "$BIN/run_one" "$key" "$cfg" 2 1 \
    >"$LOGS/$name-vendor.csv" 2>&1
  NCU_EXTRA=${NCU_EXTRA:-} python3 - "$LOGS/$name.csv" "$LOGS/$name-vendor.csv" <<'PY2' 2>&1 | tee -a "$SUMMARY"
import csv, collections, os, sys
extra = [k for k in os.environ["NCU_EXTRA"].split(",") if k]
rows = [r for f in sys.argv[1:] for r in csv.reader(open(f)) if len(r) > 10 and r[0] != "ID"]
by = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    try:
        by[r[4]][r[-3]].append(float(r[-1].replace(",", "")))
    except ValueError:
        pass
for name, m in by.items():
    dur = m.get("gpu__time_duration.sum", [0])
    i = dur.index(min(dur))
    def at(k):
        v = m.get(k, [])
        return v[i] if i < len(v) else float("nan")
    print("  %-70s x%-3d %9.2f us  read %7.2f MB  write %7.2f MB  dram %5.1f%%  L2 %8.1f MB hit %5.1f%%  %4.0f MHz  grid %d"
          % (name[:70], len(dur), at("gpu__time_duration.sum") / 1e3, at("dram__bytes_read.sum") / 1e6,
             at("dram__bytes_write.sum") / 1e6, at("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
             at("lts__t_bytes.sum") / 1e6, at("lts__t_sector_hit_rate.pct"), at("sm__cycles_elapsed.avg.per_second") / 1e6,
             at("launch__grid_size")))
    if extra:
        print("    " + ", ".join("%s %s" % (k, "%.2f M" % (at(k) / 1e6) if abs(at(k)) >= 1e6 else "%.4g" % at(k)) for k in extra))
PY2
}

# Executed instructions by opcode (ncu's sass__inst_executed_per_opcode, one launch, cold L2) of
# each KEY CONFIG line of INSTMIX_FILE, and with INSTMIX_VENDOR=1 of the vendor kernels timed beside
# the first line: where a kernel's instructions go, to set beside another's for the same work.
# instmix_ncu LOG SECONDS KERNEL_REGEX SKIP COUNT [VAR=VALUE...]: run_one on $key $cfg under ncu,
# the opcode counts of the matching kernels into LOG (CSV, with instance names).
instmix_ncu() {
  local log=$1 secs=$2 kernels=$3 skip=$4 count=$5
  shift 5
  env "$@" TT_TEMPLATE="${INSTMIX_TEMPLATE:-wgmma_gemm}" timeout "$secs" ncu --clock-control none \
    --kernel-name regex:"$kernels" --launch-skip "$skip" --launch-count "$count" --csv --print-metric-instances details \
    --metrics sass__inst_executed_per_opcode,smsp__inst_executed.sum,gpu__time_duration.sum \
    "$BIN/run_one" "$key" "$cfg" 2 1 >"$log" 2>&1
}

step_instmix() {
  local file=${INSTMIX_FILE:?INSTMIX_FILE names a KEY CONFIG file} key cfg n=0
  while read -r key cfg; do
    case "$key" in '#'* | '') continue ;; esac
    n=$((n + 1))
    say "instmix $n: $key $cfg"
    instmix_ncu "$LOGS/instmix-$n.csv" 200 '^tt_w' 1 1 TT_NO_BASELINE=1
    if [ "$n" = 1 ] && [ -n "${INSTMIX_VENDOR:-}" ]; then
      instmix_ncu "$LOGS/instmix-vendor.csv" 300 "$CUBLAS_KERNELS" 0 40
    fi
  done <"$file"
  python3 - "$LOGS"/instmix-*.csv <<'PY' 2>&1 | tee -a "$SUMMARY"
import csv, sys
seen = set()
for f in sys.argv[1:]:
    rows = [r for r in csv.reader(open(f)) if len(r) > 10 and r[0] != "ID"]
    by = {}
    for r in rows:
        by.setdefault((r[0], r[4]), {})[r[-3]] = r[-1]
    for (_, name), m in by.items():
        if name in seen:
            continue
        seen.add(name)
        # "total (OPCODE: n; OPCODE: n; ...)" with instance details (the separator may be a space).
        ops = m.get("sass__inst_executed_per_opcode", "")
        inner = ops[ops.find("(") + 1 : ops.rfind(")")] if "(" in ops else ops
        pairs = []
        for item in inner.split(";"):
            parts = item.replace(":", " ").split()
            if len(parts) >= 2:
                try:
                    pairs.append((float(parts[-1].replace(",", "")), " ".join(parts[:-1])))
                except ValueError:
                    pass
        pairs.sort(reverse=True)
        total = m.get("smsp__inst_executed.sum", "?")
        print("  %s: %s instructions, %s ns" % (name[:80], total, m.get("gpu__time_duration.sum", "?")))
        print("    " + ", ".join("%s %.2fM" % (op, v / 1e6) for v, op in pairs[:24]))
PY
}

# Matmul kernels against the memory and the L2: each KEY CONFIG line of DIAG_FILE (default
# lab/inputs/diag-14336.txt) under ncu beside every cuBLAS candidate of its baseline (ncu_pair);
# DIAG_VENDOR=first profiles the vendor's kernels for the first line of each workload only, 0 never.
step_diag() {
  local file=${DIAG_FILE:-lab/inputs/diag-14336.txt} key cfg n=0 seen=" "
  while read -r key cfg; do
    case "$key" in '#'* | '') continue ;; esac
    n=$((n + 1))
    say "diag $n: $key ${DIAG_TEMPLATE:-wgmma_gemm} $cfg"
    # DIAG_VENDOR_REGEX: the vendor's kernel names (default cuBLAS's; for a conv file with
    # DIAG_TEMPLATE=wgmma_conv2d, cuDNN's: the value of CUDNN_KERNELS above).
    local vendor=${DIAG_VENDOR_REGEX:-$CUBLAS_KERNELS}
    case "${DIAG_VENDOR:-all}" in
      0) vendor= ;;
      first) case "$seen" in *" $key "*) vendor= ;; esac ;;
    esac
    seen="$seen$key "
    ncu_pair "diag-$n" "$key" "${DIAG_TEMPLATE:-wgmma_gemm}" "$cfg" "$vendor"
  done <"$file"
}

# Where conv layers stand against the memory (CDIAG_SUITE, required: a suite of conv layers): a bench
# of the suite (CDIAG_TRIALS) keeps its database; each workload's fastest record is run by run_one
# under Nsight Compute (cold L2, as ncu flushes caches between passes): ours alone in its process,
# then cuDNN's kernels, each with its duration, DRAM bytes read and written, DRAM throughput
# against its peak, L2 hit rate and SM clock. A first run (H100, 2026-11-25) caught only the
# support kernels (tt_fill_*) for ours; the filter now names the templates' kernels.
step_convdiag() {
  local suite=${CDIAG_SUITE:?CDIAG_SUITE names a suite of conv layers} db="$LOGS/cdiag.db" start=$(date +%s.%N)
  timeout 600 "$BIN/tensortune" --db "$db" bench --suite "$suite" --trials "${CDIAG_TRIALS:-150}" \
    --json "$OUT/cdiag-bench.json" >"$LOGS/cdiag-bench.log" 2>&1
  say "convdiag bench exit $? in $(since "$start") s"
  sed -n '/^suite/,$p' "$LOGS/cdiag-bench.log" | tee -a "$SUMMARY"
  "$BIN/tensortune" --db "$db" records export --ok-only -o "$LOGS/cdiag-records.jsonl" >/dev/null 2>&1
  python3 - "$LOGS/cdiag-records.jsonl" >"$LOGS/cdiag-best.txt" <<'PY2'
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    t = r.get("median_us") or 0
    if t > 0 and (r["workload"] not in best or t < best[r["workload"]][0]):
        best[r["workload"]] = (t, r["template"], json.dumps(r["config"], separators=(",", ":")))
for w, (t, tmpl, cfg) in best.items():
    print(w, tmpl, cfg)
PY2
  local key tmpl cfg n=0
  while read -r key tmpl cfg; do
    n=$((n + 1))
    say "convdiag $n: $key $tmpl $cfg"
    TT_TEMPLATE=$tmpl "$BIN/run_one" "$key" "$cfg" 10 2 2>&1 | grep -m2 ' median ' | cut -c1-240 | tee -a "$SUMMARY"
    ncu_pair "cdiag-$n" "$key" "$tmpl" "$cfg" "$CUDNN_KERNELS"
  done <"$LOGS/cdiag-best.txt"
}

# Runs one step; fails for a name that is not a step.
dispatch() {
  case "$1" in
    ab | abwin | sustain | hot | diag | convdiag | instmix | vendorkern | profile | sass | compile | repeat) "step_$1" || true ;;
    cudnn | membw | clusters | splitpairs | regstore | exportdiag) "step_$1" || true ;;
    *) return 1 ;;
  esac
}

run_steps "$@"
