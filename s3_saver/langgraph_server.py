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

Long-term memory: [store()][s3_saver.langgraph_server.store] is the server's store
(``"store": {"path": "s3_saver.langgraph_server.store"}``): an
[S3Store][s3_saver.S3Store] on the same bucket, table and prefix, from the same
variables. The server calls it with no argument, so it reads the rest of
``langgraph.json``'s ``store`` block where the server puts it, the ``LANGGRAPH_STORE``
variable (JSON; ``langgraph dev`` sets it, ``langgraph build`` writes it into the image):

- ``index``: ``dims``, ``embed`` and ``fields``, for semantic search. ``embed`` is a
  file's attribute (``./embeddings.py:embed``, relative to the server's working
  directory), a module's attribute (``myapp.embeddings:embed``) or a LangChain provider
  string (``openai:text-embedding-3-small``, which needs ``langchain``): an
  ``Embeddings``, or a function from a list of texts to a list of vectors.
  ``langgraph dev`` loads ``embed`` too, for its built-in store, and stops at start on
  a ``module:attr``: in ``langgraph.json``, use one of the other two.
- ``ttl``: ``default_ttl`` (minutes) and ``refresh_on_read``, as LangGraph's ``TTLConfig``.
  With ``sweep_interval_minutes``, one TTL sweeper per process
  ([start_ttl_sweeper()][s3_saver.S3Store.start_ttl_sweeper]: the server runs none for a
  custom store) from the first ``store()`` entered until the last context leaves. An
  expired item is never returned, swept or not.

``checkpointer()`` and ``store()`` share one saver per process: one cache budget
(``CHECKPOINT_CACHE_BYTES``), one set of clients for each event loop. Each entered
context counts itself; the last one out on a loop closes that loop's clients.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from langchain_core.embeddings import Embeddings
from langgraph.store.base import ensure_embeddings

from s3_saver import EraseReport, S3Store
from s3_saver._format.key_codec import check_prefix
from s3_saver._format.memory.ttl import check_ttl_config
from s3_saver._saver.options import parse_bytes, parse_duration
from s3_saver._saver.saver import S3Saver
from s3_saver._saver.serde import load_serde
from s3_saver._transport.budget import MIN_BYTES
from s3_saver._transport.clients import TABLE_NAME, bucket_name_ok
from s3_saver.errors import ConfigurationError

