"""Every cache of a saver is bounded in bytes by one budget (issue 35, item 3).

The outside review's scenario: 24 threads with ~50 KB states, 40 checkpoints
each, then the latest state and the history of each. The caches stay within
the budget (64 MiB by default, 2 MiB here to see eviction work), and what was
evicted changes no answer: the reads match those of a saver that never evicted.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from conftest import _ready, make_saver
from helpers import checkpoint, config
from s3_saver import S3Saver
from s3_saver._format.archive import decode_archive
from s3_saver._transport.budget import DEFAULT_BYTES, MIB, default_bytes
from s3_saver.errors import ConfigurationError

THREADS, STEPS = 24, 40
_WORDS = "the agent asked tool for a reply and read state of message with token from user".split()


def _text(size: int, seed: str) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(size // 4))[:size]


def _grow(saver: Any, thread_id: str) -> None:
    """``STEPS`` checkpoints of a ~50 KB state: a document rewritten at every
    step (stored inside the checkpoint object) and a list that grows."""
    stored, doc, messages, messages_list = config(thread_id), None, None, []
    for step in range(STEPS):
        doc = saver.get_next_version(doc, None)
        messages = saver.get_next_version(messages, None)
        messages_list = [*messages_list, _text(400, f"{thread_id}/m{step}")]
        values = {"doc": _text(50_000, f"{thread_id}/{step}"), "messages": messages_list}
        versions = {"doc": doc, "messages": messages}
        stored = saver.put(stored, checkpoint(values, versions), {"step": step}, versions)


def _reads(saver: Any, thread_id: str) -> tuple[Any, ...]:
    """What a reader sees of a thread: its latest state and its whole history."""
    latest = saver.get_tuple(config(thread_id))
    history = [(t.checkpoint["id"], t.metadata["step"], t.checkpoint["channel_values"]) for t in saver.list(config(thread_id))]
    return latest.checkpoint["channel_values"], latest.metadata["step"], history


def _resident(saver: S3Saver) -> int:
    """The bytes the caches hold, counted from what they keep (not from the
    saver's own estimate): bodies, pinned bodies, list values, decoded archives."""
    total = 0
    for cache in saver._base_ctx.budget._store.caches.values():
        for value, _ in cache.data.values():
            if cache.kind.endswith("heads"):
                parts = [*value.entries, *value.writes]
                total += sum(len(e.body or b"") for e in parts) + sum(map(len, value.pinned.values()))
            elif cache.kind.endswith("segments"):
                total += sum(len(e.body or b"") for part in value for e in part)
            elif cache.kind.endswith("bodies"):
                total += len(value)
            elif cache.kind.endswith("lists"):
                total += len(value.data)
    return total


def _within(saver: S3Saver, budget: int) -> Any:
    stats = saver.cache_stats()
    assert stats.budget == budget
    assert _resident(saver) <= stats.used <= budget
    assert stats.used == sum(c.bytes for c in stats.caches.values())
    return stats


def test_the_reviews_scenario_stays_within_the_budget_and_reads_the_same(endpoint: str, index_mode: str) -> None:
    small = _ready(make_saver(endpoint, index_mode, cache_bytes=2 * MIB))
    threads = [f"review-{i}" for i in range(THREADS)]
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda t: _grow(small, t), threads))
    stats = _within(small, 2 * MIB)
    assert sum(c.evictions for c in stats.caches.values()) > 0  # it had to evict
    # A saver with the default budget reads every thread once: it keeps all it read.
    fresh = make_saver(endpoint, index_mode)
    expected = {t: _reads(fresh, t) for t in threads}
    _within(fresh, DEFAULT_BYTES)
    # The small one answers the same, read twice: after its own writes, and
    # after its reads evicted one another.
    for _ in range(2):
        assert {t: _reads(small, t) for t in threads} == expected
        _within(small, 2 * MIB)
    # Writing on after eviction (parents, heads and list bases read again) stays right.
    for t in threads[:4]:
        latest = small.get_tuple(config(t))
        versions = dict(latest.checkpoint["channel_versions"])
        versions["doc"] = small.get_next_version(versions["doc"], None)
        values = {**latest.checkpoint["channel_values"], "doc": "after eviction"}
        small.put(latest.config, checkpoint(values, versions), {"step": STEPS}, {"doc": versions["doc"]})
        again = make_saver(endpoint, index_mode).get_tuple(config(t))
        assert again.checkpoint["channel_values"] == values
        assert again.metadata["step"] == STEPS
    _within(small, 2 * MIB)
    small.close()
    fresh.close()


