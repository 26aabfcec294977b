"""S3Saver for LangGraph Server, configured by environment variables.

LangGraph Server (``langgraph dev``, ``langgraph up``, deployments; langgraph-api
0.16) takes a custom checkpointer from ``langgraph.json``:

```json
{"checkpointer": {"path": "s3_saver.langgraph_server.checkpointer"}}
```

(or the same JSON in ``LANGGRAPH_CHECKPOINTER``). The path is the dotted import
path of [checkpointer()][s3_saver.langgraph_server.checkpointer], dotted to the end: langgraph-api 0.16 imports a path
without ``/`` as ``module.attribute``, so ``s3_saver.langgraph_server:checkpointer``
does not load. [checkpointer()][s3_saver.langgraph_server.checkpointer] is an async context manager factory: the server enters
it once per event loop it runs graphs on, and leaves it at shutdown, which closes
the saver's async clients. The server uses the saver's async methods only, so the
``async`` extra (aioboto3) must be installed: ``pip install '.[async]'`` in a
checkout (the package is not on PyPI yet). It finds ``adelete_thread``, ``adelete_for_runs``,
``acopy_thread`` and ``aprune`` on S3Saver, so deleting and copying threads,
deleting runs (and rolling them back) and pruning reach the bucket and the index.

The variables are the command line's (``langgraph-s3-saver``), so a shell set up
like the server reaches the same store:

- ``CHECKPOINT_BUCKET`` (required): the S3 bucket.
- ``CHECKPOINT_TABLE``: the DynamoDB table of the index; unset or empty, the
  index is the manifest in the bucket.
- ``CHECKPOINT_PREFIX``: a key prefix in the bucket.
- ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``): the region of the bucket and table.
- ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL_DYNAMODB``:
  endpoints (moto, LocalStack, MinIO...); the last two override the first.
- ``CHECKPOINT_SERDE``: ``MODULE:ATTR`` of the serializer the threads are
  written with (an object, or a class or zero-argument factory of one), e.g.
  ``langgraph.checkpoint.serde.encrypted:EncryptedSerializer.from_pycryptodome_aes``
  (which reads ``LANGGRAPH_AES_KEY``); unset, S3Saver's default.
- ``CHECKPOINT_SETUP``: ``1`` (or ``true``, ``yes``, ``on``) creates the bucket
  and table when missing as the server starts; off by default, since a
  deployment creates them ahead (``infra/``) and runs with narrower rights.
- ``CHECKPOINT_TTL``: how long a checkpoint stays readable (``30d``, ``12h``,
  ``2w``, ``1h30m`` or seconds), the saver's ``ttl``; unset, no expiry.
- ``CHECKPOINT_CACHE_BYTES``: the memory the saver's caches may take
  together (``64MiB``, ``256MB`` or bytes), the saver's ``cache_bytes``; unset,
  its default (64 MiB).
- ``CHECKPOINT_ERASE_ON_DELETE``: ``1`` (same switches) makes the server's thread
  deletes (``DELETE /threads/{id}``, a prune with the "delete" strategy) erase
  the thread ([S3Saver.erase_thread()][s3_saver.S3Saver.erase_thread]: every version of its objects goes,
  in the replica too); off by default. The role needs ``infra/``'s
  ``EraseThreadsPolicy`` beside the saver's. Versions a lock holds are logged.

Credentials come from boto3's usual chain (environment, profile, role). A
variable with a wrong value stops the server at start with a
[ConfigurationError][s3_saver.errors.ConfigurationError] naming it.

Example:
    ```bash
    CHECKPOINT_BUCKET=my-checkpoints CHECKPOINT_TABLE=langgraph-checkpoints \\
    AWS_REGION=us-east-1 langgraph dev
    ```
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from s3_saver import EraseReport
from s3_saver._format.key_codec import check_prefix
from s3_saver._saver.options import parse_bytes, parse_duration
from s3_saver._saver.saver import S3Saver
from s3_saver._saver.serde import load_serde
from s3_saver._transport.budget import MIN_BYTES
from s3_saver._transport.clients import TABLE_NAME, bucket_name_ok
from s3_saver.errors import ConfigurationError

__all__ = ["ServerSettings", "checkpointer", "saver_from_env", "settings_from_env"]

# botocore's own rule for a region name (it refuses others when a client is made,
# which would be at the first request): checked here so the server stops at start.
_REGION = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class ServerSettings:
    """The saver's settings as read from the environment (see the module docstring).

    Attributes:
        bucket: ``CHECKPOINT_BUCKET``.
        table: ``CHECKPOINT_TABLE``; None: the manifest index.
        prefix: ``CHECKPOINT_PREFIX``.
        region: ``AWS_REGION`` or ``AWS_DEFAULT_REGION``.
        endpoint_url: ``AWS_ENDPOINT_URL``.
        s3_endpoint_url: ``AWS_ENDPOINT_URL_S3``.
        dynamodb_endpoint_url: ``AWS_ENDPOINT_URL_DYNAMODB``.
        serde: ``CHECKPOINT_SERDE`` (the ``MODULE:ATTR`` spec, loaded by `saver()`).
        setup: ``CHECKPOINT_SETUP``: create the bucket and table at start.
        ttl: ``CHECKPOINT_TTL``: how long a checkpoint stays readable (the saver's ``ttl``).
        erase_on_delete: ``CHECKPOINT_ERASE_ON_DELETE``: thread deletes erase.
        cache_bytes: ``CHECKPOINT_CACHE_BYTES``: the caches' budget (the saver's ``cache_bytes``).
    """

    bucket: str
    table: str | None = None
    prefix: str = ""
    region: str | None = None
    endpoint_url: str | None = None
    s3_endpoint_url: str | None = None
    dynamodb_endpoint_url: str | None = None
    serde: str | None = None
    setup: bool = False
    ttl: timedelta | None = None
    erase_on_delete: bool = False
    cache_bytes: int | None = None

    def saver(self) -> S3Saver:
        """A new S3Saver with these settings (no network call; see [S3Saver.setup()][s3_saver.S3Saver.setup]).

        Raises:
            ConfigurationError: ``CHECKPOINT_SERDE`` names no serializer.
        """
        serde: Any = None
        if self.serde:
            try:
                serde = load_serde(self.serde)
            except ConfigurationError as exc:
                raise ConfigurationError(f"CHECKPOINT_SERDE={self.serde!r}: {exc}") from exc
        kind = _ErasingSaver if self.erase_on_delete else S3Saver
        return kind(
            self.bucket,
            table=self.table,
            prefix=self.prefix,
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            s3_endpoint_url=self.s3_endpoint_url,
            dynamodb_endpoint_url=self.dynamodb_endpoint_url,
            serde=serde,
            ttl=self.ttl,
            cache_bytes=self.cache_bytes,
        )


def settings_from_env(environ: Mapping[str, str] | None = None) -> ServerSettings:
    """Read and check the variables of the module docstring.

    Args:
        environ: The variables; ``os.environ`` by default.

    Returns:
        The settings.

    Raises:
        ConfigurationError: ``CHECKPOINT_BUCKET`` is missing, or a variable holds a
            value that cannot work (the message names the variable and its value).
    """
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        # An empty variable counts as unset: `KEY=` in a .env file, or a
        # deployment template's blank default.
        value = env.get(name, "").strip()
        return value or None

    bucket = get("CHECKPOINT_BUCKET")
    if bucket is None:
        raise ConfigurationError(
            "CHECKPOINT_BUCKET is not set: LangGraph Server's S3Saver needs the name of the S3 bucket "
            "holding the checkpoints (and CHECKPOINT_TABLE for a DynamoDB index)"
        )
    if not bucket_name_ok(bucket):
        raise ConfigurationError(
            f"CHECKPOINT_BUCKET={bucket!r} is not an S3 bucket name "
            "(letters, digits, dots and hyphens, starting and ending with a letter or digit; "
            "the name alone, without s3:// or a prefix: the prefix goes in CHECKPOINT_PREFIX)"
        )
    table = get("CHECKPOINT_TABLE")
    if table is not None and not TABLE_NAME.match(table):
        raise ConfigurationError(
            f"CHECKPOINT_TABLE={table!r} is not a DynamoDB table name (3-255 letters, digits, '_', '-', '.'); "
            "unset it for the manifest index in the bucket"
        )
    region_name, region = next(
        ((name, value) for name in ("AWS_REGION", "AWS_DEFAULT_REGION") if (value := get(name))), ("", None)
    )
    if region is not None and not _REGION.match(region):
        raise ConfigurationError(f"{region_name}={region!r} is not an AWS region name (e.g. us-east-1)")
    endpoints = {}
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_DYNAMODB"):
        value = get(name)
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ConfigurationError(f"{name}={value!r} is not an http:// or https:// URL")
        endpoints[name] = value
    serde = get("CHECKPOINT_SERDE")
    if serde is not None and not re.fullmatch(r"[\w.]+:[\w.]+", serde):
        raise ConfigurationError(f"CHECKPOINT_SERDE={serde!r} is not MODULE:ATTR (e.g. myapp.checkpoints:serde)")
    setup, erase = (_switch(get, name) for name in ("CHECKPOINT_SETUP", "CHECKPOINT_ERASE_ON_DELETE"))
    ttl_text = get("CHECKPOINT_TTL")
    ttl = None
    if ttl_text is not None:
        try:
            ttl = parse_duration(ttl_text)
        except ValueError:
            ttl = None
        if ttl is None or ttl.total_seconds() < 1:
            raise ConfigurationError(
                f"CHECKPOINT_TTL={ttl_text!r} is not a duration of at least a second "
                "(90s, 30m, 12h, 30d, 2w, 1h30m or plain seconds)"
            )
    cache_text = get("CHECKPOINT_CACHE_BYTES")
    cache_bytes = None
    if cache_text is not None:
        try:
            cache_bytes = parse_bytes(cache_text)
        except ValueError:
            cache_bytes = None
        if cache_bytes is None or cache_bytes < MIN_BYTES:
            raise ConfigurationError(
                f"CHECKPOINT_CACHE_BYTES={cache_text!r} is not a size of at least 1 MiB "
                "(64MiB, 256MB, 1GiB or plain bytes)"
            )
    # The prefix keeps its spaces: it is part of every key, as given.
    prefix = env.get("CHECKPOINT_PREFIX", "")
    try:
        check_prefix(prefix, bucket, table)
    except ConfigurationError as exc:
        raise ConfigurationError(f"CHECKPOINT_PREFIX={prefix!r}: {exc}") from exc
    return ServerSettings(
        bucket=bucket,
        table=table,
        prefix=prefix,
        region=region,
        endpoint_url=endpoints["AWS_ENDPOINT_URL"],
        s3_endpoint_url=endpoints["AWS_ENDPOINT_URL_S3"],
        dynamodb_endpoint_url=endpoints["AWS_ENDPOINT_URL_DYNAMODB"],
        serde=serde,
        setup=setup,
        ttl=ttl,
        erase_on_delete=erase,
        cache_bytes=cache_bytes,
    )


def _switch(get: Any, name: str) -> bool:
    value = (get(name) or "").lower()
    if value not in _TRUE + _FALSE:
        raise ConfigurationError(f"{name}={value!r} is not a switch: use 1 or 0 (true/false, yes/no, on/off)")
    return value in _TRUE


class _ErasingSaver(S3Saver):
    """S3Saver whose thread deletes erase (``CHECKPOINT_ERASE_ON_DELETE``): the
    server calls ``adelete_thread`` and ``aprune`` with the "delete" strategy."""

    def delete_thread(self, thread_id: str) -> None:
        _told(self.erase_thread(thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        _told(await self.aerase_thread(thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest", keep_last: int | None = None) -> None:
        if strategy not in _DELETES or isinstance(thread_ids, str):
            return super().prune(thread_ids, strategy=strategy, keep_last=keep_last)  # it checks the arguments
        for thread_id in thread_ids:
            self.delete_thread(thread_id)

    async def aprune(
        self, thread_ids: Sequence[str], *, strategy: str = "keep_latest", keep_last: int | None = None
    ) -> None:
        if strategy not in _DELETES or isinstance(thread_ids, str):
            return await super().aprune(thread_ids, strategy=strategy, keep_last=keep_last)
        for thread_id in thread_ids:
            await self.adelete_thread(thread_id)


_DELETES = ("delete", "delete_all")  # prune's names for deleting the threads
log = logging.getLogger("s3_saver")


def _told(report: EraseReport) -> None:
    """The server has no answer to carry an erase's report: what remains is logged."""
    for r in report.remaining:
        log.warning(
            "erase of thread %r left s3://%s/%s (version %s): %s%s", report.thread_id, r.bucket, r.key, r.version_id,
            r.reason, f", retained until {r.retain_until.isoformat()}" if r.retain_until else "",
        )


def saver_from_env(environ: Mapping[str, str] | None = None) -> S3Saver:
    """An S3Saver built from the variables of the module docstring (``CHECKPOINT_SETUP``
    aside: this makes no network call).

    Raises:
        ConfigurationError: A variable is missing or wrong (named in the message).
    """
    return settings_from_env(environ).saver()


@asynccontextmanager
async def checkpointer() -> AsyncIterator[S3Saver]:
    """The checkpointer LangGraph Server enters: ``"s3_saver.langgraph_server.checkpointer"``.

    Builds the saver from the environment, runs [S3Saver.asetup()][s3_saver.S3Saver.asetup] when
    ``CHECKPOINT_SETUP`` is on, yields it, and closes its async clients on exit.

    Yields:
        The saver.

    Raises:
        ConfigurationError: A variable is missing or wrong (named in the message).
    """
    settings = settings_from_env()
    saver = settings.saver()
    try:
        if settings.setup:
            await saver.asetup()
        yield saver
    finally:
        await saver.aclose()
        # The sync driver is idle under the server (it calls async methods only),
        # but a user's code may have used the saver's sync side: release it too.
        saver.close()
