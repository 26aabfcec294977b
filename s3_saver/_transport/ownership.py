"""Who owns a table's key prefix: one bucket (by name).

The DynamoDB index keys a thread by prefix and thread id, not by bucket. Two
buckets on one table and prefix would share every thread: one reads the
other's state, and a delete in one empties the other's thread. So the table
holds one ownership record per prefix (``<prefix>#owner``, a partition no
thread can have: ``encode`` never produces ``#``), written by ``setup()`` or
by the first saver that uses a table set up before the record existed, and a
saver of another bucket is refused with [TableOwnedError][s3_saver.errors.TableOwnedError].

The check costs no request per write: it rides on the first round trip a
process sends to the site (one more request in a wave already sent), and is
remembered. Only a wave that writes the table goes after a check of its own:
a refused saver must never have written there. A saver with a Replica
accepts the other region's bucket as owner, and lists it in the record
(``replicas``): a global table carries the record to that region.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from s3_saver._format.codec import from_attrs, to_attrs
from s3_saver._format.keys import KeyLayout
from s3_saver._transport.failures import (
    CONDITION_FAILED_CODES,
    KEY_SCHEMA,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Call, Op, T, raise_failure, site_of
from s3_saver.errors import TableOwnedError, Where

OWNER_SORT_KEY = "owner"
# On the record: the buckets of the owner's replica regions (S3 replication,
# a global table), added by a saver configured with a Replica.
REPLICAS = "replicas"
# DynamoDB calls that only read: a wave of these can carry the check.
_READS = frozenset({"get_item", "batch_get_item", "query", "scan", "describe_table", "describe_time_to_live"})


class Ownership:
    """One site's claim on its table's prefix, checked once per saver object.

    Attributes:
        checked: The record was read and names this bucket (or the replica
            paired with it): nothing more is sent for it.
    """

    def __init__(
        self,
        table: str,
        layout: KeyLayout,
        where: Where,
        endpoint: str | None,
        partner: str | None = None,
        claims: bool = True,
    ) -> None:
        self.table = table
        self.prefix = layout.prefix
        self.where = where
        self.bucket = where.bucket
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        # The other region's bucket of a saver with a Replica: replication
        # copies objects (and a global table's items) between the two, so
        # either may be the recorded owner.
        self.partner = partner
        # A global table's replica region gets the primary's record by
        # replication: it never writes one of its own.
        self.claims = claims
        self.checked = False
        # Written and read whole by conditional requests: two processes that
        # check at once both end accepted, or refused, by the one record.
        self._key = {"pk": {"S": layout.listing_partition("owner")}, "sk": {"S": OWNER_SORT_KEY}}

    # -- calls ---------------------------------------------------------------------
    def read_call(self) -> Call:
        return Call("dynamodb", "get_item", {"TableName": self.table, "Key": self._key, "ConsistentRead": True}, self.where)

    def claim_call(self, over_partner: bool = False) -> Call:
        record = {"bucket": self.bucket, "prefix": self.prefix, "endpoint": self.endpoint, "claimed_at": int(time.time())}
        params: dict[str, Any] = {"TableName": self.table, "Item": {**self._key, **to_attrs(record)}}
        # Never over another owner's record: of two buckets racing for a table
        # set up before records existed, one wins and the other is refused.
        params["ConditionExpression"] = "attribute_not_exists(pk)"
        if over_partner:
            # A rebuild from this bucket: the table is this bucket's now, also
            # when it held the other region's record (promote's rebuild).
            mine = [self.bucket] + ([self.partner] if self.partner else [])
            names = [f":b{i}" for i in range(len(mine))]
            params["ConditionExpression"] += f" OR #b IN ({', '.join(names)})"
            params["ExpressionAttributeNames"] = {"#b": "bucket"}
            params["ExpressionAttributeValues"] = {n: {"S": b} for n, b in zip(names, mine)}
        return Call("dynamodb", "put_item", params, self.where)

    # -- checks --------------------------------------------------------------------
    def ensure(self) -> Op[None]:
        """``setup()``: read the record, write it when missing, refuse another owner."""
        (found,) = yield (self.read_call(),)
        if isinstance(found, BaseException):
            raise_failure(self.read_call(), found)
        yield from self.settle(found)

    def take(self) -> Op[None]:
        """A rebuild of the whole table from this bucket records this bucket
        (over the paired region's record); another owner's record is refused."""
        (taken,) = yield (self.claim_call(over_partner=True),)
        if not isinstance(taken, BaseException):
            self.checked = True
            return
        if error_code(taken) not in CONDITION_FAILED_CODES:
            raise_failure(self.claim_call(True), taken)
        yield from self.ensure()  # raises: the record names another bucket

    def settle(self, found: Any) -> Op[None]:
        """Judge the record a wave read (claim it when there is none). A failed
        read leaves the check for the next call: the operation reports its own
        failures, and a missing table is setup()'s to create. A table of another
        key schema is named here: this read is the first call to touch the table."""
        if isinstance(found, BaseException):
            if classify(found) == KEY_SCHEMA:
                raise_failure(self.read_call(), found)  # SetupMismatchError
            return
        item = found.get("Item")
        if item is None:
            if not self.claims:
                self.checked = True
                return
            (claimed,) = yield (self.claim_call(),)
            if not isinstance(claimed, BaseException):
                self.checked = True
                return
            if classify(claimed) == KEY_SCHEMA:
                raise_failure(self.claim_call(), claimed)  # SetupMismatchError
            if error_code(claimed) not in CONDITION_FAILED_CODES:
                return
            (found,) = yield (self.read_call(),)  # lost the race: whose is it?
            if isinstance(found, BaseException) or "Item" not in found:
                return
            item = found["Item"]
        record = from_attrs(item)
        self.judge(record)
        self.checked = True
        unlisted = {self.bucket, self.partner} - {record.get("bucket"), None} - set(record.get(REPLICAS) or ())
        if self.partner and self.claims and unlisted and record.get("bucket"):
            # A saver that names its Replica lists the pair in the record: a
            # process of the other region (a global table's, configured
            # without a Replica) is then accepted too. Best effort: this
            # saver is accepted either way.
            yield (self._pair_call(record["bucket"], sorted(unlisted)),)

    def _pair_call(self, owner: str, buckets: list[str]) -> Call:
        params = {
            "TableName": self.table,
            "Key": self._key,
            "UpdateExpression": "ADD #r :r",
            "ConditionExpression": "#b = :o",
            "ExpressionAttributeNames": {"#r": REPLICAS, "#b": "bucket"},
            "ExpressionAttributeValues": {":r": {"SS": buckets}, ":o": {"S": owner}},
        }
        return Call("dynamodb", "update_item", params, self.where)

    def judge(self, record: dict[str, Any]) -> None:
        owner, endpoint = record.get("bucket"), record.get("endpoint") or None
        # Bucket names alone are compared. One bucket is often reached through
        # two endpoints (a VPC endpoint, a proxy, a store's internal and public
        # names); two stores' buckets of one name behind one table are rare. A
        # refusal of the first would stop a working app; the endpoint is only
        # named in the message.
        if owner in (self.bucket, self.partner) or self.bucket in (record.get(REPLICAS) or ()):
            return
        theirs = f"bucket {owner!r}" + (f" (endpoint {endpoint})" if endpoint else "")
        raise TableOwnedError(
            f"DynamoDB table {self.table!r}, prefix {self.prefix!r}, belongs to {theirs}, not to bucket "
            f"{self.bucket!r}: two buckets on one table and prefix would read and delete each other's threads. "
            "Give this saver a table of its own (table=...) or another prefix (prefix=...)"
        )


def owned(op: Op[T], owners: Callable[[str], Ownership | None]) -> Op[T]:
    """``op``, with each site's ownership check riding on the first wave sent to it.

    The check joins that wave (one more request, no more round trips); when
    the wave writes the site's table, the check goes first, alone: a saver
    refused here must not have written to another bucket's threads.
    """
    reply: Any = None
    try:
        while True:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                return stop.value
            if not isinstance(step, tuple):
                reply = yield step
                continue
            pending: list[Ownership] = []
            for call in step:
                if call.operation == "head_bucket":
                    continue  # whether the bucket exists is told first (setup, check)
                owner = owners(site_of(call))
                if owner is not None and not owner.checked and owner not in pending:
                    pending.append(owner)
            for owner in [o for o in pending if _writes(step, o)]:
                pending.remove(owner)
                (found,) = yield (owner.read_call(),)
                yield from owner.settle(found)
            if not pending:
                reply = yield step
                continue
            results = list((yield step + tuple(o.read_call() for o in pending)))
            reply = results[: len(step)]
            for owner, found in zip(pending, results[len(step) :]):
                yield from owner.settle(found)
    finally:
        op.close()  # as resilient() does: an operation cut short hands on at once


def _writes(step: tuple[Call, ...], owner: Ownership) -> bool:
    return any(c.service == "dynamodb" and c.operation not in _READS and site_of(c) == owner.where.site for c in step)

