"""The schema as shipped: schema.sql agrees with the migrations, and it is safe to call.

Security is tested as a caller would meet it: a role that may only EXECUTE, a
schema of look-alike objects earlier in the caller's search_path.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

from pylease._resources import data_dir
from pylease.migrate import migrate, rollback

Conn = psycopg.Connection[Any]
HOUR = timedelta(hours=1)

MIGRATIONS = [
    "pylease-0001-leases",
    "pylease-0002-safety",
    "pylease-0003-operations",
    "pylease-0004-faster",
    "pylease-0005-waiters",
    "pylease-0006-tenures",
    "pylease-0007-edges",
    "pylease-0008-permits",
    "pylease-0009-keeper",
    "pylease-0010-prune",
    "pylease-0011-groups",
    "pylease-0012-tenure-renewals",
    "pylease-0013-shared",
    "pylease-0014-fenced-releases",
    "pylease-0015-groups-kept",
    "pylease-0016-data",
    "pylease-0017-permit-claim",
    "pylease-0018-renew-held",
    "pylease-0019-shares",
    "pylease-0020-first-readers",
    "pylease-0021-unwait",
    "pylease-0022-renew-held-statement",
    "pylease-0023-lean-paths",
    "pylease-0024-readers-write-no-lease-row",
    "pylease-0025-unchecked-rows",
    "pylease-0026-serializable-races",
]
FUNCTIONS = (
    "lease_claim",
    "lease_claim_new",
    "lease_renew",
    "lease_renew_many",
    "lease_renew_each",
    "lease_release",
    "lease_steal",
    "lease_holds",
    "lease_status",
    "lease_counters",
    "lease_history",
    "lease_prune_history",
    "lease_prune",
    "lease_wait",
    "lease_unwait",
    "lease_claim_all",
    "lease_release_all",
    "permit_claim",
    "permit_renew",
    "permit_release",
    "permit_holds",
    "permit_status",
    "permit_set_max",
    "permit_revoke",
    "permit_claim_new",
    "lease_claim_all_new",
    "group_join",
    "group_renew",
    "group_leave",
    "group_members",
    "member_holds",
    "group_assignment",
    "group_status",
    "lease_claim_shared",
    "lease_holders",
    "lease_set_data",
    "lease_request_release",
    "lease_watch",
    "lease_unwatch",
    # Internal (not in the contract), called by the keeper as the application's role,
    # or by the SQL functions below (inlined into the caller's statement, so run as the
    # caller): SECURITY DEFINER and executable by PUBLIC, as the functions of the contract.
    "pylease_renew_held",
    "pylease_claim",
    "pylease_permit_claim",
    "pylease_claim_all",
    # 0019: a reader's claim answering its share's id, and the release naming it.
    "pylease_claim_shared",
    "pylease_release_share",
)
# SQL functions whose body was parsed when it was created (0012): what they call was
# resolved then, so no search_path can stand in for it and there is none to pin; they
# run as the caller, and what they call is SECURITY DEFINER. (name, identity arguments).
WRAPPERS = {
    ("lease_claim", "name text, ttl interval, holder text"),
    ("lease_claim_new", "name text, ttl interval, holder text"),
    ("lease_claim", "name text, ttl interval, holder text, data jsonb"),
    ("lease_claim_new", "name text, ttl interval, holder text, data jsonb"),
    ("lease_set_data", "name text, holder text, data jsonb"),
    ("lease_renew", "name text, holder text, ttl interval"),
    ("lease_renew_many", "names text[], holders text[], ttl interval"),
    ("permit_claim", "name text, max_permits integer, ttl interval, holder text, permits integer"),
    (
        "permit_claim_new",
        "name text, max_permits integer, ttl interval, holder text, permits integer",
    ),
    ("lease_claim_all", "names text[], ttl interval, holder text"),
    ("lease_claim_all_new", "names text[], ttl interval, holder text"),
    ("pylease_renew_held", "kinds text[], names text[], holders text[], ttls interval[]"),
    # 0014
    ("permit_release", "name text, holder text"),
    ("lease_release_all", "names text[], holder text"),
    # 0019
    ("lease_claim_shared", "name text, ttl interval, holder text"),
    ("pylease_release_shared", "lease text, reader text, epoch bigint"),
}
HELPERS = (
    "pylease_check_key",
    "pylease_check_ttl",
    "pylease_check_span",
    "pylease_check_batch",
    "pylease_refuse_standby",
    "pylease_refuse_read_only",
    "pylease_refuse_history",
    "pylease_refuse_unseen_readers",
    "pylease_history_rows",
    "pylease_check_count",
    "pylease_check_names",
    "pylease_register_lease",
    "pylease_fence_floor",
    "pylease_floor_slot",
    "pylease_check_group",
    "pylease_check_data",
    "pylease_assignment",
    "pylease_release_shared",
    "pylease_tell_watchers",
    "pylease_mark_watched",
    "pylease_unshared",
)
# The claims that wait a bounded time for a row a fenced transaction holds, then are busy.
WAITING_CLAIMS = (
    "pylease_claim",
    "pylease_claim_all",
    "pylease_claim_shared",
    "pylease_permit_claim",
    "group_join",
)
# Every object pylease owns is named like this; yoyo's bookkeeping is not ours.
OURS = "(lease\\_%|pylease\\_%)"
NOT_YOYO = "NOT (c.relname LIKE '\\_yoyo%' OR c.relname LIKE '\\_pylease\\_yoyo%')"

CATALOG: dict[str, str] = {
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               p.prosrc, p.proargnames, p.proconfig, p.prosecdef, p.provolatile,
               p.proacl::text, obj_description(p.oid, 'pg_proc'), p.proowner::regrole::text
          FROM pg_proc AS p WHERE p.pronamespace = 'public'::regnamespace
         ORDER BY 1, 2""",
    "relations": f"""
        SELECT c.relname, c.relkind, c.reloptions, c.relacl::text,
               obj_description(c.oid, 'pg_class'), c.relowner::regrole::text
          FROM pg_class AS c WHERE c.relnamespace = 'public'::regnamespace AND {NOT_YOYO}
         ORDER BY 1""",
    "columns": f"""
        -- The position among the live columns: a column dropped and added again (a
        -- rollback) leaves a gap in attnum, which no query sees.
        SELECT c.relname, row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum), a.attname,
               format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attacl::text,
               col_description(c.oid, a.attnum)
          FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0
           AND NOT a.attisdropped AND {NOT_YOYO}
         ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
         WHERE schemaname = 'public' AND tablename NOT LIKE '\\_yoyo%'
           AND tablename NOT LIKE '\\_pylease\\_yoyo%'
         ORDER BY 1, 2""",
    "constraints": f"""
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid)
          FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid
         WHERE c.relnamespace = 'public'::regnamespace AND {NOT_YOYO}
         ORDER BY 1, 2""",
    "triggers": f"""
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'public'::regnamespace AND {NOT_YOYO}
         ORDER BY 1, 2""",
    "types": """
        SELECT t.typname, t.typtype FROM pg_type AS t
         WHERE t.typnamespace = 'public'::regnamespace AND t.typrelid = 0
           AND t.typcategory <> 'A'
         ORDER BY 1""",
    "schema": "SELECT nspacl::text, obj_description(oid, 'pg_namespace') FROM pg_namespace"
    " WHERE nspname = 'public'",
}


