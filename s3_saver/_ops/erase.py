"""erase_thread: ``delete_thread``, then every version and delete marker the thread left.

A versioned bucket (replication and Object Lock need one) keeps what a delete
removes as noncurrent versions behind delete markers. An erase lists the
thread's own key ranges (``live/``, ``manifests/``, ``archive/`` and
``set-aside/`` of its encoded id: an admin path, listing is allowed) and
deletes each version by id, in the region written to and in the replica.

What stays is the index's record of the delete (its generation: a run still in
flight cannot bring the thread back): a table item, or the manifest's head.
A version Object Lock holds is reported, never an error that stops the rest.

Order, so that a call cut short anywhere and called again finishes:

1. versioned bucket, manifest index: the keys outside the thread's ranges that
   name it (listing and run hints, ``Index.erase_hints``, and activity entries)
   go into a record of their own in the thread's manifest folder *before* the
   delete takes them out of the head (an earlier delete or prune recorded those
   of the thread's earlier lives: ``ManifestLifecycle._unname``);
2. ``delete_thread`` (gone for readers and writers from its first write);
3. every noncurrent version and delete marker in the ranges and of those keys
   goes, and every current object older than ``GRACE`` that the index does
   not name. A younger one may be a write about to commit (its object sent,
   its read of the thread's record not yet: it commits into the generation
   after the delete), so it stays, as ``collect_garbage`` leaves it; so does
   what the index names (its record; a thread started afresh since);
4. the hint records last, once nothing they name is left.

With encryption, before all of this: the thread's data key is destroyed (its record in
the key store replaced by its erasure, on the ETag read: ``KeyStore.destroy``), so that
from the first request on, every copy of the thread anywhere (a locked version, a
backup, a restored old version) is unreadable, whatever the rest of the erase manages.
The delete's switch records the destroyed key ids in the thread's index record: a
process that cached the key before commits nothing under it after the switch
(``Index.commit_checkpoint``'s fence). A write sealed under it that lands before the
switch is in the generation the switch deletes. Once every region is erased, the key
record is marked settled: only then may the thread begin a new life under a new key
(a key made earlier could seal content this erase deletes, and what a lock keeps of it
would stay readable). Cut short anywhere, a call again finishes: the record read erased
is not destroyed again, its ids are recorded again, and it is settled at the end. With a
replica, the key is destroyed in the replica region's key store right after, before
anything is deleted (and an erasure written there where no copy had arrived, so that a
copy still pending never lands after it); both erasures are settled at the end.
Every version the erase leaves is read for the key it is sealed under (its first
bytes): one sealed under a destroyed key is reported crypto-erased.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from s3_saver._crypto.envelope import HEADER_BYTES, is_sealed, key_id_of
from s3_saver._crypto.records import KeyRecord
from s3_saver._format.archive import metadata_key_id
from s3_saver._format.keys import KeyLayout, new_token
from s3_saver._ops import delete, idle
from s3_saver._ops.audit import _referenced
from s3_saver._ops.bucket import _GONE, RemainingVersion, _listed, _purge, _Version
from s3_saver._ops.context import Context, target
from s3_saver._transport.failures import (
    error_code,
)
from s3_saver._transport.mode import settle_mode
from s3_saver._transport.protocol import Op, gather, raise_failure, request_one
from s3_saver._transport.s3 import put_immutable
from s3_saver.errors import (
    CorruptObjectError,
    TableNotFoundError,
)

NEWER = "an unreferenced object younger than the grace period"
# As collect_garbage's default: a write commits its index entry within seconds of
# its objects (a Lambda within its 15 minutes at most).
GRACE = 3600.0
RECORD = "the erase's record of the keys it has still to erase"
IN_USE = "named by the index"
NESTED = "a key of a saver whose prefix lies inside this one's folders"
# Stores without the versioning API answer these: the bucket keeps no versions.
_NO_VERSIONING = frozenset({"NotImplemented", "MethodNotAllowed", "XNotImplemented"})


@dataclass(frozen=True)
class EraseReport:
    """What [S3Saver.erase_thread()][s3_saver.S3Saver.erase_thread] removed, and what remains.

    Attributes:
        thread_id: The thread erased.
        buckets: The buckets erased in (the region written to, then the replica).
        deleted: Object versions and delete markers removed after the delete
            (what ``delete_thread`` leaves: none on an unversioned bucket,
            unless a write cut short left objects no index entry names).
        remaining: Versions left in place, each with its reason (empty: every
            version of the thread is gone).
        records: What stays so that the thread stays deleted, per region: the
            index's delete record (no user content, under 1 KB), and with
            encryption the key store's record of the key's destruction (no key
            material).
        key_destroyed_at: With ``encryption=``: when the thread's data key was
            destroyed (the first thing the erase does). From then on no copy of the
            thread can be read: what ``remaining`` marks ``crypto_erased``, and
            every copy out of the saver's reach (backups, point-in-time restores,
            copies of the bucket). None: no encryption, or the thread had no key.
    """

    thread_id: str
    buckets: tuple[str, ...]
    deleted: int
    remaining: tuple[RemainingVersion, ...]
    records: tuple[str, ...]
    key_destroyed_at: datetime | None = None

    @property
    def complete(self) -> bool:
        """True when no version of the thread remains in any bucket."""
        return not self.remaining

    @property
    def unreadable(self) -> bool:
        """True when nothing the thread held can be read from what remains: every
        remaining version is crypto-erased or is the erase's own record of the
        keys it has still to erase (no user content)."""
        return all(r.crypto_erased or r.reason == RECORD for r in self.remaining)


def erase_thread(ctx: Context, thread_id: str, others: Sequence[tuple[Context, bool]] = ()) -> Op[EraseReport]:
    """Erase in ``ctx``'s region, then in each of ``others`` (context, whether
    its index is its own to delete in: a global table's replica is not)."""
    thread_id, _, _ = target({"configurable": {"thread_id": thread_id}})
    # First, with encryption: the key (with a replica, in both regions' key stores).
    # Every copy is unreadable from these answers on.
    destroyed, buried = yield from _destroy_key(ctx, thread_id)
    # The replica's erasure names every key of the thread either store held (a superset).
    every = buried if buried is not None else destroyed
    gone = frozenset(k.hex() for k in every.erased_ids()) if every is not None else frozenset()
    deleted = 0
    remaining: list[RemainingVersion] = []
    records: list[str] = []
    named: tuple[set[str], set[str]] | None = None
    for site, own_index in ((ctx, True), *others):
        # A global table's replica is the same index: what the region written
        # to names after its delete is the answer there too (its copy may lag).
        # Only the region written to receives writes that may still commit.
        count, left, record, found = yield from _erase_in(
            site, thread_id, own_index, None if own_index else named, written=site is ctx, gone=gone
        )
        named = named or found
        deleted += count
        if every is not None:
            left = yield from _crypto_erased(site, left, every)
        remaining += left
        records.append(record)
    destroyed_at = None
    if destroyed is not None and ctx.crypt is not None:
        # Every region's index records the destroyed ids now: a new life may begin.
        yield from ctx.crypt.settle(thread_id, destroyed, buried)
        ctx.crypt.forget(thread_id)
        for c, _ in others:
            if c.crypt is not None:
                c.crypt.forget(thread_id)
        stores = [ctx.crypt.store] + ([ctx.crypt.partner] if buried is not None and ctx.crypt.partner else [])
        records += [f"{s.where(thread_id)}: the record of the key's destruction (no key material)" for s in stores]
        if destroyed.erased_at is not None:
            destroyed_at = datetime.fromtimestamp(destroyed.erased_at, UTC)
    return EraseReport(
        thread_id,
        tuple(c.s3.bucket for c, _ in ((ctx, True), *others)),
        deleted,
        tuple(remaining),
        tuple(records),
        destroyed_at,
    )


