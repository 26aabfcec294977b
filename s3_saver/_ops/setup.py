"""setup: create the bucket and the table when missing, check them when present."""

from __future__ import annotations

from typing import Any

from s3_saver._dynamodb import TABLE_ATTRIBUTE_DEFINITIONS, TABLE_KEY_SCHEMA, TTL_ATTRIBUTE
from s3_saver._ops.context import Context
from s3_saver._protocol import Op, Sleep, raise_failure, request_one
from s3_saver.errors import (
    BUCKET_MISSING,
    BUCKET_OURS_CODES,
    TABLE_MISSING,
    TABLE_RACING_CODES,
    ConfigurationError,
    SetupMismatchError,
    SetupTimeoutError,
    classify,
    error_code,
)
_POLL_SECONDS = 0.5
_POLL_LIMIT = 600


def setup(ctx: Context, region: str | None) -> Op[None]:
    head, described = yield (ctx.s3.head_bucket(), ctx.index.describe())
    creates = []
    if isinstance(head, BaseException):
        if classify(head, "head_bucket") != BUCKET_MISSING:
            raise_failure(ctx.s3.head_bucket(), head)
        creates.append(ctx.s3.create_bucket(region))
    if isinstance(described, BaseException):
        if classify(described) != TABLE_MISSING:
            raise_failure(ctx.index.describe(), described)
        if not isinstance(head, BaseException):
            _check_bucket_region(ctx, head)
        creates.append(ctx.index.create())
    else:
        _check_shape(ctx.index.table, described["Table"])
    if creates:
        results = yield tuple(creates)
        for call, result in zip(creates, results):
            ours = error_code(result) in BUCKET_OURS_CODES | TABLE_RACING_CODES
            if isinstance(result, BaseException) and not ours:
                raise_failure(call, result)
    status = described.get("Table", {}).get("TableStatus") if isinstance(described, dict) else None
    for _ in range(_POLL_LIMIT):
        if status == "ACTIVE":
            break
        if status is not None:
            yield Sleep(_POLL_SECONDS)
        status = (yield from request_one(ctx.index.describe()))["Table"]["TableStatus"]
    else:
        raise SetupTimeoutError(
            f"table {ctx.index.table} did not become ACTIVE within {_POLL_LIMIT * _POLL_SECONDS:.0f} s; "
            "run setup() again"
        )
    if ctx.ttl_seconds:
        ttl = yield from request_one(ctx.index.describe_ttl())
        if ttl.get("TimeToLiveDescription", {}).get("TimeToLiveStatus") not in {"ENABLED", "ENABLING"}:
            yield from request_one(ctx.index.enable_ttl())


def _check_bucket_region(ctx: Context, head: dict[str, Any]) -> None:
    """Refuse to create an index next to a bucket that lives in another region.

    A wrong ``region_name`` finds no table; creating one there would give the
    bucket a second, empty index. HeadBucket names the bucket's region.
    """
    bucket_region = head.get("BucketRegion") or (
        head.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region")
    )
    where = ctx.index.where
    table_region = where.region("dynamodb") if where is not None else None
    if bucket_region and table_region and bucket_region != table_region:
        raise ConfigurationError(
            f"bucket {ctx.s3.bucket!r} lives in region {bucket_region}, but the saver's region is "
            f"{table_region}, where table {ctx.index.table!r} does not exist. setup() created nothing: "
            f"set region_name={bucket_region!r} if the table lives with the bucket, or pass clients "
            "for each region"
        )


def _check_shape(table: str, description: dict[str, Any]) -> None:
    keys = sorted((k["AttributeName"], k["KeyType"]) for k in description["KeySchema"])
    want = sorted((k["AttributeName"], k["KeyType"]) for k in TABLE_KEY_SCHEMA)
    types = {a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])}
    want_types = {a["AttributeName"]: a["AttributeType"] for a in TABLE_ATTRIBUTE_DEFINITIONS}
    if keys != want or any(types.get(n) != t for n, t in want_types.items()):
        raise SetupMismatchError(
            f"table {table} has key schema {keys} with types {types}; the saver needs "
            f"{want} with types {want_types} (and TTL attribute {TTL_ATTRIBUTE!r}). "
            "Use another table name or recreate it."
        )
