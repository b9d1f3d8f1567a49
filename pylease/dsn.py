"""Connection strings: where one comes from, what form it may take, how to show it safely.

The command line looks for a database in this order (read when a command runs,
never at import): ``--dsn``, ``PYLEASE_DSN``, ``DATABASE_URL``, else the embedded
default, a SQLite file in the user's state directory. ``PGHOST``, ``PGSERVICE`` and
the other libpq variables never choose PostgreSQL by themselves: they fill in what
a ``postgresql://`` URL leaves out (``PYLEASE_DSN=postgresql://`` uses them all).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pylease.errors import ConfigurationError

ENV_VARS = ("PYLEASE_DSN", "DATABASE_URL")
SCHEMA_VAR = "PYLEASE_SCHEMA"
# libpq variables that make people expect PostgreSQL; they only fill in a URL.
LIBPQ_HINTS = ("PGHOST", "PGSERVICE", "PGDATABASE", "PGHOSTADDR")
# SQLAlchemy's spelling names the driver too: postgresql+psycopg://, postgres+psycopg2://.
_DRIVER_URL = re.compile(r"^(postgresql|postgres)\+[a-z0-9_]+://", re.IGNORECASE)
HOST_WIDE = "sqlite:////var/lib/pylease/leases.sqlite3"


@dataclass(frozen=True)
class Found:
    """A connection string and where it was found: ``--dsn``, an environment variable,
    or ``default`` (then ``value`` is None)."""

    value: str | None
    source: str


def find(explicit: str | None, environ: Mapping[str, str] | None = None) -> Found:
    """``explicit``, else ``PYLEASE_DSN``, else ``DATABASE_URL``, read now."""
    if explicit:
        return Found(explicit, "--dsn")
    env = os.environ if environ is None else environ
    for var in ENV_VARS:
        value = env.get(var)
        if value:
            return Found(value, var)
    return Found(None, "default")


def misspelled(environ: Mapping[str, str] | None = None) -> list[str]:
    """Why no variable named a database although one was meant to: each of
    :data:`ENV_VARS` set but empty, and each variable spelled like one of them
    (``PYLEASE_DNS``), as a phrase for a message."""
    env = os.environ if environ is None else environ
    said = [f"{var} is set but empty" for var in ENV_VARS if var in env and not env[var]]
    for var in sorted(env):
        if var in ENV_VARS or not env[var]:
            continue
        close = difflib.get_close_matches(var.upper(), ENV_VARS, n=1, cutoff=0.8)
        if close:
            said.append(f"{var} is set: did you mean {close[0]}?")
    return said


def normalize(dsn: str) -> str:
    """``dsn`` in the form libpq reads: ``postgresql+psycopg://`` (SQLAlchemy's, common
    in ``DATABASE_URL``) becomes ``postgresql://``; anything else is returned as is."""
    match = _DRIVER_URL.match(dsn)
    if match is None:
        return dsn
    return "postgresql://" + dsn[match.end() :]


def is_sqlite(dsn: str) -> bool:
    """True for ``sqlite:...`` URLs (well formed or not: see :func:`check_sqlite`)."""
    return dsn.startswith("sqlite:")


def check_sqlite(dsn: str, source: str = "the URL") -> None:
    """Refuse a SQLite URL that is not ``sqlite:///relative`` or ``sqlite:////absolute``.

    ``sqlite:/tmp/x`` looks absolute but would be read as the relative ``tmp/x``;
    ``sqlite://host/x`` names a host SQLite cannot have.

    :raises ConfigurationError: naming ``source``; nothing is created.
    """
    if not dsn.startswith("sqlite:///") or dsn == "sqlite:///":
        raise ConfigurationError(
            f"pylease: malformed SQLite URL in {source}: {dsn!r}; use sqlite:///relative/path "
            "or sqlite:////absolute/path (four slashes for an absolute path)"
        )


