"""Permits and several names on the command line (contract 5.1, 5.3), as users type it:
``run NAME... --`` and ``run NAME --max-permits N``, ``claim``/``renew``/``release
--max-permits``, ``status`` showing ``3/4 held``, ``pylease permits NAME``, ``metrics``.

Commands run in-process (``cli``), ``run`` as a real process (``pylease``); the other
party acts through a backend of its own. Both backends.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.cli.test_run import finish, pylease, start, wait_for
from tests.support.cli import cli, ok
from tests.support.safety_kit import Db

HOUR = timedelta(hours=1)
NAME = "export"
ENV = (
    "import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
    "if k.startswith('PYLEASE_')}, open(sys.argv[1], 'w'))"
)


# A command that says it is ready, and ends at SIGTERM.
STOPPABLE = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
    "open(sys.argv[1], 'a').write('ready\\n'); time.sleep(60)"
)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def in_use(db: Db, name: str = NAME) -> dict[int, str]:
    """slot -> holder of every permit held now."""
    return {r.slot: r.holder for r in db.backend().permit_status(name) if r.held}


def held_names(db: Db, *names: str) -> dict[str, str]:
    backend = db.backend()
    return {n: r.holder for n in names for r in backend.status(n) if r.held}


# claim, renew, release --max-permits ---------------------------------------------------


def test_claim_grants_permits_up_to_the_limit_then_says_busy(db: Db) -> None:
    args = ("--ttl", "1m", "--max-permits", "3", "--dsn", db.url)
    first = ok("claim", NAME, *args, "--holder", "a").stdout
    two = ok("claim", NAME, *args, "--holder", "b", "--permits", "2").stdout
    holder, fence = first.rstrip("\n").split("\t")
    assert (holder, fence) == ("a", "1")
    b_line = two.rstrip("\n").split("\t")
    assert b_line[0] == "b" and len(b_line) == 3 and all(f.isdigit() for f in b_line[1:])
    assert sorted(in_use(db).values()) == ["a", "b", "b"]

    busy = cli("claim", NAME, *args, "--holder", "c")
    assert busy.exit_code == 1
    assert re.fullmatch(
        r"pylease: semaphore 'export' is busy: 3/3 held, the first expires in \w+\n",
        busy.stderr,
    ), busy.stderr
    assert sorted(in_use(db).values()) == ["a", "b", "b"]  # the busy claim took nothing

    quiet = cli("claim", NAME, *args, "--holder", "c", "--json")
    assert quiet.exit_code == 1 and quiet.stderr == ""
    assert json.loads(quiet.stdout)["claimed"] is False


def test_claim_json_gives_every_slot_and_its_fence(db: Db) -> None:
    shown = ok(
        "claim", NAME, "--ttl", "1m", "--max-permits", "4", "--permits", "2",
        "--holder", "h", "--json", "--dsn", db.url,
    )  # fmt: skip
    got = json.loads(shown.stdout)
    mine = {r.slot: r.fence for r in db.backend().permit_status(NAME) if r.holder == "h"}
    assert got["claimed"] is True and got["holder"] == "h" and got["max_permits"] == 4
    assert got["slots"] == {str(slot): fence for slot, fence in mine.items()}
    assert got["fence"] == mine[min(mine)]
    assert got["expires_at"] is not None


def test_renew_and_release_take_max_permits_and_only_the_holders_own(db: Db) -> None:
    ok("claim", NAME, "--ttl", "5s", "--max-permits", "2", "--holder", "a", "--dsn", db.url)
    kept = ("--max-permits", "2", "--dsn", db.url)
    ok("renew", NAME, "--holder", "a", "--ttl", "1h", *kept)
    row = next(r for r in db.backend().permit_status(NAME) if r.holder == "a")
    assert row.ttl == HOUR

    stranger = cli("renew", NAME, "--holder", "z", *kept)
    assert stranger.exit_code == 1
    assert stranger.stderr == "pylease: semaphore 'export': z holds none of its permits any more\n"
    assert cli("release", NAME, "--holder", "z", *kept).exit_code == 1
    assert in_use(db) != {}

    ok("release", NAME, "--holder", "a", *kept)
    assert in_use(db) == {}
    again = cli("release", NAME, "--holder", "a", *kept)
    assert again.exit_code == 1
    assert again.stderr == "pylease: semaphore 'export': a did not hold its permits\n"
    # A lease's renew does not see a semaphore's permits: the option says the kind.
    ok("claim", NAME, "--ttl", "1m", "--max-permits", "2", "--holder", "a", "--dsn", db.url)
    assert cli("renew", NAME, "--holder", "a", "--dsn", db.url).exit_code != 0


def test_a_claim_with_the_holder_of_live_permits_is_busy_not_joined(db: Db) -> None:
    """Two `pylease claim --holder a` (two processes given one holder): the second is
    busy while the first's permits are live, as a lease's claim is (issue 21)."""
    ok("claim", NAME, "--ttl", "1m", "--max-permits", "2", "--holder", "a", "--dsn", db.url)
    held = in_use(db)
    second = cli(
        "claim", NAME, "--ttl", "1m", "--max-permits", "2", "--holder", "a", "--dsn", db.url
    )
    assert second.exit_code == 1, second.output
    assert in_use(db) == held


def test_a_claim_naming_another_limit_is_refused_naming_both(db: Db) -> None:
    ok("claim", NAME, "--ttl", "1m", "--max-permits", "2", "--dsn", db.url)
    other = cli("claim", NAME, "--ttl", "1m", "--max-permits", "3", "--dsn", db.url)
    assert other.exit_code == 2
    assert "3" in other.stderr and "2" in other.stderr, other.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["claim", NAME, "--ttl", "1m", "--permits", "2"], "give --max-permits too"),
        (
            ["claim", NAME, "--ttl", "1m", "--max-permits", "2", "--permits", "3"],
            "--permits 3 is more than --max-permits 2",
        ),
        (["claim", NAME, "--ttl", "1m", "--max-permits", "0"], "--max-permits"),
        (["claim", NAME, "--ttl", "1m", "--max-permits", "10001"], "--max-permits"),
        (
            ["release", NAME, "--holder", "h", "--max-permits", "2", "--min-hold", "1m"],
            "--min-hold is for a lease",
        ),
        (["run", "a", "b", "--ttl", "1m", "--max-permits", "2", "--", "true"], "one NAME"),
        (["run", "a", "b", "--ttl", "1m", "--min-hold", "1m", "--", "true"], "several names"),
        (["run", "a", "b", "a", "--ttl", "1m", "--", "true"], "a name twice"),
        (["run", "a", "--ttl", "1m", "--permits", "2", "--", "true"], "--max-permits too"),
    ],
)
def test_options_that_mean_nothing_together_are_usage_errors(
    db: Db, args: list[str], says: str
) -> None:
    result = cli(*args, "--dsn", db.url) if "--" not in args else cli(*_dsn_first(args, db))
    assert result.exit_code == 2, result.output
    assert says in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert db.backend().permit_status() == [] and db.backend().status() == []


def _dsn_first(args: list[str], db: Db) -> list[str]:
    at = args.index("--")
    return [*args[:at], "--dsn", db.url, *args[at:]]


# run NAME... -- CMD ---------------------------------------------------------------------


def test_run_several_names_gives_the_command_every_fence_and_releases_them_all(
    db: Db, tmp_path: Path
) -> None:
    seen = tmp_path / "env.json"
    result = pylease(
        "run", "acct-42", "acct-17", "--ttl", "1m", "--holder", "transfer", "--dsn", db.url,
        "--", sys.executable, "-c", ENV, str(seen),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    env = json.loads(seen.read_text())
    backend = db.backend()
    fences = {n: backend.status(n)[0].fence for n in ("acct-42", "acct-17")}
    assert env["PYLEASE_FENCES"] == f"acct-42={fences['acct-42']} acct-17={fences['acct-17']}"
    assert (env["PYLEASE_NAME"], env["PYLEASE_FENCE"]) == ("acct-42", str(fences["acct-42"]))
    assert env["PYLEASE_HOLDER"] == "transfer" and "PYLEASE_SLOTS" not in env
    assert held_names(db, "acct-42", "acct-17") == {}


def test_run_several_names_is_all_or_nothing(db: Db, tmp_path: Path) -> None:
    assert db.backend().claim("b", HOUR, "other") is not None
    marker = tmp_path / "ran"
    result = pylease(
        "run", "a", "b", "c", "--ttl", "1m", "--dsn", db.url, "--", "touch", str(marker)
    )
    assert result.returncode == 1
    assert result.stderr.startswith("pylease: lease 'b' is held by other (fence 1"), result.stderr
    assert not marker.exists()
    assert db.backend().status("a") == [] and db.backend().status("c") == []

    waited = pylease(
        "run", "a", "b", "c", "--ttl", "1m", "--wait", "300ms", "--busy-exit", "9",
        "--dsn", db.url, "--", "touch", str(marker),
    )  # fmt: skip
    assert waited.returncode == 9 and not marker.exists()
    assert db.backend().status("a") == [] and db.backend().status("c") == []


def test_run_several_names_waits_holding_none_and_runs_once_they_are_free(
    db: Db, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    other = db.backend()
    assert other.claim("b", HOUR, "other") is not None
    marker = tmp_path / "ran"
    proc = start(
        procs, "run", "a", "b", "--ttl", "1m", "--wait", "60s", "--dsn", db.url,
        "--", "touch", str(marker),
    )  # fmt: skip
    # While it waits it holds neither name: "a" stays free for anyone.
    assert other.claim("a", HOUR, "passer-by") is not None
    assert other.release("a", "passer-by")
    assert other.release("b", "other")
    code, err = finish(proc)
    assert code == 0, err
    assert marker.exists()
    assert held_names(db, "a", "b") == {}


def test_run_max_permits_gives_the_command_its_slots(db: Db, tmp_path: Path) -> None:
    seen = tmp_path / "env.json"
    result = pylease(
        "run", NAME, "--max-permits", "4", "--permits", "2", "--ttl", "1m", "--dsn", db.url,
        "--", sys.executable, "-c", ENV, str(seen),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    env = json.loads(seen.read_text())
    rows = db.backend().permit_status(NAME)
    slots = {r.slot: r.fence for r in rows if r.holder == env["PYLEASE_HOLDER"]}
    assert len(slots) == 2
    assert env["PYLEASE_SLOTS"] == " ".join(f"{s}={f}" for s, f in sorted(slots.items()))
    assert env["PYLEASE_FENCE"] == str(slots[min(slots)]) and env["PYLEASE_NAME"] == NAME
    assert "PYLEASE_FENCES" not in env
    assert in_use(db) == {}  # given back when the command exited


def test_run_max_permits_is_busy_when_every_permit_is_held(db: Db, tmp_path: Path) -> None:
    other = db.backend()
    assert other.permit_claim(NAME, 2, HOUR, "x", 2)
    marker = tmp_path / "ran"
    result = pylease(
        "run", NAME, "--max-permits", "2", "--ttl", "1m", "--dsn", db.url,
        "--", "touch", str(marker),
    )  # fmt: skip
    assert result.returncode == 1
    assert re.fullmatch(
        r"pylease: semaphore 'export' is busy: 2/2 held, the first expires in \w+\n",
        result.stderr,
    ), result.stderr
    assert not marker.exists()


def test_runs_over_a_semaphore_of_two_never_run_more_than_two_at_once(
    db: Db, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """Six runs of a command that notes its start and its end in one file: in the
    file's order, never more than two between a start and its end; all six ran."""
    log = tmp_path / "log"
    work = 'echo start >> "$0"; sleep 0.3; echo end >> "$0"'
    args = ("--max-permits", "2", "--ttl", "5s", "--wait", "120s", "--dsn", db.url)
    runs = [start(procs, "run", NAME, *args, "--", "sh", "-c", work, str(log)) for _ in range(6)]
    for proc in runs:
        code, err = finish(proc)
        assert code == 0, err
    running = most = 0
    lines = log.read_text().split()
    for line in lines:
        running += 1 if line == "start" else -1
        most = max(most, running)
    assert lines.count("start") == lines.count("end") == 6
    assert most <= 2


