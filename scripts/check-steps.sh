#!/usr/bin/env bash
# Checks that a step script's header, its `dispatch` and its step_ functions name the same steps:
# every step the header lists exists and every step that exists is listed.
#   scripts/check-steps.sh [SCRIPT...]   (default: scripts/gpu-check.sh lab/gpu-lab.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for script in "${@:-scripts/gpu-check.sh lab/gpu-lab.sh}"; do
  for s in $script; do
    listed=$(sed -n 's/^#     \([a-z]\+\) .*/\1/p' "$s" | sort)
    defined=$(sed -n 's/^step_\([a-z]\+\)() {.*/\1/p' "$s" | sort)
    dispatched=$(sed -n '/^dispatch() {/,/^}/p' "$s" | grep '"step_\$1"' | sed 's/).*//' | tr '|' '\n' | tr -d ' ' | grep . | sort)
    if [ "$listed" != "$defined" ] || [ "$listed" != "$dispatched" ]; then
      echo "$s: the header lists [$(echo $listed)], step_ functions are [$(echo $defined)], the dispatch runs [$(echo $dispatched)]" >&2
      status=1
    else
      echo "$s: $(echo "$listed" | wc -l) steps, header, functions and dispatch agree"
    fi
  done
done
exit $status