def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as c:
        return {part: c.execute(query).fetchall() for part, query in CATALOG.items()}  # type: ignore[arg-type]


def ours(conn: Conn) -> list[str]:
    """Every pylease function, table, index or type left in the database."""
    rows = conn.execute(
        f"""
        SELECT 'function ' || proname FROM pg_proc WHERE proname SIMILAR TO '{OURS}'
        UNION ALL
        SELECT 'relation ' || relname FROM pg_class WHERE relname SIMILAR TO '{OURS}'
        UNION ALL
        SELECT 'type ' || typname FROM pg_type WHERE typname SIMILAR TO '{OURS}'
        """  # type: ignore[arg-type]
    ).fetchall()
    return sorted(r[0] for r in rows)


def quiet(_line: str) -> None:
    pass


@pytest.fixture
def from_schema_sql(empty_dsn: str) -> str:
    """A database built by running sql/postgres/schema.sql, as psql -f would."""
    script = (data_dir("sql", "postgres") / "schema.sql").read_text()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(script)  # type: ignore[call-overload]
    return empty_dsn


def test_schema_sql_and_the_migrations_build_the_same_catalog(
    from_schema_sql: str, fresh_db: Any
) -> None:
    migrated: str = fresh_db()
    assert migrate(migrated, say=quiet) == MIGRATIONS
    expected = catalog(from_schema_sql)
    assert catalog(migrated) == expected
    # The comparison covered the whole API, not an empty schema.
    assert {r[0] for r in expected["functions"]} == {*FUNCTIONS, *HELPERS}
    assert [r[0] for r in expected["relations"]] == [
        "pylease_events",
        "pylease_events_at",
        "pylease_events_id_seq",
        "pylease_events_name_at",
        "pylease_fence_floors",
        "pylease_fence_floors_pkey",
        "pylease_groups",
        "pylease_groups_pkey",
        "pylease_leases",
        "pylease_leases_fence",
        "pylease_leases_pkey",
        "pylease_members",
        "pylease_members_incarnation",
        "pylease_members_pkey",
        "pylease_names",
        "pylease_names_pkey",
        "pylease_permits",
        "pylease_permits_fence",
        "pylease_permits_holder",
        "pylease_permits_pkey",
        "pylease_share_ids",
        "pylease_shared",
        "pylease_shared_pkey",
        "pylease_waiters",
        "pylease_waiters_expires_at",
        "pylease_waiters_id_seq",
        "pylease_waiters_name_id",
        "pylease_waiters_name_waiter_key",
        "pylease_waiters_pkey",
        "pylease_watchers",
        "pylease_watchers_pkey",
    ]
    assert len(expected["constraints"]) == 23


