"""``pylease history``, ``prune-history`` and ``metrics``: what an operator reads at 3 a.m."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pylease._rows import PageRow
from pylease.cli import _metrics as metrics_mod
from pylease.cli import _render
from pylease.errors import DatabaseUnavailable
from tests.support.cli import cli, ok
from tests.support.pgserver import free_port


def takeover_and_steal(url: str) -> None:
    """Under the default history setting: one takeover, one steal, three grants."""
    ok("claim", "job", "--ttl", "250ms", "--holder", "dies", "--dsn", url)
    time.sleep(0.5)
    ok("claim", "job", "--ttl", "1h", "--holder", "next", "--dsn", url)  # a takeover
    ok("steal", "job", "--ttl", "1h", "--holder", "ops", "--dsn", url)
    ok("claim", "other", "--ttl", "1h", "--holder", "o", "--dsn", url)


# history ---------------------------------------------------------------------------------


def test_history_newest_first_with_readable_times(url: str) -> None:
    takeover_and_steal(url)
    events = json.loads(ok("history", "--json", "--dsn", url).stdout)
    assert [(e["name"], e["event"], e["holder"], e["previous_holder"]) for e in events] == [
        ("job", "stolen", "ops", "next"),
        ("job", "taken_over", "next", "dies"),
    ]
    assert [e["fence"] for e in events] == [3, 2]
    assert all(datetime.fromisoformat(e["at"]).tzinfo is not None for e in events)

    lines = ok("history", "job", "--dsn", url, env={"COLUMNS": "80"}).stdout.splitlines()
    assert lines[0].split() == ["WHEN", "AT", "NAME", "EVENT", "HOLDER", "FENCE", "PREVIOUS"]
    # An age in whole seconds (seconds here, however loaded the machine).
    assert re.fullmatch(r"now|\d+s", lines[1].split()[0]) and "stolen" in lines[1]
    assert "taken_over" in lines[2]
    assert max(len(line) for line in lines) <= 80

    assert len(json.loads(ok("history", "--limit", "1", "--json", "--dsn", url).stdout)) == 1
    assert json.loads(ok("history", "other", "--json", "--dsn", url).stdout) == []
    assert "no events for lease 'other'" in ok("history", "other", "--dsn", url).stdout
    assert cli("history", "--limit", "0", "--dsn", url).exit_code == 2


def test_history_since(url: str) -> None:
    takeover_and_steal(url)
    time.sleep(1.2)
    assert json.loads(ok("history", "--since", "1s", "--json", "--dsn", url).stdout) == []
    assert len(json.loads(ok("history", "--since", "1h", "--json", "--dsn", url).stdout)) == 2


def test_prune_history_prints_how_many(url: str) -> None:
    takeover_and_steal(url)
    assert ok("prune-history", "--older-than", "1h", "--dsn", url).stdout == "removed 0 events\n"
    time.sleep(0.3)
    assert ok("prune-history", "--older-than", "100ms", "--dsn", url).stdout == (
        "removed 2 events\n"
    )
    assert json.loads(ok("history", "--json", "--dsn", url).stdout) == []
    assert cli("prune-history", "--dsn", url).exit_code == 2  # --older-than is required


def test_prune_prints_how_many_names_went(url: str) -> None:
    takeover_and_steal(url)
    ok("release", "job", "--holder", "ops", "--dsn", url)
    assert ok("prune", "--idle-for", "1h", "--dsn", url).stdout == "removed 0 names\n"
    time.sleep(0.3)
    assert ok("prune", "--idle-for", "100ms", "--dsn", url).stdout == "removed 1 name\n"
    assert "job" not in ok("status", "--dsn", url).stdout
    assert len(json.loads(ok("history", "--json", "--dsn", url).stdout)) == 2
    assert cli("prune", "--dsn", url).exit_code == 2  # --idle-for is required
    assert cli("prune", "--idle-for", "1 fortnight", "--dsn", url).exit_code == 2


# metrics -----------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, str], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, sample.labels.get("name", ""))] = sample.value
    return found


def test_metrics_once_parses_and_counters_match_history(url: str) -> None:
    takeover_and_steal(url)
    ok("release", "other", "--holder", "o", "--dsn", url)
    text = ok("metrics", "--once", "--dsn", url).stdout
    got = samples(text)
    events = json.loads(ok("history", "--json", "--dsn", url).stdout)
    taken = sum(e["event"] == "taken_over" for e in events)
    stolen = sum(e["event"] == "stolen" for e in events)
    assert got[("pylease_up", "")] == 1
    assert got[("pylease_takeovers_total", "job")] == taken == 1
    assert got[("pylease_steals_total", "job")] == stolen == 1
    assert got[("pylease_grants_total", "job")] == 3
    assert got[("pylease_releases_total", "other")] == 1
    assert got[("pylease_lease_held", "job")] == 1 and got[("pylease_lease_held", "other")] == 0
    assert got[("pylease_lease_fence", "job")] == 3
    assert 3500 < got[("pylease_lease_expires_in_seconds", "job")] <= 3600
    assert 0 <= got[("pylease_lease_held_for_seconds", "job")] < 60
    assert got[("pylease_lease_expires_in_seconds", "other")] == 0
    # Pruning the history never lowers a counter.
    ok("prune-history", "--older-than", "0", "--dsn", url)
    assert (
        samples(ok("metrics", "--once", "--dsn", url).stdout)[("pylease_takeovers_total", "job")]
        == 1
    )


def test_metrics_names_filter(url: str) -> None:
    takeover_and_steal(url)
    got = samples(ok("metrics", "--once", "--names", "jo*", "--dsn", url).stdout)
    assert {name for _metric, name in got if name} == {"job"}


def test_metrics_prefix_and_cap_report_what_they_left_out(url: str) -> None:
    # Names that a LIKE pattern would mistake: the prefix is taken literally.
    for name in ("t_1", "t_2", "t_3", "t%4", "tx5", "u_6"):
        ok("claim", name, "--ttl", "1h", "--holder", "h", "--dsn", url)

    def scrape(*args: str) -> tuple[set[str], float]:
        got = samples(ok("metrics", "--once", *args, "--dsn", url).stdout)
        named = {name for metric, name in got if name and metric == "pylease_lease_held"}
        assert named == {name for _metric, name in got if name}, "every series, the same names"
        return named, got[("pylease_names_omitted", "")]

    assert scrape() == ({"t_1", "t_2", "t_3", "t%4", "tx5", "u_6"}, 0)
    assert scrape("--prefix", "t_") == ({"t_1", "t_2", "t_3"}, 0)
    assert scrape("--prefix", "t%") == ({"t%4"}, 0)
    assert scrape("--prefix", "nothing") == (set(), 0)
    # The cut keeps the first names by name (in the database's collation, which may
    # ignore punctuation: these sort alike in any), and counts the others.
    assert scrape("--prefix", "t_", "--max-names", "2") == ({"t_1", "t_2"}, 1)
    named, omitted = scrape("--max-names", "4")
    assert len(named) == 4 and omitted == 2
    # Patterns filter before the cut: the omitted names are matching ones only.
    assert scrape("--names", "*_*", "--max-names", "2") == ({"t_1", "t_2"}, 2)
    named, omitted = scrape("--prefix", "t", "--names", "*[0-9]", "--max-names", "4")
    assert len(named) == 4 and omitted == 1
    assert cli("metrics", "--once", "--max-names", "0", "--dsn", url).exit_code == 2
    assert cli("metrics", "--once", "--prefix", "x" * 201, "--dsn", url).exit_code == 2


def test_metrics_needs_one_of_listen_and_once(url: str) -> None:
    assert cli("metrics", "--dsn", url).exit_code == 2
    assert cli("metrics", "--once", "--listen", "127.0.0.1:0", "--dsn", url).exit_code == 2
    assert cli("metrics", "--listen", "nonsense", "--dsn", url).exit_code == 2


def test_metrics_listen_is_scraped_over_http(url: str) -> None:
    takeover_and_steal(url)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylease", "metrics", "--listen", f"127.0.0.1:{port}", "--dsn", url],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        body = None
        while body is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    assert r.status == 200
                    body = r.read().decode()
            except OSError:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.1)
        assert body is not None
        got = samples(body)
        assert got[("pylease_takeovers_total", "job")] == 1
        ok("steal", "job", "--ttl", "1h", "--holder", "ops2", "--dsn", url)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            again = samples(r.read().decode())
        assert again[("pylease_steals_total", "job")] == 2  # read at every scrape
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _, err = proc.communicate()
    assert err.startswith(f"pylease: serving metrics on http://127.0.0.1:{port}/metrics")


# The rendering alone, on rows as the backends return them ------------------------------


@dataclass(frozen=True)
class Event:
    at: datetime
    name: str
    event: str
    holder: str | None
    fence: int | None
    previous_holder: str | None


def page_row(name: str, held: bool, fence: int, counted: tuple[int, int, int, int]) -> PageRow:
    now = datetime.now(UTC)
    since, until = (now - timedelta(seconds=30), now + timedelta(seconds=60))
    if not held:
        since, until = (now - timedelta(hours=1), now - timedelta(seconds=5))
    state = "held" if held else "expired"
    return PageRow(
        *(name, "h", fence, since, now, until, held, state, timedelta(minutes=1), 0, None, None),
        *counted,
        2,
    )


def test_collector_series() -> None:
    rows = [page_row("a", True, 4, (4, 1, 2, 0)), page_row("b", False, 2, (2, 0, 0, 2))]
    now = rows[0].renewed_at
    got = samples(metrics_mod.text(metrics_mod.LeaseCollector(lambda: (rows, 0, now))))
    assert got[("pylease_lease_held", "a")] == 1 and got[("pylease_lease_held", "b")] == 0
    assert got[("pylease_lease_expires_in_seconds", "a")] == 60
    assert got[("pylease_lease_held_for_seconds", "a")] == 30
    assert got[("pylease_lease_held_for_seconds", "b")] == 0
    assert got[("pylease_lease_fence", "b")] == 2
    assert got[("pylease_grants_total", "a")] == 4 and got[("pylease_steals_total", "a")] == 2
    assert got[("pylease_takeovers_total", "a")] == 1
    assert got[("pylease_releases_total", "b")] == 2
    assert got[("pylease_names_omitted", "")] == 0

    errors: list[Exception] = []

    def broken() -> Any:
        raise DatabaseUnavailable("pylease: database unavailable: gone")

    down = samples(metrics_mod.text(metrics_mod.LeaseCollector(broken, errors.append)))
    assert down == {("pylease_up", ""): 0}
    assert len(errors) == 1


def test_select_cuts_after_the_patterns_and_counts_what_it_left_out() -> None:
    rows = [page_row(f"n{i}", True, 1, (1, 0, 0, 0)) for i in range(5)]
    # The database's page: cut at max_names already, matching counts the rest.
    page = [replace(row, matching=9) for row in rows[:3]]
    assert metrics_mod.select(page, (), 3) == (page, 6)
    # With patterns, every name of the prefix came back: filtered, then cut.
    kept, omitted = metrics_mod.select(rows, ["n[1-4]"], 2)
    assert [r.name for r in kept] == ["n1", "n2"] and omitted == 2
    assert metrics_mod.select(rows, ["x*"], 2) == ([], 0)
    assert metrics_mod.select([], (), 2) == ([], 0)


def test_history_lines_fit_and_read() -> None:
    now = datetime.now(UTC)
    events = [
        Event(now - timedelta(minutes=3), "job", "stolen", "ops", 3, "x" * 200),
        Event(now - timedelta(hours=2), "job", "taken_over", "y" * 200, 2, "dies"),
        Event(now, "job", "released", "ops", 3, None),
    ]
    lines = _render.history_lines(events, now, 80)
    assert max(len(line) for line in lines) <= 80, lines
    assert lines[1].split()[:2] == ["3m", "ago"] and "stolen" in lines[1]
    assert lines[2].split()[:2] == ["2h", "ago"] and "taken_over" in lines[2]
    assert lines[3].split()[0] == "now" and lines[3].rstrip().endswith("-")
    assert "y" * 200 in _render.history_lines(events, now, None)[2]


# An EXECUTE-only role ------------------------------------------------------------------------


@pytest.fixture
def app_dsn(dsn: str) -> Iterator[str]:
    """A login role with nothing but what PUBLIC may do: EXECUTE the lease functions."""
    role = f"pylease_cli_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    params = conninfo_to_dict(dsn)
    params["user"] = role
    params.pop("password", None)
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_an_execute_only_role_reads_metrics_and_history_but_may_not_prune(
    dsn: str, app_dsn: str
) -> None:
    takeover_and_steal(dsn)
    got = samples(ok("metrics", "--once", "--dsn", app_dsn).stdout)
    assert got[("pylease_takeovers_total", "job")] == 1
    assert len(json.loads(ok("history", "--json", "--dsn", app_dsn).stdout)) == 2
    refused = cli("prune-history", "--older-than", "1d", "--dsn", app_dsn)
    assert refused.exit_code == 3, refused.output
    line = refused.stderr.strip()
    assert "may not prune the history" in line
    grant = line.split("runs: ", 1)[1]
    assert grant.startswith('GRANT EXECUTE ON FUNCTION "public".lease_prune_history(interval) TO')
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(grant.encode())
    assert ok("prune-history", "--older-than", "0", "--dsn", app_dsn).stdout == "removed 2 events\n"
    refused = cli("prune", "--idle-for", "1d", "--dsn", app_dsn)
    assert refused.exit_code == 3, refused.output
    line = refused.stderr.strip()
    assert "may not prune names" in line
    grant = line.split("runs: ", 1)[1]
    assert grant.startswith('GRANT EXECUTE ON FUNCTION "public".lease_prune(interval) TO')
