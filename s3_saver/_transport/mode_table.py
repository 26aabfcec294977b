"""A prefix belongs to one DynamoDB table: the index-mode marker's table, and the moves that change it.

A DynamoDB-indexed prefix belongs to one table: two tables on one prefix would each take the
other's threads for unindexed objects, and their garbage collections would
delete them. So a DynamoDB saver whose table is not the marker's is refused,
with no request more (the same read), except for the table of its ``Replica``:
replication copies the marker between the regions, so a replica bucket holds
one naming the primary's table. Two admin steps move a prefix to the saver's
table, each by replacing the marker (``take``) once its index is whole:
a ``rebuild_index()`` of every thread (into a lost table's replacement: from
any table's marker, once DescribeTable says that table is gone, or its
processes, each of which judged the marker once, would go on writing to it),
and ``promote()`` (from the other region's: the promoted region's own savers
and command line then find their table named).
"""

from __future__ import annotations

import dataclasses
import json
import time

from s3_saver._format.keys import KeyLayout
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    DENIED,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    TABLE_MISSING,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Call, Op, raise_failure
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import IndexModeMismatchError, StoreUnavailableError

DYNAMODB = "dynamodb"
CLAIM_ATTEMPTS = 4


class TableMove:
    """The table part of ``mode.ModeMark`` (its base): the refusal of another
    table's prefix, and the moves (``take``, ``lost``, ``stay``). It calls the
    marker's read and verdicts of its subclass (``read_call``, ``_decode``,
    ``mismatch``)."""

    s3: S3Calls
    layout: KeyLayout
    key: str
    mode: str
    table: str | None
    # The tables that index this prefix (the saver's, its Replica's); the other
    # table a marker read named, with that marker's ETag; accepted for a move
    # only; the other table a move found gone. See ModeMark.__init__.
    tables: set[str]
    theirs: tuple[str, str | None] | None
    moving: bool
    gone: str | None
    checked: bool
    read: bool

    def other_table(self, theirs: str, how: str) -> IndexModeMismatchError:
        where = f"s3://{self.s3.bucket}/{self.layout.prefix}"
        text = (
            f"{where} is indexed by DynamoDB table {theirs!r}, but this saver uses table {self.table!r} ({how}). "
            "A prefix belongs to one saver and one index: a saver of another table would see none of its "
            "threads, start second histories under their ids and collect their objects as garbage. "
            f"Pass table={theirs!r} (command line: --table {theirs}, or CHECKPOINT_TABLE={theirs}), or give this "
            f"saver another prefix or bucket. If table {theirs!r} is lost, rebuild_index() with no thread id "
            f"moves the prefix to table {self.table!r} (made by setup() first, if need be): it indexes every "
            f"thread there, then makes the marker name it. A saver whose Replica names table {theirs!r} (the "
            "other region's) is accepted"
        )
        return IndexModeMismatchError(text, bucket=self.s3.bucket, prefix=self.layout.prefix, found=DYNAMODB, table=theirs)

    def _still_there(self, theirs: str, why: str) -> IndexModeMismatchError:
        where = f"s3://{self.s3.bucket}/{self.layout.prefix}"
        text = (
            f"{where} is indexed by DynamoDB table {theirs!r} (its marker s3://{self.s3.bucket}/{self.key} says "
            f"so), and {why}: a prefix moves to table {self.table!r} only from a lost table, "
            f"since processes of table {theirs!r} would go on writing there, unseen by table {self.table!r} "
            "(a prefix belongs to one saver and one index). "
            f"Pass table={theirs!r} (command line: --table {theirs}, or CHECKPOINT_TABLE={theirs}) to go on with "
            f"it; to move anyway, stop its processes and delete table {theirs!r}, then run rebuild_index() with "
            "no thread id (or copy the threads to another prefix with migrate)"
        )
        return IndexModeMismatchError(text, bucket=self.s3.bucket, prefix=self.layout.prefix, found=DYNAMODB, table=theirs)

    def take(self) -> Op[None]:
        """Admin (a rebuild of every thread, ``promote``): the prefix's marker names
        this saver's table from here on, where the one judged named another
        (``theirs``). One PUT on the condition that the marker is the one read
        (``IfMatch``), sent once the index is whole: cut before it, the prefix
        stays the other table's and the call again finishes; its answer lost,
        the marker read again says it landed. Nothing sent otherwise."""
        for _ in range(CLAIM_ATTEMPTS):
            if self.theirs is None:
                self.moving = False
                return
            theirs, etag = self.theirs
            record = {"index": self.mode, "table": self.table, "moved_from": theirs, "written_at": int(time.time())}
            call = self.s3.put_swap(self.key, json.dumps(record, sort_keys=True).encode(), etag)
            (put,) = yield (call,)
            if not isinstance(put, BaseException):
                self.theirs, self.moving = None, False
                return
            if error_code(put) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
                raise_failure(call, put)
            # This call's own write met by its retry (the answer lost), or the marker changed.
            (found,) = yield (self.read_call(),)
            if isinstance(found, BaseException):
                if classify(found, "get_object") not in (OBJECT_MISSING, DENIED):
                    raise_failure(self.read_call(), found)
                self.theirs = (theirs, None)  # expired meanwhile (a lifecycle rule): written anew
                continue
            now = self._decode(found.get("Body"))
            if now["index"] != self.mode:
                raise self.mismatch(now["index"], now.get("table"), "its marker changed while it was re-marked")
            table = now.get("table")
            if not table or table == self.table:
                self.theirs, self.moving = None, False
                return
            if table not in self.tables and table != theirs:
                raise self.other_table(table, "another call re-marked it meanwhile")
            self.theirs = (table, found.get("ETag"))
        raise StoreUnavailableError(
            f"s3://{self.s3.bucket}/{self.key}: the marker of the prefix's index mode kept changing "
            f"while it was re-marked for table {self.table!r} ({CLAIM_ATTEMPTS} attempts); call again"
        )

    def lost(self) -> Op[None]:
        """A move (``judge(move=True)``) only from a lost table: one DescribeTable of
        the marker's table, in this saver's region, sent by a rebuild of every
        thread (or setup(), which makes that table) and only when the marker
        names another table. Were that table
        there, its processes (each judged the marker once, when it started) would
        go on writing to it after the switch: two tables on one prefix."""
        if not self.moving or self.theirs is None or self.theirs[0] == self.gone:
            return
        theirs = self.theirs[0]
        where = dataclasses.replace(self.s3.where, table=theirs) if self.s3.where is not None else None
        call = Call("dynamodb", "describe_table", {"TableName": theirs}, where)
        (found,) = yield (call,)
        if isinstance(found, BaseException):
            kind = classify(found, "describe_table")
            if kind == TABLE_MISSING:
                self.gone = theirs
                return
            if kind == DENIED:
                raise self._still_there(
                    theirs, "whether that table still exists cannot be told (DescribeTable on it was denied: "
                    "grant dynamodb:DescribeTable on it, or delete it)"
                )
            raise_failure(call, found)
        if found["Table"].get("TableStatus") == "DELETING":
            self.gone = theirs
            return
        raise self._still_there(theirs, f"that table still exists ({found['Table'].get('TableStatus')})")

    def stay(self) -> None:
        """A move cut short before its switch (``take``), or setup()'s (which never
        switches): the prefix is still the other table's, and this saver
        object's next call judges the marker again."""
        if self.moving:
            self.theirs, self.moving, self.checked, self.read, self.gone = None, False, False, False, None
