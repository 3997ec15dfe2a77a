#!/usr/bin/env bash
# Lead, 2026-11-29 night: issue 39's tuned-kernel bars (scripts/energy-tuned.sh) on two GPUs, default and large a GPU,
# with main cea6942's binary (M.xz).
set -uo pipefail
mkdir -p /tmp/b && xz -dc .gpu-lead15/M.xz > /tmp/b/tensortune && chmod +x /tmp/b/tensortune
BIN=/tmp/b ENERGY_TUNED_GPUS=2 ENERGY_TUNED_BUDGET_S=${B:-545} ENERGY_COMMIT=cea6942 bash scripts/energy-tuned.sh
