#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the distributed-tuning test.
#   postgres.sh run CMD...   start, export SERVELAB_TEST_POSTGRES_DSN, run CMD, stop (trap), exit with CMD's status
#   postgres.sh start        start; print "DSN DATA_DIR" on stdout
#   postgres.sh stop DIR     stop the server of DATA_DIR and delete it
# Installs the Debian package `postgresql` when no server binaries are found. As root, the server runs as the
# `postgres` user (initdb refuses root). Nothing is written outside a fresh temporary directory.
set -euo pipefail

pg_bin() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -z "$dir" ]] && command -v pg_ctl >/dev/null; then
        dir=$(dirname "$(readlink -f "$(command -v pg_ctl)")")
    fi
    echo "$dir"
}

ensure_installed() {
    if [[ -z "$(pg_bin)" ]]; then
        echo "postgres.sh: installing the postgresql package" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    fi
    [[ -n "$(pg_bin)" ]] || { echo "postgres.sh: no PostgreSQL server binaries after install" >&2; exit 1; }
}

as_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    ensure_installed
    local bin data port
    bin=$(pg_bin)
    data=$(mktemp -d /tmp/servelab-pg.XXXXXX)
    [[ $(id -u) -eq 0 ]] && chown postgres: "$data"
    port=$(free_port)
    as_owner "$bin/initdb" -D "$data/db" -A trust -U servelab --no-sync >"$data/initdb.log" 2>&1 \
        || { cat "$data/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$data/db" -l "$data/server.log" -w -t 60 \
        -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50" start >&2 \
        || { cat "$data/server.log" >&2; exit 1; }
    as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U servelab servelab_test
    echo "postgresql://servelab@127.0.0.1:$port/servelab_test $data"
}

stop() {
    local data=$1 bin
    bin=$(pg_bin)
    [[ -d "$data/db" ]] && as_owner "$bin/pg_ctl" -D "$data/db" -m fast -w stop >&2 || true
    rm -rf "$data"
}

case "${1:-}" in
    start) start ;;
    stop) stop "$2" ;;
    run)
        shift
        read -r dsn data < <(start) || true
        [[ -n "${dsn:-}" ]] || { echo "postgres.sh: PostgreSQL did not start" >&2; exit 1; }
        trap 'stop "$data"' EXIT
        echo "postgres.sh: PostgreSQL on $dsn" >&2
        SERVELAB_TEST_POSTGRES_DSN=$dsn "$@"
        ;;
    *) echo "usage: $0 run CMD... | start | stop DATA_DIR" >&2; exit 2 ;;
esac