def test_a_revoked_permit_stops_the_command_and_says_who_has_the_slot(
    db: Db, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    out = tmp_path / "out"
    proc = start(
        procs, "run", NAME, "--max-permits", "1", "--ttl", "6s", "--dsn", db.url,
        "--", sys.executable, "-c", STOPPABLE, str(out),
    )  # fmt: skip
    wait_for(out, "ready", proc)
    other = db.backend()
    (holder,) = in_use(db).values()
    assert other.permit_revoke(NAME, holder)
    assert other.permit_claim(NAME, 1, HOUR, "operator") == {0: 2}
    code, err = finish(proc)
    assert code == 75, err
    assert "was lost" in err
    assert err.splitlines()[-1] == (
        "pylease: slot 0 of semaphore 'export' is now held by operator (fence 2)"
    ), err
    assert in_use(db) == {0: "operator"}


# -- is what tells the names from the command ----------------------------------------------


def test_run_without_double_dash_is_a_usage_error_that_says_where_it_goes(db: Db) -> None:
    result = cli("run", "a", "b", "--ttl", "1m", "--dsn", db.url, "true")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "Missing argument '-- CMD [ARG...]'" in line
    assert "the command goes after --, the names before it" in line
    assert db.backend().status() == []

    # Without --, the command's own option reads as one of pylease's: said so.
    option = cli("run", "a", "--ttl", "1m", "--dsn", db.url, "ls", "-l")
    assert option.exit_code == 2
    assert option.stderr.startswith(
        "pylease: No such option: -l; the command goes after --, the names before it"
    ), option.stderr
    assert db.backend().status() == []

    no_name = cli("run", "--ttl", "1m", "--dsn", db.url, "--", "echo", "hi")
    assert no_name.exit_code == 2
    assert "NAME goes before '--'" in no_name.stderr
    assert db.backend().status() == []


def test_run_usage_shows_several_names_and_the_command() -> None:
    usage = ok("run", "--help").stdout.splitlines()[0]
    assert usage == "Usage: pylease run [OPTIONS] NAME [NAME...] -- CMD [ARG...]"
    text = " ".join(ok("run", "--help").stdout.split())
    for option in ("--max-permits N", "--permits K", "PYLEASE_FENCES", "PYLEASE_SLOTS"):
        assert option in text, option


# status, permits, metrics ----------------------------------------------------------------


def three_of_four(db: Db) -> None:
    for holder in ("h1", "h2", "h3"):
        ok("claim", NAME, "--ttl", "1m", "--max-permits", "4", "--holder", holder, "--dsn", db.url)
    ok("claim", "sweep", "--ttl", "1m", "--holder", "me", "--dsn", db.url)


def test_status_shows_a_semaphore_as_3_of_4_held(db: Db) -> None:
    three_of_four(db)
    lines = ok("status", "--dsn", db.url).stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "HOLDER", "FENCE", "AGE", "EXPIRES"]
    assert [line.split()[0] for line in lines[1:]] == [NAME, "sweep"]
    assert lines[1].split()[:5] == [NAME, "3/4", "held", "3", "holders"]
    one = ok("status", NAME, "--dsn", db.url).stdout.splitlines()
    assert one[1].split()[:5] == lines[1].split()[:5]

    rows = json.loads(ok("status", "--json", "--dsn", db.url).stdout)
    sem = next(r for r in rows if r["name"] == NAME)
    assert (sem["kind"], sem["max_permits"], sem["in_use"]) == ("semaphore", 4, 3)
    assert (sem["state"], sem["held"]) == ("held", True)
    assert sorted(s["holder"] for s in sem["slots"]) == ["h1", "h2", "h3"]
    lease = next(r for r in rows if r["name"] == "sweep")
    assert (lease["kind"], lease["state"], lease["holder"]) == ("lease", "held", "me")

    for holder in ("h1", "h2", "h3"):
        ok("release", NAME, "--holder", holder, "--max-permits", "4", "--dsn", db.url)
    line = ok("status", NAME, "--dsn", db.url).stdout.splitlines()[1]
    assert line.split()[:3] == [NAME, "0/4", "held"]
    assert json.loads(ok("status", NAME, "--json", "--dsn", db.url).stdout)[0]["state"] == "free"


