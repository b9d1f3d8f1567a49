"""The throwaway database, the benchmark's own tables, and what machine this ran on."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

import psycopg
from psycopg import conninfo, sql

from pylease.migrate import migrate

# The floor of section 1, the hand-written lease of section 7 and the witness of
# section 6. The witness functions are fenced writes: they change the witness row
# only while lease_holds() confirms (and locks) the tenure, and they report any
# tenure that found another one still inside, or an older fence after a newer one.
# Witness writes skip the WAL flush: they prove exclusion, durability is not asked of them.
BENCH_SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS bench_handlease (
    name text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL);

CREATE TABLE IF NOT EXISTS bench_witness (
    name text PRIMARY KEY,
    occupant text,
    fence bigint NOT NULL DEFAULT 0,
    entries bigint NOT NULL DEFAULT 0,
    violations bigint NOT NULL DEFAULT 0);

CREATE OR REPLACE FUNCTION bench_witness_enter(p_name text, p_holder text, p_fence bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    prev_occupant text;
    prev_fence bigint;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF NOT lease_holds(p_name, p_holder, p_fence) THEN
        RETURN 'rejected';
    END IF;
    SELECT w.occupant, w.fence INTO prev_occupant, prev_fence
      FROM bench_witness AS w WHERE w.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'bench: no witness row for %', p_name;
    END IF;
    UPDATE bench_witness AS w
       SET occupant = p_holder, fence = p_fence, entries = w.entries + 1,
           violations = w.violations
               + CASE WHEN prev_occupant IS NOT NULL OR prev_fence >= p_fence THEN 1 ELSE 0 END
     WHERE w.name = p_name;
    IF prev_occupant IS NOT NULL THEN
        RETURN 'overlap';
    ELSIF prev_fence >= p_fence THEN
        RETURN 'fence';
    END IF;
    RETURN 'ok';
END
$$;

-- The cheapest function a SQL API under the contract's rules can offer: PL/pgSQL,
-- SECURITY DEFINER, search_path pinned. Section 2 times it as the floor of any call.
CREATE OR REPLACE FUNCTION bench_noop(name text, ttl interval, holder text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION bench_witness_leave(p_name text, p_holder text, p_fence bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF NOT lease_holds(p_name, p_holder, p_fence) THEN
        RETURN 'rejected';
    END IF;
    UPDATE bench_witness AS w SET occupant = NULL
     WHERE w.name = p_name AND w.occupant = p_holder AND w.fence = p_fence;
    IF NOT FOUND THEN
        UPDATE bench_witness AS w SET violations = w.violations + 1 WHERE w.name = p_name;
        RETURN 'overlap';
    END IF;
    RETURN 'ok';
END
$$;
"""


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return conninfo.make_conninfo("", **params)


def dbname_of(dsn: str) -> str:
    name = conninfo.conninfo_to_dict(dsn).get("dbname")
    if not name:
        raise SystemExit("benchmarks: the DSN must name its database, e.g. .../pylease_bench")
    return str(name)


def recreate(dsn: str, say: Callable[[str], None]) -> None:
    """Drop and create the database the DSN names, then migrate it: a clean slate per run."""
    name = dbname_of(dsn)
    if not (name.startswith("pylease_bench") or name.endswith("_bench")):
        raise SystemExit(
            f"benchmarks: refusing to drop database {name!r}; --fresh only drops"
            " pylease_bench* and *_bench"
        )
    admin = with_dbname(dsn, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(dsn, say=lambda line: say(f"  {line}"))


def install_bench_schema(conn: psycopg.Connection[Any]) -> None:
    conn.execute(BENCH_SCHEMA)  # type: ignore[arg-type]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """The commit measured, ``+dirty`` when the work tree had changes beyond it."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], capture_output=True, text=True, check=True, cwd=here
            )
        except (OSError, subprocess.CalledProcessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return None
    dirty = git(
        "status", "--porcelain", "--untracked-files=no", "--", "pylease", "migrations", "sql"
    )
    return f"{commit}+dirty" if dirty else commit


def machine(conn: psycopg.Connection[Any], redis_client: Any) -> dict[str, Any]:
    """Cores, versions and the durability settings that decide the floors."""
    settings = {}
    for name in (
        "server_version",
        "synchronous_commit",
        "fsync",
        "wal_sync_method",
        "commit_delay",
        "shared_buffers",
        "max_connections",
    ):
        row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
        settings[name] = row[0] if row else None
    version_row = conn.execute("SELECT version()").fetchone()
    # The machine may be shared: how busy the server was with others when the run began.
    others = conn.execute(
        "SELECT count(*) FILTER (WHERE datname IS DISTINCT FROM current_database()),"
        " count(*) FILTER (WHERE state = 'active' AND datname IS DISTINCT FROM current_database())"
        " FROM pg_stat_activity WHERE backend_type = 'client backend'"
    ).fetchone()
    info: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": _memory_gib(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "postgresql": settings.pop("server_version"),
        "postgresql_build": version_row[0] if version_row else None,
        "postgresql_settings": settings,
        "server": conninfo.conninfo_to_dict(conn.info.dsn).get("host"),
        "load_average_at_start": list(os.getloadavg()),
        "other_sessions_at_start": {"connected": others[0], "active": others[1]}
        if others
        else None,
        "git_commit": _git_commit(),
        "packages": {
            d: _version(d)
            for d in (
                "pylease",
                "psycopg",
                "redis",
                "python-redis-lock",
                "pals",
                "sqlalchemy",
                "filelock",
            )
        },
    }
    if redis_client is not None:
        try:
            info["redis"] = redis_client.info("server").get("redis_version")
        except Exception:
            info["redis"] = None
    return info


def _memory_gib() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * size / 2**30, 1)
