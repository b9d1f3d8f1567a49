"""`make test`'s workers run each xdist_group in one worker (--dist loadgroup).

pytest-xdist sends a group to one worker by suffixing the node id of each of its tests
with the group's name; with a pytest whose node ids it cannot rename (9.2, under
pytest-xdist 3.8) the group is spread over every worker, and each worker builds the
group's cluster for itself: a run many minutes longer, and green. This test is in a
group of its own and fails such a run.
"""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("self-check")
def test_a_grouped_test_is_sent_as_its_group(request: pytest.FixtureRequest) -> None:
    grouped = bool(getattr(request.config.option, "loadgroup", False))
    assert request.node.nodeid.endswith("@self-check") == grouped, request.node.nodeid
