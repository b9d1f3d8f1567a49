"""Check what ``make dist`` built in ``dist/``: what a user installs, before anyone does.

    python scripts/check_dist.py dist              # metadata, then a fresh venv
    python scripts/check_dist.py dist --python python3.12 --python python3.13
    python scripts/check_dist.py dist --no-install  # metadata only (no network)

The metadata: one wheel and one sdist, named and versioned as pyproject.toml and
``pylease.__version__`` say, MIT with its LICENSE, the SQL and the migrations inside the
wheel, README, LICENSE and CHANGELOG in the sdist. Then a virtual environment of its own,
whose dependencies come from the package index as a user's would, installs the wheel and
runs, from a directory outside the clone: ``pylease --version``; ``pylease migrate``
against a throwaway SQLite file and a throwaway PostgreSQL database (created on the
server of ``PYLEASE_DIST_ADMIN_DSN``, default the local one, and dropped after); and the
README's quick start, two ``pylease run`` of one lease at once on the embedded default.
Prints one line per check; exits 1 on the first that fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import uuid
import zipfile
from collections.abc import Callable
from email.parser import Parser
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ADMIN_DSN = os.environ.get(
    "PYLEASE_DIST_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)


class Failed(Exception):
    pass


def ok(what: str) -> None:
    print(f"check_dist: ok: {what}")


def expect(condition: object, what: str, detail: str = "") -> None:
    """``what`` holds, or the check fails, saying ``detail`` (what went wrong)."""
    if not condition:
        raise Failed(f"{what}: {detail.strip()[-2000:]}" if detail.strip() else what)
    ok(what)


def project() -> dict[str, str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    init = (ROOT / "pylease" / "__init__.py").read_text()
    version = next(
        line.split('"')[1] for line in init.splitlines() if line.startswith("__version__")
    )
    return {"name": meta["name"], "version": meta["version"], "code_version": version}


def check_metadata(dist: Path) -> Path:
    """The wheel and the sdist as pyproject.toml describes them; returns the wheel."""
    want = project()
    expect(
        want["version"] == want["code_version"],
        f"pyproject's version {want['version']} is pylease.__version__",
    )
    stem = f"{want['name'].replace('-', '_')}-{want['version']}"
    wheels = sorted(dist.glob("*.whl"))
    sdists = sorted(dist.glob("*.tar.gz"))
    expect(
        [w.name for w in wheels] == [f"{stem}-py3-none-any.whl"], f"one wheel, {stem}-py3-none-any"
    )
    expect([s.name for s in sdists] == [f"{stem}.tar.gz"], f"one sdist, {stem}.tar.gz")
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        metadata = Parser().parsestr(wheel.read(f"{stem}.dist-info/METADATA").decode())
    expect(metadata["Name"] == want["name"], f"the wheel's Name is {want['name']}")
    expect(metadata["Version"] == want["version"], f"the wheel's Version is {want['version']}")
    expect(metadata["Requires-Python"] == ">=3.11", "the wheel requires Python >=3.11")
    expect(metadata["License-Expression"] == "MIT", "the wheel's licence is MIT")
    expect(f"{stem}.dist-info/licenses/LICENSE" in names, "the wheel carries LICENSE")
    for inside in (
        "pylease/py.typed",
        "pylease/cli/_watchdog.py",
        "pylease/sql/postgres/schema.sql",
        "pylease/migrations/postgres/pylease-0001-leases.sql",
        "pylease/migrations/sqlite/pylease-0001-leases.sql",
    ):
        expect(inside in names, f"the wheel carries {inside}")
    with tarfile.open(sdists[0]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    for inside in ("README.md", "LICENSE", "CHANGELOG.md", "pyproject.toml", "sql/", "migrations/"):
        found = any(m == inside or (inside.endswith("/") and m.startswith(inside)) for m in members)
        expect(found, f"the sdist carries {inside}")
    return wheels[0]


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)


def check_install(wheel: Path, python: str) -> None:
    """A fresh venv of ``python`` installs the wheel, with its dependencies from the
    index, and runs it."""
    want = project()
    with tempfile.TemporaryDirectory(prefix="pylease-dist-") as tmp:
        here = Path(tmp)
        venv = here / "venv"
        done = run([python, "-m", "venv", str(venv)])
        version = run([str(venv / "bin" / "python"), "--version"]).stdout.strip()
        expect(done.returncode == 0, f"a fresh venv of {version or python}", done.stderr)
        done = run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)])
        expect(done.returncode == 0, "pip installs the wheel there", done.stderr)
        outside = here / "elsewhere"
        outside.mkdir()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYLEASE_DSN", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")
        }
        env["XDG_STATE_HOME"] = str(here / "state")
        pylease = str(venv / "bin" / "pylease")

        def command(*args: str) -> subprocess.CompletedProcess[str]:
            return run([pylease, *args], cwd=outside, env=env)

        done = command("--version")
        expect(
            done.stdout.strip() == f"pylease {want['version']}",
            f"`pylease --version` says pylease {want['version']}",
            done.stdout + done.stderr,
        )
        sqlite_file = here / "throwaway.sqlite3"
        done = command("migrate", "--dsn", f"sqlite:///{sqlite_file}")
        expect(
            done.returncode == 0 and sqlite_file.exists(),
            "`pylease migrate` on a throwaway SQLite file",
            done.stderr,
        )
        _postgres(command)
        _quick_start(pylease, outside, env)


def _postgres(command: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    import psycopg
    from psycopg import conninfo, sql

    name = f"pylease_dist_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = conninfo.make_conninfo(ADMIN_DSN, dbname=name)
        done = command("migrate", "--dsn", dsn)
        expect(
            done.returncode == 0 and "applied pylease-0001-leases" in done.stdout,
            "`pylease migrate` on a throwaway PostgreSQL database",
            done.stderr,
        )
        done = command("run", "job", "--ttl", "10s", "--dsn", dsn, "--", "true")
        expect(done.returncode == 0, "`pylease run` on it", done.stderr)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _quick_start(pylease: str, cwd: Path, env: dict[str, str]) -> None:
    """The README's quick start (make demo) without the clone: one of two runs runs."""
    argv = [pylease, "run", "demo-report", "--ttl", "10s", "--", "sleep", "2"]
    runs = [
        subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    codes = sorted(p.wait(timeout=120) for p in runs)
    for p in runs:
        p.communicate()
    expect(codes == [0, 1], "two `pylease run` of one lease at once: one runs, one is busy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", type=Path)
    parser.add_argument("--no-install", action="store_true", help="check the metadata only")
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        help="an interpreter to install the wheel with (repeatable; default: this one's)",
    )
    args = parser.parse_args(argv)
    try:
        wheel = check_metadata(args.dist)
        for python in [] if args.no_install else args.python or [sys.executable]:
            check_install(wheel, python)
    except Failed as exc:
        print(f"check_dist: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
