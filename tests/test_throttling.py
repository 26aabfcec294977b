"""Issue 32, item 2: a graph step rides out seconds of throttling with the default policy.

The saver talks to moto through :class:`faults.FaultProxy`, which answers every
write (object PUTs and index writes) with S3's ``503 SlowDown`` or DynamoDB's
``ThrottlingException`` / ``ProvisionedThroughputExceededException`` for 3 s
from the first one, without forwarding it. Before, 4 attempts with backoffs of
at most 0.1 + 0.2 + 0.4 s gave up after under a second and the step raised
``StoreUnavailableError``. Now throttled calls are sent again until
``RetryPolicy.throttle_budget`` (10 s): the step returns, and its state reads back.
The schedule itself (give-up times, budget, deadline) is in tests/test_retry.py.
"""

from __future__ import annotations

import asyncio

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from conftest import make_saver
from fault_graph import build, plain, step_input
from faults import FaultProxy, Req, object_puts_and_commits
from s3_saver import RetryPolicy

THROTTLED_FOR = 3.0


def _dynamodb_writes(req: Req) -> bool:
    return req.service == "dynamodb" and req.is_write


# (index mode, what throttles, the proxy's fault kinds, which requests, driver)
CASES = [
    pytest.param("dynamodb", ("s3_503",), object_puts_and_commits, "sync", id="dynamodb-s3-slowdown-sync"),
    pytest.param(
        "dynamodb", ("ddb_throttle", "ddb_provisioned"), _dynamodb_writes, "sync", id="dynamodb-throttling-sync"
    ),
    pytest.param(
        "dynamodb", ("ddb_throttle", "ddb_provisioned"), _dynamodb_writes, "async", id="dynamodb-throttling-async"
    ),
    pytest.param("manifest", ("s3_503",), object_puts_and_commits, "sync", id="manifest-s3-slowdown-sync"),
    pytest.param("manifest", ("s3_503",), object_puts_and_commits, "async", id="manifest-s3-slowdown-async"),
]


def _reference() -> list[dict]:
    graph = build(InMemorySaver(), interrupts=False)
    cfg = {"configurable": {"thread_id": "ref"}}
    return [plain(graph.invoke(step_input(turn), cfg)) for turn in range(2)]


@pytest.mark.parametrize(("mode", "kinds", "which", "driver"), CASES)
def test_a_step_rides_out_seconds_of_throttling_on_every_write(endpoint, mode, kinds, which, driver) -> None:
    setup = make_saver(endpoint, mode)
    setup.setup()
    setup.close()
    cfg = {"configurable": {"thread_id": f"throttled-{mode}-{driver}"}}
    expected = _reference()
    with FaultProxy(endpoint) as proxy:
        saver = make_saver(proxy.url, mode)  # the default RetryPolicy and client timeouts
        graph = build(saver, interrupts=False)
        try:
            # A first step without faults: the thread exists, the process is warm.
            assert plain(graph.invoke(step_input(0), cfg)) == expected[0]
            proxy.reset_counts()
            saver.stats.reset()
            proxy.configure(seed=1, kinds=kinds, rate=1.0, operations=which, window=THROTTLED_FOR)
            if driver == "sync":
                result = graph.invoke(step_input(1), cfg)
            else:

                async def step() -> dict:
                    try:
                        return await graph.ainvoke(step_input(1), cfg)
                    finally:
                        await saver.aclose()

                result = asyncio.run(step())
            proxy.configure(enabled=False)
        finally:
            saver.close()
        assert plain(result) == expected[1]
        assert set(proxy.faults) <= set(kinds) and proxy.total_faults > 0
        # One call was refused more times than the old policy's 4 attempts allowed:
        # the first 5 backoffs of a call end within 1.5 s (+ round trips) of its
        # first attempt, inside the 3 s of throttling.
        assert max(proxy.per_request.values()) > RetryPolicy().attempts, proxy.per_request
        # Every refused call was sent again, and the stats tell those resends apart
        # (a timeout under load may add one the proxy did not cause).
        resent = saver.stats.resent
        assert sum(resent.values()) >= proxy.total_faults and saver.stats.resent_round_trips > 0
        assert set(saver.stats.first_sends().requests) <= set(saver.stats.requests)
        assert saver.stats.first_sends().round_trips == saver.stats.round_trips - saver.stats.resent_round_trips
    fresh = make_saver(endpoint, mode)
    try:
        state = build(fresh, interrupts=False).get_state(cfg)
        assert {k: v for k, v in state.values.items()} == {k: v for k, v in expected[1].items()}
    finally:
        fresh.close()
