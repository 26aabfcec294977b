"""Small builders shared by the tests."""

from __future__ import annotations

import gc
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.base.id import uuid6

from s3_saver._transport.mode import MARKER_NAME


def checkpoint(values: dict[str, Any], versions: dict[str, Any], checkpoint_id: str | None = None) -> Checkpoint:
    return Checkpoint(
        v=1,
        id=checkpoint_id or str(uuid6(clock_seq=-1)),
        ts="2026-11-22T00:00:00+00:00",
        channel_values=values,
        channel_versions=versions,
        versions_seen={},
        pending_sends=[],
        updated_channels=None,
    )


def config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def is_marker(key: str) -> bool:
    """The prefix's index-mode marker (``<prefix>live/#index-mode``, one object per
    prefix, written by setup() or the first write): no thread's object."""
    return key.endswith("live/" + MARKER_NAME)


def grow_thread(saver: Any, thread_id: str, length: int, ns: str = "") -> dict[str, Any]:
    """Put ``length`` checkpoints: channel "counter" changes each step, "doc" never.

    Returns the config of the last checkpoint.
    """
    stored = config(thread_id, ns)
    version = None
    for step in range(length):
        version = saver.get_next_version(version, None)
        versions = {"counter": version, "doc": "1"}
        new = {"counter": version} if step else versions
        cp = checkpoint({"counter": step, "doc": "a document"}, versions)
        stored = saver.put(stored, cp, {"source": "loop", "step": step}, new)
    return stored


def concat(state: list, writes: list) -> list:
    """A DeltaChannel reducer: each write is a list appended to the state."""
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


def long_form() -> bool:
    """``make test-all`` (``TEST_ALL=1``) and ``make soak``: the long forms of the
    sampled tests (every cut, the whole SeaweedFS matrix); ``make test`` samples them."""
    return os.environ.get("TEST_ALL") == "1" or bool(os.environ.get("SOAK_MINUTES"))


# The calls that only read: a round trip made of them leaves the store as it was.
READS = frozenset(
    "get_object head_object list_objects_v2 head_bucket get_bucket_versioning"
    " get_bucket_lifecycle_configuration get_bucket_replication get_item batch_get_item"
    " query scan transact_get_items describe_table describe_time_to_live".split()
)


def store_changing_cuts(changes: list[bool]) -> list[int]:
    """The cuts of a call whose round trip k changed the store iff ``changes[k]``.

    Cut after k round trips, the store holds what rounds 0..k-1 wrote; when round
    k-1 only read, that is what the cut after k-1 left. A call again from a fresh
    process then meets the same store, so that cut tests nothing new: ``make test``
    skips it, ``make test-all`` cuts after every round trip all the same."""
    if long_form():
        return list(range(len(changes)))
    return [k for k in range(len(changes)) if k == 0 or changes[k - 1]]


def cut_points(total: int, most: int = 5) -> list[int]:
    """Where a test that cuts an operation short cuts it, of ``total`` round trips.

    ``make test-all``: after every round trip. ``make test``: at most ``most`` of
    them, spread evenly, always the first two and the last two (before anything is
    written, after the first write, before and after the commit point). The
    simulation (tests/test_simulation.py) cuts the operation generators at other
    calls on every run; these end-to-end cases through LangGraph sample, to keep
    ``make test`` short.
    """
    if total <= most or long_form():
        return list(range(total))
    edges = {0, 1, total - 2, total - 1}
    inner = most - len(edges)
    step = (total - 3) / (inner + 1)
    return sorted(edges | {1 + round(step * (k + 1)) for k in range(inner)})


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def no_unclosed_sessions(capfd: Any) -> Iterator[dict[str, str]]:
    """Fail if aiohttp reports a session or connector left open (warning, log or stderr).
    Yields a dict that holds, once the block is left, what it printed on stdout ("out")."""
    captured: dict[str, str] = {}
    handler = _Records()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield captured
            gc.collect()  # aiohttp reports from __del__
    finally:
        logger.removeHandler(handler)
    out, err = capfd.readouterr()
    captured["out"] = out
    reports = [str(w.message) for w in caught] + handler.messages + [err]
    leaks = [r for r in reports if "Unclosed" in r]
    assert not leaks, leaks
