"""Readers and writers from the command line (contract 5.2), on both backends:
``claim --shared``, ``status`` (``shared by N``) and ``holders``."""

from __future__ import annotations

import json

from tests.support.cli import cli, ok


def test_readers_claim_together_and_a_writer_is_busy(url: str) -> None:
    first = ok("claim", "doc", "--ttl", "1m", "--shared", "--holder", "r1", "--dsn", url)
    assert first.stdout == "r1\t0\n"
    second = json.loads(
        ok("claim", "doc", "--ttl", "1m", "--shared", "--json", "--dsn", url).stdout
    )
    assert (second["claimed"], second["fence"], second["shared"]) == (True, 0, True)
    assert second["expires_at"] is not None
    busy = cli("claim", "doc", "--ttl", "1m", "--holder", "w", "--dsn", url)
    assert busy.exit_code == 1
    assert "lease 'doc' is shared by 2 readers (epoch 0" in busy.stderr
    # The readers renew and release with their holders, as a writer does.
    ok("renew", "doc", "--holder", "r1", "--dsn", url)
    ok("release", "doc", "--holder", "r1", "--dsn", url)
    ok("release", "doc", "--holder", second["holder"], "--dsn", url)
    assert ok("claim", "doc", "--ttl", "1m", "--holder", "w", "--dsn", url).stdout == "w\t1\n"
    held = cli("claim", "doc", "--ttl", "1m", "--shared", "--dsn", url)
    assert held.exit_code == 1
    assert "lease 'doc' is held by w (fence 1" in held.stderr


def test_status_shows_a_name_read_by_three_as_shared_by_3(url: str) -> None:
    for reader in ("r1", "r2", "r3"):
        ok("claim", "doc", "--ttl", "1m", "--shared", "--holder", reader, "--dsn", url)
    ok("claim", "solo", "--ttl", "1m", "--holder", "w", "--dsn", url)
    lines = ok("status", "--dsn", url).stdout.splitlines()
    doc = next(line for line in lines if line.startswith("doc "))
    assert doc.split()[1:5] == ["shared", "by", "3", "-"], lines
    [row] = json.loads(ok("status", "doc", "--json", "--dsn", url).stdout)
    assert (row["state"], row["holder"], row["fence"], row["shared"]) == ("shared", None, 0, 3)


def test_holders_lists_every_holder_of_every_kind(url: str) -> None:
    assert ok("holders", "--dsn", url).stdout.startswith("nobody holds a lease")
    for reader in ("r1", "r2"):
        ok("claim", "doc", "--ttl", "1m", "--shared", "--holder", reader, "--dsn", url)
    ok("claim", "solo", "--ttl", "1m", "--holder", "w", "--dsn", url)
    rows = json.loads(ok("holders", "--json", "--dsn", url).stdout)
    assert [(r["name"], r["holder"], r["mode"], r["slot"], r["fence"]) for r in rows] == [
        ("doc", "r1", "shared", None, 0),
        ("doc", "r2", "shared", None, 0),
        ("solo", "w", "exclusive", None, 1),
    ]
    table = ok("holders", "doc", "--dsn", url).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODE", "SLOT", "FENCE", "AGE", "EXPIRES", "HOLDER"]
    assert [line.split()[-1] for line in table[1:]] == ["r1", "r2"]
    assert ok("holders", "other", "--dsn", url).stdout == "nobody holds 'other'\n"


def test_a_reader_takes_no_min_hold(url: str) -> None:
    result = cli(
        "run", "doc", "--ttl", "1m", "--shared", "--min-hold", "1m", "--dsn", url, "--", "true"
    )
    assert result.exit_code == 2, result.output
    assert "min_hold" in result.stderr
