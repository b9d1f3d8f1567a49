"""pylease for Django: ``INSTALLED_APPS += ["pylease.contrib.django"]``.

- ``manage.py migrate`` installs pylease's schema, and upgrades it after an upgrade of
  pylease, in the database ``PYLEASE_DATABASE`` names (default ``"default"``), with
  the same migrations and bookkeeping as ``pylease migrate``;
- ``manage.py pylease status|history ...`` runs the ``pylease`` command of that name on
  that database;
- :func:`connection` is that database's connection, a lease target::

      from pylease import lease
      from pylease.contrib.django import connection

      with lease(connection(), "nightly-report", ttl=600): ...

``django.db.connection`` and ``django.db.connections[alias]`` are targets as they are;
as for a psycopg connection, a claim is never made inside the caller's open transaction
(a claim inside ``transaction.atomic()`` survives its rollback), and renewals run on a
connection of pylease's own.
"""

from __future__ import annotations

from typing import Any

SETTING = "PYLEASE_DATABASE"


def database_alias() -> str:
    """The alias of the database pylease lives in: ``settings.PYLEASE_DATABASE``, else default."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.db import DEFAULT_DB_ALIAS, connections

    alias = getattr(settings, SETTING, DEFAULT_DB_ALIAS)
    if alias not in connections.settings:
        raise ImproperlyConfigured(f"{SETTING} = {alias!r} is not a key of DATABASES")
    return str(alias)


def connection() -> Any:
    """The connection of the pylease database (this thread's, as ``django.db.connection``)."""
    from django.db import connections

    return connections[database_alias()]


def conninfo() -> str:
    """Parameters to open another connection to the pylease database, password included."""
    from pylease import _orm
    from pylease.postgres._conninfo import connection_conninfo

    conn = _orm.adapt(connection(), SETTING)
    assert not isinstance(conn, str)
    return connection_conninfo(conn)  # type: ignore[arg-type]


def install(say: Any = None) -> list[str]:
    """Apply pylease's pending migrations to the pylease database; returns the ids applied."""
    from pylease.migrate import migrate

    return migrate(conninfo(), say=say or (lambda _line: None))
