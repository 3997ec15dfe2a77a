#!/usr/bin/env bash
# Builds and runs the `tensortune` CLI with NVRTC reachable: the CUDA toolkit's when the machine has
# one (/usr/local/cuda or $CUDA_HOME), otherwise NVIDIA's PyPI wheels (scripts/setup-nvrtc.sh).
#   scripts/run.sh tune matmul --m 512 --n 64 --k 512 --trials 100
#   scripts/run.sh tune matmul --m 512 --n 64 --k 512 --device sim     # no GPU
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ -e "$cuda/lib64/libnvrtc.so.13" ] && [ -e "$cuda/include/mma.h" ]; then
  export LD_LIBRARY_PATH="$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TENSORTUNE_CUDA_INCLUDE="$cuda/include"
else
  wheels=$(scripts/setup-nvrtc.sh)
  export LD_LIBRARY_PATH="$wheels/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TENSORTUNE_CUDA_INCLUDE="$wheels/include"
fi
cargo build --release --locked --quiet --bin tensortune --bin tensortune-tracker --bin tensortune-worker
exec "${CARGO_TARGET_DIR:-target}/release/tensortune" "$@"
