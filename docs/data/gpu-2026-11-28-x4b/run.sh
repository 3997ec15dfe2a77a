#!/usr/bin/env bash
# model3 (issue 37), one nvidia-h200-x4 call: ResNet-50 N=32 on GPU 0 with 16 cores (r50-1), N=1 on
# GPU 1 (r50-n1) and torch.compile max-autotune-no-cudagraphs filling Inductor's cache on GPU 3
# (compile) side by side on disjoint cores; then the same N=32 job on all four GPUs and all cores,
# timed beside eager and the compiled model (r50-all). Timelines of each job from its database.
cd "$(dirname "$0")/.." && G=$PWD/.gpu-model3
mkdir -p "$OUT"
gunzip -c "$G/tensortune.gz" > "$G/tensortune" && chmod +x "$G/tensortune" || exit 1
G=$G STEPS="r50-1&r50-n1&compile r50-all" R50_TRIALS=500 PER_WORKLOAD=40 N1_TRIALS=300 \
  GPU_r50_1=0 CORES_r50_1=0-15 GPU_r50_n1=1 CORES_r50_n1=16-31 GPU_compile=3 CORES_compile=32-63 \
  R50_1_SECS=200 R50_N1_SECS=190 COMPILE_SECS=200 R50_ALL_SECS=210 bash "$G/scripts/gpu-model.sh"
