"""The Python API's SQLite locations refuse what the command line refuses.

``sqlite:/tmp/x`` (one slash) looks absolute but names the relative ``tmp/x``, and a
missing or nonexistent ``HOME`` leaves no embedded default: the CLI refuses both
(pylease.dsn), and so must ``pylease.sqlite.connect`` and every API taking a URL, with
a ConfigurationError that says what is wrong, before anything is created.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import pylease.sqlite
from pylease import ConfigurationError, lease, run_exclusive
from pylease import dsn as dsn_mod


def _tree(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a subdirectory ``d``, where ``sqlite:/d/x`` would land."""
    (tmp_path / "d").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("url", ["sqlite:/d/leases.sqlite3", "sqlite:d/leases.sqlite3"])
def test_connect_refuses_a_one_slash_url(workdir: Path, url: str) -> None:
    with pytest.raises(ConfigurationError, match="malformed SQLite URL") as caught:
        pylease.sqlite.connect(url)
    assert "sqlite:////absolute/path" in str(caught.value)
    assert _tree(workdir) == [workdir / "d"]


def test_path_of_refuses_what_the_cli_refuses(workdir: Path) -> None:
    for url in ("sqlite:/d/x", "sqlite://host/x", "sqlite:", "sqlite:///"):
        with pytest.raises(ConfigurationError):
            dsn_mod.check_sqlite(url)
        with pytest.raises(ConfigurationError, match="SQLite URL"):
            pylease.sqlite.path_of(url)
    assert pylease.sqlite.path_of("sqlite:///d/x") == Path("d/x")
    assert pylease.sqlite.path_of("sqlite:////d/x") == Path("/d/x")


def test_lease_and_run_exclusive_refuse_a_one_slash_url(workdir: Path) -> None:
    url = "sqlite:/d/leases.sqlite3"
    with (
        pytest.raises(ConfigurationError, match="malformed SQLite URL"),
        lease(url, "sweep", ttl=5),
    ):
        pytest.fail("the block must not run")
    ran: list[bool] = []
    with pytest.raises(ConfigurationError, match="malformed SQLite URL"):
        run_exclusive(url, "sweep", 5, lambda: ran.append(True))
    assert ran == []
    assert _tree(workdir) == [workdir / "d"]


def test_a_well_formed_relative_url_still_works(workdir: Path) -> None:
    with lease("sqlite:///d/leases.sqlite3", "sweep", ttl=5) as held:
        assert held.fence == 1
    assert (workdir / "d" / "leases.sqlite3").is_file()


def test_default_refuses_a_nonexistent_home_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "nonexistent"
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(gone))
    with pytest.raises(ConfigurationError, match="does not exist") as caught:
        pylease.sqlite.connect()
    assert "PYLEASE_DSN" in str(caught.value)
    with pytest.raises(ConfigurationError, match="does not exist"):
        pylease.sqlite.default_path()
    assert not gone.exists()
    assert _tree(tmp_path) == []


@pytest.mark.parametrize("home", [None, "", "relative/home"])
def test_default_refuses_no_usable_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: str | None
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    with pytest.raises(ConfigurationError, match="no default SQLite file"):
        pylease.sqlite.default_path()
    with pytest.raises(ConfigurationError, match="no default SQLite file"):
        pylease.sqlite.connect(None)
    assert _tree(tmp_path) == []


def test_xdg_state_home_needs_no_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    expected = tmp_path / "state" / "pylease" / "leases.sqlite3"
    assert pylease.sqlite.default_path() == expected == dsn_mod.default_sqlite_path()
    pylease.sqlite.connect().close()
    assert expected.is_file()
    assert (expected.parent.stat().st_mode & 0o777) == 0o700


def test_the_api_and_the_cli_name_one_default_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert pylease.sqlite.default_path() == dsn_mod.default_sqlite_path()
    assert dsn_mod.default_sqlite_path() == tmp_path / ".local/state/pylease/leases.sqlite3"
