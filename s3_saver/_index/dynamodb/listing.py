"""The DynamoDB thread listing and run hints, spread over shard partitions.

A thread's listing item goes to ``<prefix>#threads#<shard_of(thread)>`` and a
run's hints to ``<prefix>#runs#<shard_of(run)>`` (``LISTING_SHARDS`` each), in
the request that wrote them before sharding: no partition takes every new
thread's write. The sort keys are unchanged, so the listing's order is the
sort keys' order across shards, and a page is a merge of the shards.

Earlier versions kept each in one partition (``<prefix>#threads``,
``<prefix>#runs``): it is read as one more stream, and ``setup()`` moves its
items into their shards (``move_unsharded``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from s3_saver._format import keys as _keys
from s3_saver._format.codec import to_attrs
from s3_saver._index.dynamodb.items import DynamoCalls
from s3_saver._index.dynamodb.table import PARTITION_KEY, SORT_KEY
from s3_saver._transport.protocol import Op, request

# Items moved per transaction: a Put and a Delete each, of DynamoDB's 100 actions.
_MOVE_BATCH = 50


@dataclass
class _Stream:
    """One partition of the listing, as far as a walk has read it."""

    pk: str
    after: str | None  # the last sort key read (at first: the walk's start)
    items: list[str] = field(default_factory=list)  # read, not handed out yet, ascending
    done: bool = False  # read to its end


@dataclass
class ListingWalk:
    """The cursor of a walk down the merged listing (``listing_page``)."""

    streams: list[_Stream]


def partitions(calls: DynamoCalls, what: str) -> list[str]:
    """Every shard's partition, then the unsharded one of earlier versions."""
    layout = calls.layout
    return [layout.listing_partition(what, k) for k in range(_keys.LISTING_SHARDS)] + [layout.listing_partition(what)]


def listing_page(
    calls: DynamoCalls, after: str | None, page_size: int, cursor: ListingWalk | None
) -> Op[tuple[list[str], ListingWalk | None]]:
    """The next ``page_size`` listing sort keys above ``after``, ascending, in one
    round trip; returns the cursor for the next page (None at the end).

    Each stream is read up to ``page_size`` items ahead, and only the streams
    that hold fewer are read again (a walk's later pages read about what the
    page before took). A key is handed out only when no stream still unread
    can hold a smaller one: every key up to the smallest "last read" key of
    the streams not at their end. That stream holds ``page_size`` keys up to
    there, so every page but the last is full.
    """
    walk = cursor or ListingWalk([_Stream(pk, after) for pk in partitions(calls, "threads")])
    wanted = [s for s in walk.streams if not s.done and len(s.items) < page_size]
    pages = yield from request(*(calls.query_listing(s.pk, s.after, page_size - len(s.items)) for s in wanted))
    for stream, page in zip(wanted, pages):
        keys = [r[SORT_KEY]["S"] for r in page.get("Items", [])]
        stream.items += keys
        last = page.get("LastEvaluatedKey")
        stream.done = last is None
        stream.after = last[SORT_KEY]["S"] if last is not None else stream.after
    bound = min((s.after for s in walk.streams if not s.done and s.after is not None), default=None)
    ready = sorted({k for s in walk.streams for k in s.items if bound is None or k <= bound})
    taken = ready[:page_size]
    if taken:
        # ``taken`` is a prefix of the merged order: each stream loses its keys up to its end.
        for stream in walk.streams:
            stream.items = [k for k in stream.items if k > taken[-1]]
    more = any(not s.done or s.items for s in walk.streams)
    return taken, walk if more else None


def run_threads(calls: DynamoCalls, run_ids: list[str]) -> Op[dict[str, list[str]]]:
    """The threads of each run's hints: its shard and the unsharded partition,
    every run's in one wave (and a wave per further page)."""
    found: dict[str, dict[str, None]] = {r: {} for r in run_ids}
    pending: dict[tuple[str, str], Any] = {}
    for run_id in run_ids:
        pending[(run_id, calls.layout.listing_partition("runs", _keys.shard_of(run_id)))] = None
        pending[(run_id, calls.layout.listing_partition("runs"))] = None
    while pending:
        order = list(pending)
        pages = yield from request(*(calls.query_run(pk, r, pending[(r, pk)]) for r, pk in order))
        pending = {}
        for (run_id, pk), page in zip(order, pages):
            start = len(_keys.run_sort_prefix(run_id))
            # A hint in both partitions (a run that wrote before and after the upgrade) counts once.
            found[run_id].update(dict.fromkeys(_keys.decode(r[SORT_KEY]["S"][start:]) for r in page.get("Items", [])))
            if page.get("LastEvaluatedKey"):
                pending[(run_id, pk)] = page["LastEvaluatedKey"]
    return {r: list(threads) for r, threads in found.items()}


def move_unsharded(index: Any) -> Op[int]:
    """Move the items of the unsharded listing and run-hint partitions into
    their shards (``setup()``); returns how many moved.

    Each item moves in a transaction that puts it in its shard and deletes it
    from the old partition only if it is still there: a delete that removed
    it meanwhile cancels the move (no listing item of a deleted thread comes
    back), and a move cut short at any request moved whole items or none.
    Each round reads the old partition from its start (what moved is gone),
    so a run again resumes where one stopped, and on a moved table costs two
    queries.
    """
    calls: DynamoCalls = index.calls
    moved = 0
    for what, owner in (("threads", _listed_thread), ("runs", _hinted_run)):
        old = calls.layout.listing_partition(what)
        while True:
            page = yield from request(calls.query_listing(old, None, _MOVE_BATCH, consistent=True))
            keys = [r[SORT_KEY]["S"] for r in page[0].get("Items", [])]
            if not keys:
                break
            actions: list[dict[str, Any]] = []
            for sk in keys:
                shard = calls.layout.listing_partition(what, _keys.shard_of(owner(sk)))
                actions.append({"Put": {"TableName": calls.table, "Item": to_attrs({PARTITION_KEY: shard, SORT_KEY: sk})}})
                actions.append(
                    {
                        "Delete": {
                            "TableName": calls.table,
                            "Key": to_attrs({PARTITION_KEY: old, SORT_KEY: sk}),
                            "ConditionExpression": "attribute_exists(#k)",
                            "ExpressionAttributeNames": {"#k": PARTITION_KEY},
                        }
                    }
                )
            # Refused (a condition): an item went meanwhile; the next round reads
            # what is left. ``transact`` raises for anything else.
            refused = yield from index.transact(actions, f"the move of {what} items into shards")
            moved += 0 if refused else len(keys)
    return moved


def _listed_thread(sk: str) -> str:
    return _keys.parse_listing_sort_key(sk)[1]


def _hinted_run(sk: str) -> str:
    # A run sort key is ``<encoded run>!<encoded thread>`` (``run_sort_key``):
    # ``encode`` never produces "!".
    return _keys.decode(sk.partition("!")[0])