def test_rollback_removes_everything_and_reapply_works(from_schema_sql: str, fresh_db: Any) -> None:
    migrated: str = fresh_db()
    migrate(migrated, say=quiet)
    with psycopg.connect(migrated, autocommit=True) as c:
        assert c.execute("SELECT lease_claim('sweep', '1 hour', 'me')").fetchone() == (1,)
        assert len(ours(c)) > 10
    said: list[str] = []
    assert rollback(migrated, say=said.append) == MIGRATIONS[::-1]
    assert said == [f"rolled back {m}" for m in MIGRATIONS[::-1]]
    with psycopg.connect(migrated, autocommit=True) as c:
        assert ours(c) == []
    assert migrate(migrated, say=quiet) == MIGRATIONS
    assert catalog(migrated) == catalog(from_schema_sql)
    with psycopg.connect(migrated, autocommit=True) as c:
        assert c.execute("SELECT lease_claim('sweep', '1 hour', 'me')").fetchone() == (1,)


def test_every_function_is_security_definer_with_a_pinned_search_path(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT proname, pg_get_function_identity_arguments(oid), prosecdef, proconfig,"
        "       prosqlbody IS NOT NULL FROM pg_proc"
        " WHERE pronamespace = 'public'::regnamespace ORDER BY proname"
    ).fetchall()
    assert {r[0] for r in rows} == {*FUNCTIONS, *HELPERS}
    assert {(r[0], r[1]) for r in rows if r[4]} == WRAPPERS
    for proname, args, secdef, config, parsed in rows:
        if parsed:
            assert not secdef and config is None, proname
            continue
        # A takeover waits a bounded time for a fenced transaction, then is busy.
        bound = ["lock_timeout=2s"] if proname in WAITING_CLAIMS else []
        assert config == ["search_path=public, pg_temp", *bound], (proname, args)
        assert secdef is (proname in FUNCTIONS), (proname, args)


@pytest.mark.parametrize(
    "table",
    [
        "pylease_leases",
        "pylease_events",
        "pylease_names",
        "pylease_permits",
        "pylease_fence_floors",
        "pylease_groups",
        "pylease_members",
        "pylease_shared",
    ],
)
def test_public_has_no_privilege_on_the_tables(conn: Conn, table: str) -> None:
    for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"):
        assert not conn.execute(
            "SELECT has_table_privilege('public', %s, %s)", (table, privilege)
        ).fetchone()[0], privilege  # type: ignore[index]


