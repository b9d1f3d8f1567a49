"""Recognise a schema installed from ``sql/postgres/schema.sql`` (``psql -f``, or
``pylease.schema_sql()`` run by another migration tool) so that ``pylease migrate``
can take it over: such a schema has pylease's objects but no record of yoyo
migrations, and applying 0001 to it would fail on the existing table.

The objects are compared with what each prefix of the migrations builds, in a
scratch schema inside a transaction that is rolled back: the newest prefix that
matches is the version installed. Grants and owners are left out of the
comparison (they are the operator's), everything pylease defines is in it.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql

from pylease._resources import data_dir

# Everything pylease defines in a schema, with the schema's name written as "@".
_CATALOG: dict[str, str] = {
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prosrc,
               pg_get_function_result(p.oid), p.proargnames,
               replace(array_to_string(p.proconfig, ','), %(quoted)s, '@'),
               p.prosecdef, p.provolatile, obj_description(p.oid, 'pg_proc')
          FROM pg_proc AS p WHERE p.pronamespace = %(oid)s
         ORDER BY 1, 2""",
    "relations": """
        SELECT c.relname, c.relkind, c.reloptions, obj_description(c.oid, 'pg_class')
          FROM pg_class AS c WHERE c.relnamespace = %(oid)s
           AND (c.relname LIKE 'pylease\\_%%' OR c.relname LIKE 'lease\\_%%')
         ORDER BY 1""",
    # A column's place among the live columns: one that a migration dropped leaves a gap
    # in attnum that schema.sql, which never had it, does not.
    "columns": """
        SELECT c.relname, row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum), a.attname,
               format_type(a.atttypid, a.atttypmod),
               a.attnotnull, a.attidentity, pg_get_expr(d.adbin, d.adrelid)
          FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = %(oid)s AND c.relname LIKE 'pylease\\_%%'
           AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY 1, 2""",
    "indexes": """
        SELECT c.relname, replace(pg_get_indexdef(i.indexrelid), %(quoted)s || '.', '@.')
          FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
         WHERE c.relnamespace = %(oid)s AND c.relname LIKE 'pylease\\_%%'
         ORDER BY 1""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid)
          FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid
         WHERE c.relnamespace = %(oid)s AND c.relname LIKE 'pylease\\_%%'
         ORDER BY 1, 2""",
}


def catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """What pylease defines in ``schema``, comparable across schemas."""
    row = conn.execute(
        "SELECT oid, quote_ident(nspname) FROM pg_namespace WHERE nspname = %s", (schema,)
    ).fetchone()
    assert row is not None
    params = {"oid": row[0], "quoted": row[1]}
    return {part: conn.execute(query, params).fetchall() for part, query in _CATALOG.items()}


def has_leases(conn: psycopg.Connection[Any], schema: str) -> bool:
    row = conn.execute(
        "SELECT to_regclass(format('%%I.pylease_leases', %s::text)) IS NOT NULL", (schema,)
    ).fetchone()
    return bool(row and row[0])


def installed_version(
    conn: psycopg.Connection[Any], schema: str, migration_ids: list[str]
) -> int | None:
    """How many of ``migration_ids`` (in order) built what ``schema`` holds; None if no prefix.

    ``conn`` must be in autocommit mode; the probe leaves nothing behind.
    """
    wanted = catalog(conn, schema)
    folder = data_dir("migrations", "postgres")
    scripts = [(folder / f"{m}.sql").read_text(encoding="utf-8") for m in migration_ids]
    probe = f"pylease_probe_{uuid.uuid4().hex[:12]}"
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(probe)))
        conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(probe)))
        for count, script in enumerate(scripts, 1):
            conn.execute(script)
            conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(probe)))
            if catalog(conn, probe) == wanted:
                return count
    return None
