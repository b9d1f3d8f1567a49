#!/usr/bin/env bash
# What `make test` needs beyond the venv, installed where it can be.
#
# Each need is checked first, with a file test or `command -v`, so that a machine that
# has everything pays a few milliseconds and runs no package manager. What is missing
# is installed with apt-get when we are root on a Debian-like system; otherwise the
# script stops at once and prints the one command that installs it.
#
#   scripts/test-deps.sh            check, install what is missing, start PostgreSQL
#   scripts/test-deps.sh --check    check only; exit 1 and print the command if anything is missing
set -euo pipefail
cd "$(dirname "$0")/.."

check_only=
[ "${1:-}" = "--check" ] && check_only=1

say() { printf 'test-deps: %s\n' "$*" >&2; }

# need PACKAGE TEST...: PACKAGE is missing unless the test command succeeds.
missing=()
need() {
    local package=$1
    shift
    "$@" >/dev/null 2>&1 || missing+=("$package")
}
have() { command -v "$1"; }
have_file() { local f; for f in "$@"; do [ -e "$f" ] && return 0; done; return 1; }

# PostgreSQL's server binaries: tests/support/pgserver.py starts a throwaway server with them
# when none answers, and tests/support/faultkit.py runs initdb/pg_ctl for the restart tests.
need postgresql have_file /usr/lib/postgresql/*/bin/pg_ctl
need postgresql-client have psql
# tests/faults/test_pgbouncer.py starts its own PgBouncer: only the binary is needed.
need pgbouncer have_file /usr/sbin/pgbouncer /usr/bin/pgbouncer
# tests/integrations/test_other_languages.py runs a Node.js client of the SQL API.
need nodejs have node
need npm have npm
# Clock tests step a process's clock with libfaketime (LD_PRELOAD) or faketime(1).
need faketime have faketime
need libfaketime have_file /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1
# Examples of the docs that tests/docs/test_docs.py runs: the sqlite3 shell, pgrep.
need sqlite3 have sqlite3
need procps have pgrep
# `make model-check` checks model/ with SPIN (it compiles the verifier with gcc).
need spin have spin
need gcc have gcc
# tests/integrations/test_celery.py uses the Redis on 127.0.0.1:6379 as broker, started there if absent.
need redis-server have redis-server
# tests/failover/test_patroni.py runs one etcd and three Patroni nodes of its own; Patroni
# talks to etcd through python3-etcd (one of the DCS clients the package only recommends
# as alternatives), with the system python3, not the venv's.
need patroni have patroni
need etcd-server have etcd
need python3-etcd /usr/bin/python3 -c 'import etcd'

if [ ${#missing[@]} -gt 0 ]; then
    command="apt-get install -y ${missing[*]}"
    if [ -n "$check_only" ] || [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        [ "$(id -u)" -ne 0 ] && command="sudo $command"
        say "missing: ${missing[*]}"
        say "run: $command"
        exit 1
    fi
    say "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    # Debian's pgbouncer package starts a service on 6432; the tests start their own.
    if [[ " ${missing[*]} " == *" pgbouncer "* ]]; then
        if command -v systemctl >/dev/null && systemctl is-active -q pgbouncer 2>/dev/null; then
            systemctl stop pgbouncer || true
        fi
        service pgbouncer stop >/dev/null 2>&1 || true
    fi
    # Debian's etcd-server starts an etcd on 2379 (patroni's units start only once
    # configured); the tests start their own on free ports and want no other running.
    if [[ " ${missing[*]} " == *" etcd-server "* || " ${missing[*]} " == *" patroni "* ]]; then
        for service in etcd patroni; do
            if command -v systemctl >/dev/null && systemctl is-active -q $service 2>/dev/null; then
                systemctl stop $service || true
            fi
            service $service stop >/dev/null 2>&1 || true
        done
    fi
fi

# node's `pg` for the interop client, once; the lock is the one the test takes.
if [ ! -e tests/interop/node_modules/pg/package.json ]; then
    if [ -n "$check_only" ]; then
        say "missing: the npm package pg in tests/interop"
        say "run: (cd tests/interop && npm install)"
        exit 1
    fi
    say "installing the npm package pg into tests/interop/node_modules"
    (
        cd tests/interop
        flock .npm-install.lock npm install --no-audit --no-fund --loglevel=error >/dev/null
    ) || {
        say "npm install failed"
        say "run: (cd tests/interop && npm install)"
        exit 1
    }
fi

# The machine's PostgreSQL on 127.0.0.1:5432, started if it is installed and down.
# Not fatal: without it tests/conftest.py starts a throwaway server of its own.
if [ -z "${PYLEASE_TEST_DSN:-}" ] && [ -z "$check_only" ] \
    && ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ] && [ "$(id -u)" -eq 0 ]; then
        version=$(ls /etc/postgresql | sort -V | tail -1)
        say "starting PostgreSQL $version (cluster main)"
        pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    fi
fi
