"""The ``pylease`` app: help and usage errors that read as the README promises, and ``main``."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup
from typer.main import get_command_from_info, get_command_name

from pylease import __version__
from pylease import dsn as dsn_mod
from pylease.cli import _render
from pylease.cli._edge import is_verbose, set_verbose
from pylease.cli._options import VerboseOption

EXAMPLES = f"""\
\b
Examples:
  pylease migrate --dsn postgresql://app@db/app     # at deploy
  pylease run report --ttl 10m --busy-exit 0 -- ./report.sh   # in cron
  pylease claim sweep --ttl 5m --wait 30s           # prints HOLDER<tab>FENCE
  pylease renew sweep --holder "$holder" --ttl 5m
  pylease release sweep --holder "$holder"
  pylease status                                    # who holds what
  pylease steal sweep --ttl 5m --holder ops --older-than 10m   # break a lock

\b
The database is --dsn, else $PYLEASE_DSN, else $DATABASE_URL, else this user's
SQLite file in $XDG_STATE_HOME/pylease (~/.local/state/pylease), created on first
use. PGHOST and the other libpq variables only fill in a postgresql:// URL:
PYLEASE_DSN=postgresql:// uses them. One file for the host:
PYLEASE_DSN={dsn_mod.HOST_WIDE}
-v says which database a command used, and why.
Durations: 250ms, 30s, 5m, 1h30m, or plain seconds; --wait also takes forever.
Exit codes: 0 done; 1 busy, not held or lost; 2 usage; 3 database or
configuration error. `pylease run CMD` exits with CMD's code.
"""

# Help and usage that read as the README promises ----------------------------------


#: The commands in --help, in the order a newcomer needs them: the module that defines
#: each, imported only when it runs (a shell loop of ``pylease run`` loads no other
#: command's), and its summary in --help, the first paragraph of its docstring (a test
#: in tests/cli holds them equal), so that --help imports no command's module.
COMMANDS = {
    "run": (
        "_run",
        "Run CMD while holding the lease NAME, renewing it; skip CMD when the lease is busy.",
    ),
    "migrate": (
        "_commands",
        "Install or upgrade the pylease schema (idempotent; safe to run from two deploys at once).",
    ),
    "claim": (
        "_commands",
        "Claim a lease and print HOLDER<tab>FENCE; exit 1 if another holder has it.",
    ),
    "renew": (
        "_commands",
        "Extend a lease this holder still holds; exit 1 if it was released or taken.",
    ),
    "release": (
        "_commands",
        "Give a lease back (only this holder's); exit 1 if it was not held by this holder.",
    ),
    "steal": (
        "_commands",
        "Take a lease whatever its state (an operator's break-lock) and print HOLDER<tab>FENCE.",
    ),
    "status": (
        "_views",
        "Show every lease (or one): state, holder, fence, how long, and when it expires.",
    ),
    "holders": (
        "_views",
        "Show every current holder of every kind: a lease's writer (exclusive), its readers"
        " (shared; FENCE is a reader's epoch), a semaphore's permits (with SLOT).",
    ),
    "permits": (
        "_permits",
        "Show the slots of the semaphore NAME: who holds each permit, its fence, until when.",
    ),
    "members": (
        "_groups",
        "Show the live members of GROUP: incarnation, data, how long since they joined, when"
        " they expire, and how many of the group's partitions each owns (the leases GROUP#N"
        " it holds).",
    ),
    "history": (
        "_views",
        "Show what happened to leases, newest first: takeovers and steals (and, with"
        " pylease.history = 'all', claims and releases).",
    ),
    "prune": ("_views", "Delete the names nobody has held for a while and print how many."),
    "prune-history": (
        "_views",
        "Delete old history events and print how many; the counters are never pruned.",
    ),
    "metrics": (
        "_views",
        "Leases as Prometheus metrics: held, seconds to expiry, fence, held for, and the"
        " grants, takeovers, steals and releases counters, each labelled with the lease name;"
        " for a semaphore, the permits in use and its limit, and the same counters; for a"
        " group, its live members and the partitions each member owns.",
    ),
    "leader": (
        "_leader",
        "Wait until this process leads NAME, run CMD while leading, resign when CMD exits.",
    ),
    "request-release": (
        "_commands",
        "Ask the holder of a lease to step down; exit 1 if the lease is not held.",
    ),
}


# Click's UsageError, whether typer vendors click or depends on it.
_UsageError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)


def _usage_error_in_one_line(error: Any, ctx: Any) -> None:
    """Click prints usage, a hint and the error on four lines; a script wants one."""
    if type(error).__name__ == "NoArgsIsHelpError":
        return
    where = ctx.command_path if ctx is not None else "pylease"
    message = error.format_message().rstrip(".")

    def show(file: Any = None) -> None:
        typer.echo(f"pylease: {message} (see '{where} --help')", err=True)

    error.show = show


def _no_type(ctx: Any) -> str | None:
    return None


def _pieces(shown: str) -> Callable[[Any], list[str]]:
    return lambda ctx: [shown]


_TRUE = frozenset(("1", "true", "t", "yes", "y", "on"))
_FALSE = frozenset(("", "0", "false", "f", "no", "n", "off"))


class _Plain:
    """Typer's coercion of the few types these commands take (str, int, bool, a parser's
    value, lists of them), without its pydantic layer: importing pydantic alone costs a
    command more than all the rest of its start-up. Typer asks for it through
    ``param._runtime_param``; another type keeps typer's own."""

    TYPES = (str, int, bool)

    def __init__(self, annotation: Any, info: Any) -> None:
        self._one = annotation
        self._parser: Callable[[Any], Any] | None = info.parser
        self._min, self._max = info.min, info.max

    @classmethod
    def of(cls, param: Any) -> _Plain | None:
        descriptor: Any = getattr(param, "type_descriptor", None)
        info = getattr(descriptor, "parameter_info", None)
        if info is None or descriptor.file_annotation is not None or info.clamp:
            return None
        annotation = descriptor.annotation
        if getattr(annotation, "__origin__", None) is list:
            annotation = annotation.__args__[0]
        if info.parser is None and annotation not in cls.TYPES:
            return None
        return cls(annotation, info)

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        if param.multiple or param.nargs == -1:
            if isinstance(value, str):
                raise typer.BadParameter("Value must be an iterable.", ctx=ctx, param=param)
            return [self._convert(item, param, ctx) for item in value]
        return self._convert(value, param, ctx)

    def _convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if self._parser is not None:
            return self._parser(value)
        if self._one is bool:
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word not in _TRUE | _FALSE:
                raise typer.BadParameter(f"{value!r} is not a boolean (1 or 0)", ctx, param)
            return word in _TRUE
        if self._one is int:
            try:
                number = int(value)
            except (TypeError, ValueError):
                raise typer.BadParameter(f"{value!r} is not an integer", ctx, param) from None
            if self._min is not None and number < self._min:
                raise typer.BadParameter(f"must be at least {self._min}", ctx, param)
            if self._max is not None and number > self._max:
                raise typer.BadParameter(f"must be at most {self._max}", ctx, param)
            return number
        return str(value)