def _destroy_key(ctx: Context, thread_id: str) -> Op[tuple[KeyRecord | None, KeyRecord | None]]:
    """With encryption: the thread's data key destroyed (its record replaced by its
    erasure on the ETag read; an erasure found is left as it is: a call again after
    a cut), then with a replica in that region's key store too (``Crypt.destroy``).
    None: no encryption, or the thread never had a key."""
    if ctx.crypt is None:
        return None, None
    found = yield from ctx.crypt.destroy(thread_id, ctx.now())
    # This process's own cache: nothing here seals or opens under it any more.
    ctx.crypt.forget(thread_id)
    return found


def _crypto_erased(ctx: Context, left: list[RemainingVersion], destroyed: KeyRecord) -> Op[list[RemainingVersion]]:
    """``left`` with each version sealed under a destroyed key of the thread marked
    crypto-erased: its first bytes read (one ranged GET each, one wave), the key id
    its envelope names looked up among the destroyed ones. A version in a class that
    must be restored before it is read (an archive in GLACIER or DEEP_ARCHIVE) is
    asked with HeadObject instead (one more wave, for those only): an archive names
    the key it is sealed under in its user metadata. One that names none (a plaintext
    archive, anything else moved to a cold class) is not marked. Another saver's
    keys, and the erase's own records (no content), are not read."""
    gone = destroyed.erased_ids()
    candidates = [i for i, r in enumerate(left) if r.reason not in (RECORD, NESTED) and r.bucket == ctx.s3.bucket]
    if not candidates:
        return left
    calls = [ctx.s3.get_start(left[i].key, left[i].version_id, HEADER_BYTES) for i in candidates]
    answers = yield tuple(calls)
    found: dict[int, bytes | None] = {}
    cold: list[int] = []
    for i, call, answer in zip(candidates, calls, answers):
        if isinstance(answer, BaseException):
            code = error_code(answer)
            if code in _GONE:
                continue  # gone meanwhile: nothing to mark (reported as it was)
            if code != "InvalidObjectState":
                raise_failure(call, answer)
            cold.append(i)
        else:
            start = bytes(answer["Body"])
            found[i] = key_id_of(start) if is_sealed(start) else None
    if cold:
        heads = [ctx.s3.head_version(left[i].key, left[i].version_id) for i in cold]
        answers = yield tuple(heads)
        for i, call, answer in zip(cold, heads, answers):
            if isinstance(answer, BaseException):
                if error_code(answer) in _GONE:
                    continue
                raise_failure(call, answer)
            found[i] = metadata_key_id(answer.get("Metadata") or {})
    out = list(left)
    for i, key_id in found.items():
        if key_id is None or key_id not in gone:
            continue
        when = gone[key_id]
        at = datetime.fromtimestamp(when, UTC) if when is not None else None
        out[i] = replace(out[i], crypto_erased=True, key_destroyed_at=at)
    return out


