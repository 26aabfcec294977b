"""The manifest index's lifecycle: a thread changed as a whole.

Restore a thread, delete it, drop pruned checkpoints (emptying the graveyard after) and copy
a thread. A thread as the index reads it (setup, contents, listings, runs) is ``threads``;
``ManifestIndex`` mixes both in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from s3_saver._format.entries import Activity, ArchiveRef, CheckpointEntry, WritesEntry
from s3_saver._format.keys import KeyLayout
from s3_saver._index.manifest.doc import Head, SegmentRef, record_of, with_active
from s3_saver._index.manifest.seal import _MAX_SWAPS, Bodies, _apply_seal, _plan_seal
from s3_saver._index.manifest.threads import _delete_keys
from s3_saver._index.terms import Cut, Fenced, Release
from s3_saver._transport.protocol import Op, gather
from s3_saver._transport.s3 import S3Calls, put_immutable
from s3_saver.errors import (
    ConfigurationError,
    S3SaverError,
)


class ManifestLifecycle:
    """The store's setup and the operations on a thread as a whole, for ``ManifestIndex``."""

    # What these methods rely on, from ManifestIndex: the attributes its __init__
    # sets, and its methods describe, note, _read_head, _cached, _swap, _update,
    # _load_segments and _latest_in, and _limits.
    s3: S3Calls
    layout: KeyLayout
    bodies: Bodies

    def restore(
        self,
        thread_id: str,
        entries: list[CheckpointEntry],
        writes: list[WritesEntry],
        created: int,
        active: Activity | None = None,
        key_id: str | None = None,
    ) -> Op[None]:
        head = yield from self._read_head(thread_id)
        # What an interrupted delete buried stays deleted.
        buried = {_grave_key(e) for e in head.graveyard}
        entries = sorted((e for e in entries if _grave_key(e) not in buried), key=lambda e: (e.checkpoint_id, e.ns))
        writes = [w for w in writes if _grave_key(w) not in buried]

        def install(h: Head) -> Head | None:
            _key_fence(h, key_id)
            # ``active`` (its object written) is recorded by the same swap.
            new = replace(
                h,
                entries=[replace(e, gen=h.gen, writes=[]) for e in entries],
                writes=[replace(w, gen=h.gen) for w in writes],
                segments=[],
                created=h.created or created,
            )
            return with_active(new, active)

        yield from self._install(head, install)

    # -- delete, prune and copy ----------------------------------------------------------
    def delete_thread(self, thread_id: str, now: int, release: Release, gone: frozenset[str] = frozenset()) -> Op[None]:
        """One swap makes the thread gone (the next generation, no entries); its old
        entries and segments wait in the head's graveyard until their objects are
        deleted, so a delete cut short is finished by the next one. What stays is
        the head alone: the generation and when it was deleted (and ``gone``, an
        erase's destroyed key ids: see ``Index.delete_thread``)."""
        head = yield from self._read_head(thread_id)
        if head.etag is None and not gone:
            return  # nothing was ever stored: leave no trace

        marked: list[str | None] = [None]

        def bury(h: Head) -> Head | None:
            marked[0] = h.archiving
            return Head(
                thread_id,
                version=h.version,
                gen=h.gen + 1,
                deleted_at=now,
                graveyard=[*h.graveyard, *h.entries, *h.writes],
                graveyard_segments=[*h.graveyard_segments, *h.segments],
                retired=h.retired,
                # Not listed from now on (a run that starts it afresh lists it anew);
                # its listing object is removed once the head says where it is.
                unlisting=h.created or h.unlisting,
                # An archived thread's archive goes with the rest.
                stale_archive=h.archive.key if h.archive is not None else h.stale_archive,
                # Its runs too: the archive reference was all that named them, and
                # this swap takes it out. Kept here until their hints are gone
                # (``_clear_graveyard``), so a delete cut short after this swap
                # and called again still finds (and, versioned, records) them.
                stale_runs=sorted({*h.stale_runs, *(h.archive.runs if h.archive is not None else [])}),
                # Its activity entries (day and tokens), until they are removed (below).
                active=h.active,
                active_tokens=h.active_tokens,
                # The entries of earlier days wait for archive_idle's walk (a
                # versioned bucket keeps them after): an erase looks from here.
                since=h.since,
                # The erase's destroyed keys, in the switch: no commit under one after it.
                gone_keys=sorted({*h.gone_keys, *gone}),
            )

        head = yield from self._update(thread_id, bury, head)
        if marked[0] is not None:
            # An archive under way (its switch now fails) or cut short: its object goes.
            yield from release([ArchiveRef(marked[0], "", 0, 0, {})], [])
        runs = {e.run_id for e in head.graveyard if isinstance(e, CheckpointEntry) and e.run_id is not None}
        runs.update(head.stale_runs)
        for entries, _ in (yield from self._load_segments(thread_id, head.graveyard_segments, buried=True)):
            runs.update(e.run_id for e in entries if e.run_id is not None)
        # The records that find the thread go first, while the head still names them
        # (the graveyard's runs, ``unlisting``): a delete cut short finds them again.
        # Versioned, their keys are recorded for an erase first (``_unname``): the
        # thread's next life's head names none of them.
        hints = [self.layout.run_key(r, thread_id) for r in sorted(runs)]
        listing = [self.layout.listing_key(head.unlisting, thread_id)] if head.unlisting else []
        # The activity entries the head names, by their keys (their tokens): only
        # those (another entry of the thread waits for the walk, or an erase).
        listing += [self.entry_key(a) for a in record_of(head).named_entries()]  # type: ignore[attr-defined]
        yield from self._unname({thread_id: hints + listing})
        yield from self._clear_graveyard(head, release, unlist=True)

    def drop(self, thread_id: str, plan: Callable[[list[CheckpointEntry]], Op[Cut]], release: Release) -> Op[None]:
        """One swap installs the thread's history without the dropped checkpoints
        (in new segments and head; the old segments retire), the dropped ones in
        the graveyard until their objects are deleted. ``plan`` decides on the
        very head the swap replaces: when another writer swaps first, the head
        is read again and ``plan`` asked again. A commit needs its parent in the
        head (``commit_checkpoint``): once the drop is in, nothing new reads
        through what went."""
        # The head this process last read or wrote first (delete_for_runs' mark just
        # swapped it): if another writer swapped since, this swap fails and the
        # head is read again, and planned again.
        head = self._cached(thread_id)
        for _ in range(_MAX_SWAPS):
            if head is None or head.archive is not None:
                head = yield from self._live_head(thread_id)
            entries = yield from self._contents(head)
            cut = yield from plan(entries)
            if not cut.hide and not cut.drop:
                if head.graveyard or head.retired:
                    # A drop whose swap landed and whose clearing did not (cut
                    # short, or its answer lost): rolled forward here.
                    yield from self._clear_graveyard(head, release, unlist=False)
                return
            hidden = {(e.ns, e.checkpoint_id) for e in cut.hide}
            dropped = {(e.ns, e.checkpoint_id) for e in cut.drop}
            known = {(e.ns, e.checkpoint_id) for e in entries}
            new = replace(
                head,
                entries=[
                    replace(e, writes=[], hidden=e.hidden or (e.ns, e.checkpoint_id) in hidden)
                    for e in entries
                    if (e.ns, e.checkpoint_id) not in dropped
                ],
                writes=[w for e in entries if (e.ns, e.checkpoint_id) not in dropped for w in e.writes or ()]
                # Writes that came before their checkpoint: a run in flight's.
                + [w for w in head.writes if (w.ns, w.checkpoint_id) not in known],
                segments=[],
                retired=[*head.retired, *head.segments],
                graveyard=[*head.graveyard, *(replace(e, writes=[]) for e in cut.drop), *(w for e in cut.drop for w in e.writes or ())],
            )
            keep = self._limits.keep
            plan_seal = _plan_seal(self.layout, new, self.bodies.fill, keep) if len(new.entries) > keep else None
            if plan_seal is not None:
                # Objects first: the segments exist before the head that refers to them.
                yield from put_immutable(self.s3, dict(plan_seal.objects))
                _apply_seal(new, plan_seal)
            if (yield from self._swap(head, new)):
                yield from self._clear_graveyard(new, release, unlist=False)
                return
            # Another writer came first, or this swap landed and its answer was
            # lost (the retried PUT then meets it: 412): the head tells which.
            # The segments written for it go only when no head names them.
            head = yield from self._live_head(thread_id)
            if plan_seal is not None:
                ours = {(r.number, r.token) for r in plan_seal.refs}
                if ours & {(r.number, r.token) for r in head.segments + head.retired + head.graveyard_segments}:
                    if ours & {(r.number, r.token) for r in head.segments}:
                        yield from self._clear_graveyard(head, release, unlist=False)
                    return
                yield from _delete_keys(self.s3, [k for k, _ in plan_seal.objects])
        raise S3SaverError(
            f"the manifest head of thread {thread_id!r} in s3://{self.s3.bucket} kept changing under "
            f"other writers; prune gave up after {_MAX_SWAPS} attempts (nothing was removed)"
        )

    def drop_strays(self, thread_id: str, strays: list[WritesEntry]) -> Op[list[WritesEntry]]:
        """One swap takes the parts out of the head, each while the head holds
        that very part and no entry of its checkpoint (a checkpoint committed
        lands in the head; sealed, its writes went with it)."""
        slots = {(w.ns, w.checkpoint_id, w.task_id, w.part, w.token) for w in strays}
        dropped: list[WritesEntry] = []

        def take(head: Head) -> Head | None:
            dropped.clear()
            if head.archive is not None:
                return None  # writes parked until a restore: not strays
            present = {(e.ns, e.checkpoint_id) for e in head.entries}
            for w in head.writes:
                if (w.ns, w.checkpoint_id, w.task_id, w.part, w.token) in slots and (w.ns, w.checkpoint_id) not in present:
                    dropped.append(w)
            if not dropped:
                return None
            gone = {id(w) for w in dropped}
            return replace(head, writes=[w for w in head.writes if id(w) not in gone])

        yield from self._update(thread_id, take)
        return list(dropped)

    def _clear_graveyard(self, head: Head, release: Release, unlist: bool) -> Op[Head]:
        """Delete what ``head``'s graveyard holds (the objects its entries, and the
        entries of its buried segments, name and no entry the head still holds
        names; retired segments), then take that out of the head. ``unlist``
        (a delete): the stale archive goes too, and ``unlisting`` (the caller
        removed that listing object)."""
        thread_id = head.thread_id
        buried: list[Any] = list(head.graveyard)
        for entries, writes in (yield from self._load_segments(thread_id, head.graveyard_segments, buried=True)):
            buried += [*entries, *writes]
        staying = yield from self._contents(head)
        if not unlist:
            # A delete's graveyard (entries of an older generation: only a delete
            # moves the head to the next) is cleared by whichever call finds it
            # first: a prune or an archive's finish, when the delete was cut short
            # or its answer lost. The delete finds its runs' hints through these
            # entries; past this call's swap nothing names them, so they go here
            # first, as the delete does (versioned: recorded for an erase).
            # A run the thread still names (a new life's, its archive's) keeps its hint.
            named = {e.run_id for e in staying} | set(head.archive.runs if head.archive is not None else ())
            old_runs = {
                e.run_id for e in buried if isinstance(e, CheckpointEntry) and e.run_id is not None and e.gen < head.gen
            }
            if old_runs - named:
                yield from self._unname({thread_id: [self.layout.run_key(r, thread_id) for r in sorted(old_runs - named)]})

        def segment_keys(refs: list[SegmentRef]) -> list[str]:
            return [self.layout.segment_key(thread_id, r.number, r.token) for r in refs]

        # A buried segment goes after the objects it lists (a call again needs
        # it to find them); a retired one lists nothing that goes.
        stale = [ArchiveRef(head.stale_archive, "", 0, 0, {})] if head.stale_archive is not None and unlist else []
        yield from gather(release([*buried, *stale], staying), _delete_keys(self.s3, segment_keys(head.retired)))
        yield from _delete_keys(self.s3, segment_keys(head.graveyard_segments))
        gone = {_grave_key(e) for e in head.graveyard}

        def clear(h: Head) -> Head | None:
            unlisted = unlist and bool(head.unlisting) and h.unlisting == head.unlisting
            dropped_stale = bool(stale) and h.stale_archive == head.stale_archive
            # A delete's activity entry is removed (delete_thread): the head forgets its day.
            inactive = unlist and bool(head.active) and (h.active, h.active_tokens) == (head.active, head.active_tokens)
            # A delete removed the hints of these runs (delete_thread, before this).
            unhinted = [r for r in h.stale_runs if r in head.stale_runs] if unlist else []
            if not (h.graveyard or h.graveyard_segments or h.retired or unlisted or dropped_stale or inactive or unhinted):
                return None
            # Only what this call removed: another may have buried more meanwhile.
            return replace(
                h,
                graveyard=[e for e in h.graveyard if _grave_key(e) not in gone],
                graveyard_segments=[r for r in h.graveyard_segments if r not in head.graveyard_segments],
                retired=[r for r in h.retired if r not in head.retired],
                unlisting=0 if unlisted else h.unlisting,
                stale_archive=None if dropped_stale else h.stale_archive,
                active=0 if inactive else h.active,
                active_tokens=[] if inactive else h.active_tokens,
                stale_runs=[r for r in h.stale_runs if r not in unhinted],
            )

        return (yield from self._update(thread_id, clear, head))

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
        """Write the entries of a copy (objects copied already) into ``dest``'s head
        in one swap: a copy cut short leaves the target as it was. The swap checks
        the target again (the head as ``check_copy_target`` read it, or newer)."""
        target = self._cached(dest)
        if target is None:
            target = yield from self.check_copy_target(source, dest)

        def install(h: Head) -> Head | None:
            _key_fence(h, key_id)
            if (h.entries or h.segments) and h.copied_from != source:
                raise ConfigurationError(f"thread {dest!r} got checkpoints of its own while being copied into")
            new = replace(
                h,
                entries=[replace(e, gen=h.gen, writes=[]) for e in entries],
                writes=[replace(w, gen=h.gen) for w in writes],
                segments=[],
                copied_from=source,
                created=h.created or now,
            )
            return with_active(new, active)  # recorded by the same swap (its object is written)

        earlier = yield from self._contents(target)  # what a copy cut short and called again left
        installed = yield from self._install(target, install)
        if earlier and installed.copied_from == source:
            # An earlier copy's entries (under its own tag) gave way to these.
            yield from release(earlier, [*entries, *writes])
        # The copy's runs, for delete_for_runs to find it too.
        runs = sorted({e.run_id for e in entries if e.run_id is not None})
        yield from gather(*(self.note(dest, None, r) for r in runs))

    def check_copy_target(self, source: str, dest: str) -> Op[Head]:
        """The target's head; refuses a target archived, or holding checkpoints of
        its own (an earlier copy of ``source`` is brought up to date)."""
        target = yield from self._read_head(dest)
        if target.archive is not None:
            raise ConfigurationError(f"thread {dest!r} is archived ({self.describe()}); copy_thread copies into an empty thread")
        if (target.entries or target.segments) and target.copied_from != source:
            raise ConfigurationError(
                f"thread {dest!r} already has checkpoints of its own ({self.describe()}); copy_thread "
                "copies into an empty thread (delete_thread it first)"
            )
        return target

    def _install(self, head: Head, install: Callable[[Head], Head | None]) -> Op[Head]:
        """Swap in a whole history (restore, copy), list the thread if it was not,
        and delete the segments ``head`` referred to (an earlier copy's, the lost
        index's): nothing refers to them any more."""
        thread_id = head.thread_id
        installed = yield from self._update(thread_id, install, head)
        if not head.created:
            yield from self.note(thread_id, installed.created, None)
        old = [r for r in head.segments if r not in installed.segments]
        yield from _delete_keys(self.s3, [self.layout.segment_key(thread_id, r.number, r.token) for r in old])
        return installed


def _key_fence(head: Head, key_id: str | None) -> None:
    """A whole history's swap (import, copy) checks the key it is sealed under as a
    commit does (``backend._fence``): an erase of the thread since the operation read
    its key destroyed it, and nothing sealed under it is installed after the erase's
    switch. Checked in the swap itself: no request of its own."""
    if key_id is not None and key_id in head.gone_keys:
        raise Fenced(record_of(head))


def _grave_key(entry: CheckpointEntry | WritesEntry) -> tuple[Any, ...]:
    if isinstance(entry, CheckpointEntry):
        return ("c", entry.ns, entry.checkpoint_id)
    return ("w", entry.ns, entry.checkpoint_id, entry.task_id, entry.part, entry.token)


