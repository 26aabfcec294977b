"""The DynamoDB index's lifecycle: a thread changed as a whole.

Restore a thread's items, delete a thread, drop pruned checkpoints and copy a thread. A
thread as the index reads it (the table's setup, contents, listings, runs) is ``threads``;
``DynamoIndex`` mixes both in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from s3_saver._format.entries import (
    Activity,
    ArchiveRef,
    CheckpointEntry,
    Tombstone,
    WritesEntry,
)
from s3_saver._index.dynamodb.items import (
    DynamoCalls,
    Link,
    _listed_first,
    _live,
    _thread_item,
)
from s3_saver._index.dynamodb.table import (
    COPIED_FROM,
    GEN,
    PARTITION_KEY,
    RUN,
    SORT_KEY,
    TAG,
)
from s3_saver._index.terms import (
    Archived,
    Cut,
    Fenced,
    Release,
)
from s3_saver._transport.failures import (
    CONDITION_FAILED_CODES,
    error_code,
)
from s3_saver._transport.protocol import Op, gather, raise_failure, request, request_one
from s3_saver.errors import (
    ConfigurationError,
    S3SaverError,
)

# Passes of a delete over the thread: a second one finds what a pass left (a
# page written during the first); a third is for good measure.
_MAX_DELETE_PASSES = 3
# Attempts of delete_thread's switch, each on the thread's record as read just
# before (an archive's switch or a listing in between makes it read again).
_MAX_SWITCHES = 5
# A transaction's actions besides the thread's record check (100 at most).
_TRANSACTION_ACTIONS = 99
# What a delete or an archive's cleanup reads of each item: enough to name its objects.
_ENTRY_ATTRIBUTES = (PARTITION_KEY, SORT_KEY, "loc", "token", GEN, TAG, RUN, "parent")


class DynamoLifecycle:
    """The table's setup and the operations on a thread as a whole, for ``DynamoIndex``."""

    # What these methods rely on, from DynamoIndex: the attributes its __init__
    # sets, and its methods latest, note and write_batches.
    calls: DynamoCalls
    table: str

    def restore(
        self,
        thread_id: str,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        created: int,
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[None]:
        # Entries keep the generation they come with (0 for a rebuild): where a
        # record survived the loss of the rest of the index, what it deleted
        # stays deleted.
        try:
            record, before = yield from self._contents(thread_id)
            _key_fence(record, key_id)
        except Archived:
            before = []
        what = f"entries of thread {thread_id!r}"
        yield from self._write_whole(thread_id, entries, writes, {}, what)
        # Replaced, not added to: what the thread held and the new history lacks
        # goes, after the new is in (a cut short leaves extra items, never a hole).
        calls = self.calls
        kept = {e.key for e in entries}
        slots = {(w.ns, w.checkpoint_id, w.task_id, w.part) for w in writes}
        gone = [k for e in before if e.key not in kept for k in (calls.key_of(*e.key), calls.link_key(e))]
        gone += [
            calls.writes_key(w)
            for e in before
            for w in e.writes or ()
            if (w.ns, w.checkpoint_id, w.task_id, w.part) not in slots
        ]
        yield from self.write_batches([{"DeleteRequest": {"Key": k}} for k in gone], what)
        gen = max((e.gen for e in entries), default=0)
        yield from gather(self.note(thread_id, created, None), self.record_active(thread_id, gen, active))  # type: ignore[attr-defined]

    def _write_whole(
        self,
        thread_id: str,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        extra: dict[str, Any],
        what: str,
    ) -> Op[None]:
        """Write a history's items so that one cut short shows only whole
        checkpoints: every writes item and link first, then the checkpoint items,
        newest first (the latest state shows first)."""
        calls = self.calls
        newest_first = sorted(entries, key=lambda e: (e.ns, e.checkpoint_id), reverse=True)
        first = [calls.writes_item(w) for w in sorted(writes, key=lambda w: (w.ns, w.checkpoint_id), reverse=True)]
        first += [calls.link_item(e) for e in newest_first]
        for items in (first, [calls.checkpoint_item(e) for e in newest_first]):
            yield from self.write_batches([{"PutRequest": {"Item": {**i, **extra}}} for i in items], what)

    # -- delete, prune and copy ---------------------------------------------------------
    def delete_thread(self, thread_id: str, now: int, release: Release, gone: frozenset[str] = frozenset()) -> Op[None]:
        """One write of the thread's record is the switch: the next generation
        (readers ignore every item below it, writers' commits name the old one
        and are refused), archive and marks off. Then what is left goes: the
        archive object, the older generations' objects before their items, the
        thread's listing and run hints. Only the record stays (its generation
        and when it was deleted). Cut short anywhere, a call again finishes it."""
        calls = self.calls
        found, first = yield from request(
            calls.get_tombstone(thread_id), calls.query(thread_id, limit=1, projection=(PARTITION_KEY, SORT_KEY))
        )
        if "Item" not in found and not first.get("Items") and not gone:
            # Nothing was ever stored: leave no trace. (With destroyed keys to record,
            # the record is written all the same: a process that cached one of them
            # must find it there at its commit.)
            return
        for _ in range(_MAX_SWITCHES):
            record = _thread_item(calls, found)
            gen = record.gen + 1
            stale = record.archive.key if record.archive is not None else record.stale_archive
            archived_runs = record.archive.runs if record.archive is not None else []
            # The switch takes the archive reference out, and with it the only thing
            # that named the archive's runs: it keeps them (``stale_runs``) until their
            # hints are deleted, so a delete cut short after it and called again
            # still deletes them.
            runs = sorted({*record.stale_runs, *archived_runs})
            call = calls.bury_thread(
                thread_id, gen, now, stale, record.created or record.unlisting, archived_runs, record, gone
            )
            (buried,) = yield (call,)
            if not isinstance(buried, BaseException):
                break
            if error_code(buried) not in CONDITION_FAILED_CODES:
                raise_failure(call, buried)
            # An archive switched (or marked), or a restore, an import or a copy
            # listed the thread, since the read: decided again on the record as it is.
            found = yield from request_one(calls.get_tombstone(thread_id))
        else:
            raise S3SaverError(
                f"DynamoDB table {self.table}: the record of thread {thread_id!r} kept changing under "
                f"delete_thread (archives, restores, listings); gave up after {_MAX_SWITCHES} attempts, "
                "nothing was deleted: call again"
            )
        # The activity entry the record named at the switch, not at the read: a
        # commit, a restore's switch or an import's entry that landed in between
        # named its own, and none lands after (each needs the old generation, or
        # the archive reference, which the switch took out).
        at_switch = _thread_item(calls, {"Item": buried["Attributes"]}) if "Attributes" in buried else record
        if record.archiving is not None:
            yield from release([ArchiveRef(record.archiving, "", 0, 0, {})], [])
        if stale is not None or runs:
            # The hints and the object go before the record forgets them.
            yield from gather(
                release([ArchiveRef(stale, "", 0, 0, {})] if stale is not None else [], []),
                self.forget_runs([(r, thread_id) for r in runs]),  # type: ignore[attr-defined]
            )
            yield from self.forget_deleted_archive(thread_id, stale, runs)  # type: ignore[attr-defined]
        # The records that find the thread go first (while what names them is
        # still there: a delete cut short and called again finds them).
        # Its activity entry too (the day its record names, which the switch keeps:
        # a call again finds it), beside the listing's.
        unlisting = record.created or record.unlisting
        # Only as the record names it (its token): a new life's entry of the same day stays.
        active = at_switch.named_entries()
        if unlisting:
            call = calls.unlist_thread(unlisting, thread_id, pending=True)
            unlisted, _ = yield from gather(_answer(call), self.drop_active(active))  # type: ignore[attr-defined]
            if isinstance(unlisted, BaseException) and not _listed_first(unlisted):
                raise_failure(call, unlisted)
        else:
            yield from self.drop_active(active)  # type: ignore[attr-defined]
        for _ in range(_MAX_DELETE_PASSES):
            found_any = False
            start: dict[str, Any] | None = None
            while True:
                page = yield from request_one(
                    calls.query(thread_id, newest_first=False, start_key=start, projection=_ENTRY_ATTRIBUTES)
                )
                raws = [r for r in page.get("Items", []) if _is_older(calls.parse(r), gen)]
                if raws:
                    found_any = True
                    parsed = [calls.parse(r) for r in raws]
                    runs = sorted({e.run_id for e in parsed if isinstance(e, CheckpointEntry) and e.run_id is not None})
                    # Run hints and objects before the items that name them: a call again finds them.
                    yield from gather(
                        self.forget_runs([(r, thread_id) for r in runs]),  # type: ignore[attr-defined]
                        release([e for e in parsed if isinstance(e, (CheckpointEntry, WritesEntry))], []),
                    )
                    yield from self.write_batches(
                        [{"DeleteRequest": {"Key": {k: r[k] for k in (PARTITION_KEY, SORT_KEY)}}} for r in raws],
                        f"deletes of thread {thread_id!r}",
                    )
                start = page.get("LastEvaluatedKey")
                if start is None:
                    break
            if not found_any:
                break

    def drop(self, thread_id: str, plan: Callable[[list[CheckpointEntry]], Op[Cut]], release: Release) -> Op[None]:
        """Hidden marks and dropped items change in transactions checked against
        the thread's record (an archive under way loses its mark, an archived or
        deleted thread stops the prune), then the index is read again and the
        objects only the dropped checkpoints named go. A commit needs its
        parent's link item (``parent_fence``; each goes with its checkpoint's
        item, before the second read): once the drop is in, nothing new reads
        through what went, and what committed before is in the second read."""
        calls = self.calls
        record, entries = yield from self._contents(thread_id)
        cut = yield from plan(entries)
        if not cut.hide and not cut.drop:
            return
        actions = [calls.hide(e) for e in cut.hide]
        # A checkpoint that stays in the history while its parent leaves it is
        # marked first: a global table's replica, which gets items one by one,
        # tells that removal from a parent item not replicated yet (a hole).
        out = {e.key for e in cut.hide} | {e.key for e in cut.drop}
        for e in entries:
            parent = (e.thread_id, e.ns, e.parent_id)
            if e.chained and not e.parent_gone and not e.hidden and e.key not in out and parent in out:
                actions[:0] = calls.mark_parent_gone(e)
        for e in cut.drop:
            keys = [calls.key_of(*e.key), calls.link_key(e)] + [calls.writes_key(w) for w in e.writes or ()]
            actions += [{"Delete": {"TableName": self.table, "Key": k}} for k in keys]
        while actions:
            chunk = actions[:_TRANSACTION_ACTIONS]
            refused = yield from self.transact([*chunk, calls.fence(thread_id, record.gen)], f"prune of thread {thread_id!r}")  # type: ignore[attr-defined]
            if not refused:
                actions = actions[len(chunk) :]
                continue
            code, item = refused[-1]
            if code == "ConditionalCheckFailed":
                now = calls.parse(item) if item else None
                if isinstance(now, Tombstone) and now.archiving is not None and now.archive is None and now.gen == record.gen:
                    yield from self.cancel_archiving(thread_id, now.archiving)  # type: ignore[attr-defined]
                    continue
                _live(now if isinstance(now, Tombstone) else Tombstone(thread_id, None, 0), thread_id)
                return  # deleted meanwhile: nothing of this generation is read any more
            # A checkpoint to hide went meanwhile (another prune): hide the others.
            gone = {i for i, (code, _) in enumerate(refused[:-1]) if code == "ConditionalCheckFailed"}
            actions = [a for i, a in enumerate(chunk) if i not in gone] + actions[len(chunk) :]
        _, staying = yield from self._contents(thread_id)
        yield from release(cut.drop, staying)

    def drop_strays(self, thread_id: str, strays: list[WritesEntry]) -> Op[list[WritesEntry]]:
        """One transaction per checkpoint: its parts go, each while its slot holds
        that token, only while the checkpoint has no item (a put landing first
        keeps them: its writes are its own again)."""
        calls = self.calls
        by_checkpoint: dict[tuple[str, str], list[WritesEntry]] = {}
        for w in strays:
            by_checkpoint.setdefault((w.ns, w.checkpoint_id), []).append(w)
        dropped: list[WritesEntry] = []
        for (ns, checkpoint_id), parts in sorted(by_checkpoint.items()):
            absent = {
                "ConditionCheck": {
                    "TableName": self.table,
                    "Key": calls.key_of(thread_id, ns, checkpoint_id),
                    "ConditionExpression": "attribute_not_exists(#k)",
                    "ExpressionAttributeNames": {"#k": PARTITION_KEY},
                }
            }
            for start in range(0, len(parts), _TRANSACTION_ACTIONS - 1):
                chunk = parts[start : start + _TRANSACTION_ACTIONS - 1]
                deletes = [
                    {
                        "Delete": {
                            "TableName": self.table,
                            "Key": calls.writes_key(w),
                            "ConditionExpression": "#t = :t",
                            "ExpressionAttributeNames": {"#t": "token"},
                            "ExpressionAttributeValues": {":t": {"S": w.token}},
                        }
                    }
                    for w in chunk
                ]
                refused = yield from self.transact([absent, *deletes], f"stray writes of thread {thread_id!r}")  # type: ignore[attr-defined]
                if not refused:
                    dropped += chunk
        return dropped

    def copy_thread(
        self,
        source: str,
        dest: str,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        now: int,
        release: Release,
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[None]:
        """Write the entries of a copy (objects copied already) into ``dest``, marked
        as copies of ``source``: a copy cut short is completed by a call again,
        and anything else in ``dest`` is its own history, which a copy refuses."""
        calls = self.calls
        # The target checked again (nothing of its own came since), beside what an
        # earlier copy cut short left in it (copies of ``source``).
        record, (_, earlier) = yield from gather(self.check_copy_target(source, dest), self._contents(dest))
        _key_fence(record, key_id)
        # A copy cut short leaves whole checkpoints, newest first (their objects
        # were copied before any item); the next call writes them all again.
        yield from self._write_whole(
            dest,
            [replace(e, gen=record.gen) for e in entries],
            [replace(w, gen=record.gen) for w in writes],
            {COPIED_FROM: {"S": calls.pk(source)}},
            f"copies into thread {dest!r}",
        )
        # ... and what an earlier attempt copied that the source holds no more
        # (pruned, its run deleted since) goes: the copy equals the source as read.
        kept = {e.key for e in entries}
        kept_writes = {(w.ns, w.checkpoint_id, w.task_id, w.part) for w in writes}
        stale = [e for e in earlier if e.key not in kept]
        stale_writes = [
            w for e in earlier for w in e.writes or () if (w.ns, w.checkpoint_id, w.task_id, w.part) not in kept_writes
        ]
        if stale or stale_writes:
            keys = [k for e in stale for k in (calls.key_of(*e.key), calls.link_key(e))]
            keys += [calls.writes_key(w) for w in stale_writes]
            yield from self.write_batches([{"DeleteRequest": {"Key": k}} for k in keys], f"stale copies in thread {dest!r}")
        # Every earlier attempt's objects that no entry names now go: the stale
        # entries' and those of the entries just written over (same keys, the
        # objects of this call's fresh tag). A copy run again after it finished
        # leaves no orphan.
        earlier_writes = [w for e in earlier for w in e.writes or ()]
        if earlier or earlier_writes:
            yield from release([*earlier, *earlier_writes], [*entries, *writes])
        runs = sorted({e.run_id for e in entries if e.run_id is not None})
        yield from gather(
            self.note(dest, now, None),  # type: ignore[attr-defined]
            *(self.note(dest, None, r) for r in runs),  # type: ignore[attr-defined]
            self.record_active(dest, record.gen, active),  # type: ignore[attr-defined]
        )

    def check_copy_target(self, source: str, dest: str) -> Op[Tombstone]:
        """The target's record; refuses a target archived, or holding checkpoints of
        its own (copies of ``source`` an earlier call left are not its own)."""
        calls = self.calls
        page, found = yield from request(calls.query(dest, not_copied_from=calls.pk(source)), calls.get_tombstone(dest))
        record = _thread_item(calls, found)
        if record.archive is not None:
            raise ConfigurationError(f"thread {dest!r} is archived (table {self.table}); copy_thread copies into an empty thread")
        while True:
            own = [i for i in map(calls.parse, page.get("Items", [])) if i is not None and i.gen >= record.gen]  # type: ignore[union-attr]
            if own:
                raise ConfigurationError(
                    f"thread {dest!r} already has checkpoints of its own in table {self.table}; copy_thread "
                    "copies into an empty thread (delete_thread it first)"
                )
            if "LastEvaluatedKey" not in page:
                return record
            page = yield from request_one(calls.query(dest, not_copied_from=calls.pk(source), start_key=page["LastEvaluatedKey"]))


def _answer(call: Any) -> Op[Any]:
    """One call's answer, a failure included (the caller decides)."""
    (result,) = yield (call,)
    return result


def _is_older(entry: Any, gen: int) -> bool:
    """A checkpoint, link or writes item of a generation the delete removes, or a
    namespace's tombstone (earlier versions' deletes wrote them)."""
    if isinstance(entry, Tombstone):
        return entry.ns is not None
    return isinstance(entry, (CheckpointEntry, WritesEntry, Link)) and entry.gen < gen


def _key_fence(record: Tombstone, key_id: str | None) -> None:
    """A whole history written (import, copy) checks the key it is sealed under on the
    record read at the start of its write (no request of its own): an erase of the
    thread since the operation read its key destroyed it (``Fenced``, nothing written).
    An erase after this read bumps the generation the entries are written under:
    they are never read (``_items``)."""
    if key_id is not None and key_id in record.gone_keys:
        raise Fenced(record)
