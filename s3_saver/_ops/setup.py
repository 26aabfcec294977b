"""setup: create the bucket and the table when missing, check them when present."""

from __future__ import annotations

from typing import Any

from s3_saver._dynamodb import TABLE_ATTRIBUTE_DEFINITIONS, TABLE_KEY_SCHEMA, TTL_ATTRIBUTE
from s3_saver._ops.context import Context
from s3_saver._protocol import Op, Sleep, raise_failure, request_one
from s3_saver.errors import SetupMismatchError, error_code

_BUCKET_MISSING = {"404", "NoSuchBucket", "NotFound"}
_BUCKET_OURS = {"BucketAlreadyOwnedByYou"}
_TABLE_MISSING = {"ResourceNotFoundException"}
_TABLE_RACING = {"ResourceInUseException"}  # another process is creating it
_POLL_SECONDS = 0.5
_POLL_LIMIT = 600


def setup(ctx: Context, region: str | None) -> Op[None]:
    head, described = yield (ctx.s3.head_bucket(), ctx.index.describe())
    creates = []
    if isinstance(head, BaseException):
        if error_code(head) not in _BUCKET_MISSING:
            raise_failure(ctx.s3.head_bucket(), head)
        creates.append(ctx.s3.create_bucket(region))
    if isinstance(described, BaseException):
        if error_code(described) not in _TABLE_MISSING:
            raise_failure(ctx.index.describe(), described)
        creates.append(ctx.index.create())
    else:
        _check_shape(ctx.index.table, described["Table"])
    if creates:
        results = yield tuple(creates)
        for call, result in zip(creates, results):
            if isinstance(result, BaseException) and error_code(result) not in _BUCKET_OURS | _TABLE_RACING:
                raise_failure(call, result)
    status = described.get("Table", {}).get("TableStatus") if isinstance(described, dict) else None
    for _ in range(_POLL_LIMIT):
        if status == "ACTIVE":
            break
        if status is not None:
            yield Sleep(_POLL_SECONDS)
        status = (yield from request_one(ctx.index.describe()))["Table"]["TableStatus"]
    else:
        raise TimeoutError(f"table {ctx.index.table} did not become ACTIVE")
    if ctx.ttl_seconds:
        ttl = yield from request_one(ctx.index.describe_ttl())
        if ttl.get("TimeToLiveDescription", {}).get("TimeToLiveStatus") not in {"ENABLED", "ENABLING"}:
            yield from request_one(ctx.index.enable_ttl())


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
