"""An archived thread read as an index: every read answered from its archive, no request.

``_ops.archive`` reads an archive object once (one GET), decodes it, and runs the
same read operations (get_tuple, list, the delta walk) against this index: each
entry carries its checkpoint record and its writes, and the blobs are held here
(``held_blobs``), so the resolver fetches nothing. Writes never reach it: a
write to an archived thread restores the thread first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from s3_saver._format.archive import Archive
from s3_saver._format.codec import BLOB_FORMAT, CHECKPOINT_FORMAT, unpack
from s3_saver._format.entries import (
    ArchiveRef,
    CheckpointEntry,
    Key3,
    Tombstone,
    WritesEntry,
)
from s3_saver._format.keys import KeyLayout
from s3_saver._index.base import (
    Index,
)
from s3_saver._index.terms import (
    DepthHint,
    Holdings,
    Prepared,
    ThreadRef,
    WritesOutcome,
)
from s3_saver._transport.budget import KEY_BYTES, entry_bytes
from s3_saver._transport.protocol import Op
from s3_saver.errors import ThreadArchivedError


class ArchiveIndex(Index):
    local_lookups = True

    def __init__(self, archive: Archive, ref: ArchiveRef, layout: KeyLayout, bucket: str) -> None:
        self.ref = ref
        self.thread_id = archive.thread_id
        self._where = f"archive s3://{bucket}/{ref.key}"
        self._entries = archive.entries
        self._by_key = {e.key: e for e in archive.entries}
        self._blobs = {
            layout.blob_key(archive.thread_id, ns, ch, version, cid): unpack(body, BLOB_FORMAT, f"{self._where}: blob {ch}")
            for (ns, ch, version, cid), body in archive.blobs.items()
        }
        self._records = {
            layout.checkpoint_key(archive.thread_id, ns, cid): unpack(body, CHECKPOINT_FORMAT, f"{self._where}: checkpoint {cid}")
            for (ns, cid), body in archive.records.items()
        }
        # What it holds, estimated for the cache budget (``Context.archives``):
        # the entries with their bodies, and each record's decoded bytes.
        held = [*archive.entries, *archive.writes]
        decoded = [*archive.blobs.values(), *archive.records.values()]
        self.size = sum(map(entry_bytes, held)) + sum(len(b) + KEY_BYTES for b in decoded)

    def describe(self) -> str:
        return self._where

    def held_blobs(self) -> dict[str, dict[str, Any]]:
        return self._blobs

    def held_records(self) -> dict[str, dict[str, Any]]:
        return self._records

    # -- reads -----------------------------------------------------------------------
    def _visible(self, thread_id: str, ns: str | None) -> list[CheckpointEntry]:
        if thread_id != self.thread_id:
            return []
        return [e for e in self._entries if not e.hidden and (ns is None or e.ns == ns)]

    def latest(self, thread_id: str, ns: str) -> Op[CheckpointEntry | None]:
        yield from ()
        newest = max(self._visible(thread_id, ns), key=lambda e: e.checkpoint_id, default=None)
        return _copy(newest)

    def get(self, thread_id: str, ns: str, checkpoint_id: str) -> Op[CheckpointEntry | None]:
        yield from ()
        entry = self._by_key.get((thread_id, ns, checkpoint_id))
        return None if entry is None or entry.hidden else _copy(entry)

    def writes(self, entry: CheckpointEntry) -> Op[list[WritesEntry]]:
        yield from ()
        own = self._by_key.get(entry.key)
        return list(own.writes or []) if own is not None else []

    def entries(self, keys: list[Key3]) -> Op[dict[Key3, CheckpointEntry | None]]:
        yield from ()
        return {k: _copy(self._by_key.get(k)) for k in keys}

    def history(
        self, thread_id: str, ns: str | None, before_id: str | None, page_size: int | None, cursor: Any
    ) -> Op[tuple[list[CheckpointEntry], Any]]:
        yield from ()
        page = [e for e in self._visible(thread_id, ns) if before_id is None or e.checkpoint_id < before_id]
        page.sort(key=lambda e: (e.ns, e.checkpoint_id), reverse=True)
        return [_copy(e) for e in page], None  # type: ignore[misc]

    def ancestors(
        self, thread_id: str, ns: str, checkpoint_id: str, channels: set[str], depth_hint: DepthHint | None = None
    ) -> Op[tuple[CheckpointEntry | None, list[CheckpointEntry]]]:
        yield from ()
        target = self._by_key.get((thread_id, ns, checkpoint_id))
        if target is None or target.hidden:
            return None, []
        chain: list[CheckpointEntry] = []
        unseeded = set(channels)
        cursor = target.parent_id
        while cursor is not None and unseeded and (thread_id, ns, cursor) in self._by_key:
            entry = self._by_key[(thread_id, ns, cursor)]
            chain.append(_copy(entry))  # type: ignore[arg-type]
            unseeded -= set(entry.loc)
            cursor = entry.parent_id
        return _copy(target), chain

    def contents(self, thread_id: str) -> Op[list[CheckpointEntry]]:
        yield from ()
        return [_copy(e) for e in self._entries] if thread_id == self.thread_id else []  # type: ignore[misc]

    def committed(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], list[WritesEntry]]]:
        # An archive holds its checkpoints' writes only: an archive is made of
        # what the thread's checkpoints name.
        return (yield from self.contents(thread_id)), []

    # -- what an archive does not do: it is read-only, and holds one thread ------------------
    def _refuse(self, what: str) -> ThreadArchivedError:
        return ThreadArchivedError(
            f"{what} on thread {self.thread_id!r}, read from its {self._where}: archives are read-only",
            self.thread_id,
            self.ref.storage_class,
            self.ref.key,
        )

    def setup(self, bucket: str, bucket_region: str | None, ttl: bool) -> Op[None]:
        raise self._refuse("setup")

    def prepare(
        self,
        thread_id: str,
        ns: str,
        parent_id: str | None,
        list_at: int | None = None,
        gen: int | None = None,
        active: int | None = None,
    ) -> Op[Prepared]:
        raise self._refuse("a write")

    def commit_checkpoint(
        self,
        entry: CheckpointEntry,
        created: int | None = None,
        parent_tag: str | None = None,
        active: Any = None,
        key_id: str | None = None,
    ) -> Op[None]:
        raise self._refuse("a write")

    def touch(self, thread_id: str, day: int) -> Op[None]:
        raise self._refuse("a write")

    def stage_active(self, thread_id: str, day: int) -> Op[Any]:
        raise self._refuse("a write")

    def untouch(self, entry: Any) -> Op[None]:
        raise self._refuse("a write")

    def active_page(self, cursor: dict[str, str], until: int, size: int) -> Op[list[Any]]:
        raise self._refuse("archive_idle")

    def drop_active(self, entries: list[Any]) -> Op[None]:
        raise self._refuse("archive_idle")

    def load_cursor(self, name: str) -> Op[dict[str, str]]:
        raise self._refuse("archive_idle")

    def save_cursor(self, name: str, cursor: dict[str, str]) -> Op[None]:
        raise self._refuse("archive_idle")

    def erase_activity(self, thread_id: str, days: list[int]) -> Op[list[str]]:
        raise self._refuse("erase_thread")

    def activity_since(self, thread_id: str) -> Op[tuple[int, int]]:
        raise self._refuse("erase_thread")

    def note(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        raise self._refuse("a write")

    def commit_writes(self, entries: list[WritesEntry], key_id: str | None = None) -> Op[WritesOutcome]:
        raise self._refuse("a write")

    def unnote(self, thread_id: str, created: int | None, run_id: str | None) -> Op[None]:
        raise self._refuse("a write")

    def threads(self, before: ThreadRef | None, page_size: int, cursor: Any) -> Op[tuple[list[Any], Any]]:
        raise self._refuse("listing threads")

    def created(self, thread_id: str) -> Op[int | None]:
        raise self._refuse("the thread listing")

    def runs(self, run_ids: list[str]) -> Op[dict[str, list[str]]]:
        raise self._refuse("finding runs")

    def bury_runs(self, thread_id: str, run_ids: list[str]) -> Op[None]:
        raise self._refuse("delete_for_runs")

    def forget_runs(self, pairs: list[tuple[str, str]]) -> Op[None]:
        raise self._refuse("delete_for_runs")

    def all_threads(self) -> Op[list[CheckpointEntry]]:
        raise self._refuse("list(None)")

    def restore(
        self,
        thread_id: str,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        created: int,
        active: Any = None,
        key_id: str | None = None,
    ) -> Op[None]:
        raise self._refuse("rebuild_index")

    def delete_thread(self, thread_id: str, now: int, release: Any, gone: frozenset[str] = frozenset()) -> Op[None]:
        raise self._refuse("delete_thread")

    def drop(self, thread_id: str, plan: Any, release: Any) -> Op[None]:
        raise self._refuse("prune")

    def drop_strays(self, thread_id: str, strays: list[WritesEntry]) -> Op[list[WritesEntry]]:
        raise self._refuse("collect_garbage")

    def copy_thread(
        self, source: str, dest: str, entries: Any, writes: Any, now: int, release: Any, active: Any = None,
        key_id: str | None = None,
    ) -> Op[None]:
        raise self._refuse("copy_thread")

    def check_copy_target(self, source: str, dest: str) -> Op[Any]:
        raise self._refuse("copy_thread")

    def archive_of(self, thread_id: str) -> Op[Tombstone]:
        raise self._refuse("archive_thread")

    def mark_archive(self, thread_id: str, key: str) -> Op[str | None]:
        raise self._refuse("archive_thread")

    def snapshot(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], Any]]:
        raise self._refuse("archive_thread")

    def switch_archive(self, thread_id: str, ref: ArchiveRef, snapshot: Any) -> Op[bool]:
        raise self._refuse("archive_thread")

    def finish_archive(self, thread_id: str, ref: ArchiveRef, release: Any) -> Op[None]:
        raise self._refuse("archive_thread")

    def unarchive(
        self,
        thread_id: str,
        ref: ArchiveRef,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        active: Any = None,
        key_id: str | None = None,
    ) -> Op[None]:
        raise self._refuse("restore_thread")

    def cancel_archiving(self, thread_id: str, key: str) -> Op[None]:
        raise self._refuse("a write")

    def forget_archive(self, thread_id: str, key: str) -> Op[None]:
        raise self._refuse("restore_thread")

    def holdings(self, thread_id: str) -> Op[Holdings]:
        raise self._refuse("audit")


def _copy(entry: CheckpointEntry | None) -> CheckpointEntry | None:
    # Callers may set an entry's writes; the archive's own stay as read.
    return None if entry is None else replace(entry, writes=list(entry.writes or []))
