#!/usr/bin/env bash
# Builds the release binaries here and copies them, stripped, into .gpu/ (ignored by git via
# .git/info/exclude) for the `device` tool to carry to the GPU machine, where nothing is built:
# tensortune, tensortune-tracker, tensortune-worker, the worker's GPU-only tests and the exhaustive
# compile test (what scripts/gpu-check.sh runs). GPU_PACK_LAB=1 adds the lab's binaries (lab/gpu-lab.sh: run_one,
# clusters, cudnn_check, compile_bench).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.gpu/' "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo '/.gpu/' >> "$exclude"; }
bins=(tensortune tensortune-tracker tensortune-worker)
lab=()
[ "${GPU_PACK_LAB:-0}" = 1 ] && lab=(run_one clusters cudnn_check compile_bench)
cargo build --release --locked "${bins[@]/#/--bin=}"
[ ${#lab[@]} -gt 0 ] && cargo build --release --locked -p tensortune-lab "${lab[@]/#/--bin=}"
mkdir -p .gpu
target=${CARGO_TARGET_DIR:-target}
for b in "${bins[@]}" ${lab[@]+"${lab[@]}"}; do strip -o ".gpu/$b" "$target/release/$b"; done
# The tests CI leaves out (#[ignore]), as test binaries run by gpu-check.sh gputests: the worker's
# GPU-only ones, and the exhaustive NVRTC compile of one workload's space (kernels' compile tests).
test_exe() {
  cargo test --release --locked -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null \
    | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4
}
strip -o .gpu/worker-gpu-tests "$(test_exe tensortune-worker worker)"
strip -o .gpu/compile-tests "$(test_exe tensortune-kernels compile)"
ls -la .gpu
# The device tool carries at most 64 MiB (the working tree and .gpu together). GPU_PACK_ONLY
# (space-separated names) keeps only those binaries in .gpu; the others go to .gpu-spare/ (also
# ignored), from where a later pack or a `mv` brings them back.
if [ -n "${GPU_PACK_ONLY:-}" ]; then
  mkdir -p .gpu-spare
  grep -qx '/.gpu-spare/' "$exclude" 2>/dev/null || echo '/.gpu-spare/' >> "$exclude"
  for f in .gpu/*; do
    case " $GPU_PACK_ONLY " in *" $(basename "$f") "*) ;; *) mv "$f" .gpu-spare/ ;; esac
  done
fi
size=$(du -sm .gpu | cut -f1)
echo ".gpu holds ${size} MiB"
if [ "$size" -gt 56 ]; then
  echo "warning: .gpu is ${size} MiB; with the tree it may pass the device tool's 64 MiB: set GPU_PACK_ONLY to the binaries the steps need (e.g. 'tensortune run_one')" >&2
fi