def parse(dsn: str, source: str | None = None) -> dict[str, str]:
    """libpq parameters of a URL or ``key=value`` string.

    :raises ConfigurationError: if malformed, with libpq's reason (any password in it
        replaced by ``***``) and, when given, where the string came from.
    """
    # Imported here: a command on SQLite starts without loading the driver.
    from psycopg import conninfo

    try:
        params = conninfo.conninfo_to_dict(normalize(dsn))
    except Exception as exc:
        # Not chained: psycopg's message may quote the string, password and all.
        where = f" in {source}" if source else ""
        reason = redact_reason(" ".join(str(exc).split()), dsn)
        raise ConfigurationError(f"pylease: malformed connection string{where}: {reason}") from None
    return {k: str(v) for k, v in params.items() if v is not None}


def _secrets(dsn: str) -> list[str]:
    """What in ``dsn`` may be a password, even in a string libpq cannot parse."""
    found = re.findall(r"password\s*=\s*(.*?)(?=\s+\w+\s*=|&|$)", dsn, flags=re.IGNORECASE)
    found += re.findall(r"://[^/@?#]*?:([^@]*)@", dsn)
    return [s.strip("'\"") for s in found if s.strip("'\"")]


def redact_reason(reason: str, dsn: str) -> str:
    """libpq's complaint about ``dsn`` without any password it quotes."""
    secrets = _secrets(dsn)

    def hide(match: re.Match[str]) -> str:
        quoted = match.group(1)
        if quoted and any(quoted in s or s in quoted for s in secrets):
            for secret in secrets:
                quoted = quoted.replace(secret, "***")
            if any(quoted in s for s in secrets):
                quoted = "***"
        return f'"{quoted}"'

    text = re.sub(r'"([^"]*)"', hide, reason)
    return re.sub(r"(://[^/@:\s\"]*:)[^@\s\"]*@", r"\1***@", text)


def redact(dsn: str) -> str:
    """The connection string with any password replaced, for messages and logs."""
    from psycopg import conninfo

    try:
        params = conninfo.conninfo_to_dict(normalize(dsn))
    except Exception:
        return "<unparsable connection string>"
    if "password" in params:
        params["password"] = "***"
    return conninfo.make_conninfo("", **{k: v for k, v in params.items() if v is not None})


def with_schema(dsn: str, schema: str) -> str:
    """``dsn`` as a ``key=value`` string whose sessions find pylease in ``schema``.

    The schema travels in the connection's ``options`` (``-c search_path=...``), so
    every connection pylease opens from it (claims, the keeper's, LISTEN) uses it.
    Behind PgBouncer, which refuses ``options``, set the role's search_path instead
    (``ALTER ROLE app SET search_path = leases``).
    """
    from psycopg import conninfo

    params = parse(dsn)
    quoted = '"' + schema.replace('"', '""') + '"'
    path = "-c search_path=" + quoted.replace("\\", "\\\\").replace(" ", "\\ ")
    params["options"] = f"{params['options']} {path}" if params.get("options") else path
    return conninfo.make_conninfo("", **params)


def default_sqlite_path(environ: Mapping[str, str] | None = None) -> Path:
    """The embedded default: ``$XDG_STATE_HOME/pylease/leases.sqlite3``, else under
    ``$HOME/.local/state``, read now; creates nothing.

    One file per user: two users' jobs on one host do not see each other's leases
    (a host-wide file is ``PYLEASE_DSN=sqlite:////var/lib/pylease/leases.sqlite3``).

    :raises ConfigurationError: no ``XDG_STATE_HOME`` and no ``HOME`` that exists
        (a service user's ``/nonexistent``): pylease does not guess another place.
    """
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME", "")
    if os.path.isabs(state):
        return Path(state) / "pylease" / "leases.sqlite3"
    home = env.get("HOME", "")
    if not home or not os.path.isabs(home) or not os.path.isdir(home):
        what = f"HOME={home} does not exist" if home else "HOME is not set"
        raise ConfigurationError(
            f"pylease: no database given and {what}, so there is no default SQLite file: "
            f"set PYLEASE_DSN (e.g. {HOST_WIDE} for one file per host) or XDG_STATE_HOME"
        )
    return Path(home) / ".local" / "state" / "pylease" / "leases.sqlite3"