__all__ = [
    "ServerSettings",
    "StoreSettings",
    "checkpointer",
    "load_embeddings",
    "saver_from_env",
    "settings_from_env",
    "store",
    "store_settings_from_env",
]

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

    Builds the saver from the environment (or shares the one [store()][s3_saver.langgraph_server.store]
    built), runs [S3Saver.asetup()][s3_saver.S3Saver.asetup] when ``CHECKPOINT_SETUP`` is on,
    yields it, and on exit closes the async clients of its event loop once no other context
    of this module uses them.

    Yields:
        The saver.

    Raises:
        ConfigurationError: A variable is missing or wrong (named in the message).
    """
    async with _shared() as saver:
        yield saver


# -- long-term memory ------------------------------------------------------------------

_STORE_VARIABLE = "LANGGRAPH_STORE"
_WHERE = f"{_STORE_VARIABLE} (langgraph.json's \"store\")"
_INDEX_KEYS = frozenset({"dims", "embed", "fields"})
_IDENTIFIERS = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class StoreSettings:
    """The store's settings from ``LANGGRAPH_STORE`` (see the module docstring).

    Attributes:
        index: The ``index`` block, checked: ``dims``, ``embed`` (the spec, loaded by
            `index_config()`), ``fields``; None: no semantic search.
        ttl: The ``ttl`` block, checked (LangGraph's ``TTLConfig``); None: no expiry.
    """

    index: Mapping[str, Any] | None = None
    ttl: Mapping[str, Any] | None = None

    def index_config(self) -> dict[str, Any] | None:
        """The ``IndexConfig`` to give the store, its ``embed`` loaded (this imports the
        embedder's code, or builds a LangChain model: call it off the event loop).

        Raises:
            ConfigurationError: ``embed`` names nothing that loads, naming the spec.
        """
        if self.index is None:
            return None
        return {**self.index, "embed": load_embeddings(self.index["embed"])}


def store_settings_from_env(environ: Mapping[str, str] | None = None) -> StoreSettings:
    """Read and check ``LANGGRAPH_STORE`` (nothing is imported: see `StoreSettings.index_config()`).

    Unset or empty, the store has no index and no TTL. Its ``path`` is the server's; keys
    other than ``index`` and ``ttl`` are left to the server.

    Args:
        environ: The variables; ``os.environ`` by default.

    Returns:
        The settings.

    Raises:
        ConfigurationError: The variable is not a JSON object, or its ``index`` or ``ttl``
            cannot work (the message names the variable and the key).
    """
    env = os.environ if environ is None else environ
    text = env.get(_STORE_VARIABLE, "").strip()
    if not text:
        return StoreSettings()
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{_WHERE} is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ConfigurationError(f"{_WHERE} is not a JSON object: {text[:200]!r}")
    index = config.get("index") or None  # {} (a template's blank block): no index, as the server reads it
    if index is not None:
        index = _check_index(index)
    try:
        ttl = check_ttl_config(config.get("ttl") or None)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{_WHERE}: {exc}") from exc
    return StoreSettings(index=index, ttl=ttl)


def _check_index(index: Any) -> dict[str, Any]:
    if not isinstance(index, dict):
        raise ConfigurationError(f"{_WHERE}: index must be an object with dims, embed and fields, got {index!r}")
    # A typo ("dim", "field") would otherwise pass as "no such setting": refused, named.
    unknown = sorted(set(index) - _INDEX_KEYS)
    if unknown:
        raise ConfigurationError(f"{_WHERE}: index has unknown keys {unknown}; the store reads {sorted(_INDEX_KEYS)}")
    dims = index.get("dims")
    if isinstance(dims, bool) or not isinstance(dims, int) or dims <= 0:
        raise ConfigurationError(f"{_WHERE}: index.dims must be a positive integer, got {dims!r}")
    embed = index.get("embed")
    if not isinstance(embed, str) or not embed.strip():
        raise ConfigurationError(
            f"{_WHERE}: index.embed must be a string: ./path/to/file.py:attr, module:attr or a provider string "
            f"(openai:text-embedding-3-small), got {embed!r}"
        )
    fields = index.get("fields")
    if fields is not None and (not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields)):
        raise ConfigurationError(f"{_WHERE}: index.fields must be a list of field paths or null, got {fields!r}")
    return {"dims": dims, "embed": embed.strip(), **({"fields": fields} if fields is not None else {})}


def load_embeddings(spec: str) -> Any:
    """The embedder ``index.embed`` names, as LangChain ``Embeddings``.

    - ``path/to/file.py:attr`` (the server's own rule: the spec holds ``.py:``): the file,
      relative to the working directory, is run as a module once per process;
    - ``module:attr`` (``attr`` a dotted name): the module is imported, when it is one;
    - anything else is a provider string for LangGraph's ``ensure_embeddings``
      (``openai:text-embedding-3-small``; it needs ``langchain``).

    The attribute is an ``Embeddings``, or a function (sync or async) from a list of texts
    to a list of vectors, wrapped by ``ensure_embeddings``.

    Raises:
        ConfigurationError: Naming the spec and what failed.
    """
    label = f"{_WHERE}: index.embed={spec!r}"
    target, sep, attr = spec.rpartition(":")
    found: Any = None
    if ".py:" in spec:
        found = _attribute(_file_module(target, label), attr, label)
    elif sep and _IDENTIFIERS.fullmatch(target) and _IDENTIFIERS.fullmatch(attr) and _is_module(target):
        try:
            module = importlib.import_module(target)
        except Exception as exc:  # the user's module failed on import: its own error, named
            raise ConfigurationError(f"{label}: importing {target!r} failed: {type(exc).__name__}: {exc}") from exc
        found = _attribute(module, attr, label)
    else:
        try:
            return ensure_embeddings(spec)
        except Exception as exc:  # ValueError, ImportError, a provider's own (a missing API key)
            raise ConfigurationError(
                f"{label} names no file (path.py:attr) or module (module:attr) attribute, and as a provider "
                f"string it fails: {type(exc).__name__}: {exc}"
            ) from exc
    if isinstance(found, Embeddings):
        return found
    if not callable(found) or isinstance(found, type):
        raise ConfigurationError(
            f"{label}: found {type(found).__name__} {found!r:.80}, not an Embeddings or a function from texts to vectors"
        )
    return ensure_embeddings(found)


def _is_module(name: str) -> bool:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a project's own module, as CHECKPOINT_SERDE's
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is not one
        return False


def _file_module(path: str, label: str) -> ModuleType:
    """The file run as a module, under the name LangGraph Server gives it (its in-memory
    runtime loads the same file for its own store), so it runs once per process."""
    name = path.replace("/", "__").replace(".py", "").replace(" ", "_")
    module = sys.modules.get(name)
    if module is not None and Path(getattr(module, "__file__", None) or "").resolve() == Path(path).resolve():
        return module
    if not Path(path).is_file():
        raise ConfigurationError(f"{label}: no file {path!r} (from the working directory {os.getcwd()!r})")
    spec = importlib.util.spec_from_file_location(name, str(Path(path).resolve()))
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"{label}: {path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigurationError(f"{label}: running {path!r} failed: {type(exc).__name__}: {exc}") from exc
    sys.modules[name] = module
    return module


def _attribute(module: ModuleType, attr: str, label: str) -> Any:
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError as exc:
            raise ConfigurationError(f"{label}: {module.__name__!r} has no attribute {attr!r}") from exc
    return found


@asynccontextmanager
async def store() -> AsyncIterator[S3Store]:
    """The store LangGraph Server enters: ``"s3_saver.langgraph_server.store"``.

    An [S3Store][s3_saver.S3Store] on the saver's bucket, table, prefix and serializer, from
    the same variables as [checkpointer()][s3_saver.langgraph_server.checkpointer], with the
    ``index`` and ``ttl`` of ``LANGGRAPH_STORE``. It shares the saver
    [checkpointer()][s3_saver.langgraph_server.checkpointer] yields (its clients, request
    counts and cache budget); ``CHECKPOINT_SETUP`` creates the bucket and table once per
    process. On exit, the async clients of its event loop close once no other context of
    this module uses them.

    Yields:
        The store.

    Raises:
        ConfigurationError: A variable is missing or wrong, or ``index.embed`` does not load
            (named in the message).
    """
    settings = settings_from_env()
    memory = store_settings_from_env()
    # The embedder is the user's code (a file run, a module imported, a model built):
    # off the event loop, which `langgraph dev` watches for blocking calls.
    index = await asyncio.to_thread(memory.index_config)
    async with _shared(settings) as saver:
        made = S3Store.from_saver(saver, index=index, ttl=memory.ttl)
        if memory.ttl and memory.ttl.get("sweep_interval_minutes"):
            with _LOCK:
                runtime = _RUNTIMES[settings]
                if runtime.sweeper is None:
                    runtime.sweeper = made
                    made.start_ttl_sweeper()
        yield made


# -- one saver per process, under checkpointer() and store() ------------------------------


class _Runtime:
    """A saver and who uses it: the contexts entered, by event loop."""

    def __init__(self, saver: S3Saver) -> None:
        self.saver = saver
        self.loops: dict[asyncio.AbstractEventLoop, int] = {}
        self.set_up = False
        # The TTL sweeper's store: one per process (LangGraph Server runs none for a custom
        # store), started by the first store() entered with sweep_interval_minutes.
        self.sweeper: S3Store | None = None


# Keyed by the settings: the server reads one environment, so both factories share one
# saver; a context entered after the environment changed (tests) gets its own.
_RUNTIMES: dict[ServerSettings, _Runtime] = {}
_LOCK = threading.Lock()  # the server enters a factory once per OS thread: threads race here


@asynccontextmanager
async def _shared(settings: ServerSettings | None = None) -> AsyncIterator[S3Saver]:
    """The process's saver for these settings, built at the first entry and dropped (its
    sync side closed) when the last context leaves. A saver's async clients belong to the
    event loop that made them: the last context to leave a loop closes that loop's."""
    settings = settings_from_env() if settings is None else settings
    loop = asyncio.get_running_loop()
    with _LOCK:
        runtime = _RUNTIMES.get(settings)
        if runtime is None:
            runtime = _RUNTIMES[settings] = _Runtime(settings.saver())
        runtime.loops[loop] = runtime.loops.get(loop, 0) + 1
    try:
        if settings.setup and not runtime.set_up:
            # Idempotent: two threads entering at once may both run it; once done, the
            # other factory (and later entries) skip it.
            await runtime.saver.asetup()
            runtime.set_up = True
        yield runtime.saver
    finally:
        with _LOCK:
            runtime.loops[loop] -= 1
            last_on_loop = not runtime.loops[loop]
            if last_on_loop:
                del runtime.loops[loop]
            last = not runtime.loops
            if last and _RUNTIMES.get(settings) is runtime:
                del _RUNTIMES[settings]
        try:
            if last_on_loop:
                await runtime.saver.aclose()
        finally:
            if last:
                if runtime.sweeper is not None:
                    runtime.sweeper.stop_ttl_sweeper()
                # The sync driver is idle under the server (it calls async methods only),
                # but a user's code may have used the saver's sync side: release it too.
                runtime.saver.close()
