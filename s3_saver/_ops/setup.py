"""setup: create the bucket and the index when missing, check them when present."""

from __future__ import annotations

from typing import Any

from s3_saver._ops.context import Context
from s3_saver._ops.versioning import warn_setup
from s3_saver._protocol import Op, raise_failure
from s3_saver.errors import BUCKET_MISSING, BUCKET_OURS_CODES, classify, error_code


def setup(ctx: Context, region: str | None) -> Op[None]:
    (head,) = yield (ctx.s3.head_bucket(),)
    bucket_region = None
    if isinstance(head, BaseException):
        if classify(head, "head_bucket") != BUCKET_MISSING:
            raise_failure(ctx.s3.head_bucket(), head)
        (created,) = yield (ctx.s3.create_bucket(region),)
        if isinstance(created, BaseException) and error_code(created) not in BUCKET_OURS_CODES:
            raise_failure(ctx.s3.create_bucket(region), created)
    else:
        bucket_region = _bucket_region(head)
    yield from ctx.index.setup(ctx.s3.bucket, bucket_region, bool(ctx.ttl_seconds))
    # Last: the manifest writes lean heads on a versioned bucket from here on.
    yield from warn_setup(ctx)


def _bucket_region(head: dict[str, Any]) -> str | None:
    """The region HeadBucket names (a wrong ``region_name`` must not create a
    second, empty index next to a bucket that lives elsewhere)."""
    return head.get("BucketRegion") or head.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
        "x-amz-bucket-region"
    )
