"""scripts/test-deps.sh: what `make test` needs is checked, installed, or named in one line.

A missing package is simulated by hiding /usr/sbin (where Debian puts pgbouncer) behind
an empty tmpfs in a mount namespace of the test's own, so nothing on the machine changes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test-deps.sh"


@pytest.fixture
def world_readable_copy() -> Iterator[Path]:
    """The script where user nobody can run it (a clone under /root is not such a place)."""
    base = Path(tempfile.mkdtemp(prefix="adopt-test-deps-"))
    try:
        base.chmod(0o755)
        (base / "scripts").mkdir(mode=0o755)
        copy = base / "scripts" / SCRIPT.name
        shutil.copy(SCRIPT, copy)
        copy.chmod(0o755)
        yield copy
    finally:
        shutil.rmtree(base)


def run(
    *args: str, hide_sbin: bool = False, as_nobody: bool = False, script: Path = SCRIPT
) -> subprocess.CompletedProcess[str]:
    inner = f"{script} {' '.join(args)}"
    if as_nobody:
        inner = f"setpriv --reuid=65534 --regid=65534 --clear-groups {inner}"
    if hide_sbin:
        inner = f"mount -t tmpfs adopt-test-deps /usr/sbin && {inner}"
        command = ["unshare", "--mount", "--propagation", "private", "bash", "-c", inner]
    else:
        command = ["bash", "-c", inner]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_everything_present_is_quiet_and_succeeds() -> None:
    assert run().returncode == 0  # a fresh clone has no tests/interop/node_modules yet
    done = run("--check")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_it_is_idempotent() -> None:
    for _ in range(2):
        done = run()
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""


def test_a_missing_package_is_named_with_the_one_command_to_run() -> None:
    assert os.geteuid() == 0, "this test hides /usr/sbin in a mount namespace: run it as root"
    assert shutil.which("unshare") and shutil.which("setpriv")
    done = run("--check", hide_sbin=True)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "test-deps: missing: pgbouncer",
        "test-deps: run: apt-get install -y pgbouncer",
    ]


def test_without_root_it_stops_at_once_and_says_sudo(world_readable_copy: Path) -> None:
    assert os.geteuid() == 0, "this test hides /usr/sbin in a mount namespace: run it as root"
    done = run(hide_sbin=True, as_nobody=True, script=world_readable_copy)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "test-deps: run: sudo apt-get install -y pgbouncer"
