"""What a newcomer installs is what the project says (issue 29, item 1): every install hint
names this distribution and an extra it has, one version everywhere, a licence and a
changelog, and the supported Pythons stated."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pylease

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# `pip install X`, `pip install 'X[extra]'`, `pip install -e '.[docs]'`, a wheel's path.
HINT = re.compile(r"pip install\s+(?:-[a-zA-Z-]+\s+)*['\"]?([\w./-]+?)(?:\[([\w,-]+)\])?['\"\s)`]")
# What the hints may install besides this distribution: its dependencies, by their names.
OTHERS = {"psycopg", "psycopg-pool"}


def texts() -> list[tuple[str, str]]:
    paths = [*(ROOT / "pylease").rglob("*.py"), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    paths += [*(ROOT / "docs").rglob("*.md")]
    return [(str(p.relative_to(ROOT)), p.read_text()) for p in paths]


def test_every_install_hint_names_this_distribution_and_an_extra_it_has() -> None:
    name, extras = PROJECT["name"], set(PROJECT["optional-dependencies"])
    # The wheel `make dist` builds now: a hint naming another version is stale.
    wheel = re.compile(rf"(?:.*/)?{name.replace('-', '_')}-{PROJECT['version']}-py3-none-any\.whl$")
    seen = 0
    for where, text in texts():
        for match in HINT.finditer(text):
            what, wanted = match.group(1), match.group(2)
            seen += 1
            assert what in {name, ".", *OTHERS} or wheel.match(what), (where, match.group(0))
            if wanted and what not in OTHERS:
                assert set(wanted.split(",")) <= extras, (where, match.group(0))
    assert seen >= 5
    for where, text in texts():
        assert "pylease[" not in text, f"{where} names the unrelated distribution 'pylease'"


def test_metrics_without_its_extra_says_what_to_install(tmp_path: Path) -> None:
    # prometheus-client missing, as after `pip install pylease-pg`: the hint must install
    # it, and never the unrelated 2015 project called pylease.
    code = (
        "import sys\n"
        "class Missing:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'prometheus_client':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Missing())\n"
        "from pylease.cli import main\n"
        "sys.argv = ['pylease', *sys.argv[1:]]\n"
        "main()\n"
    )
    url = f"sqlite:///{tmp_path / 'leases.sqlite3'}"
    done = subprocess.run(
        [sys.executable, "-c", code, "metrics", "--once", "--dsn", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    hint = f"pip install '{PROJECT['name']}[metrics]'"
    assert done.stderr == f"pylease: pylease metrics needs prometheus-client: {hint}\n"
    assert "metrics" in PROJECT["optional-dependencies"]


def test_one_version_everywhere() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pylease", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.stdout == f"pylease {PROJECT['version']}\n"
    assert pylease.__version__ == PROJECT["version"]


def test_a_licence_a_changelog_and_the_supported_pythons_are_stated() -> None:
    assert PROJECT["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    assert "## [Unreleased]" in (ROOT / "CHANGELOG.md").read_text()
    oldest = PROJECT["requires-python"].removeprefix(">=")
    readme = (ROOT / "README.md").read_text()
    assert f"Python {oldest} or later" in readme
    # make test runs on the oldest supported Python: this one, when the suite runs.
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == oldest
