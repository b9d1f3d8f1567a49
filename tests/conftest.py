"""The fixtures every test may use, one plugin module per concern (``tests/fixtures/``).

Kits that tests import rather than request (a fault proxy, the belief witness, a
replicated pair, the CLI run in-process) live in ``tests/support/``.
"""

pytest_plugins = ["tests.fixtures.database", "tests.fixtures.keeper", "tests.fixtures.waiting"]
