"""A replica region: its settings, and what promote and verify report.

S3 replication copies each object of the primary bucket to the replica bucket
on its own, in no particular order, usually within seconds. The saver reads
there when the primary fails, and always lag-safe: the newest checkpoint whose
objects have all arrived, never a mixed one (see ``_ops/lagged.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from s3_saver._ops.rebuild_keys import Unindexed
from s3_saver._transport.clients import (
    BUCKET_RULE,
    TABLE_NAME,
    TABLE_RULE,
    bucket_name_ok,
)
from s3_saver.errors import ConfigurationError

ON_LAG = ("older", "raise")


@dataclass(frozen=True)
class Replica:
    """A second region holding a replica of the bucket (and of the index).

    Reads fall over to it when the primary fails (the saver's, and those of a store made by
    [S3Store.from_saver()][s3_saver.S3Store.from_saver]); writes go to it only after
    [S3Saver.promote()][s3_saver.S3Saver.promote]. The prefix is the primary's (replication keeps keys).

    Attributes:
        bucket: The replica bucket (S3 replication's destination).
        region_name: Its region.
        endpoint_url: Endpoint for both services there (S3-compatible stores, tests).
        s3_endpoint_url: Endpoint for S3 only.
        dynamodb_endpoint_url: Endpoint for DynamoDB only.
        table: DynamoDB mode: the index table in that region (default: the
            primary's table name, as a global table keeps it).
        global_table: DynamoDB mode: the table is a replica of a DynamoDB
            global table, so reads can use it before ``promote()``, which then
            has nothing to rebuild. Without it, the table there is filled by
            ``promote()`` (rebuilt from the replica bucket) and reads wait for it;
            [S3Store.from_saver()][s3_saver.S3Store.from_saver] then refuses the saver
            (memory items live in the table: a rebuild from the bucket has none).
        failover_after: Seconds a read may spend on the primary, its retries
            included, before it goes to the replica (a single attempt that
            hangs still ends only at the client's read timeout).
        recheck_after: After a failover, reads go straight to the replica for
            this many seconds before the primary is tried again.
        on_lag: What a read of the latest checkpoint returns when the replica's
            index names checkpoints whose objects have not all arrived:
            ``"older"`` the newest complete one (``saver.last_read`` says how
            stale), ``"raise"`` a [ReplicationLagError][s3_saver.errors.ReplicationLagError].
        key_bucket: With ``encryption=``: the replica region's key store, a bucket of
            its own there (never replicated, unversioned, as the primary's); None:
            ``<bucket>-keys``. Each thread's key is created in both regions' stores,
            and destroyed in both by an erase.
        boto3_session: Session the sync clients there are made from.
        aioboto3_session: Session the async clients there are made from.
        s3_client: A ready boto3 S3 client for the replica region.
        dynamodb_client: A ready boto3 DynamoDB client for the replica region.
    """

    bucket: str
    region_name: str | None = None
    endpoint_url: str | None = None
    s3_endpoint_url: str | None = None
    dynamodb_endpoint_url: str | None = None
    table: str | None = None
    global_table: bool = False
    failover_after: float = 3.0
    recheck_after: float = 30.0
    on_lag: str = "older"
    key_bucket: str | None = None
    boto3_session: Any = field(default=None, repr=False)
    aioboto3_session: Any = field(default=None, repr=False)
    s3_client: Any = field(default=None, repr=False)
    dynamodb_client: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.bucket, str) or not self.bucket:
            raise ConfigurationError(f"Replica.bucket must be a non-empty string, got {self.bucket!r}")
        if not bucket_name_ok(self.bucket):
            raise ConfigurationError(f"Replica.bucket={self.bucket!r} is not an S3 bucket name ({BUCKET_RULE})")
        if self.table is not None and (not isinstance(self.table, str) or not TABLE_NAME.match(self.table)):
            raise ConfigurationError(f"Replica.table={self.table!r} is not a DynamoDB table name ({TABLE_RULE})")
        for name in ("failover_after", "recheck_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigurationError(f"Replica.{name} must be a number of seconds >= 0, got {value!r}")
        if self.on_lag not in ON_LAG:
            raise ConfigurationError(f"Replica.on_lag must be one of {ON_LAG}, got {self.on_lag!r}")
        if self.key_bucket is not None and (not isinstance(self.key_bucket, str) or not bucket_name_ok(self.key_bucket)):
            raise ConfigurationError(f"Replica.key_bucket={self.key_bucket!r} is not an S3 bucket name ({BUCKET_RULE})")


@dataclass(frozen=True)
class ReplicationGap:
    """A checkpoint or pending-write part one region holds and the other lacks.

    Attributes:
        thread_id: Its thread.
        ns: Its namespace.
        checkpoint_id: The checkpoint (of the write, for a pending write).
        kind: ``"checkpoint"`` or ``"writes"``.
        task_id: The writing task (pending writes).
        missing: Object keys absent from the other bucket (empty: only the
            other index lacks the entry). In ``set_aside``: the objects of
            the parts the merge did not keep.
        reason: Why it is reported: ``""`` for a gap between the regions; in
            ``set_aside``, why a failback's merge did not keep it.
    """

    thread_id: str
    ns: str
    checkpoint_id: str
    kind: str
    task_id: str | None = None
    missing: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class ReplicationReport:
    """What [S3Saver.verify()][s3_saver.S3Saver.verify] found, comparing the primary and the replica.

    Attributes:
        primary: ``s3://bucket`` (region) of the primary.
        replica: ``s3://bucket`` (region) of the replica.
        threads: Threads compared.
        unreplicated: Entries the primary holds and the replica lacks, whole or
            in part. After a failback these are the writes that reached the old
            primary and never replicated before the outage (plus any written
            since that replication has not copied yet).
        replica_only: Entries the replica holds, complete, that the primary lacks.
        set_aside: Committed checkpoints and pending writes that a failback's
            merge did not keep, each with its ``reason``: a task both regions
            ran keeps one run (the region promoted away from wins), and what
            the merge could not find all objects of goes. Readers no longer
            reach them; their objects stay until garbage collection.
    """

    primary: str
    replica: str
    threads: int
    unreplicated: tuple[ReplicationGap, ...]
    replica_only: tuple[ReplicationGap, ...]
    set_aside: tuple[ReplicationGap, ...] = ()

    @property
    def in_sync(self) -> bool:
        return not self.unreplicated and not self.replica_only


@dataclass(frozen=True)
class Promotion:
    """What [S3Saver.promote()][s3_saver.S3Saver.promote] did.

    Attributes:
        primary: The region now written to (``s3://bucket`` (region)).
        replica: The region reads now fall over to.
        checked: True when the former primary answered and everything its index
            holds was found in the new primary (False: it was unreachable).
        rebuilt: Checkpoints indexed by a rebuild from the bucket (None: the
            promoted region's index was settled instead, see [S3Saver.promote()][s3_saver.S3Saver.promote]).
        incomplete: Checkpoints left out of the promoted region's index because
            their objects never all arrived there (``thread/ns/checkpoint_id``).
        incomplete_writes: Pending writes left out for the same reason, or
            because the other region ran the same task too and its run won
            (``thread/ns/checkpoint_id/task_id``; [S3Saver.verify()][s3_saver.S3Saver.verify]
            lists a failback's with their reason, in ``set_aside``).
        unindexed: With ``encryption=``, what the rebuild left out because it
            cannot be opened, each with why ([Unindexed][s3_saver.Unindexed]): a
            thread erased, or whose key never reached the promoted region's key
            store (its checkpoints are in ``incomplete`` too).
    """

    primary: str
    replica: str
    checked: bool
    rebuilt: int | None
    incomplete: tuple[str, ...] = ()
    incomplete_writes: tuple[str, ...] = ()
    unindexed: tuple[Unindexed, ...] = ()


