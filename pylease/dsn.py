"""Connection strings: where the command line finds one, and how to show one safely."""

from __future__ import annotations

import os
from collections.abc import Mapping

from psycopg import conninfo

from pylease.errors import ConfigurationError

ENV_VARS = ("PYLEASE_DSN", "DATABASE_URL")


def from_environment(explicit: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """``explicit``, else ``PYLEASE_DSN``, else ``DATABASE_URL``, read now; None if none is set."""
    if explicit:
        return explicit
    env = os.environ if environ is None else environ
    for var in ENV_VARS:
        value = env.get(var)
        if value:
            return value
    return None


def is_sqlite(dsn: str) -> bool:
    """True for ``sqlite:///path`` URLs."""
    return dsn.startswith("sqlite:")


def parse(dsn: str) -> dict[str, str]:
    """libpq parameters of a URL or ``key=value`` string; ConfigurationError if malformed."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except Exception:
        # Not chained: psycopg's message repeats the string, password and all.
        raise ConfigurationError("pylease: malformed connection string") from None
    return {k: str(v) for k, v in params.items() if v is not None}


def redact(dsn: str) -> str:
    """The connection string with any password replaced, for messages and logs."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except Exception:
        return "<unparsable connection string>"
    if "password" in params:
        params["password"] = "***"
    return conninfo.make_conninfo("", **{k: v for k, v in params.items() if v is not None})
