"""The S3 side: immutable object writes and the calls that read and delete them."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Call, Instruction, raise_failure
from s3_saver.errors import (
    ImmutableObjectConflictError,
    Where,
)

DELETE_BATCH = 1000  # DeleteObjects accepts at most 1,000 keys per request
_MAX_CONFLICT_RETRIES = 3


class S3Calls:
    def __init__(
        self, bucket: str, where: Where | None = None, live_root: str = "", live_class: str | None = None
    ) -> None:
        self.bucket = bucket
        self.where = where
        # The storage class of objects under ``live_root`` (None: the bucket's
        # default). Manifests and listings stay in the default class: heads are
        # replaced all the time, and infrequent-access classes bill early deletes.
        self.live_root = live_root
        self.live_class = live_class

    def _call(self, operation: str, params: dict[str, Any]) -> Call:
        return Call("s3", operation, params, self.where)

    def _class_of(self, key: str) -> dict[str, str]:
        if self.live_class is not None and self.live_root and key.startswith(self.live_root):
            return {"StorageClass": self.live_class}
        return {}

    def put_new(
        self, key: str, body: bytes, storage_class: str | None = None, metadata: dict[str, str] | None = None
    ) -> Call:
        # IfNoneMatch="*": a key is written once; see put_immutable for retries.
        extra: dict[str, Any] = {"StorageClass": storage_class} if storage_class else self._class_of(key)
        if metadata:
            extra["Metadata"] = metadata
        return self._call(
            "put_object",
            {"Bucket": self.bucket, "Key": key, "Body": body, "IfNoneMatch": "*", **extra},
        )

    def head(self, key: str) -> Call:
        return self._call("head_object", {"Bucket": self.bucket, "Key": key})

    def restore(self, key: str, days: int | None, tier: str) -> Call:
        """Ask S3 for a readable copy of an object in a cold class, for ``days``; None: no
        ``Days`` (an Intelligent-Tiering archive tier, where S3 refuses one)."""
        request: dict[str, Any] = {"GlacierJobParameters": {"Tier": tier}}
        if days is not None:
            request["Days"] = days
        return self._call("restore_object", {"Bucket": self.bucket, "Key": key, "RestoreRequest": request})

    def put_swap(self, key: str, body: bytes, etag: str | None) -> Call:
        # Compare-and-swap of a mutable object (a manifest head): replaces the
        # version read (IfMatch), or creates it only if absent (IfNoneMatch).
        condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        return self._call("put_object", {"Bucket": self.bucket, "Key": key, "Body": body, **condition})

    def put_replace(self, key: str, body: bytes) -> Call:
        """A plain PUT, last writer wins: only for a node cache's entries, the one
        object a writer may replace without a condition (one PUT is never torn,
        and a lost entry is a cache miss)."""
        return self._call("put_object", {"Bucket": self.bucket, "Key": key, "Body": body})

    def list_keys(
        self, prefix: str, token: str | None = None, start_after: str | None = None, max_keys: int | None = None
    ) -> Call:
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if token is not None:
            params["ContinuationToken"] = token
        elif start_after is not None:
            params["StartAfter"] = start_after
        if max_keys is not None:
            params["MaxKeys"] = max_keys
        return self._call("list_objects_v2", params)

    def get(self, key: str, version_id: str | None = None) -> Call:
        params = {"Bucket": self.bucket, "Key": key}
        if version_id is not None:
            params["VersionId"] = version_id
        return self._call("get_object", params)

    def get_start(self, key: str, version_id: str | None, size: int) -> Call:
        """The first ``size`` bytes of one version (a ranged GET: an erase reads
        which key a version it could not delete is sealed under)."""
        params = {"Bucket": self.bucket, "Key": key, "Range": f"bytes=0-{size - 1}"}
        if version_id is not None:
            params["VersionId"] = version_id
        return self._call("get_object", params)

    def versions(self, key: str, marker: tuple[str, str] | None = None) -> Call:
        """One page of the versions of ``key`` (and of keys it is a prefix of),
        newest first (admin: a failback reads the old region's own manifest heads)."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": key}
        if marker is not None:
            params["KeyMarker"], params["VersionIdMarker"] = marker
        return self._call("list_object_versions", params)

    def copy(self, source_key: str, key: str) -> Call:
        # IfNoneMatch="*" as for every write: a copy never replaces an object.
        return self._call(
            "copy_object",
            {
                "Bucket": self.bucket,
                "Key": key,
                "CopySource": {"Bucket": self.bucket, "Key": source_key},
                "IfNoneMatch": "*",
                **self._class_of(key),
            },
        )

    def delete_many(self, keys: list[str]) -> Call:
        return self._call(
            "delete_objects",
            {
                "Bucket": self.bucket,
                "Delete": {"Objects": [{"Key": k} for k in keys], "Quiet": True},
            },
        )

    def delete_versions(self, versions: list[tuple[str, str | None]]) -> Call:
        """DeleteObjects of exact versions (None: the key as it is, which leaves a
        delete marker in a versioned bucket): an erase's purge (admin)."""
        objects = [{"Key": k, "VersionId": v} if v is not None else {"Key": k} for k, v in versions]
        return self._call("delete_objects", {"Bucket": self.bucket, "Delete": {"Objects": objects, "Quiet": True}})

    def head_version(self, key: str, version_id: str | None) -> Call:
        """HeadObject of one version: its Object Lock retention and legal hold
        are in the answer (with ``s3:GetObjectRetention`` / ``s3:GetObjectLegalHold``)."""
        params = {"Bucket": self.bucket, "Key": key}
        if version_id is not None:
            params["VersionId"] = version_id
        return self._call("head_object", params)

    def bucket_versioning(self) -> Call:
        return self._call("get_bucket_versioning", {"Bucket": self.bucket})

    def bucket_lifecycle(self) -> Call:
        return self._call("get_bucket_lifecycle_configuration", {"Bucket": self.bucket})

    def head_bucket(self) -> Call:
        return self._call("head_bucket", {"Bucket": self.bucket})

    def versioning(self) -> Call:
        return self._call("get_bucket_versioning", {"Bucket": self.bucket})

    def enable_versioning(self) -> Call:
        return self._call(
            "put_bucket_versioning", {"Bucket": self.bucket, "VersioningConfiguration": {"Status": "Enabled"}}
        )

    def create_bucket(self, region: str | None) -> Call:
        params: dict[str, Any] = {"Bucket": self.bucket}
        if region and region != "us-east-1":
            params["CreateBucketConfiguration"] = {"LocationConstraint": region}
        return self._call("create_bucket", params)


def put_immutable(
    s3: S3Calls,
    objects: dict[str, bytes],
    extra: tuple[Call, ...] = (),
    same: Callable[[str, bytes, bytes], bool] | None = None,
) -> Generator[Instruction, Any, list[Any]]:
    """Write immutable objects (with ``extra`` calls in the same round trip).

    A key that already holds the same bytes (as ``same(key, stored, wanted)`` judges;
    None: byte for byte) counts as written: that is a retried put. (An encrypted
    object written again holds another nonce: the sealer compares plaintexts.) A key holding different bytes raises
    ImmutableObjectConflictError and the stored object stays as it was.
    Returns the results of ``extra``.
    """
    pending = dict(objects)
    extra_results: list[Any] = []
    for attempt in range(_MAX_CONFLICT_RETRIES + 1):
        calls = tuple(s3.put_new(k, b) for k, b in pending.items())
        results = yield calls + (extra if attempt == 0 else ())
        if attempt == 0:
            extra_results = results[len(calls) :]
        existing, retry = _sort_out(calls, results)
        if existing:
            stored = yield tuple(s3.get(k) for k in existing)
            for key, result in zip(existing, stored):
                if isinstance(result, BaseException) and classify(result, "get_object") == OBJECT_MISSING:
                    # Deleted between the two requests (an empty hint object that a
                    # delete_for_runs removes): written again, as if first.
                    retry.append(key)
                    continue
                _check_same(s3, key, _body(s3.get(key), result), pending[key], same or _equal)
        if not retry:
            return extra_results
        pending = {k: pending[k] for k in retry}
    raise ImmutableObjectConflictError(
        f"concurrent writers kept racing on {sorted(pending)[:3]} in s3://{s3.bucket}"
    )


def copy_immutable(s3: S3Calls, pairs: dict[str, str]) -> Generator[Instruction, Any, None]:
    """Copy objects server-side (source key -> new key), as immutable writes.

    A new key that already exists is compared with its source: the same bytes
    are a copy done before (a copy_thread run again), different bytes raise
    ImmutableObjectConflictError and nothing is overwritten.
    """
    pending = {dst: src for src, dst in pairs.items()}
    for _ in range(_MAX_CONFLICT_RETRIES + 1):
        if not pending:
            return
        calls = tuple(s3.copy(src, dst) for dst, src in pending.items())
        results = yield calls
        existing, retry = _sort_out(calls, results)
        if existing:
            gets = tuple(s3.get(k) for dst in existing for k in (pending[dst], dst))
            bodies = yield gets
            for i, dst in enumerate(existing):
                source = _body(gets[2 * i], bodies[2 * i])
                _check_same(s3, dst, _body(gets[2 * i + 1], bodies[2 * i + 1]), source, _equal)
        pending = {dst: pending[dst] for dst in retry}
    if pending:
        raise ImmutableObjectConflictError(
            f"concurrent writers kept racing on {sorted(pending)[:3]} in s3://{s3.bucket}"
        )


def _sort_out(calls: tuple[Call, ...], results: list[Any]) -> tuple[list[str], list[str]]:
    """Keys that exist already (412 on IfNoneMatch) and keys to send again (409)."""
    existing: list[str] = []
    retry: list[str] = []
    for call, result in zip(calls, results):
        if not isinstance(result, BaseException):
            continue
        code = error_code(result)
        if code in PRECONDITION_FAILED_CODES:
            existing.append(call.params["Key"])
        elif code in CONDITIONAL_CONFLICT_CODES:
            retry.append(call.params["Key"])
        else:
            raise_failure(call, result)
    return existing, retry


def _body(call: Call, result: Any) -> bytes:
    if isinstance(result, BaseException):
        raise_failure(call, result)
    return result["Body"]


def _equal(key: str, stored: bytes, wanted: bytes) -> bool:
    return stored == wanted


def _check_same(s3: S3Calls, key: str, stored: bytes, wanted: bytes, same: Callable[[str, bytes, bytes], bool]) -> None:
    if not same(key, stored, wanted):
        raise ImmutableObjectConflictError(
            f"s3://{s3.bucket}/{key} already holds different content; immutable objects are never overwritten"
        )