def test_a_manifest_history_of_sealed_segments_reads_whole_under_a_small_budget(endpoint: str) -> None:
    """Segments loaded in one wave that together exceed the budget: the
    answer is what was loaded, whatever the cache kept of it."""
    writer = _ready(make_saver(endpoint, "manifest"))
    _grow_long(writer, "long", 150)
    expected = [t.checkpoint["id"] for t in writer.list(config("long"))]
    reader = make_saver(endpoint, "manifest", cache_bytes=1 * MIB)
    assert [t.checkpoint["id"] for t in reader.list(config("long"))] == expected
    assert len(expected) == 150
    # Every segment in one wave (an export reads the whole thread): more than the budget holds.
    assert len(decode_archive(reader.export_thread("long"), "export").entries) == 150
    _within(reader, 1 * MIB)
    writer.close()
    reader.close()


def _grow_long(saver: Any, thread_id: str, length: int) -> None:
    """``length`` checkpoints of ~20 KB bodies (a segment of 64 holds ~1.2 MB)."""
    stored, version = config(thread_id), None
    for step in range(length):
        version = saver.get_next_version(version, None)
        values = {"doc": random.Random(step).randbytes(20_000).hex()[:20_000]}
        stored = saver.put(stored, checkpoint(values, {"doc": version}), {"step": step}, {"doc": version})


def test_the_default_budget_is_64_mib_and_an_eighth_of_a_small_lambda() -> None:
    assert default_bytes({}) == DEFAULT_BYTES == 64 * MIB
    assert default_bytes({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128"}) == 16 * MIB
    assert default_bytes({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024"}) == 64 * MIB
    assert default_bytes({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "10240"}) == 64 * MIB
    assert default_bytes({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "lots"}) == 64 * MIB
    saver = S3Saver("checkpoints", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
    assert saver.cache_stats().budget <= 64 * MIB


def test_a_lambda_functions_memory_sets_the_default(monkeypatch) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
    saver = S3Saver("checkpoints", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
    assert saver.cache_stats().budget == 32 * MIB
    given = S3Saver("checkpoints", endpoint_url="http://127.0.0.1:9", region_name="us-east-1", cache_bytes=3 * MIB)
    assert given.cache_stats().budget == 3 * MIB


@pytest.mark.parametrize("value", [0, 1000, MIB - 1, -1, True, 2.5e6, "64MiB"])
def test_a_wrong_cache_budget_is_refused_by_name(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^cache_bytes must be an int of at least 1048576"):
        S3Saver("checkpoints", cache_bytes=value)


def test_a_replicas_caches_share_the_one_budget() -> None:
    from s3_saver import Replica

    saver = S3Saver("checkpoints", endpoint_url="http://127.0.0.1:9", cache_bytes=4 * MIB, replica=Replica("copy"))
    primary, replica = saver._ctx.budget, saver._other_ctx.budget
    primary.cache("heads").put("t", "primary's", MIB)
    replica.cache("heads").put("t", "replica's", MIB)
    assert primary.cache("heads").get("t") == "primary's"  # apart: the same thread id in two regions
    assert replica.cache("heads").get("t") == "replica's"
    assert saver.cache_stats().used == 2 * MIB
    replica.cache("segments").put("s", "big", 3 * MIB)  # over the budget: the least recently used go
    assert primary.cache("heads").get("t") is None
    assert saver.cache_stats().used <= 4 * MIB
