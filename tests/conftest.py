"""The fixtures every test may use, one plugin module per concern (``tests/fixtures/``).

Kits that tests import rather than request (a fault proxy, the belief witness, a
replicated pair, the CLI run in-process) live in ``tests/support/``.
"""

import os

pytest_plugins = ["tests.fixtures.database", "tests.fixtures.keeper", "tests.fixtures.waiting"]

# tests/soak runs for minutes: `make soak` sets PYLEASE_SOAK_GRANTS, and only then is it
# collected (make test never reports it as skipped).
collect_ignore = [] if os.environ.get("PYLEASE_SOAK_GRANTS") else ["soak"]
