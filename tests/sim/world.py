"""The world the simulated processes share: one moto server, seen one call at a time.

The only ways in to the saver are its public methods and three pieces of its
sans-I/O contract (``_protocol``'s instructions, ``_retry.resilient`` and
``SyncDriver._send``), so the harness survives a redesign of the internals:

* :func:`capture` takes the operation a public method builds, by giving the
  saver a driver that records the operation instead of running it;
* :meth:`World.send` executes one call with real boto3 (``SyncDriver._send`` of
  a saver kept for that: the same response conventions as the driver).

Schedules are isolated by a prefix of their own (keys and index partitions are
separated by prefix), never by resetting the server. Bucket and table are
replaced every ``rotate_every`` schedules: moto lists and scans in time linear
in what a bucket or table holds.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta
from typing import Any, Callable

import boto3
from botocore.config import Config

# What the harness may know of the storage layout: nothing but the leftover check
# (check.leftovers) looks at keys, and only for the thread's id inside them.
SIM_INLINE_THRESHOLD = 64  # small: values go to objects of their own
OLD = timedelta(days=1)  # how old a listing shows an object no running operation wrote


_WORLDS = itertools.count()


def _encryption(endpoint: str, kind: str | None, label: str) -> Any:
    """The world's ``encryption=`` (one master key for every saver of the world, as one
    deployment's processes share theirs)."""
    if kind is None:
        return None
    from s3_saver import KmsKey, LocalKey

    if kind == "local":
        return LocalKey(os.urandom(32))
    if kind == "kms":
        kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
        key_id = kms.create_key(Description=f"simulation {label}")["KeyMetadata"]["KeyId"]
        return KmsKey(key_id, endpoint_url=endpoint, region_name="us-east-1")
    raise ValueError(f"encryption {kind!r}: 'local' or 'kms'")


class Captured(Exception):
    """Raised by the capturing driver: the public method built its operation."""


_NOT_RUN = object()


class _Capturer:
    """Stands in for a saver's sync driver: records the operation, sends nothing."""

    def __init__(self) -> None:
        self.op: Any = None
        self.policy: Any = None

    def run(self, op: Any, policy: Any = None) -> Any:
        self.op, self.policy = op, policy
        raise Captured

    def iterate(self, op: Any, policy: Any = None) -> Any:
        self.op, self.policy = op, policy
        return _NOT_RUN

    def close(self, keep: Any = None) -> None:  # S3Saver.close() may reach it
        pass


class HarnessError(AssertionError):
    """The harness itself cannot go on (not a defect of the saver)."""


def capture(saver: Any, call: Callable[[Any], Any]) -> Any:
    """The operation (a generator) that ``call(saver)`` -- one public method of
    ``saver`` -- builds, not started. An exception the method raises before it
    reaches its driver (argument checks) is raised here."""
    real = saver._sync
    capturer = _Capturer()
    saver._sync = capturer
    try:
        try:
            call(saver)
        except Captured:
            pass
    finally:
        saver._sync = real
    if capturer.op is None:
        raise HarnessError("the public method returned without handing an operation to its driver")
    return capturer.op


