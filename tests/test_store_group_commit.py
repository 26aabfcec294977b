"""Group commit in S3Store's bucket-alone (manifest) mode: one process's concurrent
puts into one namespace go out in shared head swaps, so the process never conflicts
with itself (no 412, no read back), from threads (the sync driver) and from asyncio
tasks (the async one), on a real bucket (moto).

Request counts, never times: before group commit, n concurrent puts cost O(n²)
requests (each lost swap read the head and swapped again) and a burst of hundreds ran
out of retries. The hand-offs themselves (a lead cut short, a failed swap) are driven
step by step in tests/test_group_commit.py; cuts between requests in
tests/test_store_simulation.py (``test_store_group_commit_cut_at_every_call``).
"""

from __future__ import annotations

import asyncio
import base64
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.store.base import PutOp
from test_store_s3 import keys, make_store

from s3_saver._store.store import S3Store

DRIVERS = ["sync", "async"]
N = 40


def _at_once(store: S3Store, driver: str, calls: list[Callable[[S3Store], Any]], acalls: list[Callable[[S3Store], Any]]) -> list[Any]:
    """Run the calls at once: threads released together (sync), or tasks of one event
    loop (async). Returns each call's answer (or the exception it raised)."""
    answers: list[Any] = [None] * len(calls)
    if driver == "sync":
        barrier = threading.Barrier(len(calls))

        def run(i: int) -> None:
            barrier.wait()
            try:
                answers[i] = calls[i](store)
            except Exception as exc:
                answers[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return answers

    async def main() -> list[Any]:
        try:
            return list(await asyncio.gather(*(c(store) for c in acalls), return_exceptions=True))
        finally:
            await store.aclose()

    return asyncio.run(main())


def _requests(store: S3Store) -> dict[str, int]:
    counted = store.stats.snapshot().requests
    return {op: n for (service, op), n in counted.items() if service == "s3"}


@pytest.mark.parametrize("driver", DRIVERS)
def test_concurrent_puts_into_one_namespace_share_head_swaps(endpoint: str, driver: str) -> None:
    """40 puts of distinct keys into one namespace at once, from a process that holds its
    head: a few swaps, no head read back (no swap was refused). Before: 319 requests
    from threads, 371 from tasks, two thirds of them PUTs, a third GETs after 412s. Each put answers for
    itself (None), and every item is there."""
    ns = ("team", "notes")
    with make_store(endpoint, "manifest") as store:
        store.setup()
        store.put(ns, "first", {"i": -1})  # the namespace exists, and this process holds its head
        store.stats.reset()
        calls = [lambda s, i=i: s.put(ns, f"k{i}", {"i": i}) for i in range(N)]
        acalls = [lambda s, i=i: s.aput(ns, f"k{i}", {"i": i}) for i in range(N)]
        answers = _at_once(store, driver, calls, acalls)
        assert answers == [None] * N
        requests = _requests(store)
        assert requests.get("get_object", 0) == 0, requests  # no swap refused, none read back
        assert requests["put_object"] <= N // 4, requests  # shared swaps (a swap carries up to 64)
    with make_store(endpoint, "manifest") as reader:
        found = {item.key: item.value for item in reader.search(ns, limit=100)}
    assert found == {"first": {"i": -1}, **{f"k{i}": {"i": i} for i in range(N)}}


@pytest.mark.parametrize("driver", DRIVERS)
def test_concurrent_first_puts_into_a_new_namespace_register_it_once(endpoint: str, driver: str) -> None:
    """40 first puts into a namespace no one wrote, at once, from a process that knows
    nothing of it: each reads the head (the process cannot know it), the namespace is
    registered in one registry swap and the items go in a few head swaps. Before: 526
    and 618 requests, the registry swapped about once per put."""
    ns = ("users", "u1", "memories")
    with make_store(endpoint, "manifest") as store:
        store.setup()
        store.stats.reset()
        calls = [lambda s, i=i: s.put(ns, f"k{i}", {"i": i}) for i in range(N)]
        acalls = [lambda s, i=i: s.aput(ns, f"k{i}", {"i": i}) for i in range(N)]
        assert _at_once(store, driver, calls, acalls) == [None] * N
        requests = _requests(store)
        # The head read by each put that found none cached; the registry and the two
        # ancestors' heads once.
        assert requests["get_object"] <= N + 3, requests
        # One registry swap, one per ancestor (("users",), ("users", "u1")), and the heads'.
        assert requests["put_object"] <= 3 + N // 4, requests
        assert store.list_namespaces() == [ns]
        assert len(store.search(ns, limit=100)) == N


@pytest.mark.parametrize("driver", DRIVERS)
def test_concurrent_large_puts_of_one_key_keep_one_value_object(endpoint: str, driver: str) -> None:
    """Twelve puts of one key with values over 64 KiB (each in an object of its own,
    written first) at once: they share swaps, the last in line wins, and the objects of
    the values put and replaced within one swap (named by no head) are deleted with the
    one the swap replaced: one object is left, the one the key names."""
    ns, count = ("docs",), 12
    noise = base64.b64encode(random.Random(7).randbytes(90_000)).decode()  # 120 KB, about 90 KB compressed
    big = lambda i: {"i": i, "text": noise}
    with make_store(endpoint, "manifest") as store:
        store.setup()
        store.put(ns, "doc", big(-1))
        store.stats.reset()
        calls = [lambda s, i=i: s.put(ns, "doc", big(i)) for i in range(count)]
        acalls = [lambda s, i=i: s.aput(ns, "doc", big(i)) for i in range(count)]
        assert _at_once(store, driver, calls, acalls) == [None] * count
        requests = _requests(store)
        heads = requests["put_object"] - count  # each value's object, then the head swaps
        assert heads < count // 2 and requests.get("get_object", 0) == 0, requests
    with make_store(endpoint, "manifest") as reader:
        value = reader.get(ns, "doc").value
    assert value in [big(i) for i in range(count)]
    assert len([k for k in keys(endpoint) if "/@v/" in k]) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_batches_of_two_namespaces_in_either_order_never_wait_on_each_other(endpoint: str, driver: str) -> None:
    """Batches putting into namespaces A and B at once, half of them A first and half B
    first: a batch leading A's swap while queued behind B's leads its swap on (its
    answer is not held back by the wait), so neither waits the other out and swaps alone
    (which would meet the lead's swap: a 412 and a read back)."""
    a, b = ("a",), ("b",)
    with make_store(endpoint, "manifest") as store:
        store.setup()
        store.batch([PutOp(a, "x", {"v": 0}), PutOp(b, "x", {"v": 0})])
        store.stats.reset()

        def ops(i: int) -> list[PutOp]:
            pair = [PutOp(a, f"k{i}", {"i": i}), PutOp(b, f"k{i}", {"i": i})]
            return pair if i % 2 else pair[::-1]

        calls = [lambda s, i=i: s.batch(ops(i)) for i in range(16)]
        acalls = [lambda s, i=i: s.abatch(ops(i)) for i in range(16)]
        assert _at_once(store, driver, calls, acalls) == [[None, None]] * 16
        requests = _requests(store)
        assert requests.get("get_object", 0) == 0, requests
        assert requests["put_object"] <= 16, requests
        assert len(store.search(a, limit=100)) == len(store.search(b, limit=100)) == 17


