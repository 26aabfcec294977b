"""The manifest index's side of archival: the head's ``archive`` reference.

Archiving is read-decide-act fenced at the commit: the archive object's key is
recorded in the head first (``archiving``: the next archive, or a delete, finds
the object of one cut short), the thread is read (``snapshot``: the entries and
the exact head they came from), and the switch is one compare-and-swap of
exactly that head (``IfMatch`` its ETag): any commit since the read changed the
head, and the switch fails. The archived entries and segments go to the graveyard,
whose objects are deleted after (``finish_archive``). Restoring is one swap
back: the archive's entries, written under a fresh tag, come in with the
reference out, and the archive object waits in ``stale_archive`` until deleted.

Mixed into ``ManifestIndex`` (``ManifestArchive``), as ``lifecycle`` is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from s3_saver._format.entries import (
    SPECIAL_PART,
    Activity,
    ArchiveRef,
    CheckpointEntry,
    Tombstone,
    WritesEntry,
)
from s3_saver._index.manifest.doc import Head, _tips, record_of, with_active
from s3_saver._index.terms import Fenced, Release
from s3_saver._transport.protocol import Op
from s3_saver.errors import ThreadArchivedError


class ManifestArchive:
    """The archive reference in the head, for ``ManifestIndex``."""

    # From ManifestIndex: _read_head, _live_head, _cached, _swap, _update,
    # _contents, _clear_graveyard, describe.

    def archive_of(self, thread_id: str) -> Op[Tombstone]:
        head = yield from self._read_head(thread_id)  # type: ignore[attr-defined]
        return record_of(head)

    def mark_archive(self, thread_id: str, key: str) -> Op[str | None]:
        previous: list[str | None] = [None]

        def mark(h: Head) -> Head | None:
            if h.archive is not None:
                raise _busy(thread_id, h, self.describe())  # type: ignore[attr-defined]
            previous[0] = h.archiving if h.archiving != key else None
            return None if h.archiving == key else replace(h, archiving=key)

        yield from self._update(thread_id, mark, self._cached(thread_id))  # type: ignore[attr-defined]
        return previous[0]

    def snapshot(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], Any]]:
        # Right after mark_archive, this process's last head is the one its mark
        # wrote (no GET): a commit since then makes the switch's swap fail anyway.
        head = self._cached(thread_id)  # type: ignore[attr-defined]
        if head is None or head.archive is not None:
            head = yield from self._live_head(thread_id)  # type: ignore[attr-defined]
        return (yield from self._contents(head)), head  # type: ignore[attr-defined]

    def switch_archive(self, thread_id: str, ref: ArchiveRef, snapshot: Any) -> Op[bool]:
        head: Head = snapshot
        if head.archive is not None or head.archiving != ref.key:
            return False  # the head was read before the mark, or another call's mark came
        new = replace(
            head,
            entries=[],
            writes=[],
            segments=[],
            graveyard=[*head.graveyard, *head.entries, *head.writes],
            graveyard_segments=[*head.graveyard_segments, *head.segments],
            archive=ref,
            archiving=None,  # the object is the archive now
        )
        # The commit point: the head the archive was read from, or nothing.
        if (yield from self._swap(head, new)):  # type: ignore[attr-defined]
            return True
        # Refused, or applied and its answer lost (the retry then meets its own
        # swap): the head says which.
        now = yield from self._read_head(thread_id)  # type: ignore[attr-defined]
        return now.archive is not None and now.archive.key == ref.key

    def finish_archive(self, thread_id: str, ref: ArchiveRef, release: Release) -> Op[None]:
        # The head this process switched, when it did (a stale one fails its swap and is read again).
        head = self._cached(thread_id)  # type: ignore[attr-defined]
        if head is None or head.archive is None or head.archive.key != ref.key:
            head = yield from self._read_head(thread_id)  # type: ignore[attr-defined]
        if head.archive is not None and head.archive.key == ref.key:
            yield from self._clear_graveyard(head, release, unlist=False)  # type: ignore[attr-defined]

    def unarchive(
        self,
        thread_id: str,
        ref: ArchiveRef,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[bool]:
        # The swap that switches also records ``active`` (its object is written):
        # a delete or an archive after it removes that entry by its key.
        switched = [False]

        def install(h: Head) -> Head | None:
            switched[0] = False
            # Invariant (erase): nothing sealed under a key an erase destroyed is indexed
            # after the erase's switch. Checked in the swap itself, before "restored
            # already": an erase took the archive out too, and the restore says so.
            if key_id is not None and key_id in h.gone_keys:
                raise Fenced(record_of(h))
            if h.archive is None:
                return None  # restored already (another call, or this one's swap answered with a failure)
            if h.archive.key != ref.key:
                raise ThreadArchivedError(
                    f"thread {thread_id!r} was archived again in {h.archive.key} meanwhile ({self.describe()})",  # type: ignore[attr-defined]
                    thread_id,
                )
            # Bodies only where "latest" reads them, as a head that grew write by write
            # has them: the segments sealed from these stay as small as before the archive.
            # What an earlier version parked under the reference (commits did not
            # check it then) was committed after the archive: it comes after.
            own = {(e.ns, e.checkpoint_id) for e in entries}
            tips = _tips(entries)
            switched[0] = True
            restored = [replace(w, gen=h.gen, body=w.body if (w.ns, w.checkpoint_id) in tips else None) for w in writes]
            new = replace(
                h,
                entries=[
                    replace(e, gen=h.gen, writes=[], body=e.body if (e.ns, e.checkpoint_id) in tips else None)
                    for e in entries
                ]
                + [e for e in h.entries if (e.ns, e.checkpoint_id) not in own],
                writes=_after(restored, h.writes),
                segments=[],
                archive=None,
                stale_archive=ref.key,
            )
            return with_active(new, active)

        yield from self._update(thread_id, install)  # type: ignore[attr-defined]
        return switched[0]

    def cancel_archiving(self, thread_id: str, key: str) -> Op[None]:
        """Take an archive's mark off (the archive that did not switch: a commit
        needs no such thing here, its swap changes the head the switch needs)."""

        def cancel(h: Head) -> Head | None:
            return replace(h, archiving=None) if h.archiving == key else None

        yield from self._update(thread_id, cancel)  # type: ignore[attr-defined]

    def forget_archive(self, thread_id: str, key: str) -> Op[None]:
        def forget(h: Head) -> Head | None:
            return replace(h, stale_archive=None) if h.stale_archive == key else None

        yield from self._update(thread_id, forget)  # type: ignore[attr-defined]


def _after(first: list[WritesEntry], then: list[WritesEntry]) -> list[WritesEntry]:
    """Pending-write parts committed in this order, one per slot: a regular
    part's first commit wins, a special channel's last (as ``commit_writes``)."""
    slots: dict[tuple[str, str, str, str], WritesEntry] = {}
    for w in [*first, *then]:
        slot = (w.ns, w.checkpoint_id, w.task_id, w.part)
        if slot not in slots or w.part.startswith(SPECIAL_PART):
            slots[slot] = w
    return list(slots.values())


def _busy(thread_id: str, h: Head, where: str) -> ThreadArchivedError:
    return ThreadArchivedError(f"cannot archive thread {thread_id!r}: it is archived in {h.archive.key} ({where})", thread_id)  # type: ignore[union-attr]
