"""The manifest index's threads: the prefix's setup, a thread's contents, the threads listed,
created and active, the threads of runs, and every thread (for rebuild), for ``ManifestIndex``.

What a thread holds as the index reads it; changing a thread as a whole (restore, delete,
drop, copy) is ``lifecycle``, and the day's activity entries are ``activity``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from s3_saver._format.entries import CheckpointEntry, WritesEntry
from s3_saver._format.keys import KeyLayout, new_token
from s3_saver._index.manifest.doc import Head, _with_writes, decode_head
from s3_saver._index.manifest.seal import Bodies
from s3_saver._index.terms import Archived, ThreadRef
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    PRECONDITION_FAILED_CODES,
    error_code,
)
from s3_saver._transport.protocol import Op, gather, raise_failure, request
from s3_saver._transport.s3 import DELETE_BATCH, S3Calls, put_immutable
from s3_saver.errors import (
    ConfigurationError,
)


class ManifestThreads:
    """The prefix's setup and a thread as the index reads it, for ``ManifestIndex``."""

    # What these methods rely on (declared as in the class they came from).
    s3: S3Calls
    layout: KeyLayout
    bodies: Bodies

    # -- setup ---------------------------------------------------------------------------
    def setup(self, bucket: str, bucket_region: str | None, ttl: bool) -> Op[None]:
        """Check that the store honours conditional writes: the manifest relies on them."""
        key = self.layout.probe_key(new_token())
        (first,) = yield (self.s3.put_new(key, b"1"),)
        # The key is new (a fresh token): a 412 is this write's own retry meeting it
        # (its first answer was lost or unreadable), as good as a 200.
        if isinstance(first, BaseException) and error_code(first) not in PRECONDITION_FAILED_CODES:
            raise_failure(self.s3.put_new(key, b"1"), first)
        second, stale = yield (self.s3.put_new(key, b"2"), self.s3.put_swap(key, b"3", '"0"'))
        yield from request(self.s3.delete_many([key]))
        for name, result in (("IfNoneMatch", second), ("IfMatch", stale)):
            if not isinstance(result, BaseException):
                raise ConfigurationError(
                    f"the store behind bucket {bucket!r} ignored a PutObject with {name}: the manifest "
                    "index needs conditional writes (AWS S3, MinIO, R2, SeaweedFS >= 4.48 honour them); "
                    "use a DynamoDB table (table=...) with this store"
                )
            if error_code(result) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
                raise_failure(self.s3.put_new(key, b"2"), result)

    # -- a thread as a whole: contents, listing, runs, restore ---------------------------
    def contents(self, thread_id: str) -> Op[list[CheckpointEntry]]:
        head = yield from self._live_head(thread_id)
        return (yield from self._contents(head))

    def committed(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], list[WritesEntry]]]:
        head = yield from self._live_head(thread_id)
        return (yield from self._committed(head))

    def own_committed(self, thread_id: str) -> Op[tuple[list[CheckpointEntry], list[WritesEntry]] | None]:
        """``committed`` as this region last wrote the head itself, when another
        region's head replicated over it since (a failback); None: it did not.

        Admin: the head's stored versions (a versioned bucket), newest first by
        time, read a wave at a time until one written here turns up: a region's
        own versions are older than the copies that replaced them.
        """
        key = self.layout.manifest_head_key(thread_id)
        listed: list[tuple[Any, str, bool]] = []
        marker: tuple[str, str] | None = None
        while True:
            (page,) = yield from request(self.s3.versions(key, marker))
            listed += [
                (v["LastModified"], v["VersionId"], bool(v.get("IsLatest"))) for v in page.get("Versions", []) if v["Key"] == key
            ]
            if not page.get("IsTruncated"):
                break
            # A page that says more follow names where (checked: ``_transport/answers``); the version
            # marker is absent where the key's versions ended with the page.
            marker = (page["NextKeyMarker"], page.get("NextVersionIdMarker") or "")
        listed.sort(reverse=True)
        heads: list[Head] = []
        found_at: Any = None
        for i in range(0, len(listed), _VERSION_WAVE):
            wave = listed[i : i + _VERSION_WAVE]
            if found_at is not None:
                # Listings time versions to the second: the newest own one may
                # share its second with versions in the next wave.
                wave = [v for v in wave if v[0] >= found_at]
                if not wave:
                    break
            calls = [self.s3.get(key, version) for _, version, _ in wave]
            for (modified, _, latest), call, result in zip(wave, calls, (yield from request(*calls))):
                if isinstance(result, BaseException):
                    raise_failure(call, result)
                head = decode_head(thread_id, result["Body"], f"s3://{self.s3.bucket}/{key}", result["ETag"])
                if latest and head.site in (None, self.s3.bucket):
                    return None  # the current head is this region's own (or older than sites)
                heads.append(head)
                if head.site == self.s3.bucket and found_at is None:
                    found_at = modified
        own = [h for h in heads if h.site == self.s3.bucket]
        if not own:
            return None
        head = max(own, key=lambda h: h.version)
        if head.archive is not None:
            raise Archived(thread_id, head.archive)
        return (yield from self._committed(head))

    def _contents(self, head: Head) -> Op[list[CheckpointEntry]]:
        """Every checkpoint of the head and its segments, in commit order (segments
        oldest first, then the head), with their writes."""
        return (yield from self._committed(head))[0]

    def _committed(self, head: Head) -> Op[tuple[list[CheckpointEntry], list[WritesEntry]]]:
        """``_contents``, and the head's writes of checkpoints it does not hold."""
        out: list[CheckpointEntry] = []
        every = list(head.writes)
        for entries, writes in (yield from self._load_segments(head.thread_id, head.segments)):
            out += [_with_writes(e, writes + head.writes) for e in entries]
            every += writes
        out += [_with_writes(e, head.writes) for e in head.entries]
        held = {(e.ns, e.checkpoint_id) for e in out}
        return out, [w for w in every if (w.ns, w.checkpoint_id) not in held]

    def threads(
        self, before: ThreadRef | None, page_size: int, cursor: Any
    ) -> Op[tuple[list[tuple[ThreadRef, CheckpointEntry | None]], Any]]:
        """One page of the listing's keys (newest first by name), then the heads of
        those threads in one wave. A key counts only if its time is the head's:
        one left by a writer that lost the race to list a thread, or by a delete
        cut short, does not."""
        start_after = self.layout.listing_key(before.created, before.thread_id) if before is not None else None
        page = yield from request(self.s3.list_keys(self.layout.threads_root, cursor, start_after, page_size))
        listed = [p for o in page[0].get("Contents", []) if (p := self.layout.parse_listing_key(o["Key"]))]
        heads = yield from gather(*(self._read_head(t) for _, t in listed))
        # An archived thread shows the latest checkpoint its archive reference describes.
        found = yield from gather(*(_summary(h) if h.archive else self._latest_in(h, "") for h in heads))
        out = [
            (ThreadRef(t, created, head.archive.storage_class if head.archive else None), latest)
            for (created, t), head, latest in zip(listed, heads, found)
            if head.created == created
        ]
        return out, page[0].get("NextContinuationToken")

    def thread_ids(self) -> Op[dict[str, bool]]:
        """The heads, not only the listing: a thread's listing object and its head
        are two objects, and replication can bring the head alone (promote relists
        it). Two listings of keys, no head read; a listing object counts here
        whatever its time (``threads`` checks that against the head)."""
        heads, listed = yield from gather(
            self._keys(self.layout.manifest_root, self.layout.thread_of_head),
            self._keys(self.layout.threads_root, lambda k: (p := self.layout.parse_listing_key(k)) and p[1]),
        )
        listed_set = set(listed)
        return {t: t in listed_set for t in heads}

    def _keys(self, prefix: str, parse: Callable[[str], str | None]) -> Op[list[str]]:
        found: list[str] = []
        token: str | None = None
        while True:
            page = yield from request(self.s3.list_keys(prefix, token))
            found += [t for o in page[0].get("Contents", []) if (t := parse(o["Key"]))]
            token = page[0].get("NextContinuationToken")
            if not token:
                return found

    def created(self, thread_id: str) -> Op[int | None]:
        head = yield from self._read_head(thread_id)
        return head.created or None

    def activity_since(self, thread_id: str) -> Op[tuple[int, int]]:
        head = yield from self._read_head(thread_id)
        return head.created, head.since

    def runs(self, run_ids: list[str]) -> Op[dict[str, list[str]]]:
        found: dict[str, list[str]] = {r: [] for r in run_ids}
        pending: dict[str, str | None] = {r: None for r in run_ids}
        while pending:
            order = list(pending)
            pages = yield from request(*(self.s3.list_keys(self.layout.runs_dir(r), pending[r]) for r in order))
            pending = {}
            for run_id, page in zip(order, pages):
                threads = (self.layout.thread_of_run(run_id, o["Key"]) for o in page.get("Contents", []))
                found[run_id] += [t for t in threads if t is not None]
                if page.get("NextContinuationToken"):
                    pending[run_id] = page["NextContinuationToken"]
        return found

    def bury_runs(self, thread_id: str, run_ids: list[str]) -> Op[None]:
        def bury(h: Head) -> Head | None:
            if h.archive is not None:
                raise Archived(thread_id, h.archive)  # an archived thread keeps its runs
            new = [r for r in run_ids if r not in h.dead_runs]
            return replace(h, dead_runs=[*h.dead_runs, *new]) if new else None

        yield from self._update(thread_id, bury, self._cached(thread_id))

    def forget_runs(self, pairs: list[tuple[str, str]]) -> Op[None]:
        by_thread: dict[str, list[str]] = {}
        for run_id, thread_id in pairs:
            by_thread.setdefault(thread_id, []).append(self.layout.run_key(run_id, thread_id))
        yield from self._unname(by_thread)

    def _unname(self, by_thread: dict[str, list[str]]) -> Op[None]:
        """Delete keys outside the threads' own folders that name them (run hints,
        a listing object, an activity entry), by thread: a prune's and a delete's.

        A versioned bucket keeps each as a noncurrent version behind a delete
        marker, both keys holding the thread id; once the head no longer names
        the key (its run pruned, or the thread deleted and started afresh)
        nothing would, and an erase could not find it. So on a versioned bucket
        the keys go first (objects first) into an erase record in the thread's
        manifest folder, which ``erase_thread`` reads and removes with everything
        else. The record replicates with the folder, so a replica's erase finds
        them too (a delete by version id would not replicate)."""
        keys = [k for ks in by_thread.values() for k in ks]
        if self.versioned_bucket and keys:
            yield from put_immutable(
                self.s3,
                {self.layout.erase_key(t, new_token()): "\n".join(sorted(ks)).encode() for t, ks in by_thread.items() if ks},
            )
        yield from _delete_keys(self.s3, keys)

    def all_threads(self) -> Op[list[CheckpointEntry]]:
        """Lists the manifests (the admin path), then reads every head and segment."""
        out: list[CheckpointEntry] = []
        for thread_id in (yield from self.thread_ids()):  # every head
            head = yield from self._read_head(thread_id)
            if head.archive is None:  # archived threads are read through their archives
                out += [e for e in (yield from self._contents(head)) if not e.hidden]
        return out


# Stored versions of a head read per round trip (own_committed).
_VERSION_WAVE = 20


# -- helpers ---------------------------------------------------------------------------
def _summary(head: Head) -> Op[CheckpointEntry | None]:
    yield from ()
    return head.archive.latest if head.archive is not None else None


def _delete_keys(s3: S3Calls, keys: list[str]) -> Op[None]:
    if keys:
        yield from request(*(s3.delete_many(keys[i : i + DELETE_BATCH]) for i in range(0, len(keys), DELETE_BATCH)))
