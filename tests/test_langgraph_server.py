"""LangGraph Server with S3Saver and S3Store: s3_saver.langgraph_server's environment (and
LANGGRAPH_STORE's index and ttl), and `langgraph dev` (langgraph-api's in-memory runtime)
serving examples/langgraph_server against moto in both index modes, driven through
langgraph-sdk: threads through the checkpointer, memory through the store API and a graph.

What reaches each of the saver's thread-wide methods in langgraph-api 0.16.7:

- ``adelete_thread``: ``DELETE /threads/{id}``, and ``POST /threads/prune`` with the
  strategy "delete" (the in-memory runtime deletes each thread; its "keep_latest" is 422);
- ``acopy_thread``: ``POST /threads/{id}/copy``;
- ``adelete_for_runs``: ``DELETE /threads/{id}/runs/{run_id}`` (the server's worker also
  calls it for a run rolled back by ``multitask_strategy="rollback"``: not driven here);
- ``aprune``: the server's checkpointer gRPC service (``Prune``, called by the server's
  Go core in deployments, with "keep_latest" or "delete_all"): driven here in a process
  configured as `langgraph dev` configures its own, against the same store.

Each mode's server runs against a moto server of this module's own (the shared one is
reset by other tests of the same worker) with buckets named for the test run, so two
xdist workers can both start one.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.schema import Command

from conftest import INDEX_MODES
from moto_fixes import atomic_conditional_writes
from s3_saver import ConfigurationError, S3Saver, S3Store
from s3_saver._format.memory.names import node_id
from s3_saver._format.memory.ttl import Clock
from s3_saver.langgraph_server import (
    ServerSettings,
    StoreSettings,
    checkpointer,
    load_embeddings,
    saver_from_env,
    settings_from_env,
    store,
    store_settings_from_env,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "langgraph_server"
BIN = Path(sys.executable).parent
GRAPH = "refund"
START_TIMEOUT = 60.0  # seconds; a start takes about 4 here
CHECKPOINTER = json.loads((EXAMPLE / "langgraph.json").read_text())["checkpointer"]
STORE = json.loads((EXAMPLE / "langgraph.json").read_text())["store"]


# -- the environment ---------------------------------------------------------------------
def test_settings_from_env_reads_every_variable() -> None:
    env = {
        "CHECKPOINT_BUCKET": "my-checkpoints",
        "CHECKPOINT_TABLE": "langgraph-checkpoints",
        "CHECKPOINT_PREFIX": "agents/",
        "AWS_REGION": "eu-west-1",
        "AWS_DEFAULT_REGION": "us-east-1",  # AWS_REGION wins, as in boto3
        "AWS_ENDPOINT_URL": "http://127.0.0.1:4566",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:8000",
        "CHECKPOINT_SERDE": "langgraph.checkpoint.serde.jsonplus:JsonPlusSerializer",
        "CHECKPOINT_SETUP": "yes",
        "CHECKPOINT_TTL": "30d",
        "CHECKPOINT_ERASE_ON_DELETE": "on",
    }
    assert settings_from_env(env) == ServerSettings(
        bucket="my-checkpoints",
        table="langgraph-checkpoints",
        prefix="agents/",
        region="eu-west-1",
        endpoint_url="http://127.0.0.1:4566",
        s3_endpoint_url="http://127.0.0.1:9000",
        dynamodb_endpoint_url="http://127.0.0.1:8000",
        serde="langgraph.checkpoint.serde.jsonplus:JsonPlusSerializer",
        setup=True,
        ttl=timedelta(days=30),
        erase_on_delete=True,
    )
    saver = saver_from_env(env)
    assert saver._ctx.ttl_seconds == 30 * 86400
    assert (saver.bucket, saver.table, saver.region_name) == ("my-checkpoints", "langgraph-checkpoints", "eu-west-1")
    assert saver._location() == ("my-checkpoints", "agents/", "http://127.0.0.1:9000")
    assert type(saver.serde).__name__ == "JsonPlusSerializer"


@pytest.mark.parametrize(
    ("text", "size"), [("8MiB", 8 * 2**20), ("256 MB", 256 * 10**6), ("1GiB", 2**30), ("2097152", 2 * 2**20)]
)
def test_the_cache_budget_comes_from_checkpoint_cache_bytes(text: str, size: int) -> None:
    env = {"CHECKPOINT_BUCKET": "b-1", "CHECKPOINT_CACHE_BYTES": text}
    assert settings_from_env(env).cache_bytes == size
    assert saver_from_env(env).cache_stats().budget == size
    assert settings_from_env({"CHECKPOINT_BUCKET": "b-1"}).cache_bytes is None  # the saver's default


def test_settings_defaults_are_the_manifest_index_without_setup() -> None:
    settings = settings_from_env({"CHECKPOINT_BUCKET": "b-1", "CHECKPOINT_TABLE": "", "AWS_DEFAULT_REGION": "us-west-2"})
    assert settings == ServerSettings(bucket="b-1", region="us-west-2")
    assert saver_from_env({"CHECKPOINT_BUCKET": "b-1"}).table is None
    # A legacy us-east-1 bucket name (capitals, underscores) still names a bucket.
    assert settings_from_env({"CHECKPOINT_BUCKET": "Legacy_Bucket"}).bucket == "Legacy_Bucket"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "CHECKPOINT_BUCKET is not set"),
        ({"CHECKPOINT_BUCKET": "  "}, "CHECKPOINT_BUCKET is not set"),
        ({"CHECKPOINT_BUCKET": "s3://my-bucket"}, "CHECKPOINT_BUCKET='s3://my-bucket' is not an S3 bucket name"),
        ({"CHECKPOINT_BUCKET": "my-bucket/agents"}, "CHECKPOINT_BUCKET='my-bucket/agents' is not an S3 bucket name"),
        ({"CHECKPOINT_TABLE": "t!"}, "CHECKPOINT_TABLE='t!' is not a DynamoDB table name"),
        ({"AWS_REGION": "us east 1"}, "AWS_REGION='us east 1' is not an AWS region name"),
        ({"AWS_DEFAULT_REGION": "-x"}, "AWS_DEFAULT_REGION='-x' is not an AWS region name"),
        ({"AWS_ENDPOINT_URL": "127.0.0.1:5000"}, "AWS_ENDPOINT_URL='127.0.0.1:5000' is not an http"),
        ({"AWS_ENDPOINT_URL_S3": "s3.local"}, "AWS_ENDPOINT_URL_S3='s3.local' is not an http"),
        ({"AWS_ENDPOINT_URL_DYNAMODB": "ftp://x"}, "AWS_ENDPOINT_URL_DYNAMODB='ftp://x' is not an http"),
        ({"CHECKPOINT_SERDE": "myapp.serde"}, "CHECKPOINT_SERDE='myapp.serde' is not MODULE:ATTR"),
        ({"CHECKPOINT_SETUP": "maybe"}, "CHECKPOINT_SETUP='maybe' is not a switch"),
        ({"CHECKPOINT_TTL": "a month"}, "CHECKPOINT_TTL='a month' is not a duration"),
        ({"CHECKPOINT_TTL": "0s"}, "CHECKPOINT_TTL='0s' is not a duration"),
        ({"CHECKPOINT_ERASE_ON_DELETE": "erase"}, "CHECKPOINT_ERASE_ON_DELETE='erase' is not a switch"),
        ({"CHECKPOINT_CACHE_BYTES": "lots"}, "CHECKPOINT_CACHE_BYTES='lots' is not a size of at least 1 MiB"),
        ({"CHECKPOINT_CACHE_BYTES": "512KiB"}, "CHECKPOINT_CACHE_BYTES='512KiB' is not a size of at least 1 MiB"),
        ({"CHECKPOINT_CACHE_BYTES": "-64MiB"}, "CHECKPOINT_CACHE_BYTES='-64MiB' is not a size of at least 1 MiB"),
        ({"CHECKPOINT_PREFIX": "live/a"}, "CHECKPOINT_PREFIX='live/a': prefix 'live/a' of bucket 'b-1': its segment 'live'"),
        ({"CHECKPOINT_PREFIX": "app/../x"}, "CHECKPOINT_PREFIX='app/../x': prefix 'app/../x' of bucket 'b-1': its segment '..'"),
    ],
)
def test_a_wrong_variable_is_named(env: dict[str, str], message: str) -> None:
    base = {} if "CHECKPOINT_BUCKET" in env or not env else {"CHECKPOINT_BUCKET": "b-1"}
    with pytest.raises(ConfigurationError) as raised:
        settings_from_env({**base, **env})
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_here:serde", "cannot import 'no_such_module_here'"),
        ("langgraph.checkpoint.serde.jsonplus:NoSuchName", "has no attribute 'NoSuchName'"),
        ("json:dumps", "json:dumps() failed"),
        ("os:sep", "is a str, not a serializer"),
    ],
)
def test_a_serde_that_does_not_load_is_named(spec: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        saver_from_env({"CHECKPOINT_BUCKET": "b-1", "CHECKPOINT_SERDE": spec})
    assert str(raised.value).startswith(f"CHECKPOINT_SERDE={spec!r}: ") and message in str(raised.value)


def test_serde_factory_from_env_reads_its_own_variables(monkeypatch) -> None:
    """The serializer of the CLI's test_serde_option: a factory reading LANGGRAPH_AES_KEY."""
    monkeypatch.setenv("LANGGRAPH_AES_KEY", "k" * 32)
    factory = "langgraph.checkpoint.serde.encrypted:EncryptedSerializer.from_pycryptodome_aes"
    saver = saver_from_env({"CHECKPOINT_BUCKET": "b-1", "CHECKPOINT_SERDE": factory})
    assert saver.serde.dumps_typed({"a": 1})[0] == "msgpack+aes"