def _coerce_plainly(params: list[Any]) -> None:
    for param in params:
        if getattr(param, "_runtime_param", False) is None:
            param._runtime_param = _Plain.of(param)


class _Command(TyperCommand):
    """Help without Python types (``NAME <str>``) and a usage line a user would write."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument):
                shown = param.metavar or param.name or ""
                param.display_type_rich = _no_type  # type: ignore[method-assign]
                param.get_usage_pieces = _pieces(shown)  # type: ignore[method-assign,assignment]

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _UsageError as error:
            _usage_error_in_one_line(error, getattr(error, "ctx", None))
            raise

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _coerce_plainly(self.get_params(ctx))
        return super().parse_args(ctx, args)


#: Where :class:`_NamesThenCommand` leaves the command after ``--``.
CMD = "pylease.cmd"
CMD_USAGE = "-- CMD [ARG...]"


class _NamesThenCommand(_Command):
    """``NAME [NAME...] -- CMD [ARG...]``: the names before ``--``, the command after it.

    Only ``--`` tells names from the command (``run a b c`` could be the names a, b and
    c, or a running ``b c``), so it is required; the command is in ``ctx.meta[CMD]``.
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        cmd: list[str] = []
        dashes = "--" in args
        if dashes:
            at = args.index("--")
            args, cmd = args[:at], args[at + 1 :]
        several = any(p.name == "names" for p in self.params)
        usage = f"{ctx.command_path} NAME{' [NAME...]' if several else ''} [OPTIONS] {CMD_USAGE}"
        where = f"the command goes after --, the name{'s' if several else ''} before it ({usage})"
        try:
            rest: list[str] = super().parse_args(ctx, args)  # --help, a missing NAME: here
        except _UsageError as error:
            missing = getattr(getattr(error, "param", None), "name", None)
            if dashes and missing in ("name", "names"):
                # `run --ttl 1m -- echo hi` must not claim `echo` and run `hi`.
                raise _UsageError(f"NAME goes before '--': {usage}", ctx) from None
            if dashes or type(error).__name__ not in ("NoSuchOption", "UsageError"):
                raise
            # Without --, an option of the command reads as one of ours (`ls -l`), and
            # its words as more arguments than ours.
            said = str(error.format_message())  # type: ignore[attr-defined]
            raise _UsageError(f"{said}; {where}", ctx) from None
        if not cmd and not ctx.resilient_parsing:  # (shell completion parses resiliently)
            raise _UsageError(f"Missing argument '{CMD_USAGE}': {where}", ctx)
        ctx.meta[CMD] = cmd
        return rest

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), CMD_USAGE]


