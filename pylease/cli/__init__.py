"""The ``pylease`` command: the contract's section 3, on PostgreSQL or the embedded SQLite file.

Exit codes, for every command: 0 done; 1 busy, not held or lost; 2 usage; 3 database
or configuration error. ``pylease run`` passes its command's code through instead.
Errors are caught at the edge (:mod:`pylease.cli._edge`) and printed as one line
(``-v`` adds the details); what the output looks like is :mod:`pylease.cli._render`'s.
Each command's module registers it on :data:`app` when the command is first asked for
(:data:`pylease.cli._app.COMMANDS`): a command imports only what it uses.
"""

from pylease.cli._app import app, main

__all__ = ["app", "main"]
