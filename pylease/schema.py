"""The schema as SQL text, for projects that migrate with Alembic or a tool of their own.

``pylease migrate`` (yoyo) records what it applied in its own tables; a project that
runs :func:`schema_sql` from its own migrations records it there instead, and yoyo's
tables are then never created nor read. Choose one way per schema: ``pylease migrate``
on a schema installed this way would try to install it again, and fail.
"""

from __future__ import annotations

import re
from pathlib import Path

from psycopg import sql

from pylease._resources import data_dir
from pylease.errors import InvalidArgument
from pylease.migrate import MAX_SCHEMA_BYTES

# schema.sql is also a psql script: its own transaction must not end the caller's.
_TRANSACTION_LINE = re.compile(r"^(BEGIN|COMMIT);\s*$", re.MULTILINE)
_SAVED = "pylease.saved_search_path"


def migration_ids() -> list[str]:
    """The ids of pylease's PostgreSQL migrations, oldest first (``pylease-0001-leases``, ...)."""
    return [path.stem for path in _migration_files()]


def schema_sql(schema: str = "public", *, after: str | None = None) -> str:
    """The SQL that installs pylease's current schema into ``schema``.

    Run it inside one transaction (an Alembic migration is one): it creates the
    schema if missing, installs into it, and restores the caller's ``search_path``
    before it ends. It contains no ``BEGIN``/``COMMIT`` and no bind parameters, so
    ``op.execute(schema_sql())`` works as it is.

    :param schema: the schema to install into.
    :param after: for an upgrade: the id of the last pylease migration already
        installed (see :func:`migration_ids`); the SQL of every later migration is
        returned instead, oldest first (no statement at all when none is later).
    :raises InvalidArgument: an empty schema, one over 63 bytes or with a ``$``, or an
        ``after`` that is no migration id.
    """
    if not isinstance(schema, str) or not schema:
        raise InvalidArgument("pylease: schema must be a non-empty str", parameter="schema")
    if len(schema.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES or "$" in schema:
        # Longer names are cut by PostgreSQL (another schema); a $ could end the
        # dollar quote the name is written in.
        raise InvalidArgument(
            f"pylease: schema must be at most {MAX_SCHEMA_BYTES} bytes, without '$'",
            parameter="schema",
        )
    if after is None:
        body = (data_dir("sql", "postgres") / "schema.sql").read_text(encoding="utf-8")
        parts = [_TRANSACTION_LINE.sub("", body)]
        what = "the current schema"
    else:
        files = _migration_files()
        ids = [path.stem for path in files]
        if after not in ids:
            raise InvalidArgument(
                f"pylease: after={after!r} is not a pylease migration id "
                f"(they are: {', '.join(ids)})",
                parameter="after",
            )
        later = files[ids.index(after) + 1 :]
        if not later:
            return f"-- pylease: schema {schema!r} is up to date after {after}\n"
        parts = [path.read_text(encoding="utf-8") for path in later]
        what = "migrations " + ", ".join(path.stem for path in later)
    quoted = sql.Identifier(schema).as_string(None)
    literal = sql.Literal(quoted + ", pg_temp").as_string(None)
    head = (
        f"-- pylease: {what}, into schema {quoted}\n"
        f"SELECT set_config('{_SAVED}', current_setting('search_path'), true);\n"
        # Only when missing: CREATE SCHEMA needs CREATE on the database, even with
        # IF NOT EXISTS, which the owner of an existing schema may lack.
        f"DO $pylease$ BEGIN IF to_regnamespace({sql.Literal(quoted).as_string(None)}) IS NULL "
        f"THEN CREATE SCHEMA {quoted}; END IF; END $pylease$;\n"
        f"SELECT set_config('search_path', {literal}, true);\n"
    )
    tail = f"SELECT set_config('search_path', current_setting('{_SAVED}'), true);\n"
    return head + "\n".join(parts) + "\n" + tail


def _migration_files() -> list[Path]:
    folder = data_dir("migrations", "postgres")
    return sorted(
        path for path in folder.glob("pylease-*.sql") if not path.name.endswith(".rollback.sql")
    )
