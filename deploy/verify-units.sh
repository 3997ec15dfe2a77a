#!/usr/bin/env bash
# Checks the systemd units with `systemd-analyze verify`, against the binaries in BINDIR (the
# units name /usr/local/bin/..., which a build machine does not have: copies of the units point at
# BINDIR instead). Fails on any complaint, warnings included (verify exits 0 on an unknown key).
# Usage: deploy/verify-units.sh BINDIR   (e.g. target/debug)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=$(cd "${1:?usage: verify-units.sh BINDIR}" && pwd)
for bin in tensortune-tracker tensortune-worker; do
    test -x "$bindir/$bin" || { echo "verify-units: $bindir/$bin is missing; build it first" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
for unit in "$here"/*.service; do
    name=$(basename "$unit")
    sed "s#/usr/local/bin/#$bindir/#g" "$unit" >"$work/$name"
    if out=$(cd "$work" && systemd-analyze verify --man=no "./$name" 2>&1) && [ -z "$out" ]; then
        echo "verify-units: $name ok"
        passed=$((passed + 1))
    else
        echo "verify-units: $name FAILED:" >&2
        echo "$out" >&2
        failed=$((failed + 1))
    fi
done
echo "units: $passed passed, $failed failed"
[ "$failed" = 0 ]