@pytest.mark.parametrize("index_mode", INDEX_MODES)
async def test_checkpointer_sets_up_when_asked_and_closes(endpoint: str, index_mode: str, monkeypatch) -> None:
    """What the server enters: CHECKPOINT_SETUP=1 creates the store, the saver works, and
    leaving closes its async clients (a second entry on the same loop starts afresh)."""
    table = "server-index" if index_mode == "dynamodb" else ""
    for name, value in {
        "CHECKPOINT_BUCKET": "server-bucket",
        "CHECKPOINT_TABLE": table,
        "AWS_ENDPOINT_URL": endpoint,
        "CHECKPOINT_SETUP": "1",
    }.items():
        monkeypatch.setenv(name, value)
    config = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
    async with checkpointer() as saver:
        assert isinstance(saver, S3Saver) and saver.table == (table or None)
        stored = await saver.aput(config, _empty_checkpoint(), {"source": "input", "step": -1}, {})
        assert saver._async._loops  # its clients live on this loop...
    assert not saver._async._loops  # ...until the server leaves the context
    monkeypatch.setenv("CHECKPOINT_SETUP", "0")
    async with checkpointer() as again:
        assert (await again.aget_tuple(config)).config == stored


@pytest.mark.parametrize("index_mode", INDEX_MODES)
@pytest.mark.parametrize("erase", [True, False], ids=["erase", "delete"])
async def test_erase_on_delete_makes_the_servers_deletes_erase(endpoint: str, index_mode: str, erase: bool, monkeypatch) -> None:
    """CHECKPOINT_ERASE_ON_DELETE=1: the server's thread deletes (adelete_thread, aprune
    with "delete_all") leave no version of the thread in a versioned bucket; off, a
    delete leaves them as noncurrent versions (for the lifecycle rule to expire)."""
    from conftest import make_versioned

    make_versioned(endpoint, "server-bucket")
    for name, value in {
        "CHECKPOINT_BUCKET": "server-bucket",
        "CHECKPOINT_TABLE": "server-index" if index_mode == "dynamodb" else "",
        "AWS_ENDPOINT_URL": endpoint,
        "CHECKPOINT_SETUP": "1",
        "CHECKPOINT_ERASE_ON_DELETE": "1" if erase else "0",
    }.items():
        monkeypatch.setenv(name, value)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    def versions(thread: str) -> list[str]:
        pages = s3.get_paginator("list_object_versions").paginate(Bucket="server-bucket")
        found = [v for p in pages for v in p.get("Versions", []) + p.get("DeleteMarkers", []) if thread in v["Key"]]
        return [v["Key"] for v in found if not (v["Key"].endswith("/head") and v.get("IsLatest"))]

    async with checkpointer() as saver:
        for thread in ("t-del", "t-prune"):
            config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            await saver.aput(config, _empty_checkpoint(), {"source": "input", "step": -1}, {})
        await saver.adelete_thread("t-del")
        await saver.aprune(["t-prune"], strategy="delete_all")
        for thread in ("t-del", "t-prune"):
            assert await saver.aget_tuple({"configurable": {"thread_id": thread}}) is None
            assert (versions(thread) == []) == erase, versions(thread)


