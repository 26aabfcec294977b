"""The regions a saver talks to, and how a read chooses between them.

A saver with a [Replica][s3_saver.Replica] has two sites: the primary (written
to) and the replica (read when the primary fails). Each has its own bucket,
index and clients; both are driven by the saver's one sync and one async
driver, which send each call with the clients of the site its ``Where`` names,
so an operation may read both regions (``verify``, ``promote``).

A read goes to the primary first, with a retry budget of
``Replica.failover_after`` for failures (no answer, timeouts, 5xx) and its
whole ``RetryPolicy.throttle_budget`` for throttling (a throttling primary is
up, and holds the newest state); when the primary stays unavailable after
those retries the same read runs on the replica, lag-safe, and for
``Replica.recheck_after`` seconds later reads go straight there. A write never falls over: it raises
``PrimaryUnavailableError`` until [S3Saver.promote()][s3_saver.S3Saver.promote] swaps the roles.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from botocore.config import Config

from s3_saver._crypto.config import Encryption, KmsKey, key_bucket_of
from s3_saver._crypto.keys import Crypt
from s3_saver._format.keys import KeyLayout
from s3_saver._index.dynamodb.backend import DynamoIndex
from s3_saver._index.manifest.backend import ManifestIndex
from s3_saver._ops.context import Context
from s3_saver._ops.lagged import lag_safe
from s3_saver._ops.source import ReadSource, ReplicaReads
from s3_saver._regions.replica import Replica
from s3_saver._transport.clients import Clients
from s3_saver._transport.clients import client_config as merged_config
from s3_saver._transport.mode import ModeMark
from s3_saver._transport.ownership import Ownership
from s3_saver._transport.protocol import PRIMARY, Emit, Op, T
from s3_saver._transport.retry import RetryPolicy, resilient
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import PrimaryUnavailableError, StoreUnavailableError, Where

REPLICA = "replica"
# A routed read retries inside (per region): the driver around it sends once.
ONCE = RetryPolicy(attempts=1, budget=None, throttle_budget=0)


@dataclass
class Site:
    """One region's bucket, table and clients (``key``: its name in calls' ``Where``;
    its operations' context is the saver's, which swaps on ``promote``)."""

    key: str
    where: Where
    clients: Clients
    given: list[Any]
    # The table's ownership check (``_transport/ownership``); None in manifest mode.
    owner: Ownership | None = None
    # The prefix's index-mode check (``_transport/mode``), in both modes.
    mode: ModeMark | None = None

    def describe(self) -> str:
        region = self.where.region("s3")
        text = f"s3://{self.where.bucket}" + (f" ({region})" if region else "")
        return text + (f" with table {self.where.table!r}" if self.where.table else "")


def make_site(
    key: str,
    bucket: str,
    table: str | None,
    *,
    region_name: str | None,
    endpoints: dict[str, str | None],
    given: dict[str, Any],
    boto3_session: Any,
    aioboto3_session: Any,
    client_config: Config | None,
    max_concurrency: int,
    layout: KeyLayout,
    storage_class: str | None,
    settings: dict[str, Any],
    global_table: bool = False,
    partner: str | None = None,
    partner_table: str | None = None,
    encryption: Encryption | None = None,
    key_bucket: str | None = None,
) -> tuple[Site, Context]:
    """A region's site (clients made lazily) and its operations' context
    (``global_table``: its table is one of a global table's replicas;
    ``partner``: the other region's bucket, which may own the table too;
    ``partner_table``: the other region's table, which the prefix's marker may name;
    ``encryption``: the saver's, whose key store and KMS calls go with this site's clients;
    ``key_bucket``: this region's key store, when not the one ``encryption`` names)."""
    where = Where(bucket, table, site=key)
    s3_calls = S3Calls(bucket, where, layout.root, storage_class)
    # KMS calls go to the key's region (its ARN's, or KmsKey.region_name) in the region
    # written to; a replica region's to its own (the replica of a multi-Region key).
    kms_region = None
    if isinstance(encryption, KmsKey):
        kms_region = encryption.region_name if key == PRIMARY else region_name
    # The saver's one cache budget; each region's caches apart within it.
    budget = settings["budget"].site(key, key == PRIMARY)
    index: DynamoIndex | ManifestIndex
    if table:
        index = DynamoIndex(table, layout, where)
        # Both regions write it: each writes item names the region that committed it.
        index.calls.site = bucket if global_table else None
        # A global table's replica region receives the primary's record.
        claims = not (global_table and key == REPLICA)
        index.owner = Ownership(table, layout, where, endpoints["s3"], partner, claims)
    else:
        index = ManifestIndex(s3_calls, layout, budget)
    clients = Clients(
        where=where,
        region_name=region_name,
        endpoints=endpoints,
        config=merged_config(client_config, max_concurrency=max_concurrency, path_style=bool(endpoints["s3"])),
        boto3_session=boto3_session,
        given=given,
        aioboto3_session=aioboto3_session,
        service_regions={"kms": kms_region} if kms_region else None,
    )
    crypt = None
    if encryption is not None:
        keys = key_bucket or key_bucket_of(encryption, bucket)
        crypt = Crypt(encryption, bucket, layout.prefix, keys, where, budget, kms_region or region_name)
    # Each region's bucket carries the marker (replication copies it): a promoted
    # replica finds it there, naming the other region's table (accepted: it is
    # this prefix's index in that region).
    mode = ModeMark(s3_calls, layout, table, partner_table)
    site = Site(key, where, clients, [c for c in given.values() if c is not None], index.owner, mode)
    return site, Context(layout=layout, s3=s3_calls, index=index, mode=mode, crypt=crypt, **{**settings, "budget": budget})


class Route:
    """Which region a read goes to, and the failover state shared by all reads.

    Attributes:
        writer: The site written to (the primary until ``promote``).
        reader: The other site, read when ``writer`` fails.
    """

    def __init__(self, writer: Site, reader: Site, replica: Replica, policy: RetryPolicy) -> None:
        self.replica = replica
        # Replication keeps an index in both regions (manifest heads, a global
        # table): reads can go over. A DynamoDB table filled by promote()'s
        # rebuild, or left behind by a failover, would answer "no such thread"
        # or an old state: never read before it is promoted.
        self.replicated = writer.where.table is None or replica.global_table
        self.policy = policy
        # A failing primary is left at failover_after: the replica answers sooner.
        # A throttling one is up and holds the newest state: it is ridden out for
        # the whole throttle_budget (within budget), as without a replica.
        outage = min(x for x in (policy.budget, policy.outage_budget, replica.failover_after) if x is not None)
        self.fast = replace(policy, outage_budget=outage)
        self.source: contextvars.ContextVar[ReadSource | None] = contextvars.ContextVar("s3_saver_read", default=None)
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._cause: str | None = None
        self.writer, self.reader = writer, reader
        self._roles()

    def swap(self) -> None:
        """``promote``: the reader becomes the writer, and the other way round."""
        with self._lock:
            self.writer, self.reader = self.reader, self.writer
            self._down_until, self._cause = 0.0, None
        self._roles()

    def _roles(self) -> None:
        # Failures of the written region name the other one and promote().
        self.writer.where.fallback, self.reader.where.fallback = self.reader.describe(), None

    def as_writer(self, ctx: Context) -> Context:
        return replace(ctx, replica=None)

    def as_reader(self, ctx: Context, role: str = REPLICA) -> Context:
        """``ctx`` reading lag-safe, telling ``last_read`` how stale each answer is."""
        where = ctx.s3.where
        reads = ReplicaReads(role, where.bucket, where.region("s3"), self.replica.on_lag, self.source)
        return replace(ctx, replica=reads)

    def routed(self, make: Callable[[Context], Op[T]], writer_ctx: Context, reader_ctx: Context) -> Op[T]:
        """The read ``make(ctx)`` on the writer, or on the reader when the writer is unavailable.

        A read that already emitted results (a ``list`` half done) does not
        fall over: the caller would see some checkpoints twice.
        """
        if not self.replicated:
            # Nothing else can answer: the primary with its whole retry policy.
            self._tell(writer_ctx, failover=False)
            try:
                return (yield from resilient(make(writer_ctx), self.policy))
            except StoreUnavailableError as exc:
                raise PrimaryUnavailableError(
                    f"{exc}. The other region ({self.reader.describe()}) has no index that replication keeps "
                    "(DynamoDB mode without a global table): reads there wait for saver.promote(), which "
                    "rebuilds it from the replica bucket (see the README's failover runbook)"
                ) from exc
        if time.monotonic() >= self._down_until:
            # Told first: a lag-safe read adds how stale its answer is.
            self._tell(writer_ctx, failover=False)
            read = make(writer_ctx)
            # A promoted region's reads are lag-safe too (see ``S3Saver.promote``).
            op = resilient(lag_safe(writer_ctx, read) if writer_ctx.replica else read, self.fast)
            emitted = False
            reply: Any = None
            try:
                while True:
                    try:
                        step = op.send(reply)
                    except StopIteration as stop:
                        return stop.value
                    emitted = emitted or isinstance(step, Emit)
                    reply = yield step
            except StoreUnavailableError as exc:
                if emitted:
                    raise
                with self._lock:
                    self._down_until = time.monotonic() + self.replica.recheck_after
                    self._cause = f"{type(exc).__name__}: {exc}"
        self._tell(reader_ctx, failover=True)
        return (yield from resilient(lag_safe(reader_ctx, make(reader_ctx)), self.policy))

    def _tell(self, ctx: Context, failover: bool) -> None:
        where = ctx.s3.where
        self.source.set(
            ReadSource(
                REPLICA if failover else PRIMARY,
                where.bucket,
                where.region("s3"),
                failover=failover,
                cause=self._cause if failover else None,
            )
        )
