#!/usr/bin/env bash
# Builds the release binaries here and copies them, stripped, into .gpu/ (ignored by git via
# .git/info/exclude) for the `device` tool to carry to the GPU machine, where nothing is built.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.gpu/' "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo '/.gpu/' >> "$exclude"; }
examples=(gpu_selftest run_one compile_bench cudnn_check clusters)
cargo build --release --locked --bin tensortune --bin tensortune-tracker --bin tensortune-worker "${examples[@]/#/--example=}"
mkdir -p .gpu
target=${CARGO_TARGET_DIR:-target}
for b in tensortune tensortune-tracker tensortune-worker; do strip -o ".gpu/$b" "$target/release/$b"; done
for e in "${examples[@]}"; do strip -o ".gpu/$e" "$target/release/examples/$e"; done
# The worker's GPU-only tests (#[ignore] in CI), as a test binary run by gpu-check.sh gputests.
test_bin=$(cargo test --release --locked -p tensortune-worker --test worker --no-run --message-format=json 2>/dev/null \
  | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
strip -o .gpu/worker-gpu-tests "$test_bin"
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
  echo "warning: .gpu is ${size} MiB; with the tree it may pass the device tool's 64 MiB: set GPU_PACK_ONLY to the binaries the steps need (e.g. 'tensortune gpu_selftest run_one')" >&2
fi
