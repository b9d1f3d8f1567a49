"""``manage.py pylease status|history ...``: the ``pylease`` command on Django's database."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

SUBCOMMANDS = ("status", "history")


class Command(BaseCommand):  # type: ignore[misc]  # Django has no types
    help = (
        "Run `pylease status` or `pylease history` on the database pylease lives in "
        "(settings.PYLEASE_DATABASE, default 'default'). Options as for the pylease command."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("subcommand", choices=SUBCOMMANDS)
        parser.add_argument("options", nargs=argparse.REMAINDER)

    def handle(self, *args: Any, **options: Any) -> None:
        import typer.main

        from pylease import cli
        from pylease.contrib.django import conninfo

        argv = [options["subcommand"], "--dsn", conninfo(), *options["options"]]
        command = typer.main.get_command(cli.app)
        captured = self.stdout._out is not sys.stdout  # call_command(stdout=...)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.ExitStack() as stack:
            if captured:
                stack.enter_context(contextlib.redirect_stdout(out))
                stack.enter_context(contextlib.redirect_stderr(err))
            # Standalone, as from a shell: usage errors print and exit with the CLI's codes.
            try:
                command.main(args=argv, prog_name="manage.py pylease")
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
        if captured:
            self.stdout.write(out.getvalue(), ending="")
            self.stderr.write(err.getvalue(), ending="")
        if code:
            raise CommandError(f"pylease {options['subcommand']} exited {code}", returncode=code)
