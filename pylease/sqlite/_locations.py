"""Where SQLite lease files live, and the filesystems they may not live on."""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

from pylease import dsn as dsn_mod
from pylease.errors import ConfigurationError

#: Filesystem types (``/proc/mounts``) on which SQLite's file locks cannot be trusted.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb",
        "smb2",
        "smb3",
        "smbfs",
        "fuse.sshfs",
        "sshfs",
        "9p",
        "afs",
        "ncpfs",
        "coda",
        "ceph",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "vboxsf",
        "davfs",
        "fuse.davfs2",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.gcsfuse",
        "fuse.juicefs",
    }
)


# Locations -------------------------------------------------------------------


def default_path() -> Path:
    """The embedded default database: ``$XDG_STATE_HOME/pylease/leases.sqlite3``.

    ``~/.local/state/pylease/leases.sqlite3`` when ``XDG_STATE_HOME`` is unset
    (or not absolute, as the XDG spec asks). Read from the environment at each
    call; creates nothing: :func:`connect` creates the directory, user-only.
    The command line's own rule (:func:`pylease.dsn.default_sqlite_path`), so that
    the Python API and the CLI agree on the file and on when there is none.

    :raises ConfigurationError: no ``XDG_STATE_HOME`` and no ``HOME`` that exists
        (a service user's ``/nonexistent``): pylease does not guess another place,
        nor create a home directory.
    """
    return dsn_mod.default_sqlite_path()


def path_of(location: str | os.PathLike[str]) -> Path:
    """The file a location names: a ``sqlite:///relative`` or ``sqlite:////absolute``
    URL (percent-decoded), or a plain path (``~`` expanded).

    :raises ConfigurationError: another URL scheme, a host, a query, or no path.
    """
    text = os.fspath(location)
    if not isinstance(text, str) or not text:
        raise ConfigurationError("pylease: a SQLite location must be a non-empty path or URL")
    if text.startswith("sqlite:") or "://" in text:
        if dsn_mod.is_sqlite(text):
            # The CLI's check: sqlite:/tmp/x would otherwise open the relative tmp/x.
            dsn_mod.check_sqlite(text)
        parts = urllib.parse.urlsplit(text)
        hint = "use sqlite:///relative/path or sqlite:////absolute/path"
        if parts.scheme != "sqlite":
            raise ConfigurationError(f"pylease: not a SQLite URL: {parts.scheme}://...; {hint}")
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            raise ConfigurationError(f"pylease: malformed SQLite URL {text!r}: {hint}")
        if parts.query or parts.fragment:
            raise ConfigurationError(
                f"pylease: SQLite URLs take no options ({text!r}); pass busy_timeout to connect()"
            )
        return Path(urllib.parse.unquote(parts.path[1:]))
    return Path(text).expanduser()


def _unescape_mount(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: str | os.PathLike[str], mounts: str | None = None) -> str | None:
    """The type of the filesystem holding ``path``, from ``/proc/mounts`` (or ``mounts``).

    None when it cannot be told (no ``/proc``, as on macOS).
    """
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = os.path.realpath(path)
    best: tuple[str, str] | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape_mount(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        # The longest mount point wins; of equal ones the last, which shadows the others.
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2])
    return best[1] if best else None


def check_filesystem(path: str | os.PathLike[str], mounts: str | None = None) -> None:
    """Refuse a filesystem where SQLite's locks cannot be trusted (network filesystems).

    :raises ConfigurationError: ``path`` is on NFS, SMB/CIFS, sshfs, 9p, or another
        type of :data:`NETWORK_FILESYSTEMS`.
    """
    fstype = filesystem_type(path, mounts)
    if fstype is None:
        return
    if fstype in NETWORK_FILESYSTEMS or fstype.startswith(("nfs", "smb", "cifs")):
        raise ConfigurationError(
            f"pylease: {os.fspath(path)} is on a {fstype} filesystem, where SQLite's file "
            "locks cannot be trusted (two hosts could hold one lease): put the SQLite file "
            "on a local disk, or use PostgreSQL"
        )


def _make_private_dirs(directory: Path) -> None:
    missing: list[Path] = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for part in reversed(missing):
        try:
            part.mkdir(mode=0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigurationError(
                f"pylease: cannot create the state directory {part}: {exc.strerror}"
            ) from exc
        os.chmod(part, 0o700)


def _prepare(path: Path) -> None:
    """Loud checks before SQLite gets to create or open anything."""
    path = path.absolute()
    directory = path.parent
    if path == default_path().absolute():
        _make_private_dirs(directory)
    if not directory.is_dir():
        raise ConfigurationError(
            f"pylease: the directory {directory} does not exist: create it first "
            "(pylease creates only the directory of its default database)"
        )
    check_filesystem(path)  # the file's own target too, when it is a symlink
    if path.is_dir():
        raise ConfigurationError(f"pylease: {path} is a directory, not a SQLite file")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ConfigurationError(
            f"pylease: the SQLite file {path} is read-only for this user: "
            "claiming a lease writes to it"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"pylease: the directory {directory} is not writable: SQLite keeps "
            f"{path.name}-wal and {path.name}-shm beside the database"
        )