def _erase_in(
    ctx: Context,
    thread_id: str,
    own_index: bool,
    named: tuple[set[str], set[str]] | None,
    written: bool,
    gone: frozenset[str] = frozenset(),
) -> Op[tuple[int, list[RemainingVersion], str, tuple[set[str], set[str]]]]:
    # An object of a write that commits into the generation after the delete may
    # predate the delete (its PUT went out before its read of the record did).
    # A replica gets no write of its own: an object there that no entry names is
    # a copy of what the delete removed (replication never sends it again).
    young = time.time() - GRACE if written else float("inf")
    # First: a prefix of the other index mode holds objects this index never
    # names; they must not be taken for the thread's leftovers.
    yield from settle_mode(ctx.mode, survey=True, claim=False)
    versioned = yield from _versioned(ctx)
    hints: list[str] = []
    read: set[str] = set()  # the hint records whose keys are in ``hints``
    # The days the thread's activity entries can be on, known before the delete
    # takes its listing time (``idle.activity_span``).
    days = (yield from _activity_span(ctx, thread_id, versioned)) if own_index else []
    if versioned and own_index:
        hints = yield from _record_hints(ctx, thread_id, [ctx.layout.activity_key(d, thread_id) for d in days], read)
    elif versioned:
        hints = yield from _hints_recorded(ctx, thread_id, read)
    indexed = own_index
    if own_index:
        try:
            # The switch records the destroyed key ids (with encryption).
            yield from delete.delete_thread(ctx, thread_id, gone)
        except TableNotFoundError:
            indexed = False  # a replica's table never made (promote builds it): nothing to delete there
        if indexed:
            # The entries that name the thread (a table's items; a bucket's objects,
            # whose older versions go with the hints below). Versioned, a bucket
            # whose hints are objects (as its activity entries): the delete recorded
            # the keys it deleted, which a write that landed since the record
            # above may have added to (a run's hint): read beside.
            _, more = yield from gather(
                ctx.index.erase_activity(thread_id, days),
                _hints_recorded(ctx, thread_id, read) if versioned and ctx.index.activity_objects else _none(),
            )
            hints = sorted({*hints, *more})
    # The ranges and the hint keys are listed side by side (a page each per round trip).
    prefixes = _ranges(ctx.layout, thread_id) + hints
    pages = yield from gather(*(_listed(ctx, p, versioned) for p in prefixes))
    # The index is read after the listing: a write whose commit lands before this
    # read is named here; one still to commit was in flight as the listing ran,
    # so its objects are younger than the grace period.
    keep, own = named if named is not None else (yield from _named(ctx, thread_id))
    found = [
        v
        for prefix, listed in zip(prefixes, pages)
        for v in listed
        if (_hinted(ctx.layout, prefix, v.key) if prefix in hints else _belongs(ctx.layout, thread_id, v.key))
    ]
    # Delete only what is the thread's for certain: what a saver whose prefix lies
    # inside the thread's folders builds (a prefix an earlier version accepted)
    # stays, reported: it may be that saver's, or (ids named as folders) the thread's.
    nested = [
        RemainingVersion(ctx.s3.bucket, v.key, v.version_id, NESTED)
        for prefix, listed in zip(prefixes, pages) if prefix not in hints
        for v in listed if ctx.layout.nested_prefix(v.key) is not None
    ]
    marks = ctx.layout.erase_key(thread_id, "")
    # A record written after the last read (another call's) stays, for the next erase.
    hint_records = [v for v in found if v.key.startswith(marks) and v.key in read]
    unread = [v for v in found if v.key.startswith(marks) and v.key not in read and v.current]
    purge, left = _sort_out(ctx, [v for v in found if not v.key.startswith(marks)], keep, own, young)
    left += [RemainingVersion(ctx.s3.bucket, v.key, v.version_id, RECORD) for v in unread] + nested
    # Versions first, then the delete markers of keys none of whose versions a
    # lock kept: a marker taken off a locked version would make it current again.
    count, locked = yield from _purge(ctx, [v for v in purge if not v.marker])
    held = {r.key for r in locked}
    more, _ = yield from _purge(ctx, [v for v in purge if v.marker and v.key not in held])
    count += more
    left += locked
    if not any(r.key in hints for r in left):
        # The hint records go last: a call again needs them until what they name is gone.
        more, locked = yield from _purge(ctx, hint_records)
        count += more
        left += locked
    else:
        left += [RemainingVersion(ctx.s3.bucket, v.key, v.version_id, RECORD) for v in hint_records if v.current]
    if indexed:
        record = f"{ctx.index.describe()}: the thread's delete record (its generation, when it was deleted)"
    else:
        record = f"s3://{ctx.s3.bucket}: none here (its index is the region's written to, or none)"
    return count, left, record, (keep, own)


