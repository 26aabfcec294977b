"""Which index mode a bucket prefix belongs to: one marker object, checked once per process.

Both index modes keep the same objects under ``<prefix>live/``; only the index
differs (a DynamoDB table, or manifests in the bucket). A saver of the other
mode on the same prefix would read no threads, start a second history under a
thread id the other mode already uses, and take the other mode's objects for
garbage. So a prefix belongs to one index mode, recorded by an immutable marker,
``<prefix>live/#index-mode`` (``encode`` never produces ``#``: no thread's folder;
under ``live/`` so that the saver's IAM policy of either mode already reaches it,
and replication copies it with the threads), a small JSON document::

    {"index": "dynamodb", "table": "langgraph-checkpoints", "written_at": 1700000000}

It is written once, with ``IfNoneMatch`` (two processes racing agree on the
first), by ``setup()`` or, on a prefix written before markers existed, by the
first write; it is never replaced (a versioned or Object Lock bucket keeps one
version). A lifecycle rule on ``live/`` may expire it: the next write writes it again.

The check costs no request per write. Its GET rides on the first round trip a
process sends to the site (one more request, no more round trips; see
``marked``). Waves that may only create new objects under ``live/`` (and the
manifest's empty hints under ``listing/``) go out beside it: such objects mean
nothing until an index commits them, and a refused saver commits nothing. Any other write (an index
commit, a delete, a swap) waits for the verdict, and on a prefix without a
marker writes it first: a saver refused here never committed, deleted or
swapped anything.

A DynamoDB-indexed prefix belongs to one table too: the marker names it, and
``mode_table`` (ModeMark's base) refuses another table and moves the prefix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from s3_saver._format.key_owner import MODE_MARKER
from s3_saver._format.keys import LISTING_PREFIX, KeyLayout
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    DENIED,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.mode_table import CLAIM_ATTEMPTS, DYNAMODB, TableMove
from s3_saver._transport.protocol import Call, Op, T, raise_failure, site_of
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import (
    CorruptObjectError,
    IndexModeMismatchError,
    StoreUnavailableError,
)

MARKER_NAME = MODE_MARKER
MANIFEST = "manifest"
# Objects younger than this may belong to a write still committing (as for
# collect_garbage's default grace period): never evidence of the other mode.
_SETTLED_SECONDS = 3600
# Calls about the bucket or the table themselves, not the prefix's data (setup's):
# they neither carry the check nor wait for it. setup() writes the marker once
# the index is made: a store it refuses (one that ignores conditional writes, a
# table it cannot create) is left free for the other mode.
_RESOURCE_CALLS = frozenset(
    {"head_bucket", "create_bucket", "put_bucket_versioning", "create_table", "describe_table",
     "update_time_to_live", "describe_time_to_live"}
)
# Calls that change nothing.
_READS = frozenset(
    {
        "get_object", "head_object", "list_objects_v2", "list_object_versions", "get_bucket_versioning",
        "get_bucket_lifecycle_configuration", "get_item", "batch_get_item", "query", "scan",
        "describe_table", "describe_time_to_live",
    }
)


class ModeMark(TableMove):
    """One site's index-mode check: the marker read (or written) once per saver object.

    Attributes:
        checked: The marker names this saver's mode (read, or written here):
            nothing more is sent for it.
        read: The marker was asked for and is absent (or unreadable for lack
            of ``s3:ListBucket``, where S3 answers 403 for a missing key): the
            next write claims it.
        tried: Its GET failed on a read's wave: the next write reads it again.
        surveyed: An admin call found no threads of the other mode under the
            prefix (asked only while no marker exists).
    """

    def __init__(self, s3: S3Calls, layout: KeyLayout, table: str | None, partner_table: str | None = None) -> None:
        self.s3 = s3
        self.layout = layout
        self.mode = DYNAMODB if table else MANIFEST
        self.table = table
        # The tables that index this prefix: the saver's, and its Replica's (the
        # other region's table, named by the marker replication copies between them).
        self.tables = {t for t in (table, partner_table) if t}
        # The marker read names another table this saver accepts (its Replica's,
        # or any with ``judge(move=True)``): (that table, the marker's ETag), for
        # ``take``. ``moving``: accepted only for a move (a rebuild of every thread).
        self.theirs: tuple[str, str | None] | None = None
        self.moving = False
        # The other table a move found gone (``lost``): asked once per move.
        self.gone: str | None = None
        self.key = layout.mode_marker_key
        self.checked = False
        self.read = False
        self.surveyed = False
        # The GET that rode on a wave failed (no answer, a 5xx after the retries):
        # reads no longer carry it. A DynamoDB-mode read that needs no S3 object
        # must not wait for S3's failures at every wave; the next write settles it.
        self.tried = False
        # Admin calls under way that survey before the marker is written: a
        # claim that another check's write sets off in between (the table's
        # owner record, ``_transport/ownership``) surveys first too.
        self.surveying = 0
        # Likewise, moves under way (a rebuild of every thread, or setup() making
        # the new table; ``judge(move=True)``): a claim set off in between (the
        # new table's owner record) judges as they do.
        self.moves = 0

    # -- calls ---------------------------------------------------------------------
    def read_call(self) -> Call:
        return self.s3.get(self.key)

    def claim_call(self) -> Call:
        record = {"index": self.mode, "table": self.table, "written_at": int(time.time())}
        return self.s3.put_new(self.key, json.dumps(record, sort_keys=True).encode())

    def own(self, call: Call) -> bool:
        return call.service == "s3" and call.params.get("Key") == self.key and call.params.get("Bucket") == self.s3.bucket

    # -- verdicts ------------------------------------------------------------------
    def judge(self, found: Any, strict: bool = False, move: bool = False) -> None:
        """Judge an answer to ``read_call``: refuse another mode's marker, or
        another table's, note an absent one. Any other failure leaves the check
        for the next call (the operation reports its own failures), or with
        ``strict`` raises it. ``move``: another table's marker is the one a
        rebuild of every thread into this saver's table replaces (``take``)."""
        move = move or self.moves > 0
        if isinstance(found, BaseException):
            if classify(found, "get_object") in (OBJECT_MISSING, DENIED):
                self.read = True
            elif strict:
                raise_failure(self.read_call(), found)
            else:
                self.tried = True
            return
        record = self._decode(found.get("Body"))
        how = f"its marker s3://{self.s3.bucket}/{self.key} says so"
        if record["index"] != self.mode:
            raise self.mismatch(record["index"], record.get("table"), how)
        theirs = record.get("table")
        if self.mode == DYNAMODB and theirs and theirs != self.table:
            # Invariant: a prefix belongs to one table (the same read, no request more).
            if theirs not in self.tables:
                if not move:
                    raise self.other_table(theirs, how)
                self.moving = True
            self.theirs = (theirs, found.get("ETag"))
        self.checked = True

    def _decode(self, body: Any) -> dict[str, Any]:
        # Every answer is checked: a 200 the saver cannot read (a proxy's page) is
        # an error, never taken for an absent marker or for this saver's mode.
        try:
            record = json.loads(body)
            if not isinstance(record, dict) or record.get("index") not in (DYNAMODB, MANIFEST):
                raise ValueError(f"no index mode in {record!r:.200}")
            return record
        except (TypeError, ValueError, UnicodeDecodeError) as exc:
            raise CorruptObjectError(
                f"s3://{self.s3.bucket}/{self.key}, the marker of the prefix's index mode, cannot be read "
                f"({exc}); it holds {{\"index\": \"dynamodb\" or \"manifest\", ...}}, written once by setup()"
            ) from exc

    def mismatch(self, found: str, table: str | None, how: str, evidence: str = "") -> IndexModeMismatchError:
        where = f"s3://{self.s3.bucket}/{self.layout.prefix}"
        if found == DYNAMODB:
            theirs = "the DynamoDB index mode" + (f" (table {table!r})" if table else "")
        else:
            theirs = f"the manifest index mode (the index in the bucket, under {self.layout.manifest_root})"
        mine = f"DynamoDB table {self.table!r}" if self.mode == DYNAMODB else "the manifest index (no table)"
        if found == DYNAMODB and table:
            fix = f"Pass table={table!r} (command line: --table {table}, or CHECKPOINT_TABLE={table})"
        elif found == DYNAMODB:
            fix = "Pass the table that indexes them (table=...; command line: --table NAME, or CHECKPOINT_TABLE)"
        else:
            fix = "Leave the table out (command line: no --table, and CHECKPOINT_TABLE unset or empty)"
        text = (
            f"{where} belongs to {theirs}, but this saver uses {mine} ({how}{evidence}). A prefix belongs "
            "to one index mode: a saver of the other mode would see none of its threads, start second "
            f"histories under their ids and collect their objects as garbage. {fix}, or give this saver another "
            "prefix or bucket (migrate copies threads between index modes)"
        )
        return IndexModeMismatchError(text, bucket=self.s3.bucket, prefix=self.layout.prefix, found=found, table=table)

    # -- operations ------------------------------------------------------------------
    def claim(self) -> Op[None]:
        """Write the marker when absent (read it when not read yet); refuse another mode's."""
        if not self.read:
            (found,) = yield (self.read_call(),)
            self.judge(found, strict=True)
            # A move judged here (a claim that settle_mode's first wave set off:
            # the new table's owner record) is checked before that write too.
            yield from self.lost()
        if self.surveying and not self.checked:
            yield from self.survey()
        for _ in range(CLAIM_ATTEMPTS):
            if self.checked:
                return
            (put,) = yield (self.claim_call(),)
            if not isinstance(put, BaseException):
                self.checked = True
                return
            code = error_code(put)
            if code in CONDITIONAL_CONFLICT_CODES:
                continue  # two claims met: send again (one of them finds the other's)
            if code not in PRECONDITION_FAILED_CODES:
                raise_failure(self.claim_call(), put)
            # Another process wrote it first: whose mode?
            (found,) = yield (self.read_call(),)
            self.judge(found, strict=True)
        if not self.checked:
            raise StoreUnavailableError(
                f"s3://{self.s3.bucket}/{self.key}: the marker of the prefix's index mode kept changing "
                f"while it was written ({CLAIM_ATTEMPTS} attempts); try again"
            )

    def survey(self) -> Op[None]:
        """With no marker yet (a prefix written before markers existed), refuse
        a prefix whose objects show the other mode's threads (admin calls only:
        it lists the first page of ``manifests/`` and of ``live/``).

        * a manifest head means manifest-mode threads;
        * checkpoint objects older than an hour with no manifest at all mean
          threads whose index is a table (or first writes that never committed).

        A table's threads beside manifest heads (both modes on one prefix) are
        refused from the DynamoDB side; the manifest side cannot see a table."""
        if self.checked or self.surveyed:
            return
        calls = (self.s3.list_keys(self.layout.manifest_root), self.s3.list_keys(self.layout.root))
        pages = yield calls
        for call, page in zip(calls, pages):
            if isinstance(page, BaseException):
                if classify(page, "list_objects_v2") == DENIED:
                    return  # no s3:ListBucket: nothing to survey with; the marker decides
                raise_failure(call, page)
        manifests, live = (p.get("Contents", []) for p in pages)
        heads = [o["Key"] for o in manifests if self.layout.thread_of_head(o["Key"]) is not None]
        if self.mode == DYNAMODB and heads:
            raise self.mismatch(
                MANIFEST, None, "no marker yet, but it holds manifest heads",
                f", e.g. {heads[0]!r}; if table {self.table!r} indexes threads of this prefix too, the prefix "
                "holds threads of both modes: copy one mode's threads to another prefix (migrate) first",
            )
        cutoff = time.time() - _SETTLED_SECONDS
        settled = [
            o for o in live
            if self.layout.parse_object_key(o["Key"]) is not None and _epoch(o["LastModified"]) <= cutoff
        ]
        if self.mode == MANIFEST and settled and not manifests:
            raise self.mismatch(
                DYNAMODB, None, "no marker yet, but it holds checkpoint objects and no manifest",
                f", e.g. {settled[0]['Key']!r}, written {settled[0]['LastModified']:%Y-%m-%d %H:%M}: a saver "
                "with a table wrote them. If they are leftovers of writes that never committed, no thread of "
                "this prefix reads them: delete them and call again",
            )
        self.surveyed = True


