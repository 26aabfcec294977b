"""The manifest index's side of archival: the head's ``archive`` reference.

Archiving is one head swap: the reference goes in, the archived entries and
segments go to the graveyard (their objects are deleted after, by the
graveyard's usual clearing), so readers switch from the live objects to the
archive at once. Restoring is one swap back: the archive's entries (sealed
again into segments as the head needs) come in with the reference out, and the
archive object goes to ``stale_archive`` until it is deleted. A write that
raced the archive's swap stays in the head, parked: readers see the archive
until the restore brings both together.

Mixed into ``ManifestIndex`` (``ManifestArchive``), as ``manifest_lifecycle`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from s3_saver._index.base import ArchiveRef, CheckpointEntry, Tombstone, WritesEntry
from s3_saver._index.manifest_doc import Head, _tips
from s3_saver._protocol import Op
from s3_saver.errors import ThreadArchivedError


class _Changed(Exception):
    """The thread's sealed history changed since it was read for the archive."""


class ManifestArchive:
    """The archive reference in the head, for ``ManifestIndex``."""

    # From ManifestIndex: _read_head, _cached, _update, _clear_graveyard, describe.

    def archive_of(self, thread_id: str) -> Op[Tombstone]:
        head = yield from self._read_head(thread_id)  # type: ignore[attr-defined]
        return Tombstone(thread_id, None, head.gen, created=head.created, archive=head.archive, stale_archive=head.stale_archive)

    def archive(
        self,
        thread_id: str,
        ref: ArchiveRef,
        archived: list[CheckpointEntry] | None,
        delete_objects: Callable[[list[Any]], Op[None]],
        known: list[CheckpointEntry] | None = None,
    ) -> Op[None]:
        # The graveyard knows exactly what goes: ``known`` is not needed here.
        if archived is None:
            head = yield from self._read_head(thread_id)  # type: ignore[attr-defined]
            if head.archive is not None and head.archive.key == ref.key:
                yield from self._clear_graveyard(head, delete_objects, unlist=False)  # type: ignore[attr-defined]
            return
        read = self._cached(thread_id)  # type: ignore[attr-defined]  # the head ``contents`` was read from
        keys = {(e.ns, e.checkpoint_id) for e in archived}
        writes = {_write_key(w) for e in archived for w in e.writes or ()}

        def switch(h: Head) -> Head | None:
            if h.archive is not None and h.archive.key == ref.key:
                return None  # our own swap, applied by an earlier attempt
            if h.archive is not None or h.stale_archive != ref.key:
                raise self._busy(thread_id, h)  # archived, or intend_archive's mark is another call's
            if read is None or h.segments != read.segments:
                raise _Changed()
            return replace(
                h,
                # What came since the read stays, parked under the reference.
                entries=[e for e in h.entries if (e.ns, e.checkpoint_id) not in keys],
                writes=[w for w in h.writes if _write_key(w) not in writes],
                segments=[],
                graveyard=[
                    *h.graveyard,
                    *(e for e in h.entries if (e.ns, e.checkpoint_id) in keys),
                    *(w for w in h.writes if _write_key(w) in writes),
                ],
                graveyard_segments=[*h.graveyard_segments, *h.segments],
                archive=ref,
                stale_archive=None,  # intend_archive's mark: the object is the archive now
            )

        try:
            # The commit point: from this swap on, every read goes to the archive.
            head = yield from self._update(thread_id, switch, read)  # type: ignore[attr-defined]
        except _Changed:
            # The archive written for this attempt is referenced by nothing: it goes.
            yield from delete_objects([ref])
            yield from self.forget_archive(thread_id, ref.key)
            raise ThreadArchivedError(
                f"thread {thread_id!r} was written to while it was being archived ({self.describe()}); "  # type: ignore[attr-defined]
                "nothing was archived: call archive_thread again",
                thread_id,
            ) from None
        yield from self._clear_graveyard(head, delete_objects, unlist=False)  # type: ignore[attr-defined]

    def unarchive(
        self, thread_id: str, ref: ArchiveRef, entries: list[CheckpointEntry], writes: list[WritesEntry]
    ) -> Op[None]:
        def install(h: Head) -> Head | None:
            if h.archive is None:
                return None  # restored already (a call again after the swap)
            if h.archive.key != ref.key:
                raise ThreadArchivedError(
                    f"thread {thread_id!r} was archived again in {h.archive.key} meanwhile ({self.describe()})",  # type: ignore[attr-defined]
                    thread_id,
                )
            # Writes parked under the reference come after the archive's own
            # (a rebuilt index may hold the archive's entries again: once is enough).
            own = {(e.ns, e.checkpoint_id) for e in entries}
            own_writes = {_write_key(w) for w in writes}
            # Bodies only where "latest" reads them, as a head that grew write by write
            # has them: the segments sealed from these stay as small as before the archive.
            tips = _tips(entries)
            return replace(
                h,
                entries=[
                    replace(e, gen=h.gen, writes=[], body=e.body if (e.ns, e.checkpoint_id) in tips else None)
                    for e in entries
                ]
                + [e for e in h.entries if (e.ns, e.checkpoint_id) not in own],
                writes=[replace(w, gen=h.gen, body=w.body if (w.ns, w.checkpoint_id) in tips else None) for w in writes]
                + [w for w in h.writes if _write_key(w) not in own_writes],
                segments=[],
                archive=None,
                stale_archive=ref.key,
            )

        yield from self._update(thread_id, install, self._cached(thread_id))  # type: ignore[attr-defined]

    def intend_archive(self, thread_id: str, key: str) -> Op[None]:
        def intend(h: Head) -> Head | None:
            if h.archive is not None or h.stale_archive not in (None, key):
                raise self._busy(thread_id, h)
            return None if h.stale_archive == key else replace(h, stale_archive=key)

        yield from self._update(thread_id, intend, self._cached(thread_id))  # type: ignore[attr-defined]

    def _busy(self, thread_id: str, h: Head) -> ThreadArchivedError:
        if h.archive is not None:
            why = f"it is archived in {h.archive.key}"
        else:
            why = f"another archive or restore of it is under way (archive object {h.stale_archive}); call again"
        return ThreadArchivedError(f"cannot archive thread {thread_id!r}: {why} ({self.describe()})", thread_id)  # type: ignore[attr-defined]

    def forget_archive(self, thread_id: str, key: str) -> Op[None]:
        def forget(h: Head) -> Head | None:
            return replace(h, stale_archive=None) if h.stale_archive == key else None

        yield from self._update(thread_id, forget, self._cached(thread_id))  # type: ignore[attr-defined]


def _write_key(w: WritesEntry) -> tuple[str, str, str, str, str]:
    return (w.ns, w.checkpoint_id, w.task_id, w.part, w.token)
