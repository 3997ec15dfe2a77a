#!/usr/bin/env bash
# Checks the systemd units with `systemd-analyze verify`, against the binaries in BINDIR (the
# units name /usr/local/bin/..., which a build machine does not have: copies of the units point at
# BINDIR instead). Fails on any complaint, warnings included (verify exits 0 on an unknown key).
# Installs Debian's systemd package when systemd-analyze is missing (as root).
# Usage: deploy/verify-units.sh BINDIR   (e.g. target/debug)
set -euo pipefail
if ! command -v systemd-analyze >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
        || { echo "verify-units: systemd-analyze is missing; install Debian's systemd package" >&2; exit 1; }
    echo "verify-units: installing Debian's systemd package for systemd-analyze" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd) >&2
fi
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
