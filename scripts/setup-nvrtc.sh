#!/usr/bin/env bash
# Installs NVRTC and the CUDA headers that WMMA kernels need, from NVIDIA's PyPI wheels, into
# .nvrtc/ at the repository root. No GPU and no CUDA toolkit needed: the tests compile every kind of
# generated kernel with it. Idempotent; prints the directory it installed to.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.nvrtc"
lib="$dest/nvidia/cu13/lib/libnvrtc.so.13"
if [ ! -f "$lib" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dest" \
    nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
fi
test -f "$lib" || { echo "setup-nvrtc: $lib is missing after install" >&2; exit 1; }
test -f "$dest/nvidia/cu13/include/mma.h" || { echo "setup-nvrtc: CUDA headers missing in $dest" >&2; exit 1; }
echo "$dest/nvidia/cu13"