def _empty_checkpoint() -> dict:
    from langgraph.checkpoint.base import empty_checkpoint

    return empty_checkpoint()


# -- the store's settings: LANGGRAPH_STORE ---------------------------------------------
def test_store_settings_read_index_and_ttl_from_langgraph_store() -> None:
    """The example's store block, as `langgraph dev` puts it in LANGGRAPH_STORE: the index
    (its embed spec, not loaded yet) and the ttl (checked); unset or empty, neither."""
    settings = store_settings_from_env({"LANGGRAPH_STORE": json.dumps(STORE)})
    assert settings == StoreSettings(
        index={"dims": 64, "embed": "./embeddings.py:embed", "fields": ["text"]},
        ttl={"default_ttl": 43200.0, "refresh_on_read": True},
    )
    assert store_settings_from_env({}) == store_settings_from_env({"LANGGRAPH_STORE": " "}) == StoreSettings()
    # Only a path (the server's): no index, no ttl; a blank block counts as none.
    only_path = {"path": "s3_saver.langgraph_server.store", "index": {}, "ttl": None}
    assert store_settings_from_env({"LANGGRAPH_STORE": json.dumps(only_path)}) == StoreSettings()
    # sweep_interval_minutes passes (LangGraph's TTLConfig has it); the store starts no sweeper.
    swept = {"ttl": {"default_ttl": 5, "sweep_interval_minutes": 60}}
    assert store_settings_from_env({"LANGGRAPH_STORE": json.dumps(swept)}).ttl == {
        "default_ttl": 5.0,
        "sweep_interval_minutes": 60,
    }


