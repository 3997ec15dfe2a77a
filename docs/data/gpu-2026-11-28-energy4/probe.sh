#!/usr/bin/env bash
# One-off: cool-start selftests of two long kernels in separate processes, each after a 3 s idle:
# with --energy (the new idle after the float64 reference) and without (samples right after it),
# and the 8192^3 config with 5 and 10 samples. Prints each time.
set -u
cd "$(dirname "$0")"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT/p"
one() { # NAME KEY CONFIG ARGS...
  local name=$1 key=$2 cfg=$3; shift 3; sleep 3
  .gpu/tensortune selftest --workload "$key" --template wgmma_gemm --config "$cfg" --no-baseline "$@" --json "$OUT/p/$name.json" >"$OUT/p/$name.log" 2>&1
  python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['checks'][0]; print(sys.argv[2], round(c['median_us'],2), c.get('sm_clock_mhz'), c['status'])" "$OUT/p/$name.json" "$name $*"
}
one k14-noidle-1 'matmul/m4096n14336k4096/nn/f16,f32,f32/alpha=1,beta=0' '{"block_m": 64, "block_n": 256, "cluster": 2, "consumers": 2, "epilogue": "tma", "persistent": 1, "producer": "inline", "raster": "m", "raster_group": 4, "schedule": "cooperative", "stages": 4, "stream_k": 0}' --samples 5
one k14-idle-1 'matmul/m4096n14336k4096/nn/f16,f32,f32/alpha=1,beta=0' '{"block_m": 64, "block_n": 256, "cluster": 2, "consumers": 2, "epilogue": "tma", "persistent": 1, "producer": "inline", "raster": "m", "raster_group": 4, "schedule": "cooperative", "stages": 4, "stream_k": 0}' --samples 5 --energy
one k14-noidle-2 'matmul/m4096n14336k4096/nn/f16,f32,f32/alpha=1,beta=0' '{"block_m": 64, "block_n": 256, "cluster": 2, "consumers": 2, "epilogue": "tma", "persistent": 1, "producer": "inline", "raster": "m", "raster_group": 4, "schedule": "cooperative", "stages": 4, "stream_k": 0}' --samples 5
one k14-idle-2 'matmul/m4096n14336k4096/nn/f16,f32,f32/alpha=1,beta=0' '{"block_m": 64, "block_n": 256, "cluster": 2, "consumers": 2, "epilogue": "tma", "persistent": 1, "producer": "inline", "raster": "m", "raster_group": 4, "schedule": "cooperative", "stages": 4, "stream_k": 0}' --samples 5 --energy
one k81-s10-1 'matmul/m8192n8192k8192/nn/f16,f32,f32/alpha=1,beta=0' '{"block_m": 64, "block_n": 64, "cluster": 2, "consumers": 1, "epilogue": "direct", "persistent": 0, "producer": "warpgroup", "raster": "m", "raster_group": 8, "schedule": "cooperative", "stages": 3, "stream_k": 0}' --samples 10 --energy
one k81-s10-2 'matmul/m8192n8192k8192/nn/f16,f32,f32/alpha=1,beta=0' '{"block_m": 64, "block_n": 64, "cluster": 2, "consumers": 1, "epilogue": "direct", "persistent": 0, "producer": "warpgroup", "raster": "m", "raster_group": 8, "schedule": "cooperative", "stages": 3, "stream_k": 0}' --samples 10 --energy
tar -czf "$OUT/probe.tar.gz" -C "$OUT" p && rm -rf "$OUT/p"
