"""The ``pylease`` command: the contract's section 3, on PostgreSQL or the embedded SQLite file.

Exit codes, for every command: 0 done; 1 busy, not held or lost; 2 usage; 3 database
or configuration error. ``pylease run`` passes its command's code through instead.
Errors are caught at the edge (:mod:`pylease.cli._edge`) and printed as one line
(``-v`` adds the details); what the output looks like is :mod:`pylease.cli._render`'s.
The commands register on :data:`app` in the order a newcomer needs them.
"""

from pylease.cli import _commands, _groups, _leader, _permits, _run, _views
from pylease.cli._app import app, main

__all__ = ["app", "main"]

# Imported for the commands they register on ``app``, in this order in --help.
_COMMANDS = (_run, _commands, _views, _permits, _groups, _leader)
