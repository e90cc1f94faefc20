#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for cmdc's tests and benchmarks.
#
#   eval "$(scripts/pg_test.sh start)"    # initdb + start; exports CMDC_TEST_POSTGRES_URL,
#                                         # CMDC_TEST_POSTGRES_DIR and CMDC_TEST_POSTGRES_DATA
#   python -m pytest                      # the PostgreSQL tests now run
#   scripts/pg_test.sh stop               # stops it and removes the directory
#
# The cluster lives in a new temp directory, listens only on a unix socket inside it (no TCP
# port, so nothing clashes), and trusts local connections. As root it runs as the `postgres`
# OS user (PostgreSQL refuses to run as root). It is for tests: fsync and full_page_writes are
# off (an immediate-mode restart of the server keeps what was committed; a power cut might not).
# PG_DURABLE=1 keeps them on (the server's defaults: every commit reaches the disk, as the file
# store's do): start benchmark clusters that way, or PostgreSQL's figures are flattered.
# PG_BIN overrides where the binaries are (default: the newest /usr/lib/postgresql/*/bin).
set -euo pipefail

pg_bin() {
    if [[ -n "${PG_BIN:-}" ]]; then echo "$PG_BIN"; return; fi
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -z "$d" && -x "$(command -v initdb 2>/dev/null || true)" ]]; then d=$(dirname "$(command -v initdb)"); fi
    if [[ -z "$d" ]]; then
        echo "pg_test.sh: no PostgreSQL binaries found (apt-get install postgresql, or set PG_BIN)" >&2
        exit 1
    fi
    echo "$d"
}

as_owner() {  # run a command as the cluster's owner
    if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
    local bin dir sync
    bin=$(pg_bin)
    sync="-c fsync=off -c full_page_writes=off"
    if [[ "${PG_DURABLE:-0}" != "0" ]]; then sync=""; fi
    dir=$(mktemp -d "${TMPDIR:-/tmp}/cmdc-pg.XXXXXXXX")
    if [[ $(id -u) -eq 0 ]]; then chown postgres: "$dir"; fi
    chmod 700 "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses='' -c unix_socket_directories='$dir' $sync -c max_connections=200" \
        start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
    as_owner "$bin/createdb" -h "$dir" -U postgres cmdc_test
    echo "export CMDC_TEST_POSTGRES_URL='postgresql://postgres@/cmdc_test?host=$dir'"
    echo "export CMDC_TEST_POSTGRES_DIR='$dir'"
    echo "export CMDC_TEST_POSTGRES_DATA='$dir/data'"
    echo "export CMDC_TEST_POSTGRES_BIN='$bin'"
}

stop() {
    local dir=${1:-${CMDC_TEST_POSTGRES_DIR:-}}
    if [[ -z "$dir" || ! -d "$dir/data" ]]; then
        echo "pg_test.sh stop: give the directory printed by start (or set CMDC_TEST_POSTGRES_DIR)" >&2
        exit 1
    fi
    as_owner "$(pg_bin)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    *) echo "usage: $0 start | stop [DIR]" >&2; exit 2 ;;
esac
