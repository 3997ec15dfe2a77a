#!/usr/bin/env bash
# The test command (README, CI). Builds every test of the workspace once and runs the test
# binaries side by side (TEST_JOBS at a time, default: cores + 1), with NVRTC from PyPI: code
# generation, NVRTC compilation of generated kernels, the gRPC services, SQLite and the `sim`
# device end to end; the tracker's API suite a second time on a throwaway PostgreSQL server
# (scripts/pg-throwaway.sh), the doctests, the systemd units, the Python package's tests and the
# GPU step scripts' headers. TENSORTUNE_TEST_PG=URL uses a PostgreSQL server of your own.
# Arguments go to every test binary (a name filter, --ignored, ...). GPU-only checks live in
# scripts/gpu-check.sh. Each binary's output is printed whole when it ends; a table of binaries,
# results and seconds comes last, and the exit status is non-zero when anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-target}
logs="$target/test-logs"
rm -rf "$logs" && mkdir -p "$logs"
# A test run builds once: incremental state (about 2 GB) buys nothing here.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
began=$(date +%s)
echo "disk free for target/: $(df -h . | awk 'NR==2 {print $4}')" >&2

# What the tests need from the system, installed while the workspace builds (as root, Debian):
# chromium (the dashboard test drives a real headless browser), a TrueType font (`tensortune
# plot`), a C++20 compiler (kernels/tests/simt_cpu.rs runs generated CUDA on the CPU), systemd-analyze
# (deploy/verify-units.sh) and PostgreSQL (unless TENSORTUNE_TEST_PG names a server); then NVRTC
# and pytest when missing. NVRTC and the CUDA headers come from PyPI (scripts/setup-nvrtc.sh) on
# their own, first: the compile tests start as soon as the early build below is done.
setup() {
    local pkgs=()
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || pkgs+=(chromium)
    if [ -z "${TENSORTUNE_FONT:-}" ] && ! find /usr/share/fonts /usr/local/share/fonts -name '*.ttf' 2>/dev/null | grep -q .; then
        pkgs+=(fonts-dejavu-core)
    fi
    [ -n "${CXX:-}" ] || command -v c++ >/dev/null 2>&1 || pkgs+=(g++)
    command -v systemd-analyze >/dev/null 2>&1 || pkgs+=(systemd)
    if [ -z "${TENSORTUNE_TEST_PG:-}" ] && ! scripts/pg-throwaway.sh has-initdb; then pkgs+=(postgresql); fi
    if [ ${#pkgs[@]} -gt 0 ]; then
        if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            echo "installing ${pkgs[*]} for the tests" >&2
            (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}") >&2 \
                || echo "apt-get could not install ${pkgs[*]}: the tests that need them will say so" >&2
        else
            echo "missing ${pkgs[*]} and no root apt-get: the tests that need them will say so" >&2
        fi
    fi
    if ! python3 -c 'import pytest' 2>/dev/null; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$target/pytest-env" pytest >&2 || true
    fi
}
setup >"$logs/setup.log" 2>&1 &
setup_pid=$!
scripts/setup-nvrtc.sh >"$logs/nvrtc-dir" 2>"$logs/setup-nvrtc.log" &
nvrtc_pid=$!
# Waits for NVRTC's install and points the tests at it, the first time it is called.
use_nvrtc() {
    [ -z "${cuda:-}" ] || return 0
    wait "$nvrtc_pid" || { cat "$logs/setup-nvrtc.log" >&2; echo "installing NVRTC failed" >&2; exit 1; }
    cuda=$(cat "$logs/nvrtc-dir")
    export LD_LIBRARY_PATH="$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export TENSORTUNE_CUDA_INCLUDE="$cuda/include"
    export TENSORTUNE_REQUIRE_NVRTC=1
}

# The test binaries as a build's JSON messages list them: label, directory, executable.
list_tests() {
    python3 - "$1" "$root" <<'EOF'
import json, os, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    pkg_dir = os.path.dirname(m["manifest_path"])
    print(os.path.relpath(pkg_dir, sys.argv[2]) + "/" + m["target"]["name"], pkg_dir, m["executable"], sep="\t")
EOF
}

# Runs job $1 (label, directory, command); its output goes to a log, printed whole when it ends.
# The table at the end gives each job's wall seconds and CPU seconds (user + system, its children
# included): on a machine of two cores the CPU seconds, not the walls, say what a job costs.
run_job() {
    local label=$1 dir=$2 cmd=$3 log start rc=0 cpu TIMEFORMAT='%U %S'
    shift 3
    log="$logs/$(echo "$label" | tr ' /' '__').log"
    start=$(date +%s)
    if [[ $cmd == /* ]]; then
        cpu=$({ time { (cd "$dir" && "$cmd" "$@") >"$log" 2>&1; }; } 2>&1) || rc=$?
    else
        cpu=$({ time { (cd "$dir" && eval "$cmd") >"$log" 2>&1; }; } 2>&1) || rc=$?
    fi
    cpu=$(echo "$cpu" | awk 'END { printf "%.0f", $1 + $2 }')
    { echo "=== $label (exit $rc, $(($(date +%s) - start)) s, $cpu CPU-s)"; cat "$log"; } >&2
    printf '%s\t%s\t%s\t%s\n' "$label" "$rc" "$(($(date +%s) - start))" "$cpu" >>"$logs/results.tsv"
}
: >"$logs/results.tsv"

# The longest tests need neither the tracker, the worker nor PostgreSQL: the search crate's
# replays and NVRTC's compile of what every template generates (kernels/tests/compile). They are
# built first (kernels, search and tensortune-nvrtc only) and run while the rest of the workspace
# builds, at a lower priority (nice), so that they take what the build leaves idle (its last crates
# leave a core idle much of the time) and do not hold up the build. --workspace keeps the
# features the full build resolves, so nothing is built twice.
status=0
early=()
early_pids=()
if cargo test --workspace --locked --no-run --message-format=json \
    --test union_replay --test shipped_replay --test ground_truth_current --test compile >"$logs/build-early.json"; then
    use_nvrtc # the compile tests need it (most often installed by now)
    while IFS=$'\t' read -r label dir exe; do
        (renice -n 10 -p "$BASHPID" >/dev/null 2>&1 || true; run_job "$label" "$dir" "$exe" "$@") &
        early+=("$label")
        early_pids+=($!)
    done < <(list_tests "$logs/build-early.json")
fi
cargo test --workspace --locked --no-run --message-format=json >"$logs/build.json" \
    || { echo "the workspace's tests did not build" >&2; status=1; }
echo "the workspace's tests built $(($(date +%s) - began)) s after the start" >&2
# From here on the jobs to come run at the early ones' priority: with the build done, nothing
# is more urgent than the rest, and an early job left running must not become the last one.
renice -n 10 -p $$ >/dev/null 2>&1 || true
wait "$setup_pid" || { cat "$logs/setup.log" >&2; echo "setting up the test machine failed" >&2; exit 1; }
cat "$logs/setup.log" >&2
[ "$status" = 0 ] || exit "$status"
use_nvrtc

# The tracker's tests on PostgreSQL: each test makes a database of its own on this server.
pg_dir=
if [ -z "${TENSORTUNE_TEST_PG:-}" ]; then
    pg_dir=$(mktemp -d /tmp/tensortune-pg.XXXXXX)
    trap 'scripts/pg-throwaway.sh stop "$pg_dir"; rm -rf "$pg_dir"' EXIT
    pg_url=$(scripts/pg-throwaway.sh start "$pg_dir") || { echo "the throwaway PostgreSQL server did not start" >&2; exit 1; }
else
    pg_url=$TENSORTUNE_TEST_PG
fi

# The jobs: each test binary the build made (label, directory, command), the API suite again on
# PostgreSQL, and the checks that are not cargo tests. The long ones start first.
jobs_file="$logs/jobs.tsv"
first=(client/e2e tracker/api worker/worker)
list_tests "$logs/build.json" | awk -F'\t' -v early="${early[*]}" -v first="${first[*]}" '
    BEGIN { n = split(early, e, " "); for (i = 1; i <= n; i++) skip[e[i]] = 1
            n = split(first, f, " "); for (i = 1; i <= n; i++) rank[f[i]] = i }
    !($1 in skip) { printf "%d\t%s\n", ($1 in rank) ? rank[$1] : 99, $0 }' \
    | sort -t$'\t' -k1,1n -k2,2 | cut -f2- >"$jobs_file"
# The API suite on PostgreSQL takes as long as on SQLite: it starts right after it.
api=$(awk -F'\t' '$1 == "tracker/api" { print $3 }' "$jobs_file")
if [ -n "$api" ]; then
    pg_job=$(printf 'tracker/api on postgres\t%s/tracker\tenv TENSORTUNE_TEST_PG=%s %s' "$root" "$pg_url" "$api")
    awk -F'\t' -v job="$pg_job" '{ print } $1 == "tracker/api" { print job }' "$jobs_file" >"$jobs_file.new"
    mv "$jobs_file.new" "$jobs_file"
else
    printf 'tracker/api on postgres\t%s\tfalse the API test binary was not built\n' "$root" >>"$jobs_file"
fi
printf 'doctests\t%s\tcargo test --workspace --locked --doc\n' "$root" >>"$jobs_file"
printf 'deploy units\t%s\tdeploy/verify-units.sh %s/debug\n' "$root" "$target" >>"$jobs_file"
printf 'python tests\t%s\tenv PYTHONPATH=python:%s/pytest-env python3 -m pytest -q -p no:cacheprovider python/tests\n' \
    "$root" "$target" >>"$jobs_file"
printf 'gpu step headers\t%s\tscripts/check-steps.sh\n' "$root" >>"$jobs_file"

# At most TEST_JOBS jobs at once (default: cores + 1), not counting the early ones still running
# (they were started before the build and only share the cores with these, at the same nice).
# `wait -n` waits for a job that ends from now on, so the running ones are counted each time.
parallel=${TEST_JOBS:-$(($(nproc) + 1))}
running() {
    local n=0 p
    for p in $(jobs -rp); do [[ " ${early_pids[*]} " == *" $p "* ]] || n=$((n + 1)); done
    echo "$n"
}
while IFS=$'\t' read -r label dir cmd; do
    while [ "$(running)" -ge "$parallel" ]; do wait -n || true; done
    case "$label" in
    # Test binaries take the script's arguments; the other jobs run as they are.
    "tracker/api on postgres" | doctests | "deploy units" | "python tests" | "gpu step headers") run_job "$label" "$dir" "$cmd" & ;;
    *) run_job "$label" "$dir" "$cmd" "$@" & ;;
    esac
done <"$jobs_file"
wait

if [ -n "$pg_dir" ] && ! scripts/pg-throwaway.sh alive "$pg_dir"; then
    echo "the throwaway PostgreSQL server is gone; its log (last 60 lines):" >&2
    tail -n 60 "$pg_dir/server.log" >&2 || true
fi
echo >&2
printf '%-32s %6s %6s %6s\n' job exit s CPU-s >&2
sort -t$'\t' -k3,3nr "$logs/results.tsv" | awk -F'\t' '{ printf "%-32s %6s %6s %6s\n", $1, $2, $3, $4 }' >&2
jobs_run=$(wc -l <"$logs/results.tsv")
jobs_wanted=$(($(wc -l <"$jobs_file") + ${#early[@]}))
[ "$jobs_run" = "$jobs_wanted" ] || { echo "only $jobs_run of $jobs_wanted jobs reported" >&2; status=1; }
failed=$(awk -F'\t' '$2 != 0' "$logs/results.tsv" | wc -l)
[ "$failed" = 0 ] || { echo "$failed jobs failed" >&2; status=1; }
# The number of tests that ran, as cargo counts them.
grep -ho '^test result: .*' "$logs"/*.log | awk '{ p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' >&2
echo "$(($(date +%s) - began)) s in all" >&2
exit $status