def test_public_may_execute_every_function_but_the_operators_and_the_helpers(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT proname, has_function_privilege('public', oid, 'EXECUTE') FROM pg_proc"
        " WHERE pronamespace = 'public'::regnamespace"
    ).fetchall()
    executable = {name for name, may in rows if may}
    assert executable == set(FUNCTIONS) - {
        "lease_steal",
        "lease_prune_history",
        "lease_prune",
        "permit_set_max",
        "permit_revoke",
        "lease_request_release",
    }


def test_the_table_leaves_room_for_hot_updates(conn: Conn) -> None:
    options = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = 'pylease_leases'::regclass"
    ).fetchone()
    assert options is not None
    fillfactor = dict(o.split("=") for o in options[0])["fillfactor"]
    assert int(fillfactor) < 100
    with conn.transaction():
        conn.execute("SELECT lease_claim('sweep', %s, 'me')", (HOUR,))
        for _ in range(5):
            conn.execute("SELECT lease_renew('sweep', 'me')")
        conn.execute("SELECT lease_release('sweep', 'me')")
        conn.execute("SELECT lease_claim('sweep', %s, 'you')", (HOUR,))
        counts = conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated('pylease_leases'::regclass),"
            "       pg_stat_get_xact_tuples_hot_updated('pylease_leases'::regclass)"
        ).fetchone()
    # Renewals and the release are HOT; the grant to 'you' is not (see below).
    assert counts == (7, 6)


def test_the_fence_is_a_key_column_so_fenced_transactions_block_only_grants(conn: Conn) -> None:
    """The choice made for a holder's open fenced transaction (issue 10, defect 7).

    A unique index on (name, fence) makes every grant a key update, which waits
    for lease_holds' FOR KEY SHARE, while renewals and releases pass it. The price:
    a grant is no longer a HOT update (pinned above).
    """
    indexes = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'pylease_leases' ORDER BY indexname"
    ).fetchall()
    assert indexes == [
        (
            "CREATE UNIQUE INDEX pylease_leases_fence ON public.pylease_leases"
            " USING btree (name, fence)",
        ),
        ("CREATE UNIQUE INDEX pylease_leases_pkey ON public.pylease_leases USING btree (name)",),
    ]
    source = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'lease_holds'").fetchone()
    assert source is not None
    assert "FOR KEY SHARE" in source[0]


@pytest.fixture
def app_role(conn: Conn) -> Iterator[str]:
    """A role that may do nothing but what PUBLIC may: EXECUTE the lease functions."""
    role = f"pylease_app_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        yield role
    finally:
        conn.execute("RESET ROLE")
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def set_role(conn: Conn, role: str) -> None:
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))


def test_a_role_with_only_execute_can_use_leases_but_not_steal(conn: Conn, app_role: str) -> None:
    set_role(conn, app_role)
    assert conn.execute("SELECT current_user").fetchone() == (app_role,)

    def one(query: str, *params: Any) -> Any:
        row = conn.execute(query, params).fetchone()  # type: ignore[call-overload]
        assert row is not None
        return row[0]

    assert one("SELECT lease_claim('sweep', %s, 'me')", HOUR) == 1
    assert one("SELECT lease_renew('sweep', 'me')") is True
    assert conn.execute("SELECT * FROM lease_renew_many('{sweep}', '{me}')").fetchall() == [
        ("sweep", True)
    ]
    assert one("SELECT lease_holds('sweep', 'me', 1)") is True
    assert one("SELECT held FROM lease_status('sweep')") is True
    assert one("SELECT lease_release('sweep', 'me')") is True
    assert one("SELECT lease_claim('sweep', %s, 'me')", HOUR) == 2

    for forbidden in (
        "SELECT lease_steal('sweep', '1 hour', 'thief')",
        "SELECT * FROM pylease_leases",
        "UPDATE pylease_leases SET holder = 'thief'",
        "INSERT INTO pylease_leases VALUES ('x', 'thief', 99, '1h', now(), now(), now())",
        "DELETE FROM pylease_leases",
        "SELECT pylease_check_key('name', 'x')",
    ):
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute(forbidden)  # type: ignore[call-overload]

    conn.execute("RESET ROLE")
    assert conn.execute("SELECT holder, fence FROM pylease_leases").fetchall() == [("me", 2)]


