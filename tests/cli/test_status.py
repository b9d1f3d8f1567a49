"""``pylease status`` as an operator reads it: states, 80 columns, --wide, --json, --watch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

from pylease._rows import LeaseRow
from pylease.cli import _render
from tests.support.cli import cli, ok

# At 80 columns ----------------------------------------------------------------------


def long_leases(url: str) -> tuple[list[str], list[str]]:
    names = [("n" * 190 + f"-{i:04d}").ljust(200, "x") for i in range(2)]
    holders = [f"host-{i}:{'9' * 20}:" + "a" * 160 + f"-tail-{i}" for i in range(2)]
    holders = [h[:200] for h in holders]
    for name, holder in zip(names, holders, strict=True):
        ok("claim", "--ttl", "5m", "--holder", holder, "--dsn", url, "--", name)
    ok("claim", "short", "--ttl", "5m", "--holder", "me", "--dsn", url)
    return names, holders


def test_status_fits_80_columns_names_whole_holders_shortened(url: str) -> None:
    names, holders = long_leases(url)
    shown = ok("status", "--dsn", url, env={"COLUMNS": "80"}).stdout
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80, shown
    assert lines[0].split() == ["NAME", "STATE", "HOLDER", "FENCE", "AGE", "EXPIRES"]
    # A name is folded onto more lines, never cut: put back together, it is whole.
    flat = "".join(line.split("  ")[0] for line in lines[1:])
    for name in names:
        assert name in flat
    # Holders are shortened in the middle: the host in front, the tail at the back.
    for i, holder in enumerate(holders):
        row = next(line for line in lines if f"host-{i}:" in line)
        cell = row.split("  held  ", 1)[1].split()[0]
        assert _render.ELLIPSIS in cell and cell.endswith(f"-tail-{i}")
        assert holder not in shown
    assert any(line.split()[:3] == ["short", "held", "me"] for line in lines)


def test_status_wide_shows_holders_whole(url: str) -> None:
    names, holders = long_leases(url)
    # A pipe without COLUMNS has no width either (COLUMNS unset: a test runner's worker
    # may have one in its environment).
    for args, columns in ((("--wide",), "80"), ((), None)):
        shown = ok("status", *args, "--dsn", url, env={"COLUMNS": columns}).stdout
        for name, holder in zip(names, holders, strict=True):
            assert any(name in line and holder in line for line in shown.splitlines()), shown


def test_table_at_every_width_keeps_names_and_fits() -> None:
    now = datetime.now(UTC)
    row = LeaseRow(
        *("n" * 200, "h" * 200, 7),
        *(now - timedelta(minutes=3), now, now + timedelta(minutes=5)),
        *(True, "held", timedelta(minutes=5)),
    )
    for width in (60, 80, 100, 200, 500):
        lines = _render.table([row], now, width)
        assert max(len(line) for line in lines) <= max(width, 60), width
        assert "n" * 200 in "".join(line.split("  ")[0] for line in lines[1:])
    assert "h" * 200 in _render.table([row], now, None)[1]


def test_shorten_keeps_both_ends() -> None:
    assert _render.shorten("abcdefghij", 10) == "abcdefghij"
    assert _render.shorten("abcdefghijk", 7) == "abc…ijk"
    assert _render.shorten("abcdefghijk", 6) == "abc…jk"
    assert len(_render.shorten("x" * 200, 12)) == 12


# States -----------------------------------------------------------------------------


def test_status_json_has_state_and_ttl_in_seconds(url: str) -> None:
    ok("claim", "a", "--ttl", "90s", "--holder", "h", "--dsn", url)
    ok("claim", "b", "--ttl", "250ms", "--holder", "h", "--dsn", url)
    ok("release", "b", "--holder", "h", "--min-hold", "1h", "--dsn", url)
    rows = {r["name"]: r for r in json.loads(ok("status", "--json", "--dsn", url).stdout)}
    assert rows["a"]["state"] == "held" and rows["a"]["ttl"] == 90
    assert isinstance(rows["a"]["ttl"], float | int)
    assert rows["b"]["state"] == "resting" and rows["b"]["held"] is False


def test_status_prefix_lists_the_names_that_start_with_it(url: str) -> None:
    for name in ("report_a", "report_b", "reportxc", "sweep"):
        ok("claim", name, "--ttl", "1m", "--holder", "h", "--dsn", url)
    rows = json.loads(ok("status", "--prefix", "report_", "--json", "--dsn", url).stdout)
    assert [r["name"] for r in rows] == ["report_a", "report_b"]  # `_` is no wildcard
    assert set(rows[0]) == {
        *("name", "holder", "fence", "held", "acquired_at", "renewed_at", "expires_at"),
        *("state", "ttl", "shared", "kind", "data", "release_requested_by"),
    }
    lines = ok("status", "--prefix", "report", "--dsn", url).stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["report_a", "report_b", "reportxc"]
    assert ok("status", "--prefix", "zzz", "--dsn", url).stdout == (
        "no lease whose name starts with 'zzz'\n"
    )
    both = cli("status", "sweep", "--prefix", "s", "--dsn", url)
    assert both.exit_code == 2 and "NAME or --prefix" in both.stderr


def test_status_tells_released_from_expired(url: str) -> None:
    ok("claim", "gone", "--ttl", "250ms", "--holder", "h", "--dsn", url)
    ok("claim", "given", "--ttl", "1m", "--holder", "h", "--dsn", url)
    ok("release", "given", "--holder", "h", "--dsn", url)
    time.sleep(0.5)
    rows = {r["name"]: r for r in json.loads(ok("status", "--json", "--dsn", url).stdout)}
    assert (rows["gone"]["state"], rows["given"]["state"]) == ("expired", "released")
    lines = ok("status", "--dsn", url).stdout.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [["given", "released"], ["gone", "expired"]]


def test_status_table_states_and_times(url: str) -> None:
    ok("claim", "held", "--ttl", "5m", "--holder", "h", "--dsn", url)
    ok("claim", "rest", "--ttl", "5m", "--holder", "h", "--dsn", url)
    ok("release", "rest", "--holder", "h", "--min-hold", "1h", "--dsn", url)
    lines = ok("status", "--dsn", url).stdout.splitlines()
    held = next(line.split() for line in lines if line.startswith("held "))
    assert held[1] == "held" and held[-2] == "in" and held[-1].startswith("4m5")
    rest = next(line.split() for line in lines if line.startswith("rest "))
    assert rest[1] == "resting" and rest[-3:-1] == ["claimable", "in"]
    assert rest[-1].startswith("59m")


# --watch ------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYLEASE_DSN", "DATABASE_URL")}
    return {**env, "COLUMNS": "100"}


def test_status_watch_redraws_on_change_until_ctrl_c(url: str) -> None:
    ok("claim", "first", "--ttl", "5m", "--holder", "h1", "--dsn", url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylease", "status", "--watch", "--dsn", url],
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()

    def shows(text: str) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(text in line for line in seen):
                return True
            if proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    try:
        assert shows("first"), seen
        ok("claim", "second", "--ttl", "5m", "--holder", "h2", "--dsn", url)
        assert shows("second"), seen
        ok("release", "second", "--holder", "h2", "--dsn", url)
        assert shows("released"), seen
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    assert proc.stderr is not None
    assert proc.stderr.read() == ""
    assert any("Ctrl-C to stop" in line for line in seen)
