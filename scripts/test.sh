#!/usr/bin/env bash
# The test command (README, CI). Installs NVRTC from PyPI when needed, then runs every test of the
# workspace with it: code generation, NVRTC compilation of generated kernels, the gRPC services,
# SQLite and the `sim` device end to end. GPU-only checks live in scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=$(scripts/setup-nvrtc.sh)
export LD_LIBRARY_PATH="$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TENSORTUNE_CUDA_INCLUDE="$cuda/include"
export TENSORTUNE_REQUIRE_NVRTC=1
cargo test --workspace --locked --no-fail-fast "$@"