def test_a_role_with_only_execute_can_use_permits_and_several_names(
    conn: Conn, app_role: str
) -> None:
    set_role(conn, app_role)
    assert conn.execute("SELECT * FROM permit_claim('exports', 2, %s, 'me')", (HOUR,)).fetchall()
    assert conn.execute("SELECT permit_renew('exports', 'me')").fetchone() == (True,)
    assert conn.execute("SELECT count(*) FROM permit_status('exports')").fetchone() == (1,)
    assert conn.execute("SELECT permit_release('exports', 'me')").fetchone() == (True,)
    assert conn.execute("SELECT * FROM lease_claim_all('{a,b}', %s, 'me')", (HOUR,)).fetchall() == [
        ("a", 1),
        ("b", 1),
    ]
    assert conn.execute("SELECT * FROM lease_release_all('{b,a}', 'me')").fetchall() == [
        ("b", True),
        ("a", True),
    ]
    for forbidden in (
        "SELECT permit_set_max('exports', 3)",
        "SELECT permit_revoke('exports', 'me')",
        "SELECT * FROM pylease_permits",
        "SELECT * FROM pylease_names",
        "UPDATE pylease_permits SET holder = 'thief'",
        "DELETE FROM pylease_names",
    ):
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute(forbidden)  # type: ignore[call-overload]


def test_a_role_with_only_execute_can_use_groups(conn: Conn, app_role: str) -> None:
    set_role(conn, app_role)
    assert conn.execute("SELECT group_join('g', 'me', %s, '{\"at\": 1}')", (HOUR,)).fetchone() == (
        1,
    )
    assert conn.execute("SELECT group_renew('g', 'me')").fetchone() == (True,)
    assert conn.execute("SELECT group_renew('g', 'me', NULL, 1)").fetchone() == (True,)
    assert conn.execute("SELECT member, data FROM group_members('g')").fetchall() == [
        ("me", {"at": 1})
    ]
    assert conn.execute("SELECT member_holds('g', 'me', 1)").fetchone() == (True,)
    assert conn.execute("SELECT count(*) FROM group_assignment('g', 8)").fetchone() == (8,)
    assert conn.execute("SELECT group_leave('g', 'me', 1)").fetchone() == (True,)
    assert conn.execute("SELECT group_join('g', 'me', %s)", (HOUR,)).fetchone() == (2,)
    assert conn.execute("SELECT group_leave('g', 'me')").fetchone() == (True,)
    for forbidden in (
        "SELECT * FROM pylease_members",
        "UPDATE pylease_groups SET incarnation = 0",
        "SELECT * FROM pylease_assignment('{a}', 1)",
        "SELECT pylease_check_group('g')",
    ):
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute(forbidden)  # type: ignore[call-overload]


def test_an_operator_grants_set_max_and_revoke(conn: Conn, app_role: str) -> None:
    conn.execute("SELECT * FROM permit_claim('exports', 1, '1 hour', 'stuck')")
    for function in ("permit_set_max(text, integer)", "permit_revoke(text, text)"):
        conn.execute(
            sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
                sql.SQL(function), sql.Identifier(app_role)
            )
        )
    set_role(conn, app_role)
    assert conn.execute("SELECT permit_revoke('exports', 'stuck')").fetchone() == (True,)
    conn.execute("SELECT permit_set_max('exports', 2)")
    assert conn.execute("SELECT max_permits FROM permit_status('exports')").fetchone() == (2,)


def test_an_operator_grants_steal(conn: Conn, app_role: str) -> None:
    conn.execute("SELECT lease_claim('sweep', '1 hour', 'stuck')")
    conn.execute(
        sql.SQL(
            "GRANT EXECUTE ON FUNCTION lease_steal(text, interval, text, interval) TO {}"
        ).format(sql.Identifier(app_role))
    )
    set_role(conn, app_role)
    assert conn.execute("SELECT lease_steal('sweep', '1 hour', 'operator')").fetchone() == (2,)


