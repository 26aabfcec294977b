"""What the upkeep operations ask of an index: a thread archived and restored, the activity
entries archive_idle walks by day (which writes record), an erase's records, and what a
thread holds for the audit. Part of the interface, Index, which extends it (base).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from s3_saver._format.entries import (
    Activity,
    ArchiveRef,
    CheckpointEntry,
    Tombstone,
    WritesEntry,
)
from s3_saver._index.terms import (
    Holdings,
    Release,
)
from s3_saver._transport.protocol import Op


class Upkeep(ABC):
    """The upkeep half of the index interface (``Index`` extends it)."""

    # -- archive -----------------------------------------------------------------------
    @abstractmethod
    def archive_of(self, thread_id: str) -> Op[Tombstone]:
        """The thread's own record: ``archive`` (None: live), ``stale_archive``, marks."""

    @abstractmethod
    def mark_archive(self, thread_id: str, key: str) -> Op[str | None]:
        """Record, before anything is read or written, the archive object ``key``
        an archive of the thread is about to write: a commit from now on makes
        ``switch_archive`` fail. Returns the key of an earlier mark it replaced
        (an archive cut short, or racing: its object is the caller's to delete).
        Raises ThreadArchivedError when the thread is archived or being restored."""

    @abstractmethod
    def snapshot(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], Any]]:
        """Every checkpoint of the thread (hidden and expired ones included) with
        its writes, and what ``switch_archive`` needs to know they are still all."""

    @abstractmethod
    def switch_archive(self, thread_id: str, ref: ArchiveRef, snapshot: Any) -> Op[bool]:
        """The archive's commit point: the thread reads from ``ref`` from now on,
        if the mark of ``ref.key`` is still there and nothing was committed since
        ``snapshot``; False (nothing changed) otherwise."""

    @abstractmethod
    def finish_archive(self, thread_id: str, ref: ArchiveRef, release: Release) -> Op[None]:
        """Remove what is left of the live thread archived in ``ref`` (entries, and
        the objects they name), unless a restore began. A call again finishes it."""

    @abstractmethod
    def unarchive(
        self,
        thread_id: str,
        ref: ArchiveRef,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[bool]:
        """Install the entries read back from ``ref`` (their objects are written,
        under a tag no cleanup deletes) and take the archive out, in that order
        (the commit point), with ``ref``'s object left to delete (``stale_archive``).
        False: another restore switched first, or a delete took the archive out
        (what this one wrote may be named by nothing). ``active``: the activity
        entry ``stage_active`` made, recorded by the switch itself (as
        ``commit_checkpoint`` records a write's): a delete or an archive after
        it removes that entry. ``key_id`` (encryption): the key the entries'
        objects are sealed under, checked by the switch itself (no request of its
        own, as ``restore`` and ``copy_thread`` check theirs): refused (``Fenced``)
        when the thread's record says an erase destroyed it, and then whenever a
        refused switch finds the record naming it (the erase's delete took the
        archive out)."""

    @abstractmethod
    def cancel_archiving(self, thread_id: str, key: str) -> Op[None]:
        """Take an archive's mark off (a commit found it): that archive does not switch."""

    @abstractmethod
    def forget_archive(self, thread_id: str, key: str) -> Op[None]:
        """Drop ``key`` from ``stale_archive`` (once its object is deleted), if it is there."""

    # -- activity entries (``_ops/idle``: archive_idle walks them by day) ------------------
    # Delete only what you read: every entry written has a token of its own, and
    # every delete of an entry names the token it read (``Activity.token``). A
    # delete by day and thread alone would remove another process's entry written
    # after the read (a restore's, a new life's), which that process, remembering
    # its write of the day, would not write again: the thread would stay live,
    # never examined again, until written on a later day.
    @abstractmethod
    def touch(self, thread_id: str, day: int) -> Op[None]:
        """Write a new activity entry of the thread on ``day`` by itself (an install,
        the backfill): its own token, whatever entries the day has already."""

    @abstractmethod
    def stage_active(self, thread_id: str, day: int) -> Op[Activity]:
        """A new activity entry of the thread on ``day`` (its own token) for a
        restore, an import or a copy to record with its commit (``unarchive``,
        ``restore``, ``copy_thread`` take it), as ``prepare`` stages a write's:
        the manifest writes its object here, in the wave of the call's own
        objects (a head never names an entry that was not written); a table
        writes its item in the commit's transaction (nothing is sent here)."""

    @abstractmethod
    def untouch(self, entry: Activity) -> Op[None]:
        """Take back the activity entry that ``prepare`` (or ``stage_active``)
        wrote for a write then refused, unless the thread's record names it."""

    @abstractmethod
    def active_page(self, cursor: dict[str, str], until: int, size: int) -> Op[list[Activity]]:
        """Activity entries after ``cursor`` (a position per shard, see
        ``Activity.shard``) of days up to ``until``, oldest day first, at most
        ``size`` per shard read; [] when none is left."""

    @abstractmethod
    def drop_active(self, entries: list[Activity]) -> Op[None]:
        """Remove activity entries (stale ones, those of archived threads), each only
        as read: with its token (another entry of the same day and thread stays)."""

    @abstractmethod
    def load_cursor(self, name: str) -> Op[dict[str, str]]:
        """A persisted cursor of ``archive_idle`` ({}: none yet)."""

    @abstractmethod
    def save_cursor(self, name: str, cursor: dict[str, str]) -> Op[None]:
        """Persist a cursor (last writer wins: a run only moves it over entries it
        processed, so either of two racing runs' cursors is right)."""

    @abstractmethod
    def activity_since(self, thread_id: str) -> Op[tuple[int, int]]:
        """When the thread was listed (0: it is not) and the first day (yyyymmdd)
        whose activity entry a write recorded, in any of its lives (0: none known):
        where ``erase_thread`` starts looking for its entries (``idle.activity_span``)."""

    @abstractmethod
    def erase_activity(self, thread_id: str, days: list[int]) -> Op[list[str]]:
        """Remove the thread's activity entries of ``days``, every one found (read
        first, then deleted as read); returns the bucket keys under which they
        were (their older versions are ``erase_thread``'s; a table: none)."""

    # -- erase -------------------------------------------------------------------------
    def erase_hints(self, thread_id: str) -> Op[list[str]]:
        """Bucket keys outside the thread's own prefixes that name it (its listing
        and run hints), as the index knows them now: ``erase_thread`` removes
        every version of them. A table keeps these records as items, which
        ``delete_thread`` removes for good: none."""
        return []
        yield  # pragma: no cover - makes this a generator

    # -- audit -------------------------------------------------------------------------
    @abstractmethod
    def holdings(self, thread_id: str) -> Op[Holdings]:
        """Everything the index holds of one thread, tombstoned, hidden, expired and
        archived included, and the index's own objects; a damaged index raises
        (``CorruptObjectError``, ``MissingObjectError``)."""