def _sort_out(
    ctx: Context, found: list[_Version], keep: set[str], own: set[str], young: float
) -> tuple[list[_Version], list[RemainingVersion]]:
    """The versions to delete, and those that stay: a current object the index
    names (its own record quietly), or one no entry names younger than ``young``."""
    purge: list[_Version] = []
    left: list[RemainingVersion] = []
    for v in found:
        if v.current and v.key in keep:
            if v.key not in own:
                left.append(RemainingVersion(ctx.s3.bucket, v.key, v.version_id, IN_USE))
        elif v.current and v.modified >= young:
            left.append(RemainingVersion(ctx.s3.bucket, v.key, v.version_id, NEWER))
        else:
            purge.append(v)
    return purge, left


def _named(ctx: Context, thread_id: str) -> Op[tuple[set[str], set[str]]]:
    """What the index names now (after the delete: its own record, and the
    entries of a run that started the thread afresh meanwhile), and which of
    those are the index's own objects (a manifest's head)."""
    try:
        held = yield from ctx.index.holdings(thread_id)
    except TableNotFoundError:
        return set(), set()
    return _referenced(ctx, thread_id, held), set(held.index_keys)


def _versioned(ctx: Context) -> Op[bool]:
    """Whether the bucket keeps versions (enabled, or suspended after being on)."""
    call = ctx.s3.bucket_versioning()
    (result,) = yield (call,)
    if isinstance(result, BaseException):
        if error_code(result) in _NO_VERSIONING:
            return False
        raise_failure(call, result)
    return result.get("Status") in ("Enabled", "Suspended")


