"""The graph scenarios of test_graphs.py on SeaweedFS, a real S3-compatible server.

A manifest-mode saver (no DynamoDB there) in a fresh bucket per test must give the same
transcript as InMemorySaver, on ``invoke`` and ``ainvoke``, with durability "sync",
"async" and "exit": the matrix of test_graphs.py (the ``MODES`` it runs on moto in both
index modes). ``make test`` runs each scenario in two of the six (every one of the six
in some scenario); ``make test-all`` the whole matrix. See tests/SEAWEEDFS.md for the server.
"""

from __future__ import annotations

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from conftest import seaweedfs_saver
from helpers import long_form
from test_graphs import MODES, Runner, Scenario, execute, fork, history, interrupt_resume, reducers, subgraph

SCENARIOS = [reducers, interrupt_resume, subgraph, fork, history]
# SeaweedFS is slower than moto: a Latin-square sample (scenario k with modes 2k and
# 2k+1, mod 6: each of the six modes runs in one scenario or more) but in test-all.
CASES = [
    pytest.param(scenario, *mode.values, id=f"{scenario.__name__}-{mode.id}")
    for k, scenario in enumerate(SCENARIOS)
    for j, mode in enumerate(MODES)
    if long_form() or j in (2 * k % 6, (2 * k + 1) % 6)
]


@pytest.mark.parametrize("scenario,mode,durability", CASES)
def test_graph_matches_in_memory_on_seaweedfs(
    seaweedfs_bucket: tuple[str, str], scenario: Scenario, mode: str, durability: str
) -> None:
    endpoint, bucket = seaweedfs_bucket
    expected = execute(Runner(InMemorySaver(), mode, durability), scenario)
    saver = seaweedfs_saver(endpoint, bucket)
    try:
        saver.setup()
        got = execute(Runner(saver, mode, durability), scenario)
    finally:
        saver.close()
    assert got == expected
