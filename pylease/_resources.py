"""Where the SQL files and migrations are, in a wheel and in a source checkout alike."""

from __future__ import annotations

from pathlib import Path

from pylease.errors import ConfigurationError

_PACKAGE = Path(__file__).resolve().parent


def data_dir(*parts: str) -> Path:
    """The directory ``sql/...`` or ``migrations/...``.

    A wheel carries them inside the package; an editable install reads them from
    the top of the repository, where they are edited.
    """
    for base in (_PACKAGE, _PACKAGE.parent):
        candidate = base.joinpath(*parts)
        if candidate.is_dir():
            return candidate
    raise ConfigurationError(
        f"pylease: packaged data {'/'.join(parts)} is missing; reinstall pylease"
    )