class _Group(TyperGroup):
    """Commands in the order a newcomer needs them, each imported when it is asked for;
    one-line usage errors."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *(c for c in self.commands if c not in COMMANDS)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = self.commands.get(cmd_name)
        if found is None and cmd_name in COMMANDS:
            found = self.commands[cmd_name] = _load(cmd_name)
        return found

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # From the table, shortened as click shortens a command's help: no import.
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, TyperCommand(name, help=summary).get_short_help_str(limit))
            for name, (_module, summary) in COMMANDS.items()
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _UsageError as error:
            _usage_error_in_one_line(error, getattr(error, "ctx", None))
            raise

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _coerce_plainly(self.get_params(ctx))
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except _UsageError as error:
            # Typer suggests among the commands loaded; these are all of them.
            import difflib

            matches = difflib.get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches:
                said = error.message.rstrip(".")  # type: ignore[attr-defined]
                error.message = f"{said}. Did you mean {', '.join(map(repr, matches))}?"  # type: ignore[attr-defined]
            _usage_error_in_one_line(error, ctx)
            raise


def _load(name: str) -> Any:
    """The click command ``name``, made from what its module registered on :data:`app`."""
    importlib.import_module(f"pylease.cli.{COMMANDS[name][0]}")
    info = next(
        i
        for i in app.registered_commands
        if (i.name or get_command_name(getattr(i.callback, "__name__", ""))) == name
    )
    return get_command_from_info(
        info,
        pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode,
    )


app = typer.Typer(
    name="pylease",
    cls=_Group,
    help="Leases (locks with an expiry) arbitrated by PostgreSQL, or a local SQLite file.",
    epilog=EXAMPLES,
    no_args_is_help=True,
    suggest_commands=False,  # _Group.resolve_command suggests
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def command(
    *, names_then_command: bool = False, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command of the app; with ``names_then_command``, one that takes
    ``NAME [NAME...] -- CMD [ARG...]`` (the command: :func:`command_of`)."""
    return app.command(cls=_NamesThenCommand if names_then_command else _Command, **kwargs)


def command_of(ctx: typer.Context) -> list[str]:
    """The command after ``--`` of a ``names_then_command`` command."""
    cmd: list[str] = ctx.meta[CMD]
    return cmd


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pylease {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
    verbose: VerboseOption = False,
) -> None:
    """Leases (locks with an expiry) arbitrated by PostgreSQL, or a local SQLite file."""
    set_verbose(verbose)


# The library's log as stderr lines; attached by main(), not at import.
stderr_log = _render.StderrLog(is_verbose)


def main() -> None:
    """Entry point of the ``pylease`` script (also ``python -m pylease``)."""
    # Here rather than in the app, so that an application embedding it keeps its logging.
    library = logging.getLogger("pylease")
    library.addHandler(stderr_log)
    library.setLevel(logging.DEBUG)
    app()
