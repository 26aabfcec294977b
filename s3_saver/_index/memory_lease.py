"""A value object's lease: a commit never names a value object older than ``VALUE_LEASE``.

A value too large for its row goes to an object of its own, written before the commit
that names it (objects first, index last). Until that commit lands nothing names the
object: to ``collect_garbage`` (and to ``erase_namespace``) it is an unnamed object,
kept only while younger than their grace period. So each commit attempt (both index
modes: the manifest's head swap, the table's item write) checks, just before it names an
object, how long ago it was written by the store's clock (``Change.written``): one
written more than ``VALUE_LEASE`` ago (a process paused mid-put, a Lambda frozen and
thawed, a commit retried for long) is first copied to a fresh token, and the copy is
named instead. The old object is left unnamed, for the next collection.

Hence an object older than the lease is never named anew, and an unnamed object stays
unnamed once it is older than the lease. A collection that finds an object unnamed and
older than its grace period (at least ``VALUE_LEASE`` plus ``LEASE_MARGIN``: clock skew
between hosts and S3, and a commit request in flight) deletes what no put will ever
name: it races no put (``_ops/memory/gc``). That is the fence of "read the rows, then
delete": not a mark every commit checks (an item write in DynamoDB mode checks nothing
of its namespace), but a bound on when a commit may name an object.

A copy whose source is gone means a collection with a shorter grace period (forced, its
writers not stopped), or an erase, took the object first: the put raises, nothing of it
is written (a commit that had sent a swap before judges a refused swap in
``ManifestMemory._swap``, before it gets here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.names import show
from s3_saver._format.memory.rows import ObjectRef
from s3_saver._format.memory.ttl import Clock
from s3_saver._index.memory import Change, Path
from s3_saver._transport.failures import (
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Op, about, raise_failure
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import StoreUnavailableError

MINUTE_US = 60 * 1_000_000
VALUE_LEASE = 10 * MINUTE_US
"""A commit names a value object only within this long of its write (µs)."""
LEASE_MARGIN = 5 * MINUTE_US
"""Clock skew and a request in flight: a collection's grace period of at least
``VALUE_LEASE + LEASE_MARGIN`` (15 minutes, the command line's floor without
``--force``) races no put."""


def renewed(s3: S3Calls, value_key: Callable[[Path, str], str], clock: Clock, path: Path, changes: list[Change]) -> Op[list[Change]]:
    """``changes``, those whose value object was written more than ``VALUE_LEASE`` ago
    naming a fresh copy of it (one wave of CopyObject; none in the steady state)."""
    now = clock.now()
    stale = {
        cell.token: change.key
        for change in changes
        if change.written is not None and now - change.written > VALUE_LEASE
        for cell in (change.value, change.vectors)
        if isinstance(cell, ObjectRef)
    }
    if not stale:
        return changes
    moves = {old: new_token() for old in stale}
    subject = f"namespace {show(path)}"
    calls = tuple(about(s3.copy(value_key(path, old), value_key(path, new)), subject) for old, new in moves.items())
    sent = clock.now()
    answers = yield calls
    for (old, key), call, answer in zip(stale.items(), calls, answers, strict=True):
        if not isinstance(answer, BaseException):
            continue
        if classify(answer, call.operation) == OBJECT_MISSING:
            minutes = (now - min(c.written or now for c in changes if c.key == key)) // MINUTE_US
            raise StoreUnavailableError(
                f"put of key {show(key)} in namespace {show(path)}: its value object s3://{s3.bucket}/"
                f"{value_key(path, old)}, written {minutes} minutes ago and named by no item, is gone: a garbage "
                f"collection (or an erase) removed it while the put waited. Nothing was written; put it again"
            )
        if error_code(answer) not in PRECONDITION_FAILED_CODES:  # 412: this copy, sent again, met itself
            raise_failure(call, answer)

    def cell(c: Any) -> Any:
        return ObjectRef(moves[c.token], c.size) if isinstance(c, ObjectRef) and c.token in moves else c

    return [
        replace(c, value=cell(c.value), vectors=cell(c.vectors), written=sent) if cell(c.value) is not c.value or cell(c.vectors) is not c.vectors else c
        for c in changes
    ]