_WHERE = "LANGGRAPH_STORE (langgraph.json's \"store\")"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"index": {"dims": 4,', f"{_WHERE} is not JSON: "),
        ('["s3_saver.langgraph_server.store"]', f"{_WHERE} is not a JSON object"),
        ('{"index": "openai:text-embedding-3-small"}', f"{_WHERE}: index must be an object"),
        ('{"index": {"dim": 4, "embed": "x.py:e"}}', f"{_WHERE}: index has unknown keys ['dim']"),
        ('{"index": {"embed": "./e.py:embed"}}', f"{_WHERE}: index.dims must be a positive integer, got None"),
        ('{"index": {"dims": "64", "embed": "./e.py:embed"}}', f"{_WHERE}: index.dims must be a positive integer, got '64'"),
        ('{"index": {"dims": true, "embed": "./e.py:embed"}}', f"{_WHERE}: index.dims must be a positive integer, got True"),
        ('{"index": {"dims": 4}}', f"{_WHERE}: index.embed must be a string"),
        ('{"index": {"dims": 4, "embed": ["a"]}}', f"{_WHERE}: index.embed must be a string"),
        ('{"index": {"dims": 4, "embed": "./e.py:embed", "fields": "text"}}', f"{_WHERE}: index.fields must be a list"),
        ('{"ttl": {"default_ttl": -1}}', f"{_WHERE}: ttl['default_ttl'] must be a finite number of minutes"),
        ('{"ttl": {"defaut_ttl": 5}}', f"{_WHERE}: ttl: unknown keys ['defaut_ttl']"),
        ('{"ttl": {"refresh_on_read": "yes"}}', f"{_WHERE}: ttl['refresh_on_read'] must be True or False"),
        ('{"ttl": {"sweep_interval_minutes": 0}}', f"{_WHERE}: ttl['sweep_interval_minutes'] must be a number"),
        ('{"ttl": 30}', f"{_WHERE}: ttl: a TTLConfig (dict) is expected"),
    ],
)
def test_a_wrong_store_block_is_named(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        store_settings_from_env({"LANGGRAPH_STORE": text})
    assert str(raised.value).startswith(message), str(raised.value)


_EMBEDDER = """
calls = []

def embed(texts):
    calls.append(len(texts))
    return [[float(len(t)), 1.0] for t in texts]

class Holder:
    embed = embed

NOT_CALLABLE = 3
"""


def test_embed_is_a_file_or_a_module_attribute(tmp_path: Path, monkeypatch) -> None:
    """``./file.py:attr`` is run from the working directory once per process (the module the
    server's own loader would make, reused), ``module:attr`` imported; a function is wrapped
    as LangChain Embeddings."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "vectors.py").write_text(_EMBEDDER)
    (tmp_path / "mymod_for_embed.py").write_text(_EMBEDDER)
    from_file = load_embeddings("./lib/vectors.py:embed")
    assert from_file.embed_documents(["abc", "de"]) == [[3.0, 1.0], [2.0, 1.0]]
    assert from_file.embed_query("abcd") == [4.0, 1.0]
    module = sys.modules[".__lib__vectors"]  # the name langgraph-api gives the file
    assert module.calls == [2, 1]
    again = load_embeddings("./lib/vectors.py:Holder.embed")  # the same module: not run twice
    again.embed_query("x")
    assert sys.modules[".__lib__vectors"] is module and module.calls == [2, 1, 1]
    assert load_embeddings("mymod_for_embed:embed").embed_query("ab") == [2.0, 1.0]
    # An Embeddings is taken as it is.
    (tmp_path / "given.py").write_text(
        "from langgraph.store.base import ensure_embeddings\nmodel = ensure_embeddings(lambda t: [[0.0, 1.0]] * len(t))\n"
    )
    model = load_embeddings("./given.py:model")
    assert model is sys.modules[".__given"].model


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("./missing.py:embed", "no file './missing.py' (from the working directory"),
        ("./lib/vectors.py:nothing", "'.__lib__vectors' has no attribute 'nothing'"),
        ("./lib/vectors.py:NOT_CALLABLE", "found int 3, not an Embeddings or a function from texts to vectors"),
        ("./lib/vectors.py:Holder", "found type <class '.__lib__vectors.Holder'>, not an Embeddings"),
        ("./lib/broken.py:embed", "running './lib/broken.py' failed: ZeroDivisionError"),
        ("mymod_broken_embed:embed", "importing 'mymod_broken_embed' failed: ZeroDivisionError"),
        ("mymod_ok_embed:nothing", "'mymod_ok_embed' has no attribute 'nothing'"),
        # Not a file or module: a provider string, which needs langchain (not installed here)
        ("openai:text-embedding-3-small", "names no file (path.py:attr) or module (module:attr) attribute, and as a provider"),
        ("no_such_module_anywhere:embed", "as a provider string it fails"),
    ],
)
def test_an_embed_that_does_not_load_is_named(spec: str, message: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "vectors.py").write_text(_EMBEDDER)
    (tmp_path / "lib" / "broken.py").write_text("1 / 0\n")
    (tmp_path / "mymod_broken_embed.py").write_text("1 / 0\n")
    (tmp_path / "mymod_ok_embed.py").write_text(_EMBEDDER)
    settings = StoreSettings(index={"dims": 2, "embed": spec})
    with pytest.raises(ConfigurationError) as raised:
        settings.index_config()
    text = str(raised.value)
    assert text.startswith(f"{_WHERE}: index.embed={spec!r}") and message in text, text


def _server_variables(monkeypatch, endpoint: str, index_mode: str, **more: str) -> None:
    table = "server-index" if index_mode == "dynamodb" else ""
    variables = {"CHECKPOINT_BUCKET": "server-bucket", "CHECKPOINT_TABLE": table, "AWS_ENDPOINT_URL": endpoint}
    for name, value in {**variables, **more}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("index_mode", INDEX_MODES)
async def test_store_shares_the_checkpointers_saver(endpoint: str, index_mode: str, monkeypatch) -> None:
    """What the server enters, twice on its loop: the store is on the checkpointer's saver
    (one budget, one set of clients, one request count), with the index and ttl of
    LANGGRAPH_STORE; CHECKPOINT_SETUP runs once. The loop's clients close when the last
    context leaves it, whichever leaves last."""
    monkeypatch.chdir(EXAMPLE)  # ./embeddings.py:embed, as the server's working directory
    _server_variables(monkeypatch, endpoint, index_mode, CHECKPOINT_SETUP="1", LANGGRAPH_STORE=json.dumps(STORE))
    async with checkpointer() as saver:
        setup_requests = saver.stats.total_requests
        async with store() as memory:
            assert isinstance(memory, S3Store) and memory.table == saver.table
            assert memory._ctx.budget is saver._ctx.budget and memory._async is saver._async
            assert saver.stats.total_requests == setup_requests  # set up once, by the first
            assert memory.index_config["dims"] == 64 and memory.ttl_config == {"default_ttl": 43200.0, "refresh_on_read": True}
            await memory.aput(("notes", "ann"), "a", {"text": "ann likes strong coffee"})
            await memory.aput(("notes", "ann"), "b", {"text": "ann has a cat"})
            assert saver.stats.total_requests > setup_requests  # the store's requests are counted with the saver's
            hits = await memory.asearch(("notes",), query="coffee")
            assert [h.key for h in hits] == ["a", "b"] and hits[0].score > hits[1].score
        assert saver._async._loops  # the checkpointer still uses this loop's clients
        assert await saver.aget_tuple({"configurable": {"thread_id": "none"}}) is None
    assert not saver._async._loops
    # Entered the other way round, the store first and left last, the same.
    async with store() as memory, checkpointer() as again:
        assert again is not saver and memory._async is again._async  # a new process-wide saver
        assert (await memory.aget(("notes", "ann"), "a")).value == {"text": "ann likes strong coffee"}
    assert not again._async._loops


async def test_sweep_interval_starts_one_sweeper_per_process_until_the_last_context_leaves(endpoint: str, monkeypatch) -> None:
    """LangGraph Server runs no TTL sweeper for a custom store: with
    ``ttl.sweep_interval_minutes`` the factory starts one, once per process however many
    contexts enter, and stops it when the last one leaves."""
    block = {"ttl": {"default_ttl": 60, "sweep_interval_minutes": 30}}
    _server_variables(monkeypatch, endpoint, "manifest", CHECKPOINT_SETUP="1", LANGGRAPH_STORE=json.dumps(block))
    async with store() as first, store() as second:
        sweepers = [m for m in (first, second) if m._sweeper is not None]
        assert len(sweepers) == 1 and sweepers[0]._sweeper.is_alive()
        running = sweepers[0]._sweeper
    running.join(timeout=10)
    assert not running.is_alive()
    # Without the interval, none.
    _server_variables(monkeypatch, endpoint, "manifest", LANGGRAPH_STORE=json.dumps({"ttl": {"default_ttl": 60}}))
    async with store() as memory:
        assert memory._sweeper is None


@pytest.mark.parametrize("index_mode", INDEX_MODES)
async def test_each_thread_closes_its_own_loops_clients(endpoint: str, index_mode: str, monkeypatch) -> None:
    """The server enters the store once per OS thread: each thread's loop has its own
    clients of the one saver, closed when that thread's context leaves."""
    _server_variables(monkeypatch, endpoint, index_mode, CHECKPOINT_SETUP="1")
    monkeypatch.delenv("LANGGRAPH_STORE", raising=False)

    async def in_another_thread(saver: S3Saver) -> asyncio.AbstractEventLoop:
        async with store() as memory:
            assert memory._async is saver._async and memory.index_config is None and memory.ttl_config is None
            await memory.aput(("t",), "k", {"n": 1})
            loop = asyncio.get_running_loop()
            assert loop in saver._async._loops
        assert loop not in saver._async._loops
        return loop

    async with checkpointer() as saver:
        await saver.aget_tuple({"configurable": {"thread_id": "none"}})
        other = await asyncio.to_thread(asyncio.run, in_another_thread(saver))
        assert list(saver._async._loops) == [asyncio.get_running_loop()] and other not in saver._async._loops
        async with store() as memory:
            assert (await memory.aget(("t",), "k")).value == {"n": 1}
    assert not saver._async._loops


async def test_a_wrong_store_block_stops_the_store_at_entry(endpoint: str, monkeypatch) -> None:
    """The server enters the store at start: a block that cannot work fails there, named,
    and leaves no saver behind."""
    from s3_saver import langgraph_server

    _server_variables(monkeypatch, endpoint, "manifest")
    monkeypatch.setenv("LANGGRAPH_STORE", json.dumps({**STORE, "index": {**STORE["index"], "embed": "./nowhere.py:embed"}}))
    with pytest.raises(ConfigurationError, match="index.embed='./nowhere.py:embed': no file './nowhere.py'"):
        async with store():
            pass
    monkeypatch.setenv("CHECKPOINT_BUCKET", "s3://server-bucket")
    with pytest.raises(ConfigurationError, match="CHECKPOINT_BUCKET='s3://server-bucket'"):
        async with store():
            pass
    assert not langgraph_server._RUNTIMES


# -- langgraph dev -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def own_moto() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    atomic_conditional_writes()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@dataclass
class Server:
    """One `langgraph dev` and the store its S3Saver writes to."""

    url: str
    mode: str
    env: dict[str, str]
    bucket: str
    table: str | None
    moto: str
    log: Path

    def saver(self) -> S3Saver:
        """A fresh saver on the server's store: reads what is stored, nothing cached."""
        return S3Saver(self.bucket, table=self.table, endpoint_url=self.moto, region_name="us-east-1")

    def keys(self) -> list[str]:
        s3 = boto3.client("s3", endpoint_url=self.moto, region_name="us-east-1")
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def client(self):
        return get_client(url=self.url, timeout=30)

    def store(self, clock: Clock | None = None) -> S3Store:
        """A store of this process on the server's memory, with the example's index."""
        spec = StoreSettings(index={**STORE["index"], "embed": f"{EXAMPLE / 'embeddings.py'}:embed"})
        return S3Store(
            self.bucket, table=self.table, endpoint_url=self.moto, region_name="us-east-1", index=spec.index_config(), clock=clock
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_env(moto: str, bucket: str, table: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGSMITH_", "LANGCHAIN_", "LANGGRAPH_"))}
    env.update(
        AWS_ENDPOINT_URL=moto,
        CHECKPOINT_BUCKET=bucket,
        CHECKPOINT_TABLE=table or "",
        CHECKPOINT_SETUP="1",
        # Nothing but 127.0.0.1 is reachable: no tracing, no analytics, no version check.
        LANGSMITH_TRACING="false",
        LANGCHAIN_TRACING_V2="false",
        LANGGRAPH_CLI_NO_ANALYTICS="1",
        LANGGRAPH_NO_VERSION_CHECK="true",
        NO_PROXY="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(scope="module", params=INDEX_MODES)
def server(request, own_moto: str, tmp_path_factory) -> Iterator[Server]:
    """`langgraph dev` on the example app, in a copy of it (the server writes
    .langgraph_api/ in its working directory), on a free port."""
    mode = request.param
    run = uuid.uuid4().hex[:8]
    bucket = f"lgs-{mode}-{run}"
    table = f"lgs-{mode}-{run}" if mode == "dynamodb" else None
    app = tmp_path_factory.mktemp(f"langgraph-server-{mode}")
    for name in ("langgraph.json", "graph.py", "notes.py", "embeddings.py"):
        shutil.copy(EXAMPLE / name, app / name)
    port = _free_port()
    env = _server_env(own_moto, bucket, table)
    log = app / "server.log"
    command = [str(BIN / "langgraph"), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--config", str(app / "langgraph.json")], cwd=app, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        url = _wait_ready(port, process, log)
        yield Server(url=url, mode=mode, env=env, bucket=bucket, table=table, moto=own_moto, log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # The server closed the saver it entered, without an error on the way out.
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-4000:]


def _wait_ready(port: int, process: subprocess.Popen, log: Path) -> str:
    """The server's URL once it answers ``/ok``."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if process.poll() is not None:
            pytest.fail(f"langgraph dev exited with {process.returncode}:\n{text[-4000:]}")
        # langgraph dev moves to another port when its own was taken (by then, by another
        # process: _free_port only found it free), and says which.
        if moved := re.search(r"Port \d+ is already in use, using port (\d+) instead", text):
            port = int(moved.group(1))
        # Only once it says it started (after any such move): whatever took the port answers too.
        if "Application started up" in text:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ok", timeout=2) as answer:
                    if answer.status == 200:
                        return f"http://127.0.0.1:{port}"
            except OSError:
                pass
        time.sleep(0.2)
    pytest.fail(f"langgraph dev not ready in {START_TIMEOUT:.0f} s:\n{log.read_text(errors='replace')[-4000:]}")


async def _interrupted(client) -> tuple[str, str]:
    """A new thread run up to the graph's interrupt: (thread id, run id)."""
    thread = await client.threads.create()
    thread_id = thread["thread_id"]
    values = await client.runs.wait(thread_id, GRAPH, input={"order": "A-7", "amount": 12.5})
    assert values["__interrupt__"][0]["value"] == {
        "question": "Approve this refund?",
        "draft": "Refund 12.50 EUR for order A-7",
    }
    (run,) = await client.runs.list(thread_id)
    return thread_id, run["run_id"]


async def _finished(client) -> tuple[str, list[str]]:
    """A new thread run to its interrupt and resumed with "approve": (thread id, [first run, resume run])."""
    thread_id, first = await _interrupted(client)
    values = await client.runs.wait(thread_id, GRAPH, command=Command(resume="approve"))
    assert values["status"] == "refunded" and values["decision"] == "approve"
    runs = {r["run_id"] for r in await client.runs.list(thread_id)}
    (resume,) = runs - {first}
    return thread_id, [first, resume]


def _stored(saver: S3Saver, thread_id: str) -> list[tuple[str, str | None, dict]]:
    """The thread's checkpoints as S3Saver lists them: (id, run id, values), newest first."""
    return [
        (t.config["configurable"]["checkpoint_id"], t.metadata.get("run_id"), t.checkpoint["channel_values"])
        for t in saver.list({"configurable": {"thread_id": thread_id}})
    ]


async def _interrupt_resume_and_history_are_in_the_bucket(server: Server) -> None:
    client = server.client()
    thread_id, first_run = await _interrupted(client)
    state = await client.threads.get_state(thread_id)
    assert state["next"] == ["review"] and state["interrupts"][0]["value"]["draft"].startswith("Refund 12.50")
    interrupted_at = state["checkpoint"]["checkpoint_id"]

    values = await client.runs.wait(thread_id, GRAPH, command=Command(resume="approve"))
    assert values["log"] == ["drafted: Refund 12.50 EUR for order A-7", "reviewed: approve", "settled: refunded"]
    state = await client.threads.get_state(thread_id)
    assert state["next"] == [] and state["values"] == values
    history = await client.threads.get_history(thread_id, limit=100)
    assert [h["metadata"]["step"] for h in history] == [3, 2, 1, 0, -1]
    assert history[2]["checkpoint"]["checkpoint_id"] == interrupted_at

    # The same history, read from the store by a saver of another process.
    saver = server.saver()
    stored = _stored(saver, thread_id)
    assert [c[0] for c in stored] == [h["checkpoint"]["checkpoint_id"] for h in history]
    assert {c[1] for c in stored[2:]} == {first_run} and stored[0][1] != first_run
    assert stored[0][2] == values
    latest = saver.get_tuple({"configurable": {"thread_id": thread_id}})
    assert latest.checkpoint["id"] == state["checkpoint"]["checkpoint_id"]
    # The interrupted checkpoint holds the interrupt and the resume among its pending writes.
    at_interrupt = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": interrupted_at}})
    assert {"__interrupt__", "__resume__"} <= {channel for _, channel, _ in at_interrupt.pending_writes}
    # One object per checkpoint in the bucket (and in manifest mode, the thread's manifest).
    keys = server.keys()
    checkpoints = [k for k in keys if k.startswith(f"live/{thread_id}/=/checkpoints/")]
    assert sorted(k.rsplit("/", 1)[1].split("@")[0] for k in checkpoints) == sorted(c[0] for c in stored)
    manifests = [k for k in keys if k.startswith(f"manifests/{thread_id}/")]
    assert bool(manifests) == (server.mode == "manifest"), manifests
    saver.close()


async def _copy_thread_copies_the_store(server: Server) -> None:
    """POST /threads/{id}/copy reaches S3Saver.acopy_thread: the copy holds the same checkpoints."""
    client = server.client()
    source, _ = await _finished(client)
    copy = await client.threads.copy(source)
    target = copy["thread_id"]
    saver = server.saver()
    copied, original = _stored(saver, target), _stored(saver, source)
    assert len(original) == 5 and copied == original
    state = await client.threads.get_state(target)
    assert state["values"]["status"] == "refunded" and state["checkpoint"]["thread_id"] == target
    # The copy continues on its own: a state update lands in the copy, not the source.
    await client.threads.update_state(target, {"status": "reopened"})
    assert len(_stored(saver, target)) == 6 and _stored(saver, source) == original
    saver.close()


async def _delete_run_deletes_its_checkpoints(server: Server) -> None:
    """DELETE /threads/{id}/runs/{run_id} reaches S3Saver.adelete_for_runs: the resume run's
    checkpoints go, the first run's stay, and the thread is back at its interrupt."""
    client = server.client()
    thread_id, (first, resume) = await _finished(client)
    saver = server.saver()
    before = _stored(saver, thread_id)
    await client.runs.delete(thread_id, resume)
    after = _stored(saver, thread_id)
    assert after == [c for c in before if c[1] == first] and len(after) == 3
    state = await client.threads.get_state(thread_id)
    assert state["checkpoint"]["checkpoint_id"] == after[0][0]
    saver.close()


async def _delete_and_prune_threads_delete_them_from_the_store(server: Server) -> None:
    """DELETE /threads/{id} and POST /threads/prune (strategy "delete") reach
    S3Saver.adelete_thread: the threads' checkpoints and objects are gone, others stay."""
    client = server.client()
    deleted, _ = await _interrupted(client)
    pruned, _ = await _interrupted(client)
    kept, _ = await _interrupted(client)
    saver = server.saver()
    kept_before = _stored(saver, kept)
    await client.threads.delete(deleted)
    assert await client.threads.prune([pruned], strategy="delete") == {"pruned_count": 1}
    for thread_id in (deleted, pruned):
        assert _stored(saver, thread_id) == []
        assert saver.get_tuple({"configurable": {"thread_id": thread_id}}) is None
        assert not [k for k in server.keys() if k.startswith(f"live/{thread_id}/")]
    assert _stored(saver, kept) == kept_before
    saver.close()


# The server's checkpointer gRPC service, in a process configured as `langgraph dev`
# configures its own (the in-memory runtime's settings, LANGGRAPH_CHECKPOINTER from the
# example's langgraph.json): one Prune request per STRATEGY=THREAD_ID argument, through
# langgraph-api's adapter, as the server's Go core sends them.
_PRUNE = """
import asyncio, sys
from langgraph_api import _checkpointer
from langgraph_api.grpc.servicers.checkpointer import CheckpointerServicerImpl
from langgraph_grpc_common.proto import checkpointer_pb2

class Context:
    def code(self):
        return None
    def set_code(self, code):
        pass
    def set_details(self, details):
        print(details, file=sys.stderr)

async def main(requests):
    await _checkpointer.start_checkpointer()
    assert _checkpointer.get_checkpointer_capabilities().has_aprune
    try:
        for strategy, thread_id in requests:
            request = checkpointer_pb2.PruneRequest(
                thread_ids=[thread_id], strategy=checkpointer_pb2.PruneRequest.PruneStrategy.Value(strategy)
            )
            await CheckpointerServicerImpl().Prune(request, Context())
    finally:
        await _checkpointer.exit_checkpointer()

asyncio.run(main([arg.split("=", 1) for arg in sys.argv[1:]]))
"""


async def _grpc_prune_reaches_aprune(server: Server, alongside: Awaitable[None]) -> None:
    """Prune KEEP_LATEST keeps the thread's newest checkpoint; DELETE_ALL (which the server
    passes to aprune as "delete_all") deletes the thread; a thread not named stays.

    The process starts in seconds (langgraph-api imports): ``alongside`` runs meanwhile.
    """
    client = server.client()
    (trimmed, _), (deleted, _), (untouched, _) = [await _interrupted(client) for _ in range(3)]
    saver = server.saver()
    before = {t: _stored(saver, t) for t in (trimmed, deleted, untouched)}
    env = {
        **server.env,
        "MIGRATIONS_PATH": "__inmem",
        "DATABASE_URI": ":memory:",
        "REDIS_URI": "fake",
        "LANGGRAPH_RUNTIME_EDITION": "inmem",
        "LANGGRAPH_CHECKPOINTER": json.dumps(CHECKPOINTER),
    }
    requests = [f"KEEP_LATEST={trimmed}", f"DELETE_ALL={deleted}"]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PRUNE, *requests, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        await alongside
    finally:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()[-4000:]

    assert _stored(saver, trimmed) == before[trimmed][:1] and len(before[trimmed]) == 3
    assert _stored(saver, deleted) == []
    assert _stored(saver, untouched) == before[untouched]
    state = await client.threads.get_state(trimmed)
    assert state["checkpoint"]["checkpoint_id"] == before[trimmed][0][0] and state["next"] == ["review"]
    # The kept checkpoint still holds its interrupt: the thread resumes as before the prune.
    values = await client.runs.wait(trimmed, GRAPH, command=Command(resume="reject"))
    assert values["status"] == "rejected" and len(_stored(saver, trimmed)) == 3
    saver.close()


async def _memory_through_the_store_api(server: Server) -> None:
    """The server's store is S3Store (``"store"`` of the example's langgraph.json): items put,
    read, searched by meaning and by filter, listed and deleted through ``/store/...`` and
    from a graph node are in the bucket (manifest) or the table (DynamoDB), read back alike
    by a store of this process; the index and the default ttl are the JSON's."""
    assert "Using custom store: S3Store(" in server.log.read_text(errors="replace")
    client = server.client()
    await client.store.put_item(["notes", "alice"], "coffee", {"text": "alice likes strong coffee"})
    await client.store.put_item(["notes", "alice"], "cat", {"text": "alice has a cat named Tom", "tag": "pets"})
    await client.store.put_item(["notes", "alice"], "old", {"text": "alice lived in Lyon"})
    await client.store.put_item(["notes", "bob"], "tea", {"text": "bob drinks green tea"}, ttl=1)  # minutes
    assert (await client.store.get_item(["notes", "alice"], "coffee"))["value"] == {"text": "alice likes strong coffee"}
    await client.store.delete_item(["notes", "alice"], "old")
    assert await client.store.get_item(["notes", "alice"], "old") is None

    found = (await client.store.search_items(["notes"], query="who likes coffee"))["items"]
    assert [(i["namespace"], i["key"]) for i in found][:1] == [(["notes", "alice"], "coffee")]
    assert found[0]["score"] > max(i["score"] for i in found[1:])
    pets = (await client.store.search_items(["notes", "alice"], filter={"tag": "pets"}))["items"]
    assert [i["key"] for i in pets] == ["cat"] and pets[0]["score"] is None

    # A graph node writes and searches the same memory: a note of one thread is recalled in another.
    first, second = "carol is allergic to peanuts", "bake carol a cake without peanuts"
    for note in (first, second):
        thread = await client.threads.create()
        values = await client.runs.wait(thread["thread_id"], "notes", input={"user": "carol", "note": note})
    assert values["recalled"] == [second, first]
    listed = await client.store.list_namespaces(prefix=["notes"])
    assert sorted(listed["namespaces"]) == [["notes", "alice"], ["notes", "bob"], ["notes", "carol"]]

    # Where it is: the namespaces' heads in the bucket, or their partitions in the table.
    nodes = {ns: node_id(ns) for ns in (("notes", "alice"), ("notes", "bob"), ("notes", "carol"))}
    heads = {k for k in server.keys() if k.startswith("memory/")}
    if server.mode == "manifest":
        assert {f"memory/n/{n}/@head" for n in nodes.values()} <= heads and "memory/@reg/head" in heads
    else:
        assert not heads  # small values: nothing in the bucket
        table = boto3.client("dynamodb", endpoint_url=server.moto, region_name="us-east-1")
        pages = table.get_paginator("scan").paginate(TableName=server.table, ConsistentRead=True)
        partitions = {i["pk"]["S"] for page in pages for i in page["Items"]}
        assert {f"#m/{n}" for n in nodes.values()} <= partitions

    # Read back by another process's store: the same items, the same scores (the same index).
    theirs = (await client.store.search_items(["notes"], query="carol likes coffee"))["items"]
    async with server.store() as mine:
        ours = await mine.asearch(("notes",), query="carol likes coffee", refresh_ttl=False)
        assert [(list(i.namespace), i.key, i.score) for i in ours] == [(i["namespace"], i["key"], i["score"]) for i in theirs]
        assert len(ours) == 5 and ours[0].score > 0
        assert (await mine.aget(("notes", "bob"), "tea", refresh_ttl=False)).value == {"text": "bob drinks green tea"}

    # The ttl: the item put with ttl=1 is gone two minutes on; the graph's items took the
    # JSON's default_ttl (30 days); an item put over HTTP without a ttl never expires
    # (the server passes ttl=None for it, whatever the default).
    now = time.time_ns() // 1000

    def later(minutes: int) -> S3Store:
        return server.store(clock=Clock(lambda: now + minutes * 60_000_000))

    async with later(2) as soon, later(29 * 24 * 60) as before, later(31 * 24 * 60) as after:
        assert await soon.aget(("notes", "bob"), "tea", refresh_ttl=False) is None
        assert len(await before.asearch(("notes", "carol"), refresh_ttl=False)) == 2
        assert await after.asearch(("notes", "carol"), refresh_ttl=False) == []
        assert (await after.aget(("notes", "alice"), "coffee", refresh_ttl=False)) is not None


async def test_langgraph_dev_keeps_its_threads_and_memory_in_s3(server: Server) -> None:
    """Every check on one server per index mode, in one test: the server takes seconds to
    start, and one test stays on one xdist worker (separate tests would start it on both)."""

    async def through_the_api() -> None:
        await _memory_through_the_store_api(server)
        await _interrupt_resume_and_history_are_in_the_bucket(server)
        await _copy_thread_copies_the_store(server)
        await _delete_run_deletes_its_checkpoints(server)
        await _delete_and_prune_threads_delete_them_from_the_store(server)

    await _grpc_prune_reaches_aprune(server, alongside=through_the_api())
