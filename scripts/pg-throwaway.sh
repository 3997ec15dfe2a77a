#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests: `start DIR` creates a cluster in DIR (empty or
# missing), starts it on a free loopback port with trust authentication (nothing but this machine
# can reach it) and prints its URL; `alive DIR` succeeds while it runs; `stop DIR` stops it;
# `has-initdb` succeeds when PostgreSQL's server programs are installed.
# Debian's `postgresql` package is installed when no initdb is found and this runs as root. initdb
# refuses to run as root, so the server then runs as the `postgres` user the package creates.
set -euo pipefail

find_bin() {
    local name=$1 dir
    if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
    for dir in /usr/lib/postgresql/*/bin; do
        if [ -x "$dir/$name" ]; then echo "$dir/$name"; return; fi
    done
    return 1
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
    dir=${2:?usage: pg-throwaway.sh start DIR}
    if ! find_bin initdb >/dev/null; then
        if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            echo "installing postgresql for the tracker's PostgreSQL tests" >&2
            (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql) >&2
        else
            echo "no initdb and no root apt-get: install PostgreSQL (Debian: apt-get install postgresql)" >&2
            exit 1
        fi
    fi
    initdb=$(find_bin initdb)
    pg_ctl=$(find_bin pg_ctl)
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    as_owner "$initdb" -D "$dir/data" -U postgres -A trust --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    # A free loopback port: the first of a random run that nothing answers on.
    port=$((20000 + RANDOM % 20000))
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
    as_owner "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >&2 \
        || { cat "$dir/server.log" >&2; exit 1; }
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
has-initdb)
    find_bin initdb >/dev/null
    ;;
alive)
    dir=${2:?usage: pg-throwaway.sh alive DIR}
    pg_ctl=$(find_bin pg_ctl)
    as_owner "$pg_ctl" -D "$dir/data" status >/dev/null 2>&1
    ;;
stop)
    dir=${2:?usage: pg-throwaway.sh stop DIR}
    pg_ctl=$(find_bin pg_ctl)
    as_owner "$pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    ;;
*)
    echo "usage: pg-throwaway.sh start DIR | alive DIR | stop DIR | has-initdb" >&2
    exit 2
    ;;
esac
