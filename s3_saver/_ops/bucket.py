"""The bucket as admin operations see it: its objects listed by thread (audit, collect_garbage),
and every version and delete marker of a key range listed and purged (erase). Never on a hot
path: a checkpoint's reads and writes name their keys.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from s3_saver._format.keys import ERASE_MARK, KeyLayout
from s3_saver._ops.context import Context
from s3_saver._transport.failures import (
    DENIED_CODES,
    error_code,
)
from s3_saver._transport.protocol import Op, raise_failure, request, request_one
from s3_saver._transport.s3 import DELETE_BATCH
from s3_saver.errors import (
    AccessDeniedError,
    S3SaverError,
)

LOCKED = "object lock"


_GONE = frozenset({"NoSuchVersion", "NoSuchKey", "404", "405", "MethodNotAllowed"})


@dataclass(frozen=True)
class RemainingVersion:
    """An object version [S3Saver.erase_thread()][s3_saver.S3Saver.erase_thread] left in place, and why.

    Attributes:
        bucket: The bucket that holds it.
        key: Its key.
        version_id: Its version (None: an unversioned bucket).
        reason: ``"object lock"`` (a retention period or a legal hold: it can
            go once they end), ``"an unreferenced object younger than the grace
            period"`` (an hour, as ``collect_garbage``'s: a write that may still
            commit, or one that crashed; an erase later removes it) or
            ``"named by the index"`` (the thread was used again meanwhile, or a
            replica's index has not caught up with the delete yet). While any
            of those stays, so does the erase's own record of the listing and
            run-hint keys it has still to erase (manifest mode). Or ``"a key of
            a saver whose prefix lies inside this one's folders"``: a prefix
            such as ``live/<thread>``, refused now, that an earlier version
            accepted; its objects are never deleted from outside (move its
            threads to another prefix with ``migrate``) Or, from
            ``S3Store.erase_namespace`` in a replica's bucket, replication has not
            delivered the erase yet (call it again once it has).
        mode: Object Lock retention mode (``"GOVERNANCE"`` or ``"COMPLIANCE"``).
        retain_until: End of the retention period.
        legal_hold: A legal hold is on.
        crypto_erased: With ``encryption=``: the version is encrypted under a data
            key the erase destroyed, so nobody can read it, wherever it is kept
            (its bytes were checked: a plaintext version, or one under another key,
            is not marked).
        key_destroyed_at: When that key was destroyed (``crypto_erased`` only).
    """

    bucket: str
    key: str
    version_id: str | None
    reason: str
    mode: str | None = None
    retain_until: datetime | None = None
    legal_hold: bool = False
    crypto_erased: bool = False
    key_destroyed_at: datetime | None = None


@dataclass(frozen=True)
class _Version:
    key: str
    version_id: str | None  # None: an unversioned bucket's object
    current: bool  # the object readers get (not noncurrent, not a delete marker)
    modified: float
    marker: bool = False  # a delete marker (no lock ever holds one)


def _listed(ctx: Context, prefix: str, versioned: bool) -> Op[list[_Version]]:
    """Every version and delete marker under ``prefix`` (unversioned: every object)."""
    out: list[_Version] = []
    if not versioned:
        token: str | None = None
        while True:
            page = yield from request_one(ctx.s3.list_keys(prefix, token))
            out += [_Version(o["Key"], None, True, _time(o)) for o in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not token:
                return out
    marker: tuple[str, str] | None = None
    while True:
        page = yield from request_one(ctx.s3.versions(prefix, marker))
        out += [_Version(v["Key"], v["VersionId"], bool(v.get("IsLatest")), _time(v)) for v in page.get("Versions", [])]
        out += [_Version(m["Key"], m["VersionId"], False, _time(m), marker=True) for m in page.get("DeleteMarkers", [])]
        if not page.get("IsTruncated"):
            return out
        marker = (page["NextKeyMarker"], page.get("NextVersionIdMarker") or "")


def _time(listed: dict[str, Any]) -> float:
    modified = listed.get("LastModified")
    return modified.timestamp() if isinstance(modified, datetime) else 0.0


def _purge(ctx: Context, versions: list[_Version]) -> Op[tuple[int, list[RemainingVersion]]]:
    """Delete the versions (batches of 1,000 in one round trip); those a lock
    holds are returned, with their retention and legal hold."""
    if not versions:
        return 0, []
    pairs = [(v.key, v.version_id) for v in versions]
    markers = {(v.key, v.version_id) for v in versions if v.marker}
    batches = [pairs[i : i + DELETE_BATCH] for i in range(0, len(pairs), DELETE_BATCH)]
    results = yield from request(*(ctx.s3.delete_versions(b) for b in batches))
    refused: list[tuple[str, str | None]] = []
    for batch, result in zip(batches, results):
        for err in result.get("Errors", []):
            if err.get("Code") not in DENIED_CODES:
                raise S3SaverError(
                    f"erase could not delete s3://{ctx.s3.bucket}/{err.get('Key')} (version {err.get('VersionId')}): "
                    f"{err.get('Code')}: {err.get('Message')}"
                )
            # Some stores name the key alone: each version of it sent may be
            # the one (a delete marker is never locked).
            refused += [
                p for p in batch
                if p[0] == err.get("Key") and (p[1] == err.get("VersionId") or ("VersionId" not in err and p not in markers))
            ]
    refused = list(dict.fromkeys(refused))
    left = yield from _locks(ctx, refused)
    return len(pairs) - len(left), left


def _locks(ctx: Context, refused: list[tuple[str, str | None]]) -> Op[list[RemainingVersion]]:
    """Why each refused version stays: its retention and legal hold (one HEAD
    each). A version that is gone was deleted after all; one held by neither
    was refused by a policy: that is an error naming what is missing."""
    if not refused:
        return []
    results = yield tuple(ctx.s3.head_version(key, version) for key, version in refused)
    left: list[RemainingVersion] = []
    for (key, version), result in zip(refused, results):
        if isinstance(result, BaseException):
            if error_code(result) in _GONE:
                continue
            raise_failure(ctx.s3.head_version(key, version), result)
        mode = result.get("ObjectLockMode")
        until = result.get("ObjectLockRetainUntilDate")
        on = result.get("ObjectLockLegalHoldStatus") == "ON"
        if not on and (until is None or until.timestamp() <= time.time()):
            raise AccessDeniedError(
                f"erase was refused the deletion of s3://{ctx.s3.bucket}/{key} (version {version}) and no "
                "Object Lock holds it: the caller needs s3:DeleteObjectVersion and s3:ListBucketVersions "
                "on the bucket (infra/template.yaml's EraseThreadsPolicy)"
            )
        left.append(RemainingVersion(ctx.s3.bucket, key, version, LOCKED, mode if until is not None else None, until, on))
    return left


@dataclass(frozen=True)
class _Object:
    key: str
    size: int
    modified: datetime


def _list_all(ctx: Context, nested: dict[str, int]) -> Op[dict[str, list[_Object]]]:
    found: dict[str, list[_Object]] = defaultdict(list)
    for root in (ctx.layout.root, ctx.layout.archive_root, ctx.layout.manifest_root):
        yield from _list_into(ctx, root, root, found, nested)
    return found


def _list_thread(ctx: Context, thread_id: str, nested: dict[str, int]) -> Op[dict[str, list[_Object]]]:
    found: dict[str, list[_Object]] = defaultdict(list)
    layout = ctx.layout
    yield from _list_into(ctx, layout.thread_dir(thread_id), layout.root, found, nested)
    yield from _list_into(ctx, layout.archive_dir(thread_id), layout.archive_root, found, nested)
    yield from _list_into(ctx, layout.manifest_dir(thread_id), layout.manifest_root, found, nested)
    return found


def _list_into(
    ctx: Context, prefix: str, root: str, found: dict[str, list[_Object]], nested: dict[str, int]
) -> Op[None]:
    """Objects under ``prefix`` by thread. Only keys this layout builds count: a
    key of a saver whose prefix lies inside this one's folders (``app/live``
    inside ``app``'s ``live/``, as an earlier version accepted: counted in
    ``nested`` by its prefix), or anything else put there, is never taken for a
    thread's object, so never collected."""
    token: str | None = None
    while True:
        page = yield from request_one(ctx.s3.list_keys(prefix, token))
        for obj in page.get("Contents", []):
            thread_id = _thread_of(ctx.layout, root, obj["Key"])
            if thread_id is None:
                inner = ctx.layout.nested_prefix(obj["Key"])
                if inner is not None:
                    nested[inner] += 1
                continue
            modified = obj["LastModified"]
            if modified.tzinfo is None:
                modified = modified.replace(tzinfo=timezone.utc)
            found[thread_id].append(_Object(obj["Key"], obj.get("Size", 0), modified))
        token = page.get("NextContinuationToken")
        if not token:
            return


def _thread_of(layout: KeyLayout, root: str, key: str) -> str | None:
    """The thread of a key the layout builds under ``root``, None for any other key:
    the key must parse, the parts build exactly the same key again, and no saver
    whose prefix lies inside this one's tree builds it (``KeyLayout.nested_prefix``)."""
    if root == layout.root:
        o = layout.parse_object_key(key)
        return o.thread_id if o is not None else None
    if root == layout.archive_root:
        return layout.thread_of_archive(key)
    # A manifest's head and sealed segments (an erase's records are its business).
    return layout.thread_of_manifest(key) if not key.rpartition("/")[2].startswith(ERASE_MARK) else None
