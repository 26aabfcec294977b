"""The memory store's site: the same builder as the saver's (``make_site``), so a store
and a saver on one bucket, table and prefix reach them alike (clients, the prefix's
index-mode check, the table's owner check, the cache budget), plus the memory index of
the site's mode."""

from __future__ import annotations

from typing import Any

from botocore.config import Config

from s3_saver._crypto.config import Encryption
from s3_saver._format.keys import KeyLayout
from s3_saver._format.memory.ttl import Clock
from s3_saver._index.dynamodb.memory import DynamoMemory
from s3_saver._index.manifest.memory import ManifestMemory
from s3_saver._index.memory import MemoryIndex
from s3_saver._ops.context import Context
from s3_saver._regions.sites import Site, make_site
from s3_saver._transport.budget import CacheBudget
from s3_saver._transport.protocol import PRIMARY
from s3_saver.errors import Where


def memory_site(
    bucket: str,
    table: str | None,
    *,
    prefix: str,
    region_name: str | None,
    endpoints: dict[str, str | None],
    given: dict[str, Any],
    boto3_session: Any,
    aioboto3_session: Any,
    client_config: Config | None,
    max_concurrency: int,
    serde: Any,
    budget: CacheBudget,
    clock: Clock,
    encryption: Encryption | None = None,
) -> tuple[Site, Context, MemoryIndex]:
    """The primary site of a store (``table`` None: the manifest mode, its index in the
    bucket), its context (for setup and checks) and its memory index."""
    site, ctx = make_site(
        PRIMARY,
        bucket,
        table,
        region_name=region_name,
        endpoints=endpoints,
        given=given,
        boto3_session=boto3_session,
        aioboto3_session=aioboto3_session,
        client_config=client_config,
        max_concurrency=max_concurrency,
        layout=KeyLayout(prefix),
        storage_class=None,
        settings={"serde": serde, "inline_threshold": 0, "list_deltas": False, "ttl_seconds": None, "budget": budget},
        encryption=encryption,
    )
    return site, ctx, memory_index(ctx, site.where, table, clock)


def memory_index(ctx: Context, where: Where, table: str | None, clock: Clock) -> MemoryIndex:
    """The memory index of a site's mode, on its context (calls, prefix, cache budget)."""
    if table:
        return DynamoMemory(table, ctx.layout.prefix, where, ctx.budget, clock, ctx.s3)
    return ManifestMemory(ctx.s3, ctx.layout.prefix, ctx.budget, clock)