def _activity_span(ctx: Context, thread_id: str, versioned: bool) -> Op[list[int]]:
    try:
        return (yield from idle.activity_span(ctx, thread_id, versioned))
    except TableNotFoundError:
        return []


def _record_hints(ctx: Context, thread_id: str, activity: list[str], read: set[str]) -> Op[list[str]]:
    """The hint keys the index names now (and the thread's ``activity`` entry keys,
    which a bucket holds in manifest mode) and those earlier calls recorded; a
    record of any new ones is written before the delete removes them from the index."""
    named, recorded = yield from _gather_hints(ctx, thread_id, read)
    if ctx.index.activity_objects:
        named = [*named, *activity]
    new = sorted(set(named) - set(recorded))
    if new:
        # Immutable: a PUT sent again after its answer was lost meets its own bytes.
        key = ctx.layout.erase_key(thread_id, new_token())
        yield from put_immutable(ctx.s3, {key: "\n".join(new).encode()})
        read.add(key)
    return sorted(set(named) | set(recorded))


def _gather_hints(ctx: Context, thread_id: str, read: set[str]) -> Op[tuple[list[str], list[str]]]:
    named = yield from ctx.index.erase_hints(thread_id)
    recorded = yield from _hints_recorded(ctx, thread_id, read)
    return named, recorded


def _none() -> Op[list[str]]:
    yield from ()
    return []


def _hints_recorded(ctx: Context, thread_id: str, read: set[str]) -> Op[list[str]]:
    """The keys the thread's hint records name, of the records not in ``read``
    (which gains them)."""
    prefix = ctx.layout.erase_key(thread_id, "")
    keys: list[str] = []
    token: str | None = None
    while True:
        page = yield from request_one(ctx.s3.list_keys(prefix, token))
        # A record's key exactly: what another saver nested in this folder put
        # under the same start is never read as a list of keys to erase.
        keys += [
            o["Key"] for o in page.get("Contents", [])
            if o["Key"] not in read and ctx.layout.thread_of_manifest(o["Key"]) == thread_id
        ]
        token = page.get("NextContinuationToken")
        if not token:
            break
    read.update(keys)
    if not keys:
        return []
    calls = [ctx.s3.get(k) for k in keys]
    results = yield tuple(calls)
    lines: set[str] = set()
    for call, result in zip(calls, results):
        if isinstance(result, BaseException):
            if error_code(result) in _GONE:
                continue  # another erase finished meanwhile: what it named is gone
            raise_failure(call, result)
        try:
            text = result["Body"].decode()
        except UnicodeDecodeError as exc:
            raise CorruptObjectError(f"s3://{ctx.s3.bucket}/{call.params['Key']}: not an erase record ({exc})") from exc
        lines.update(line for line in text.split("\n") if line)
    return sorted(lines)


def _ranges(layout: KeyLayout, thread_id: str) -> list[str]:
    """The thread's own key ranges: every key under them is the thread's."""
    return [
        layout.thread_dir(thread_id),
        layout.manifest_dir(thread_id),
        layout.archive_dir(thread_id),
        layout.set_aside_dir(thread_id),
    ]


def _belongs(layout: KeyLayout, thread_id: str, key: str) -> bool:
    """A key this layout builds for the thread, exactly (``KeyLayout``'s parsing):
    never one of a saver whose prefix lies inside these folders, nor anything
    else put there."""
    if key.startswith(layout.thread_dir(thread_id)):
        o = layout.parse_object_key(key)
        return o is not None and o.thread_id == thread_id
    return thread_id in (layout.thread_of_manifest(key), layout.thread_of_archive(key), layout.thread_of_set_aside(key))


def _hinted(layout: KeyLayout, hint: str, key: str) -> bool:
    """A key ``hint`` names: itself, or, when the hint is an activity entry's day
    folder (``KeyLayout.activity_key`` without a token), an entry of that thread
    and day under any token (each entry written has its own)."""
    if key == hint:
        return True
    folder, entry = layout.parse_activity_key(hint), layout.parse_activity_key(key)
    return folder is not None and entry is not None and not folder[2] and entry[:2] == folder[:2]


