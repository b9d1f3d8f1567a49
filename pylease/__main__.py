"""``python -m pylease``: the ``pylease`` command."""

from pylease.cli import main

main()