class World:
    """One index mode (``"dynamodb"`` or ``"manifest"``) on the moto server."""

    def __init__(
        self,
        endpoint: str,
        mode: str,
        *,
        rotate_every: int = 40,
        label: str | None = None,
        versioned: bool = False,
        encryption: str | None = None,
    ) -> None:
        from s3_saver import S3Saver

        if mode not in ("dynamodb", "manifest"):
            raise ValueError(mode)
        self.endpoint = endpoint
        self.mode = mode
        # Buckets with versioning on (erase_thread's schedules): a delete leaves versions.
        self.versioned = versioned
        self.rotate_every = rotate_every
        # Unique per World: two tests of one worker never share a bucket or a prefix.
        self.label = label or f"{os.getpid() % 10000}{next(_WORLDS)}"
        config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=32)
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config)
        self.dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1", config=config)
        self._S3Saver = S3Saver
        self._generation = -1
        self._schedules = itertools.count()
        self._in_generation = 0
        self.bucket = ""
        self.table: str | None = None
        # Object key -> the logical operation (scheduler.LogicalOp) that last wrote it.
        self.writers: dict[str, Any] = {}
        self.puts_to_come: Any = set  # set by the scheduler: checkpoint ids whose put may still commit
        self.calls_sent = 0
        self.savers: list[Any] = []
        self._sender: Any = None
        # Encrypted worlds (sim.crypto): every saver built with ``encryption=`` ("local": a
        # LocalKey, "kms": a KmsKey on the moto server's KMS), the key store beside each bucket.
        self.encryption_kind = encryption
        self.encryption = _encryption(endpoint, encryption, self.label)
        self.prefix = ""
        # The current schedule's history as the world saw it: every key record PUT (key in
        # the key bucket -> the key ids written there), and each erased thread's objects and
        # index items as they were just before its erase's first call (sim.crypto).
        self.key_ids: dict[str, set[bytes]] = {}
        self.before_erase: dict[str, Any] = {}
        # A migration's thread as read just before its first call (None: no one place read
        # it whole), and what the checks at its cuts found; the rotation's keys, made once.
        self.before_migrate: dict[str, Any] = {}
        self.cut_problems: list[str] = []
        self._rotation: Any = None
        self._rotate()

    # -- places ------------------------------------------------------------------------
    def _rotate(self) -> None:
        old_table = self.table
        self._generation += 1
        self._in_generation = 0
        self.bucket = f"sim-{self.mode[:3]}-{self.label}-{self._generation}".lower()
        self.table = f"sim-{self.mode[:3]}-{self.label}-{self._generation}" if self.mode == "dynamodb" else None
        if self.versioned:  # on before setup(), which reads it (the manifest's lean heads)
            self.s3.create_bucket(Bucket=self.bucket)
            self.s3.put_bucket_versioning(Bucket=self.bucket, VersioningConfiguration={"Status": "Enabled"})
        setup = self.saver("setup")
        setup.setup()
        self._sender = self.saver("world")
        self.writers.clear()
        if old_table is not None:
            try:  # moto keeps every table in memory
                self.dynamodb.delete_table(TableName=old_table)
            except Exception:
                pass

    def new_prefix(self, tag: str = "s") -> str:
        """A prefix for one schedule (every ``rotate_every``, a new bucket and table)."""
        if self._in_generation >= self.rotate_every:
            self._rotate()
        self._in_generation += 1
        self.prefix = f"{tag}{next(self._schedules)}"
        self.key_ids.clear()
        self.before_erase.clear()
        self.before_migrate.clear()
        self.cut_problems.clear()
        return self.prefix

    def rotation(self) -> tuple[Any, Any]:
        """(the processes' key during a rotation: the new key, the old one still read;
        the rewrap's target: the new key alone), made once per world."""
        if self._rotation is None:
            from s3_saver import KmsKey, LocalKey

            old = self.encryption
            if isinstance(old, LocalKey):
                new = os.urandom(32)
                self._rotation = (LocalKey(new, previous=[old]), LocalKey(new))
            else:
                kms = boto3.client("kms", endpoint_url=self.endpoint, region_name="us-east-1")
                key_id = kms.create_key(Description=f"simulation {self.label} rotated")["KeyMetadata"]["KeyId"]
                new_key = KmsKey(key_id, endpoint_url=self.endpoint, region_name="us-east-1")
                self._rotation = (new_key, new_key)  # a record names the KMS key that wrapped it
        return self._rotation

    @property
    def key_bucket(self) -> str:
        return f"{self.bucket}-keys"  # the default key store (encrypted worlds)

    def saver(self, prefix: str, **options: Any) -> Any:
        """A new saver, as a new process would build it (no cache shared with any
        other); it shares the boto3 clients, which hold nothing of the saver."""
        options.setdefault("inline_threshold", SIM_INLINE_THRESHOLD)
        if self.encryption is not None:
            options.setdefault("encryption", self.encryption)
        saver = self._S3Saver(
            self.bucket,
            table=self.table,
            prefix=prefix,
            region_name="us-east-1",
            s3_client=self.s3,
            dynamodb_client=self.dynamodb,
            **options,
        )
        self.savers.append(saver)
        return saver

    def requests(self) -> int:
        """Requests sent so far: by the scheduler, and by the savers' own drivers
        (setup and checks); forgets the savers counted."""
        total = self.calls_sent + sum(s.stats.total_requests for s in self.savers)
        self.calls_sent = 0
        self.savers.clear()
        return total

    # -- one call -----------------------------------------------------------------------
    def between_calls(self, scheduler: Any) -> None:
        """Before the scheduler picks the next call: what the world does on its own
        (nothing here; two regions replicate, sim.failover)."""

    def at_cut(self, scheduler: Any, op: Any) -> None:
        """A process was cut short in ``op`` (its generator closed, nothing in flight of
        it): an encrypted world checks a migration's thread there (sim.crypto)."""
        if self.encryption is not None:
            from sim import crypto

            crypto.at_cut(self, scheduler, op)

    def send(self, call: Any, writer: Any = None) -> Any:
        """Execute one call; the response (get_object bodies read) or the exception."""
        self.calls_sent += 1
        if self.encryption is not None and writer is not None:
            from sim import crypto

            crypto.before_call(self, call, writer)
        result = self._sender._sync._send(call)
        if isinstance(result, BaseException) or call.service != "s3":
            return result
        if self.encryption is not None and call.operation == "put_object" and call.params.get("Bucket") == self.key_bucket:
            from sim import crypto

            crypto.record_written(self, call)
        if call.operation in ("put_object", "copy_object", "complete_multipart_upload") and writer is not None:
            key = call.params.get("Key")
            if key is not None:
                self.writers[key] = writer
        elif call.operation in ("list_objects_v2", "list_objects", "list_object_versions"):
            self._age(result)
        return result

    def _age(self, page: dict[str, Any]) -> None:
        """The grace period, idealised: an object written by an operation still
        running (or cut short and about to be retried) is listed as written now;
        any other object as written a day ago. So ``collect_garbage`` with a
        grace of an hour may take exactly what no write in flight can still
        commit, whatever the wall clock did while the schedule ran. A step's
        pending writes are as young as their checkpoint's put while it may still
        commit: LangGraph calls that put before the writes (its queue may send it
        after them), seconds apart, never an hour."""
        listed = [*(page.get("Contents", ()) or ()), *(page.get("Versions", ()) or ()), *(page.get("DeleteMarkers", ()) or ())]
        coming = self.puts_to_come()
        for obj in listed:
            writer = self.writers.get(obj.get("Key"))
            parts = (obj.get("Key") or "").split("/writes/", 1)
            if len(parts) == 2 and parts[1].split("/", 1)[0] in coming:
                continue
            if writer is None or not writer.in_flight:
                if "LastModified" in obj:
                    obj["LastModified"] = obj["LastModified"] - OLD

    # -- the leftover check's view (the only place that looks at keys) -------------------
    def objects_naming(self, prefix: str, token: str) -> list[tuple[str, int]]:
        """(key, size) of the objects under ``prefix`` whose key contains ``token``."""
        found = []
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix.rstrip("/") + "/")
        for page in pages:
            for obj in page.get("Contents", ()):
                if token in obj["Key"]:
                    found.append((obj["Key"], obj.get("Size", 0)))
        return found

    def versions_naming(self, prefix: str, token: str) -> list[tuple[str, int, bool]]:
        """(key, size, current) of every version and delete marker (size -1, never
        current) under ``prefix`` whose key contains ``token``."""
        found = []
        pages = self.s3.get_paginator("list_object_versions").paginate(Bucket=self.bucket, Prefix=prefix.rstrip("/") + "/")
        for page in pages:
            for v in page.get("Versions", ()):
                if token in v["Key"]:
                    found.append((v["Key"], v.get("Size", 0), bool(v.get("IsLatest"))))
            for m in page.get("DeleteMarkers", ()):
                if token in m["Key"]:
                    found.append((m["Key"], -1, False))
        return found

    def items_naming(self, prefix: str, token: str) -> list[dict[str, Any]]:
        """Index items (DynamoDB mode) of ``prefix`` whose keys contain ``token``."""
        if self.table is None:
            return []
        found = []
        for page in self.dynamodb.get_paginator("scan").paginate(TableName=self.table):
            for item in page.get("Items", ()):
                keys = [v.get("S", "") for k, v in item.items() if k in ("pk", "sk") or k.endswith("pk") or k.endswith("sk")]
                if any(prefix in k for k in keys) and any(token in k for k in keys):
                    found.append(item)
        return found
