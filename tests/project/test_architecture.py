"""docs/architecture.md names every module of pylease/, so a newcomer finds the room for a
change; the sync twins generated from an ``_async`` source are named with it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pylease"


def named_in_note() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return set(re.findall(r"`([\w/]+\.py)`", text))


def modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("contrib/"):
            continue  # the Django app is one paragraph of the note
        generated = path.with_name(path.stem + "_async.py")
        if generated.exists():
            continue  # a sync twin: named with its source
        found.add(relative)
    return found


def test_the_architecture_note_names_every_module() -> None:
    missing = modules() - named_in_note()
    assert not missing, f"docs/architecture.md does not name: {sorted(missing)}"


def test_the_architecture_note_names_no_module_that_is_gone() -> None:
    places = (PACKAGE, PACKAGE / "contrib" / "django", ROOT)
    gone = {n for n in named_in_note() if not any((p / n).exists() for p in places)}
    assert not gone, f"docs/architecture.md names modules that do not exist: {sorted(gone)}"
