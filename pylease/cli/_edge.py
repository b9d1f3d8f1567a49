"""The error edge of every command: one line per error, and the exit code that says what kind.

Exit codes, for every command: 0 done; 1 busy, not held or lost; 2 usage; 3 database
or configuration error. ``pylease run`` passes its command's code through instead.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from pylease import _checks
from pylease.cli import _render
from pylease.errors import (
    InvalidArgument,
    PyleaseError,
)

if TYPE_CHECKING:
    from pylease.cli._database import Store


EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3

_verbose = False


def set_verbose(value: bool) -> None:
    """``-v`` given before the command (``pylease -v status``)."""
    global _verbose
    _verbose = value


def is_verbose() -> bool:
    """Whether ``-v`` was given, before or after the command."""
    return _verbose


say = _render.say


def fail(message: str, code: int = EXIT_CONFIG) -> typer.Exit:
    say(message)
    return typer.Exit(code)


def first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


@dataclass
class Edge:
    """What the edge knows about the command, to explain a failure well."""

    store: Store | None = None


@contextlib.contextmanager
def at_edge(verbose: bool) -> Iterator[Edge]:
    """One line per error, no traceback unless -v; the exit code says what kind."""
    global _verbose
    _verbose = _verbose or verbose
    edge = Edge()
    try:
        yield edge
    except (typer.Exit, typer.Abort, typer.BadParameter):
        raise
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None
    except Exception as exc:
        if _verbose:
            traceback.print_exception(exc, file=sys.stderr)
        if isinstance(exc, InvalidArgument):
            raise fail(str(exc), EXIT_USAGE) from None
        if isinstance(exc, PyleaseError):
            explained = edge.store.explain(exc) if edge.store is not None else None
            raise fail(explained or str(exc), EXIT_CONFIG) from None
        if isinstance(exc, sqlite3.Error):
            raise fail(f"SQLite error: {first_line(exc)}", EXIT_CONFIG) from None
        if isinstance(exc, OSError):
            raise fail(first_line(exc), EXIT_CONFIG) from None
        raise fail(
            f"unexpected {type(exc).__name__}: {first_line(exc)} (rerun with -v for details)",
            EXIT_CONFIG,
        ) from None


def key(parameter: str, value: str) -> str:
    try:
        return _checks.key(parameter, value)
    except InvalidArgument as exc:
        raise fail(str(exc), EXIT_USAGE) from None
