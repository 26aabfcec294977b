"""The graph scenarios of test_graphs.py on SeaweedFS, a real S3-compatible server.

A manifest-mode saver (no DynamoDB there) in a fresh bucket per test must give the same
transcript as InMemorySaver, on ``invoke`` and ``ainvoke``, with durability "sync",
"async" and "exit": the matrix of test_graphs.py (the ``MODES`` it runs on moto in both
index modes). See tests/SEAWEEDFS.md for the server.
"""

from __future__ import annotations

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from conftest import seaweedfs_saver
from test_graphs import MODES, Runner, Scenario, execute, fork, history, interrupt_resume, reducers, subgraph


@pytest.mark.parametrize("mode,durability", MODES)
@pytest.mark.parametrize("scenario", [reducers, interrupt_resume, subgraph, fork, history], ids=lambda f: f.__name__)
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