def test_a_schema_of_look_alikes_earlier_in_the_search_path_changes_nothing(
    conn: Conn, app_role: str
) -> None:
    conn.execute(
        """
        CREATE SCHEMA evil;
        CREATE TABLE evil.pylease_leases (LIKE public.pylease_leases);
        CREATE TABLE evil.calls (what text);
        CREATE FUNCTION evil.pylease_check_key(parameter text, value text) RETURNS void
        LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('check_key ' || value) $$;
        CREATE FUNCTION evil.pylease_check_ttl(parameter text, value interval) RETURNS void
        LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('check_ttl') $$;
        CREATE FUNCTION evil.pylease_claim(name text, ttl interval, holder text,
                                           new_tenure boolean) RETURNS bigint
        LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('claim ' || name) RETURNING 99 $$;
        CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz
        LANGUAGE sql AS $$ SELECT timestamptz '2000-01-01' $$;
        CREATE FUNCTION evil.text_eq_always(text, text) RETURNS boolean
        LANGUAGE sql AS $$ SELECT true $$;
        CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.text_eq_always);
        GRANT ALL ON SCHEMA evil TO PUBLIC;
        GRANT ALL ON ALL TABLES IN SCHEMA evil TO PUBLIC;
        """
    )
    assert conn.execute("SELECT lease_claim('mine', '1 hour', 'me')").fetchone() == (1,)
    set_role(conn, app_role)
    conn.execute("SET search_path = evil, public")
    conn.execute(
        "CREATE TEMP TABLE pylease_leases (name text, holder text, fence bigint, ttl interval,"
        " acquired_at timestamptz, renewed_at timestamptz, expires_at timestamptz,"
        " released boolean)"
    )

    assert conn.execute("SELECT lease_claim('sweep', '1 hour', 'me')").fetchone() == (1,)
    assert conn.execute("SELECT lease_claim('mine', '1 hour', 'you')").fetchone() == (None,)
    assert conn.execute("SELECT lease_claim_new('mine', '1 hour', 'me')").fetchone() == (None,)
    with pytest.raises(pg_errors.InvalidParameterValue):
        conn.execute("SELECT lease_claim('', '1 hour', 'me')")
    assert conn.execute("SELECT lease_holds('sweep', 'me', 1)").fetchone() == (True,)
    assert conn.execute("SELECT lease_release('sweep', 'other')").fetchone() == (False,)
    assert conn.execute("SELECT name, held FROM lease_status()").fetchall() == [
        ("mine", True),
        ("sweep", True),
    ]
    assert conn.execute("SELECT count(*) FROM pg_temp.pylease_leases").fetchone() == (0,)

    conn.execute("RESET ROLE")
    assert conn.execute("SELECT count(*) FROM evil.pylease_leases").fetchone() == (0,)
    assert conn.execute("SELECT * FROM evil.calls").fetchall() == []
    rows = conn.execute(
        "SELECT name, holder, fence, expires_at > clock_timestamp()"
        " FROM public.pylease_leases ORDER BY name"
    ).fetchall()
    assert rows == [("mine", "me", 1, True), ("sweep", "me", 1, True)]


def test_a_non_public_schema_needs_usage_granted(dsn: str, conn: Conn, app_role: str) -> None:
    assert migrate(dsn, "leases", say=quiet) == MIGRATIONS
    config = conn.execute(
        "SELECT DISTINCT proconfig[1] FROM pg_proc WHERE pronamespace = 'leases'::regnamespace"
        " AND prosqlbody IS NULL"
    ).fetchall()
    assert config == [("search_path=leases, pg_temp",)]
    set_role(conn, app_role)
    with pytest.raises(pg_errors.InsufficientPrivilege):
        conn.execute("SELECT leases.lease_claim('sweep', '1 hour', 'me')")
    conn.execute("RESET ROLE")
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA leases TO {}").format(sql.Identifier(app_role)))
    set_role(conn, app_role)
    assert conn.execute("SELECT leases.lease_claim('sweep', '1 hour', 'me')").fetchone() == (1,)
    conn.execute("SET search_path = leases")
    assert conn.execute("SELECT lease_renew('sweep', 'me')").fetchone() == (True,)
    conn.execute("RESET ROLE")
    # Its own table, not public's.
    assert conn.execute("SELECT count(*) FROM leases.pylease_leases").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM public.pylease_leases").fetchone() == (0,)