def test_permits_lists_the_slots_of_a_semaphore(db: Db) -> None:
    three_of_four(db)
    ok("release", NAME, "--holder", "h2", "--max-permits", "4", "--dsn", db.url)
    lines = ok("permits", NAME, "--dsn", db.url).stdout.splitlines()
    assert lines[0] == "semaphore 'export': 2/4 held"
    assert lines[1].split() == ["SLOT", "STATE", "HOLDER", "FENCE", "AGE", "EXPIRES"]
    rows = db.backend().permit_status(NAME)
    shown = {int(line.split()[0]): line.split()[1:4] for line in lines[2:]}
    assert shown == {r.slot: [r.state, r.holder, str(r.fence)] for r in rows}

    got = json.loads(ok("permits", NAME, "--json", "--dsn", db.url).stdout)
    assert (got["name"], got["max_permits"], got["in_use"]) == (NAME, 4, 2)
    assert [(s["slot"], s["holder"], s["state"]) for s in got["slots"]] == [
        (r.slot, r.holder, r.state) for r in rows
    ]

    assert ok("permits", "nothing", "--dsn", db.url).stdout == "no semaphore named 'nothing'\n"
    lease = ok("permits", "sweep", "--dsn", db.url).stdout
    assert lease.startswith("'sweep' is a lease, not a semaphore")
    assert json.loads(ok("permits", "nothing", "--json", "--dsn", db.url).stdout)["slots"] == []


def test_metrics_give_permits_in_use_and_the_limit(db: Db) -> None:
    pytest.importorskip("prometheus_client")
    three_of_four(db)
    text = ok("metrics", "--once", "--dsn", db.url).stdout
    assert 'pylease_permits_in_use{name="export"} 3.0' in text
    assert 'pylease_permits_max{name="export"} 4.0' in text
    assert 'pylease_grants_total{name="export"} 3.0' in text
    assert 'pylease_lease_held{name="sweep"} 1.0' in text
    assert 'pylease_lease_held{name="export"}' not in text  # a semaphore is no lease
    only = ok("metrics", "--once", "--names", "sweep", "--dsn", db.url).stdout
    assert "pylease_permits_in_use{" not in only
    capped = ok("metrics", "--once", "--prefix", "exp", "--dsn", db.url).stdout
    assert 'pylease_permits_in_use{name="export"} 3.0' in capped
    assert 'name="sweep"' not in capped
