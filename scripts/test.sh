#!/usr/bin/env bash
# The test command (README, CI). Installs NVRTC from PyPI when needed, then runs every test of the
# workspace with it: code generation, NVRTC compilation of generated kernels, the gRPC services,
# SQLite and the `sim` device end to end; then the tracker's suite again on a throwaway PostgreSQL
# server (scripts/pg-throwaway.sh; Debian's postgresql is installed when missing, as root).
# TENSORTUNE_TEST_PG=URL uses a server of your own instead. GPU-only checks live in
# scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=$(scripts/setup-nvrtc.sh)
export LD_LIBRARY_PATH="$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TENSORTUNE_CUDA_INCLUDE="$cuda/include"
export TENSORTUNE_REQUIRE_NVRTC=1
# The dashboard test drives a real headless browser: Debian's chromium, installed when missing.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing chromium for the dashboard test" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >&2 \
            || echo "chromium could not be installed: the dashboard test will say SKIPPED" >&2
    else
        echo "no chromium and no root apt-get: the dashboard test will say SKIPPED" >&2
    fi
fi
# `tensortune plot` lays text out with a TrueType font from the system; its test needs one.
if [ -z "${TENSORTUNE_FONT:-}" ] && ! find /usr/share/fonts /usr/local/share/fonts -name '*.ttf' 2>/dev/null | grep -q .; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing fonts-dejavu-core for the plot test" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fonts-dejavu-core) >&2 \
            || echo "no font could be installed: the plot test will fail; set TENSORTUNE_FONT to a .ttf file" >&2
    else
        echo "no TrueType font and no root apt-get: the plot test will fail; set TENSORTUNE_FONT to a .ttf file" >&2
    fi
fi
# kernels/tests/simt_cpu.rs runs generated CUDA on the CPU through a C++20 compiler ($CXX, else
# c++): Debian's g++ is installed when there is none.
if [ -z "${CXX:-}" ] && ! command -v c++ >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing g++ for the simt_cpu test" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++) >&2 \
            || echo "g++ could not be installed: the simt_cpu test will fail; set CXX to a C++20 compiler" >&2
    else
        echo "no c++ and no root apt-get: the simt_cpu test will fail; set CXX to a C++20 compiler" >&2
    fi
fi
# A test run builds once: incremental state (about 2 GB) buys nothing here.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
echo "disk free for target/: $(df -h . | awk 'NR==2 {print $4}')" >&2
status=0
# The GPU step scripts: each step listed in a header exists, and each that exists is listed.
scripts/check-steps.sh || status=$?
cargo test --workspace --locked --no-fail-fast "$@" || status=$?
# The tracker's API suite as that build made it: `cargo test -p tensortune-tracker` would resolve
# the features again for one package and rebuild much of the dependency tree (minutes on 2 cores).
api_test=$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null \
  | grep '"name":"api"' | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
# The systemd units of deploy/, against the binaries the tests just built (Debian's systemd
# package is installed when systemd-analyze is missing, as root).
deploy/verify-units.sh "${CARGO_TARGET_DIR:-target}/debug" || status=$?
# The Python package's tests (python/tests): without torch here, capture's torch tests skip (they
# run on the GPU machine, scripts/gpu-model.sh); pytest goes into target/ when missing.
if ! python3 -c 'import pytest' 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target target/pytest-env pytest >&2 || true
fi
PYTHONPATH=python:target/pytest-env python3 -m pytest -q -p no:cacheprovider python/tests || status=$?
# The tracker's tests on PostgreSQL: each test makes a database of its own on this server. The
# throwaway server starts only now, so it lives for this suite alone (about a minute), not through
# the workspace's build and tests; its log is printed when the suite fails or the server is gone.
pg_dir=
if [ -z "${TENSORTUNE_TEST_PG:-}" ]; then
    pg_dir=$(mktemp -d /tmp/tensortune-pg.XXXXXX)
    trap 'scripts/pg-throwaway.sh stop "$pg_dir"; rm -rf "$pg_dir"' EXIT
    TENSORTUNE_TEST_PG=$(scripts/pg-throwaway.sh start "$pg_dir")
fi
echo "tracker tests on PostgreSQL ($TENSORTUNE_TEST_PG)" >&2
pg_status=0
if [ -z "$api_test" ]; then
    echo "the tracker's API test binary was not found in the workspace build" >&2
    pg_status=1
else
    (cd tracker && TENSORTUNE_TEST_PG=$TENSORTUNE_TEST_PG "$api_test") || pg_status=$?
fi
if [ -n "$pg_dir" ] && { [ "$pg_status" != 0 ] || ! scripts/pg-throwaway.sh alive "$pg_dir"; }; then
    echo "the throwaway PostgreSQL server's log (last 60 lines):" >&2
    tail -n 60 "$pg_dir/server.log" >&2 || true
    df -h "$pg_dir" >&2 || true
fi
[ "$pg_status" = 0 ] || status=$pg_status
exit $status
