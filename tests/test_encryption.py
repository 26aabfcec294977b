"""S3Saver with ``encryption=``: every stored byte of a thread's content is sealed, in both
index modes and both drivers, behind the same operations.

A real LangGraph graph (invoke and ainvoke, interrupts, ``update_state``, history) runs with
encryption on; then every version of every object in the bucket and the key store, and every
attribute of every table item, is decoded as deep as it goes (zlib, zstd frames, msgpack) and
searched for the strings the graph wrote: none is found. The same scan over the same graph
without encryption finds them (the scan can fail). A ciphertext moved to another thread, a
plaintext object, an encrypted thread read without encryption, and the operations that cannot
encrypt yet are refused by name. The steady state sends the requests it sends without
encryption; a cold process pays what the design says (asserted).
"""

from __future__ import annotations

import asyncio
import operator
import os
import uuid
import zlib
from typing import Annotated, Any, TypedDict

import boto3
import ormsgpack
import pytest
from conftest import BUCKET, TABLE, make_saver, make_versioned
from helpers import checkpoint, config
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from s3_saver import (
    ConfigurationError,
    EncryptedObjectError,
    ForeignCiphertextError,
    KmsKey,
    LocalKey,
    PlaintextObjectError,
    ThreadErasedError,
)

KEY_BUCKET = f"{BUCKET}-keys"


def _kms(endpoint: str) -> KmsKey:
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    key_id = kms.create_key(Description="s3_saver tests")["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName="alias/checkpoints", TargetKeyId=key_id)
    return KmsKey("alias/checkpoints")


def _encryption(endpoint: str, kind: str) -> KmsKey | LocalKey:
    return _kms(endpoint) if kind == "kms" else LocalKey(os.urandom(32))


def _saver(endpoint: str, mode: str, encryption: Any, **kwargs: Any):
    saver = make_saver(endpoint, mode, encryption=encryption, **kwargs)
    saver.setup()
    saver.stats.reset()
    return saver


# -- a real graph --------------------------------------------------------------------------
class State(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]
    answer: str


def _graph(saver: Any, secret: str):
    def write(state: State) -> dict:
        return {"notes": [f"{secret}-written-{len(state.get('notes', []))}"]}

    def ask(state: State) -> dict:
        reply = interrupt({"question": f"{secret}-asked"})
        return {"answer": f"{secret}-answer-{reply}", "notes": [f"{secret}-after"]}

    return (
        StateGraph(State)
        .add_node("write", write)
        .add_node("ask", ask)
        .add_edge(START, "write")
        .add_edge("write", "ask")
        .add_edge("ask", END)
        .compile(checkpointer=saver)
    )


def _run(graph: Any, secret: str, thread: str, driver: str, updates: int = 1) -> tuple[Any, list[Any]]:
    cfg = {"configurable": {"thread_id": thread}, "metadata": {"user_note": f"{secret}-meta"}}

    async def arun() -> tuple[Any, list[Any]]:
        await graph.ainvoke({"notes": [f"{secret}-input"]}, cfg)
        await graph.ainvoke(Command(resume=f"{secret}-resume"), cfg)
        for i in range(updates):
            await graph.aupdate_state(cfg, {"notes": [f"{secret}-updated"]} if i == updates - 1 else {"answer": f"{secret}-{i}"})
        state = await graph.aget_state(cfg)
        history = [s async for s in graph.aget_state_history(cfg)]
        return state, history

    if driver == "async":
        return asyncio.run(arun())
    graph.invoke({"notes": [f"{secret}-input"]}, cfg)
    graph.invoke(Command(resume=f"{secret}-resume"), cfg)
    for i in range(updates):
        graph.update_state(cfg, {"notes": [f"{secret}-updated"]} if i == updates - 1 else {"answer": f"{secret}-{i}"})
    return graph.get_state(cfg), list(graph.get_state_history(cfg))


def _check_state(state: Any, history: list[Any], secret: str, updates: int = 1) -> None:
    last = f"{secret}-{updates - 2}" if updates > 1 else f"{secret}-answer-{secret}-resume"
    assert state.values["answer"] == last
    assert state.values["notes"] == [
        f"{secret}-input", f"{secret}-written-1", f"{secret}-after", f"{secret}-updated"
    ]
    assert len(history) >= 5 and history[-1].metadata["source"] == "input"
    assert all(h.metadata.get("user_note") == f"{secret}-meta" for h in history if h.metadata["source"] != "update")


# -- the scan: every stored byte, decoded as deep as it goes -----------------------------------
def _layers(data: Any, depth: int = 0) -> list[bytes]:
    """``data`` and everything it decodes to: zlib, zstd, msgpack (each leaf)."""
    if isinstance(data, str):
        return [data.encode("utf-8", "surrogatepass")]
    if isinstance(data, (list, tuple)):
        return [b for item in data for b in _layers(item, depth)]
    if isinstance(data, dict):
        return [b for kv in data.items() for item in kv for b in _layers(item, depth)]
    if not isinstance(data, (bytes, bytearray)) or depth > 6:
        return [str(data).encode()]
    data = bytes(data)
    found = [data]
    for decode in (zlib.decompress, _unzstd):
        try:
            found += _layers(decode(data), depth + 1)
        except Exception:
            pass
    try:
        found += _layers(ormsgpack.unpackb(data), depth + 1)
    except Exception:
        pass
    return found


def _unzstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 26)


