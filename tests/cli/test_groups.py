"""Groups on the command line (contract 5.5): ``pylease members GROUP``, ``status`` listing
groups apart from leases, and ``metrics`` giving members per group and partitions owned
per member.

The group is made by the other party through a backend of its own: members joined with
``group_join``, partitions owned as the leases ``<grp>#<part>`` held by a member's name,
as ``partitions()`` holds them. Both backends.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tests.support.cli import cli, ok
from tests.support.safety_kit import Db

HOUR = timedelta(hours=1)
GRP = "indexers"


def two_members(db: Db) -> None:
    """Members a (owns partitions 0, 1 and 3) and b (owns 2), beside a lease and a group
    whose member has gone."""
    other = db.backend()
    assert other.group_join(GRP, "a", HOUR, {"host": "a.example"}) is not None
    assert other.group_join(GRP, "b", HOUR) is not None
    for part, member in ((0, "a"), (1, "a"), (3, "a"), (2, "b")):
        assert other.claim(f"{GRP}#{part}", HOUR, member) is not None
    assert other.claim(f"{GRP}#notapart", HOUR, "a") is not None
    assert other.claim("sweep", HOUR, "h") is not None
    assert other.group_join("gone", "x", HOUR) is not None
    assert other.group_leave("gone", "x")


def test_members_lists_the_live_members_and_their_partitions(db: Db) -> None:
    two_members(db)
    lines = ok("members", GRP, "--dsn", db.url).stdout.splitlines()
    assert lines[0] == "group 'indexers': 2 members"
    assert lines[1].split() == ["MEMBER", "PARTITIONS", "DATA", "INCARNATION", "AGE", "EXPIRES"]
    assert lines[2].split()[:2] == ["a", "3"]
    assert '{"host": "a.example"}' in lines[2]
    assert lines[3].split()[:4] == ["b", "1", "-", "2"]

    got = json.loads(ok("members", GRP, "--json", "--dsn", db.url).stdout)
    assert (got["group"], got["kind"]) == (GRP, "group")
    assert [
        (m["member"], m["incarnation"], m["data"], m["partitions"]) for m in got["members"]
    ] == [
        ("a", 1, {"host": "a.example"}, [0, 1, 3]),
        ("b", 2, None, [2]),
    ]
    assert all(m["expires_at"] > m["joined_at"] for m in got["members"])


def test_members_of_a_group_nobody_is_in(db: Db) -> None:
    two_members(db)
    assert ok("members", "gone", "--dsn", db.url).stdout == "no live member in group 'gone'\n"
    got = json.loads(ok("members", "nobody", "--json", "--dsn", db.url).stdout)
    assert got["members"] == []
    bad = cli("members", "g" * 191, "--dsn", db.url)
    assert bad.exit_code == 2, bad.output


def test_status_lists_groups_apart_from_leases(db: Db) -> None:
    two_members(db)
    lines = ok("status", "--dsn", db.url).stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "HOLDER", "FENCE", "AGE", "EXPIRES"]
    blank = lines.index("")
    assert {line.split()[0] for line in lines[1:blank]} == {
        *(f"{GRP}#{part}" for part in range(4)),
        f"{GRP}#notapart",
        "sweep",
    }
    assert lines[blank + 1].split() == [
        "GROUP",
        "MEMBERS",
        "PARTITIONS",
        "INCARNATION",
        "EXPIRES",
    ]
    groups = {line.split()[0]: line.split()[1:4] for line in lines[blank + 2 :]}
    assert groups == {"gone": ["0", "-", "1"], GRP: ["2", "4", "2"]}

    rows = json.loads(ok("status", "--json", "--dsn", db.url).stdout)
    found = [(r["name"], r["members"], r["partitions_held"]) for r in rows if r["kind"] == "group"]
    assert found == [("gone", 0, 0), (GRP, 2, 4)]
    assert rows[-2]["kind"] == "group"  # after the leases

    only = ok("status", "--prefix", "ind", "--dsn", db.url).stdout
    assert "gone" not in only and "sweep" not in only
    assert ok("status", "gone", "--dsn", db.url).stdout.splitlines()[1].split()[0] == "gone"


def test_metrics_give_members_per_group_and_partitions_per_member(db: Db) -> None:
    pytest.importorskip("prometheus_client")
    two_members(db)
    text = ok("metrics", "--once", "--dsn", db.url).stdout
    assert f'pylease_group_members{{group="{GRP}"}} 2.0' in text
    assert 'pylease_group_members{group="gone"} 0.0' in text
    assert f'pylease_group_partitions_owned{{group="{GRP}",member="a"}} 3.0' in text
    assert f'pylease_group_partitions_owned{{group="{GRP}",member="b"}} 1.0' in text
    only = ok("metrics", "--once", "--names", "sweep", "--dsn", db.url).stdout
    assert "pylease_group_members{" not in only
