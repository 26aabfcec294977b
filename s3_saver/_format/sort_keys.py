"""The DynamoDB index's keys: the partitions of a prefix (a thread's, the thread listing's,
the run hints', the activity entries': ``PartitionKeys``), how items sort within them (see the
order in ``keys``), the listing shards, and parsing a sort key back. ``keys`` re-exports the
functions; ``KeyLayout`` mixes ``PartitionKeys`` in.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

from s3_saver._format.key_codec import (
    _NS_TOMBSTONE_MARK,
    _SORT_SEP,
    ACTIVITY_SHARDS,
    CHECKPOINT_SUFFIX,
    DYNAMODB_PARTITION_KEY_MAX_BYTES,
    LINK_MARK,
    THREAD_TOMBSTONE_SK,
    WRITES_MARK,
    _checked_index,
    _checked_sort,
    decode,
    encode,
    sort_decode,
    sort_encode,
)

# Seconds are stored as (this - created), 12 digits, so newer sorts first.
_LISTING_CLOCK = 10**12 - 1

LISTING_SHARDS = 16
"""Partitions the DynamoDB thread listing and run hints are spread over: one
partition takes about 1,000 writes a second, so a single listing partition
would cap how fast a whole app starts threads. Changing it moves every item
(``setup()`` moves only the unsharded partition's): keep it fixed per table."""


def shard_of(name: str) -> int:
    """The listing shard of a thread id (or the hint shard of a run id): a
    stable hash (the same in every process and version, unlike ``hash``)."""
    digest = hashlib.blake2b(encode(name).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % LISTING_SHARDS


# -- DynamoDB sort keys ------------------------------------------------------


def listing_sort_key(created: int, thread_id: str) -> str:
    """Sort key of a thread in the listing partition: newest first, then by thread
    id, read in ascending order, as the manifest's listing keys are."""
    return _checked_sort(f"{_LISTING_CLOCK - created:012d}{_SORT_SEP}{encode(thread_id)}")


def parse_listing_sort_key(sk: str) -> tuple[int, str]:
    inverted, _, encoded = sk.partition(_SORT_SEP)
    return _LISTING_CLOCK - int(inverted), decode(encoded)


def activity_shard(thread_id: str) -> int:
    """The shard of a thread's activity entries: a stable hash (never Python's ``hash``,
    which differs per process)."""
    return zlib.crc32(thread_id.encode("utf-8", "surrogatepass")) % ACTIVITY_SHARDS


def activity_sort_key(day: int, thread_id: str) -> str:
    """Sort key of an activity entry in its shard: by day (oldest first), then thread."""
    return _checked_sort(f"{day:08d}{_SORT_SEP}{encode(thread_id)}")


def parse_activity_sort_key(sk: str) -> tuple[int, str]:
    day, _, encoded = sk.partition(_SORT_SEP)
    return int(day), decode(encoded)


def run_sort_prefix(run_id: str) -> str:
    return encode(run_id) + _SORT_SEP


def run_sort_key(run_id: str, thread_id: str) -> str:
    return _checked_sort(run_sort_prefix(run_id) + encode(thread_id))


def ns_sort_prefix(ns: str) -> str:
    return sort_encode(ns) + _SORT_SEP


def checkpoint_sort_prefix(ns: str, checkpoint_id: str) -> str:
    return ns_sort_prefix(ns) + sort_encode(checkpoint_id) + _SORT_SEP


def checkpoint_sort_key(ns: str, checkpoint_id: str) -> str:
    # "~" sorts after "w", so newest-first reads meet a checkpoint item before
    # its own writes, and its writes before the next older checkpoint.
    return _checked_sort(checkpoint_sort_prefix(ns, checkpoint_id) + CHECKPOINT_SUFFIX)


def writes_sort_prefix(ns: str, checkpoint_id: str) -> str:
    return checkpoint_sort_prefix(ns, checkpoint_id) + WRITES_MARK + _SORT_SEP


def writes_sort_key(ns: str, checkpoint_id: str, task_id: str, part: str) -> str:
    return _checked_sort(f"{writes_sort_prefix(ns, checkpoint_id)}{sort_encode(task_id)}{_SORT_SEP}{part}")


def ns_tombstone_sort_key(ns: str) -> str:
    return _checked_sort(ns_sort_prefix(ns) + _NS_TOMBSTONE_MARK)


@dataclass(frozen=True, slots=True)
class SortKey:
    """The parts of an index sort key.

    ``kind`` is "checkpoint", "writes" (with ``task_id`` and ``part``),
    "ns_tombstone" (only ``ns``) or "thread_tombstone" (nothing else).
    """

    kind: str
    ns: str = ""
    checkpoint_id: str = ""
    task_id: str = ""
    part: str = ""


def link_sort_key(ns: str, checkpoint_id: str) -> str:
    """A checkpoint's link item: its parent and loc without its body, in a range of
    their own (a space sorts below every namespace) that the ancestor walk reads."""
    return _checked_sort(LINK_MARK + checkpoint_sort_prefix(ns, checkpoint_id))


def link_ns_prefix(ns: str) -> str:
    return LINK_MARK + ns_sort_prefix(ns)


def parse_sort_key(sk: str) -> SortKey:
    if sk == THREAD_TOMBSTONE_SK:
        return SortKey("thread_tombstone")
    if sk.startswith(LINK_MARK):
        ns, checkpoint_id, _ = sk[len(LINK_MARK) :].split(_SORT_SEP)
        return SortKey("link", sort_decode(ns), sort_decode(checkpoint_id))
    parts = sk.split(_SORT_SEP)
    ns = sort_decode(parts[0])
    if parts[1] == _NS_TOMBSTONE_MARK:
        return SortKey("ns_tombstone", ns)
    checkpoint_id = sort_decode(parts[1])
    if parts[2] == CHECKPOINT_SUFFIX:
        return SortKey("checkpoint", ns, checkpoint_id)
    return SortKey("writes", ns, checkpoint_id, sort_decode(parts[3]), parts[4])


class PartitionKeys:
    """The index partitions of a ``KeyLayout``'s prefix (it mixes this in): a thread's, the
    thread listing's, the run hints' and the activity entries'."""

    prefix: str

    def activity_partition(self, shard: int | None) -> str:
        """The DynamoDB partition of one shard of the activity entries (None: the
        one of the cursors). ``encode`` never produces "#": no thread's partition."""
        base = f"{encode(self.prefix) if self.prefix else ''}#active"
        return base if shard is None else f"{base}#{shard}"

    def listing_partition(self, what: str, shard: int | None = None) -> str:
        """A partition of the thread listing ("threads") or of the run hints
        ("runs"): ``<prefix>#<what>#<shard>``, or with no shard the single
        partition earlier versions wrote (still read, until ``setup()`` moves
        its items; see ``shard_of``). ``encode`` never produces "#", so no
        thread's partition is one, and the prefix ends at the first "#"."""
        base = f"{encode(self.prefix) if self.prefix else ''}#{what}"
        return base if shard is None else f"{base}#{shard}"

    def partition_key(self, thread_id: str) -> str:
        """The index partition of a thread under this prefix.

        Whatever the prefix separates in the bucket is separate in the index:
        with a prefix the key is ``<encoded prefix>/<encoded thread>``. ``encode``
        never produces "/", so the key is injective, and the bare encoded thread
        of the empty prefix can never equal a prefixed one.
        """
        pk = f"{encode(self.prefix)}/{encode(thread_id)}" if self.prefix else encode(thread_id)
        return _checked_index(pk, DYNAMODB_PARTITION_KEY_MAX_BYTES, "partition key")

    def thread_of(self, pk: str) -> str | None:
        """The thread id of a partition key, or None when it belongs to another prefix."""
        if "#" in pk:
            return None  # the thread listing or the run hints
        head, _, tail = pk.rpartition("/")
        if head != (encode(self.prefix) if self.prefix else ""):
            return None
        return decode(tail)
