"""The fixtures every test may use, one plugin module per concern (``tests/fixtures/``).

Kits that tests import rather than request (a fault proxy, the belief witness, a
replicated pair, the CLI run in-process) live in ``tests/support/``.
"""

import os
import signal

import pytest

pytest_plugins = ["tests.fixtures.database", "tests.fixtures.keeper", "tests.fixtures.waiting"]

# The server is given as PYLEASE_TEST_DSN and kept under another name: the commands the
# tests start must see no PYLEASE_ variable of the suite's (the command line suggests
# PYLEASE_DSN for a misspelt one, and tests compare the variables their children get).
# Moved here, before xdist starts its workers, so that they inherit the moved one.
if "PYLEASE_TEST_DSN" in os.environ:
    os.environ["TESTS_SERVER_DSN"] = os.environ.pop("PYLEASE_TEST_DSN")

# tests/soak runs for minutes: `make soak` sets PYLEASE_SOAK_GRANTS, and only then is it
# collected (make test never reports it as skipped).
collect_ignore = [] if os.environ.get("PYLEASE_SOAK_GRANTS") else ["soak"]


def pytest_configure(config: pytest.Config) -> None:
    # Tests of Ctrl-C send SIGINT to this process or to the processes it starts. A run
    # started as a background job of a shell without job control (nohup cmd &, a CI
    # runner's) inherits SIGINT ignored and passes that on through exec: no
    # KeyboardInterrupt would come. Python's own handler, as in an interactive run.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