def settle_mode(mark: ModeMark | None, *, survey: bool, claim: bool, move: bool = False) -> Op[None]:
    """Admin calls (``setup``, ``check``, garbage collection, rebuild, erase, audit):
    the prefix's index mode settled before anything else, surveyed when it has no
    marker yet; ``claim``: written when absent; ``move``: the marker of a table
    that is gone (``ModeMark.lost``) is accepted, to be replaced (``ModeMark.take``)."""
    if mark is None or mark.checked:
        return
    mark.surveying += survey
    mark.moves += move
    try:
        if not mark.read:
            (found,) = yield (mark.read_call(),)
            mark.judge(found, strict=True, move=move)
            # A move: the marker's table must be gone (``lost``), before any index write.
            yield from mark.lost()
            if mark.checked:
                return
        if survey:
            yield from mark.survey()
        if claim:
            yield from mark.claim()
    finally:
        mark.surveying -= survey
        mark.moves -= move


def marked(op: Op[T], marks: Callable[[str], ModeMark | None]) -> Op[T]:
    """``op``, with each site's index-mode check riding on the first wave sent to it.

    The marker's GET joins that wave (one more request, no more round trips);
    a wave with a write other than a new object under ``live/`` (or a hint
    under ``listing/``) waits for the verdict, and writes the marker first when
    the prefix has none: a refused saver never committed, swapped or deleted.
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
            claimers: list[ModeMark] = []
            pending: list[ModeMark] = []
            settling = {id(m) for c in step if (m := marks(site_of(c))) is not None and m.own(c)}
            for call in step:
                mark = marks(site_of(call))
                if mark is None or mark.checked or call.operation in _RESOURCE_CALLS or id(mark) in settling:
                    continue  # (a wave with the marker's own call is settling it)
                group = claimers if _waits(call, mark) else pending
                if mark not in group:
                    group.append(mark)
            for mark in claimers:
                # Before the wave, alone: settled, and written when absent.
                yield from mark.claim()
            pending = [m for m in pending if not m.checked and not m.read and not m.tried]
            if not pending:
                reply = yield step
                continue
            results = list((yield step + tuple(m.read_call() for m in pending)))
            reply = results[: len(step)]
            for mark, found in zip(pending, results[len(step) :]):
                mark.judge(found)
    finally:
        op.close()  # as resilient() does: an operation cut short hands on at once


def _waits(call: Call, mark: ModeMark) -> bool:
    """A call that must not go out before the prefix's mode is known to be the saver's."""
    if call.operation in _READS:
        return False
    keys = _keys_of(call) if call.service == "s3" else []
    if keys and all(k.startswith(mark.layout.probe_key("")) for k in keys):
        # The manifest's setup() probe of conditional writes: nothing reads it,
        # and the probe deletes it itself.
        return False
    if call.operation in ("put_object", "copy_object") and call.params.get("IfNoneMatch") == "*":
        # A new object of a thread: nothing reads it until an index commits it,
        # which waits; a refused saver's are orphans. Or a new hint of the
        # manifest index (a thread's listing, a run's, a day's activity entry):
        # empty, and worth nothing without the thread's head; a DynamoDB index
        # never reads them.
        return not keys[0].startswith((mark.layout.root, mark.layout.prefix + LISTING_PREFIX))
    return True


def _epoch(modified: datetime) -> float:
    # A store that answers without a zone means UTC (as S3 does).
    return (modified if modified.tzinfo else modified.replace(tzinfo=timezone.utc)).timestamp()


def _keys_of(call: Call) -> list[str]:
    if "Key" in call.params:
        return [call.params["Key"]]
    return [o["Key"] for o in call.params.get("Delete", {}).get("Objects", [])]
