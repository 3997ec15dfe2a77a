#!/usr/bin/env bash
# Installs cuobjdump and nvdisasm from NVIDIA's PyPI wheels into .sass-tools/ at the repository
# root, so that the SASS of a generated kernel can be read on a machine without a GPU or a CUDA
# toolkit. Idempotent; prints the bin directory. Use with the lab's `cubin`:
#   cuda=$(scripts/setup-nvrtc.sh); export LD_LIBRARY_PATH=$cuda/lib TENSORTUNE_CUDA_INCLUDE=$cuda/include
#   TT_TEMPLATE=wgmma_gemm cargo run --release -p tensortune-lab --bin cubin -- KEY CONFIG sm_90a k.cubin
#   PATH=$(lab/setup-sass.sh):$PATH cuobjdump --dump-sass k.cubin
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.sass-tools"
bin="$dest/nvidia/cu13/bin"
if [ ! -x "$bin/cuobjdump" ] || [ ! -x "$bin/nvdisasm" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dest" \
    nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37
fi
for tool in cuobjdump nvdisasm; do
  test -x "$bin/$tool" || { echo "setup-sass: $bin/$tool is missing after install" >&2; exit 1; }
done
echo "$bin"
