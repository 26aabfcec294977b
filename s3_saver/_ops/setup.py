"""setup: create the bucket and the index when missing, check them when present."""

from __future__ import annotations

from typing import Any

from s3_saver._ops.context import Context
from s3_saver._ops.versioning import warn_setup
from s3_saver._transport.failures import (
    BUCKET_MISSING,
    BUCKET_OURS_CODES,
    classify,
    error_code,
)
from s3_saver._transport.mode import settle_mode
from s3_saver._transport.protocol import Op, raise_failure, request, request_one
from s3_saver.errors import ConfigurationError


def setup(ctx: Context, region: str | None, versioned: bool = False) -> Op[None]:
    """Create the bucket (``versioned``: with versioning on, as replication
    needs; a bucket that exists is left as it is) and the index."""
    (head,) = yield (ctx.s3.head_bucket(),)
    bucket_region = None
    if isinstance(head, BaseException):
        if classify(head, "head_bucket") != BUCKET_MISSING:
            raise_failure(ctx.s3.head_bucket(), head)
        (created,) = yield (ctx.s3.create_bucket(region),)
        if isinstance(created, BaseException) and error_code(created) not in BUCKET_OURS_CODES:
            raise_failure(ctx.s3.create_bucket(region), created)
        if versioned:
            yield from request_one(ctx.s3.enable_versioning())
    else:
        bucket_region = _bucket_region(head)
    if ctx.crypt is not None:
        # The key store beside the bucket (same region), never versioned.
        yield from ctx.crypt.store.setup(bucket_region or region)
        if ctx.crypt.partner is not None:
            # With a replica, a KMS key must unwrap in both regions.
            yield from ctx.crypt.check_replicable()
    # Before the index is made or touched: the prefix's index mode is read, and
    # surveyed when it has no marker (a store of an earlier version); a prefix
    # of the other mode is refused with nothing created. A prefix of a lost
    # table (``ModeMark.lost``) is not: setup() makes the table that
    # rebuild_index() then moves the prefix to. Until that move, the prefix
    # stays the lost table's, and this saver object is refused again (``stay``).
    try:
        yield from settle_mode(ctx.mode, survey=True, claim=False, move=True)
        yield from _setup_index(ctx, bucket_region)
    finally:
        if ctx.mode is not None:
            ctx.mode.stay()


def _setup_index(ctx: Context, bucket_region: str | None) -> Op[None]:
    yield from ctx.index.setup(ctx.s3.bucket, bucket_region, bool(ctx.ttl_seconds))
    if ctx.index.owner is not None:
        # Record (or check) which bucket owns the table's prefix.
        yield from ctx.index.owner.ensure()
    # Once the index is ready (a store setup() refuses stays free for the other
    # mode): the prefix's mode is recorded, if the owner's record did not already.
    yield from settle_mode(ctx.mode, survey=True, claim=True)
    # After the ownership check (a refused saver writes nothing): a table of an
    # earlier version has its listing and run hints moved into their shards.
    yield from ctx.index.reshard()
    # Last: the manifest writes heads without bodies on a versioned bucket from here on.
    yield from warn_setup(ctx)


def check(ctx: Context) -> Op[None]:
    """The bucket exists, its prefix is of the saver's index mode, and owns the
    table's prefix (an index read alone cannot tell a bucket that is gone, a
    prefix of the other mode, or another app's table)."""
    (head,) = yield (ctx.s3.head_bucket(),)
    if isinstance(head, BaseException):
        raise_failure(ctx.s3.head_bucket(), head)
    # The command line's first call: a prefix of the other index mode is
    # refused before a command answers "no threads" (nothing is written).
    yield from settle_mode(ctx.mode, survey=True, claim=False)
    owner = ctx.index.owner
    if owner is not None and not owner.checked:
        # After the HeadBucket (the driver's check does not ride on it): a
        # bucket that is gone is named as such, not as another bucket's table.
        yield from owner.ensure()


def _bucket_region(head: dict[str, Any]) -> str | None:
    """The region HeadBucket names (a wrong ``region_name`` must not create a
    second, empty index next to a bucket that lives elsewhere)."""
    return head.get("BucketRegion") or head.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
        "x-amz-bucket-region"
    )


def require_versioning(what: str, *ctxs: Context) -> Op[None]:
    """Refuse ``what`` unless every bucket of ``ctxs`` has versioning on.

    Replication needs it, and a failback's merge reads the old region's own
    last manifest head from the noncurrent versions of its key: without
    them, every checkpoint that region committed and never replicated would
    read as missing, without a word (issue 34)."""
    states = yield from request(*(c.s3.versioning() for c in ctxs))
    for ctx, state in zip(ctxs, states):
        if state.get("Status") != "Enabled":
            raise ConfigurationError(
                f"{what} needs versioning on s3://{ctx.s3.bucket} (it is {state.get('Status') or 'off'}): "
                "replication needs it, and a failback reads the old region's own index from the bucket's "
                "object versions. Turn it on (infra/replica.yaml does) and call again"
            )
