#!/usr/bin/env bash
# A PostgreSQL server of the suite's own, for `make test` (scripts/test-all.sh):
#   scripts/suite-server.sh start DIR   prints the admin DSN of a new server in DIR
#   scripts/suite-server.sh stop DIR    stops it and removes DIR
# The machine's server on 5432 allows 100 connections, and the suite's six workers
# (their keepers, listeners, child processes and PgBouncer's pools) reach about that
# much at their peak, before counting anyone else's use of that server: a suite of its
# own never meets "too many clients", and leaves no database behind on the machine's.
# Its settings are the machine server's, except for the connection limit and fsync
# (nothing of the suite's outlives the run).
set -euo pipefail
cmd=$1 dir=$2
bindir=$(command -v pg_ctl >/dev/null && dirname "$(command -v pg_ctl)" \
    || ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case $cmd in
start)
    mkdir -p "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir"
    as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
        --no-sync > "$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    port=$(python3 -c 'import random, socket
for _ in range(200):
    port = random.randint(10000, 30000)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break')
    cat >> "$dir/data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 400
fsync = off
autovacuum = off
timezone = 'Etc/UTC'
log_timezone = 'Etc/UTC'
shared_buffers = 128MB
CONF
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgresql.log" -w -t 60 start \
        > /dev/null || { cat "$dir/postgresql.log" >&2; exit 1; }
    echo "postgresql://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop > /dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