def _stored(endpoint: str) -> list[tuple[str, bytes]]:
    """Every version of every object of both buckets, every attribute of every table item."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    found = []
    for bucket in (BUCKET, KEY_BUCKET):
        try:
            pages = list(s3.get_paginator("list_object_versions").paginate(Bucket=bucket))
        except s3.exceptions.NoSuchBucket:
            continue
        for page in pages:
            for v in page.get("Versions", []):
                body = s3.get_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
                found.append((f"s3://{bucket}/{v['Key']}", body))
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    if TABLE in dynamodb.list_tables()["TableNames"]:
        for page in dynamodb.get_paginator("scan").paginate(TableName=TABLE):
            for item in page["Items"]:
                for name, value in item.items():
                    ((kind, raw),) = value.items()
                    found.append((f"{TABLE}:{item['pk']['S']}/{item['sk']['S']}/{name}", raw if kind == "B" else str(raw).encode()))
    return found


def _leaks(endpoint: str, secret: str) -> list[str]:
    needle = secret.encode()
    return sorted({where for where, blob in _stored(endpoint) if any(needle in layer for layer in _layers(blob))})


# Enough updates for the manifest head to seal segments on a versioned bucket
# (``seal.VERSIONED_LIMITS``: at 24 checkpoints), whose frames carry bodies.
_UPDATES = 26


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_graph_with_encryption_keeps_no_plaintext_anywhere(endpoint, index_mode, driver) -> None:
    # Versioned: every head a write replaced stays, and is scanned too.
    make_versioned(endpoint)
    encryption = _kms(endpoint) if driver == "sync" else LocalKey(os.urandom(32))
    saver = _saver(endpoint, index_mode, encryption)
    secret = f"secret{uuid.uuid4().hex[:12]}"
    try:
        state, history = _run(_graph(saver, secret), secret, "t-1", driver, _UPDATES)
        _check_state(state, history, secret, _UPDATES)
        # A fresh process (its own cache) reads the same, and lists with a metadata filter.
        other = make_saver(endpoint, index_mode, encryption=encryption)
        state, history = _run_reads(other, secret, driver)
        _check_state(state, history, secret, _UPDATES)
        other.close()
    finally:
        saver.close()
    stored = [where for where, _ in _stored(endpoint)]
    if index_mode == "manifest":
        assert any("/segments/" in w for w in stored)
        assert sum("/head" in w or w.endswith("manifest") or "manifest/" in w for w in stored) > _UPDATES
    assert any(w.startswith(f"s3://{KEY_BUCKET}/") for w in stored)
    assert _leaks(endpoint, secret) == []


def _run_reads(saver: Any, secret: str, driver: str) -> tuple[Any, list[Any]]:
    graph = _graph(saver, secret)
    cfg = {"configurable": {"thread_id": "t-1"}}
    filtered = list(saver.list(cfg, filter={"user_note": f"{secret}-meta"}))
    assert len(filtered) >= 3
    if driver == "async":

        async def arun() -> tuple[Any, list[Any]]:
            return await graph.aget_state(cfg), [s async for s in graph.aget_state_history(cfg)]

        return asyncio.run(arun())
    return graph.get_state(cfg), list(graph.get_state_history(cfg))


def test_the_scan_finds_the_strings_without_encryption(endpoint, index_mode) -> None:
    """The control: the same graph and scan without encryption find the strings, in the
    objects and in the index (so the scan above can fail)."""
    make_versioned(endpoint)
    saver = _saver(endpoint, index_mode, None)
    secret = f"secret{uuid.uuid4().hex[:12]}"
    state, history = _run(_graph(saver, secret), secret, "t-1", "sync", _UPDATES)
    _check_state(state, history, secret, _UPDATES)
    saver.close()
    leaks = _leaks(endpoint, secret)
    assert any("/live/" in w or w.startswith(f"s3://{BUCKET}/live") for w in leaks)
    if index_mode == "dynamodb":
        assert any(w.startswith(TABLE) for w in leaks)
    else:
        assert any("/segments/" in w for w in leaks)


# -- refusals, by name -------------------------------------------------------------------------
def _thread(saver: Any, thread: str, value: str) -> dict[str, Any]:
    cp = checkpoint({"doc": value, "big": value * 40}, {"doc": "1", "big": "1"})
    stored = saver.put(config(thread), cp, {"source": "input", "step": -1}, {"doc": "1", "big": "1"})
    saver.put_writes(stored, [("doc", f"{value}-write")], "task-1")
    return stored


def _objects(endpoint: str, thread: str) -> dict[str, bytes]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"live/{thread}/").get("Contents", [])]
    return {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


@pytest.mark.parametrize("kind", ["kms", "local"])
def test_an_object_moved_to_another_thread_is_foreign(endpoint, index_mode, kind) -> None:
    # Values in blob objects of their own: a read always GETs them.
    saver = _saver(endpoint, index_mode, _encryption(endpoint, kind), inline_threshold=0)
    _thread(saver, "a", "alpha")
    _thread(saver, "b", "bravo")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    blobs_a = {k: v for k, v in _objects(endpoint, "a").items() if "/blobs/doc/" in k}
    blobs_b = [k for k in _objects(endpoint, "b") if "/blobs/doc/" in k]
    assert len(blobs_a) == 1 and len(blobs_b) == 1
    # Thread a's value put where thread b's was (same channel and version: only the thread differs).
    s3.put_object(Bucket=BUCKET, Key=blobs_b[0], Body=next(iter(blobs_a.values())))
    cold = make_saver(endpoint, index_mode, encryption=saver._ctx.crypt.config)
    with pytest.raises(ForeignCiphertextError) as found:
        cold.get_tuple(config("b"))
    assert found.value.thread_id == "b" and found.value.key == blobs_b[0] and found.value.bucket == BUCKET
    assert cold.get_tuple(config("a")).checkpoint["channel_values"]["doc"] == "alpha"
    # The same bytes changed by one bit, in their own place: refused too.
    (key_a, body_a), = blobs_a.items()
    s3.put_object(Bucket=BUCKET, Key=key_a, Body=body_a[:-1] + bytes([body_a[-1] ^ 1]))
    with pytest.raises(ForeignCiphertextError):
        make_saver(endpoint, index_mode, encryption=saver._ctx.crypt.config).get_tuple(config("a"))
    saver.close()
    cold.close()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_saver_on_another_key_store_reads_the_thread_as_keyless(endpoint, index_mode, driver) -> None:
    """No key for a sealed thread is decided on a second read of the record (the first
    may precede a migration's key): then it is named, the key store with it, each call."""
    master = os.urandom(32)
    writer = _saver(endpoint, index_mode, LocalKey(master))
    _thread(writer, "keyless", "sealed")
    writer.close()
    other = _saver(endpoint, index_mode, LocalKey(master, key_bucket="other-keys"))
    try:
        for _ in range(2):
            with pytest.raises(ThreadErasedError, match="other-keys.*another key store") as found:
                if driver == "async":
                    asyncio.run(other.aget_tuple(config("keyless")))
                else:
                    other.get_tuple(config("keyless"))
            assert found.value.thread_id == "keyless"
    finally:
        other.close()


def test_plaintext_under_an_encrypting_saver_is_refused(endpoint, index_mode) -> None:
    plain = _saver(endpoint, index_mode, None, inline_threshold=0)
    _thread(plain, "old", "plain")
    encrypting = _saver(endpoint, index_mode, LocalKey(os.urandom(32)), inline_threshold=0)
    with pytest.raises(PlaintextObjectError) as found:
        encrypting.get_tuple(config("old"))
    assert found.value.thread_id == "old"
    with pytest.raises(PlaintextObjectError):
        list(encrypting.list(config("old")))
    # A plaintext value put in place of an encrypted thread's sealed one: refused as well.
    _thread(encrypting, "new", "sealed")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    old_blob = next(v for k, v in _objects(endpoint, "old").items() if "/blobs/doc/" in k)
    new_key = next(k for k in _objects(endpoint, "new") if "/blobs/doc/" in k)
    s3.put_object(Bucket=BUCKET, Key=new_key, Body=old_blob)
    with pytest.raises(PlaintextObjectError) as found:
        make_saver(endpoint, index_mode, encryption=encrypting._ctx.crypt.config).get_tuple(config("new"))
    assert found.value.key == new_key
    # And a saver without encryption meeting an encrypted thread says so.
    with pytest.raises(EncryptedObjectError, match="encryption="):
        make_saver(endpoint, index_mode).get_tuple(config("new"))
    plain.close()
    encrypting.close()


def test_an_archived_thread_is_refused_as_plaintext(endpoint, index_mode) -> None:
    plain = _saver(endpoint, index_mode, None)
    _thread(plain, "t", "value")
    plain.archive_thread("t")
    encrypting = _saver(endpoint, index_mode, LocalKey(os.urandom(32)))
    with pytest.raises(PlaintextObjectError, match="archive"):
        encrypting.get_tuple(config("t"))
    # A write to it would restore it into live objects in plaintext: refused the same way.
    with pytest.raises(PlaintextObjectError, match="archive"):
        encrypting.put(config("t"), checkpoint({"doc": "x"}, {"doc": "2"}), {"source": "loop", "step": 1}, {"doc": "2"})
    plain.close()
    encrypting.close()


# -- request counts ---------------------------------------------------------------------------
def _steady(saver: Any, thread: str) -> list[tuple[int, dict[Any, int]]]:
    """Each call's (round trips, requests) in a steady state: the thread written and read
    by this process already."""
    counts = []
    stored = _thread(saver, thread, "warm")
    saver.get_tuple(config(thread))
    calls = [
        lambda: saver.put(stored, checkpoint({"doc": "v2"}, {"doc": "2", "big": "1"}), {"source": "loop", "step": 0}, {"doc": "2"}),
        lambda: saver.put_writes(config(thread, checkpoint_id=stored["configurable"]["checkpoint_id"]), [("doc", "w")], "task-2"),
        lambda: saver.get_tuple(config(thread)),
        lambda: list(saver.list(config(thread), limit=2)),
    ]
    for call in calls:
        saver.stats.reset()
        call()
        counts.append((saver.stats.round_trips, dict(saver.stats.requests)))
    return counts


@pytest.mark.parametrize("kind", ["kms", "local"])
def test_the_steady_state_sends_what_it_sends_without_encryption(endpoint, index_mode, kind) -> None:
    plain = _saver(endpoint, index_mode, None, prefix="plain/")
    encrypting = _saver(endpoint, index_mode, _encryption(endpoint, kind), prefix="sealed/")
    assert _steady(encrypting, "t") == _steady(plain, "t")
    assert encrypting.cache_stats().caches["keys"].entries == 1
    plain.close()
    encrypting.close()


@pytest.mark.parametrize("kind", ["kms", "local"])
def test_a_cold_process_pays_the_key_once(endpoint, index_mode, kind) -> None:
    kms = kind == "kms"
    encryption = _encryption(endpoint, kind)
    writer = _saver(endpoint, index_mode, encryption)
    plain_writer = _saver(endpoint, index_mode, None, prefix="plain/")
    ids = {}
    for s, name in ((writer, ""), (plain_writer, "plain/")):
        ids[name] = _thread(s, "t", "value")["configurable"]["checkpoint_id"]

    def cold_read(saver_kwargs: dict[str, Any]) -> tuple[int, int]:
        cold = make_saver(endpoint, index_mode, **saver_kwargs)
        cold.get_tuple(config("t"))
        counts = cold.stats.round_trips, cold.stats.total_requests
        cold.close()
        return counts

    sealed_rt, sealed_req = cold_read({"encryption": encryption})
    plain_rt, plain_req = cold_read({"prefix": "plain/"})
    # The key's GET rides beside the index read; KMS's Decrypt is one more round trip.
    assert (sealed_rt - plain_rt, sealed_req - plain_req) == ((1, 2) if kms else (0, 1))

    # A new thread: LangGraph reads it first (the key's 404 beside the index read), then
    # writes: GenerateDataKey (KMS) and the key record's conditional create, once.
    def first_turn(saver_kwargs: dict[str, Any]) -> list[int]:
        saver = make_saver(endpoint, index_mode, **saver_kwargs)
        trips = []
        for call in (lambda: saver.get_tuple(config("new")), lambda: _thread(saver, "new", "v")):
            saver.stats.reset()
            call()
            trips.append(saver.stats.round_trips)
        saver.close()
        return trips

    sealed, plain = first_turn({"encryption": encryption}), first_turn({"prefix": "plain/"})
    assert sealed[0] == plain[0] and sealed[1] - plain[1] == (2 if kms else 1)

    # A cold process whose first call writes an existing thread: the key's GET (and
    # Decrypt) before it can seal anything.
    def cold_write(saver_kwargs: dict[str, Any]) -> int:
        saver = make_saver(endpoint, index_mode, **saver_kwargs)
        saver.put_writes(config("t", checkpoint_id=ids[saver_kwargs.get("prefix", "")]), [("doc", "late")], "task-9")
        trips = saver.stats.round_trips
        saver.close()
        return trips

    assert cold_write({"encryption": encryption}) - cold_write({"prefix": "plain/"}) == (2 if kms else 1)
    writer.close()
    plain_writer.close()


def test_setup_makes_the_key_store_and_refuses_a_versioned_one(endpoint, index_mode) -> None:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    saver = _saver(endpoint, index_mode, LocalKey(os.urandom(32)))
    assert s3.get_bucket_versioning(Bucket=KEY_BUCKET).get("Status") is None
    s3.create_bucket(Bucket="versioned-keys")
    s3.put_bucket_versioning(Bucket="versioned-keys", VersioningConfiguration={"Status": "Enabled"})
    other = make_saver(endpoint, index_mode, encryption=LocalKey(os.urandom(32), key_bucket="versioned-keys"))
    with pytest.raises(ConfigurationError, match="versioned-keys.*versioning"):
        other.setup()
    saver.close()


# -- LangGraph's conformance suite, encrypted -----------------------------------------------------
async def test_the_conformance_suite_passes_encrypted(endpoint, index_mode) -> None:
    """Every capability passes with encryption on: get, list and its filters, pending
    writes, delete, copy_thread (decrypted and encrypted again), prune, delete_for_runs."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    encryption = LocalKey(os.urandom(32))

    @checkpointer_test(name="S3Saver-encrypted")
    async def factory():
        saver = make_saver(endpoint, index_mode, encryption=encryption)
        await saver.asetup()
        yield saver
        await saver.aclose()

    report = await validate(factory)
    failed = {name: [str(f) for f in r.failures] for name, r in report.results.items() if r.passed is False}
    assert failed == {}, failed
    passed = [name for name, r in report.results.items() if r.passed]
    assert "copy_thread" in passed and len(passed) >= 8, report.results
