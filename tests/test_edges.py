"""Unusual ids, key limits, value and metadata sizes, and the errors users meet."""

from __future__ import annotations

import boto3
import pytest

from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, config, is_marker
from s3_saver import (
    BucketNotFoundError,
    ConfigurationError,
    ImmutableObjectConflictError,
    KeyTooLongError,
    SetupMismatchError,
    TableNotFoundError,
)
from s3_saver._format.keys import (
    THREAD_TOMBSTONE_SK,
    SortKey,
    checkpoint_sort_key,
    decode,
    encode,
    ns_sort_prefix,
    ns_tombstone_sort_key,
    parse_sort_key,
    writes_sort_key,
)

ODD_IDS = ["", "a/b", "/", "..", ".", "...", "#", "%", "%2F", "%25", "=", "a|b", "~", "ü🙂", "a b", "..%2F..", "\\", "\t"]


def _objects(endpoint: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []) if not is_marker(o["Key"])]


def test_encoding_is_injective_and_reversible() -> None:
    encoded = [encode(i) for i in ODD_IDS]
    assert len(set(encoded)) == len(ODD_IDS)
    for original, enc in zip(ODD_IDS, encoded):
        assert decode(enc) == original
        assert "/" not in enc and "|" not in enc and enc not in {"", ".", ".."}


# Ids whose order a naive separator would get wrong: prefixes ("a" < "ab"),
# numbers as text ("10" < "9"), and characters around the separator and escape.
ORDERED_IDS = ["1", "10", "9", "a", "ab", "a b", "a!", 'a"', "a#", "a\x00", "a\x01z", "b", "Z", "é", "🙂", "", "!", '"']


def test_sort_keys_order_as_python_orders_ids() -> None:
    pairs = [(ns, cid) for ns in ["", "a", "ab", "a!"] for cid in ORDERED_IDS if cid]
    # DynamoDB compares sort keys as UTF-8 bytes.
    by_key = sorted(pairs, key=lambda p: checkpoint_sort_key(*p).encode())
    assert by_key == sorted(pairs)
    for ns, cid in pairs:
        parsed = parse_sort_key(checkpoint_sort_key(ns, cid))
        assert (parsed.kind, parsed.ns, parsed.checkpoint_id) == ("checkpoint", ns, cid)
        parsed = parse_sort_key(writes_sort_key(ns, cid, cid + "!task", "s4"))
        assert (parsed.kind, parsed.ns, parsed.checkpoint_id, parsed.task_id, parsed.part) == (
            "writes", ns, cid, cid + "!task", "s4"
        )
        # Newest first, a namespace's tombstone comes before all of its items, a
        # checkpoint item before its writes and they before older ids; the
        # thread's tombstone sorts below every item.
        assert ns_tombstone_sort_key(ns) > checkpoint_sort_key(ns, cid + "\U0010FFFE")
        assert not ns_tombstone_sort_key(ns).startswith(ns_sort_prefix(ns + "\U0010FFFE"))
        assert checkpoint_sort_key(ns, cid) > writes_sort_key(ns, cid, "~~", "r9") > checkpoint_sort_key(ns, cid[:-1] or "")
        assert THREAD_TOMBSTONE_SK < checkpoint_sort_key(ns, cid)
        assert parse_sort_key(ns_tombstone_sort_key(ns)) == SortKey("ns_tombstone", ns)


def test_custom_ids_list_in_the_same_order_as_in_memory_saver(saver) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    memory = InMemorySaver()
    ids = [i for i in ORDERED_IDS if i]
    for ns in ["a", "ab"]:
        for n, cid in enumerate(reversed(ids)):
            for target in (saver, memory):
                target.put(config("order", ns), checkpoint({"n": n}, {"n": str(n)}, cid), {"n": n}, {"n": str(n)})

    def ids_of(s, ns, **kw):
        return [(t.config["configurable"]["checkpoint_ns"], t.config["configurable"]["checkpoint_id"])
                for t in s.list(config("order", ns), **kw)]

    for ns in ["a", "ab"]:
        expected = ids_of(memory, ns)
        assert expected == [(ns, i) for i in sorted(ids, reverse=True)]
        assert ids_of(saver, ns) == expected
        assert ids_of(saver, ns, before=config("order", ns, "a"), limit=4) == ids_of(
            memory, ns, before=config("order", ns, "a"), limit=4
        )
        assert saver.get_tuple(config("order", ns)).checkpoint["id"] == max(ids)
        for cid in ids:
            assert saver.get_tuple(config("order", ns, cid)).checkpoint["id"] == cid


def test_odd_ids_round_trip_without_collisions(saver) -> None:
    stored = []
    for i, thread_id in enumerate(ODD_IDS):
        thread_id = thread_id or "empty"  # an empty thread id is refused (test_errors.py)
        ns = ODD_IDS[-1 - i]
        channel = ODD_IDS[(i + 3) % len(ODD_IDS)] or "empty-channel"
        cp = checkpoint({channel: f"value {i}"}, {channel: "1"})
        cfg = saver.put(config(thread_id, ns), cp, {"source": "input", "step": i}, {channel: "1"})
        saver.put_writes(cfg, [(channel, i)], task_id=ODD_IDS[(i + 5) % len(ODD_IDS)])
        stored.append((thread_id, ns, channel, cfg))
    for i, (thread_id, ns, channel, cfg) in enumerate(stored):
        got = saver.get_tuple(config(thread_id, ns))
        assert got.config == cfg
        assert got.checkpoint["channel_values"] == {channel: f"value {i}"}
        assert [w[1:] for w in got.pending_writes] == [(channel, i)]
        assert [t.config for t in saver.list({"configurable": {"thread_id": thread_id}})] == [cfg]
    assert len(list(saver.list(None))) == len(ODD_IDS)
    # Deleting one odd thread leaves every other one intact.
    saver.delete_thread("..")
    assert saver.get_tuple(config("..", stored[ODD_IDS.index("..")][1])) is None
    assert sum(1 for _ in saver.list(None)) == len(ODD_IDS) - 1


def test_long_ids_round_trip_up_to_the_limit(saver) -> None:
    thread_id = "t" * 300
    cp = checkpoint({"c": 1}, {"c": "1"})
    cfg = saver.put(config(thread_id, "n" * 200), cp, {}, {"c": "1"})
    assert saver.get_tuple(cfg).checkpoint["channel_values"] == {"c": 1}


@pytest.mark.parametrize(
    "thread_id, ns",
    [("t" * 1100, ""), ("🙂" * 200, ""), ("t", "n" * 1100)],
)
def test_too_long_ids_are_refused_before_writing(endpoint, saver, thread_id, ns) -> None:
    cp = checkpoint({"c": 1}, {"c": "1"})
    with pytest.raises(KeyTooLongError, match="1024 bytes"):
        saver.put(config(thread_id, ns), cp, {}, {"c": "1"})
    assert _objects(endpoint) == []
    assert list(saver.list(None)) == []


@pytest.mark.parametrize("size", [0, 1024 * 1024, 100 * 1024 * 1024])
def test_values_from_empty_to_100_mb_round_trip(saver, size) -> None:
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    cp = checkpoint({"big": payload, "small": "s"}, {"big": "1", "small": "1"})
    cfg = saver.put(config("sizes"), cp, {"source": "input"}, {"big": "1", "small": "1"})
    saver.put_writes(cfg, [("big", payload)], "task")
    got = saver.get_tuple(config("sizes"))
    assert got.checkpoint["channel_values"]["big"] == payload
    assert got.pending_writes[0][2] == payload
    del got, payload


def test_huge_metadata_round_trips_and_filters(saver) -> None:
    big = "m" * 600_000
    for step in range(3):
        cp = checkpoint({"c": step}, {"c": str(step)})
        saver.put(config("meta"), cp, {"source": "loop", "step": step, "note": big if step == 1 else "x"}, {"c": str(step)})
    matched = list(saver.list(config("meta"), filter={"note": big}))
    assert [t.metadata["step"] for t in matched] == [1]
    assert [t.metadata["step"] for t in saver.list(config("meta"), filter={"step": 2})] == [2]
    assert saver.get_tuple(matched[0].config).metadata["note"] == big


def test_many_medium_values_overflow_the_item_into_objects(saver) -> None:
    values = {f"ch{i}": "v" * 60_000 + str(i) for i in range(12)}  # ~720 KB in all
    versions = {ch: "1" for ch in values}
    saver.put(config("wide"), checkpoint(values, versions), {}, versions)
    assert saver.get_tuple(config("wide")).checkpoint["channel_values"] == values


def test_nested_metadata_filter(saver) -> None:
    for i in range(3):
        cp = checkpoint({"c": i}, {"c": str(i)})
        saver.put(config("nested"), cp, {"source": "loop", "info": {"user": {"id": i}}}, {"c": str(i)})
    got = list(saver.list(config("nested"), filter={"info": {"user": {"id": 1}}}))
    assert [t.checkpoint["channel_values"]["c"] for t in got] == [1]
    assert list(saver.list(config("nested"), limit=0)) == []


def test_retried_put_is_a_success_and_a_conflicting_body_is_refused(endpoint, saver) -> None:
    cp = checkpoint({"c": 1}, {"c": "1"})
    cfg = saver.put(config("retry"), cp, {"step": 1}, {"c": "1"})
    assert saver.put(config("retry"), cp, {"step": 1}, {"c": "1"}) == cfg
    before = _objects(endpoint)
    with pytest.raises(ImmutableObjectConflictError, match="already holds different content"):
        saver.put(config("retry"), checkpoint({"c": 2}, {"c": "1"}, cp["id"]), {"step": 1}, {"c": "1"})
    assert _objects(endpoint) == before
    assert saver.get_tuple(config("retry")).checkpoint["channel_values"] == {"c": 1}


def test_missing_thread_id_is_named(saver) -> None:
    with pytest.raises(ConfigurationError, match="thread_id"):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(ConfigurationError, match="checkpoint_id"):
        saver.put_writes(config("t"), [("a", 1)], "task")


def test_missing_bucket_and_table_say_run_setup(endpoint) -> None:
    saver = make_saver(endpoint)
    with pytest.raises(BucketNotFoundError, match="setup"):
        saver.put(config("t"), checkpoint({"c": 1}, {"c": "1"}), {}, {"c": "1"})
    with pytest.raises(TableNotFoundError, match="setup"):
        saver.get_tuple(config("t"))
    saver.close()


def test_setup_is_idempotent_and_checks_the_table(endpoint) -> None:
    saver = make_saver(endpoint)
    saver.setup()
    saver.setup()
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    ddb.create_table(
        TableName="wrong",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    from s3_saver import S3Saver

    wrong = S3Saver(BUCKET, table="wrong", endpoint_url=endpoint, region_name="us-east-1")
    with pytest.raises(SetupMismatchError, match="key schema"):
        wrong.setup()
    assert TABLE in ddb.list_tables()["TableNames"]
    saver.close()
    wrong.close()


def test_constructor_makes_no_network_call() -> None:
    from s3_saver import S3Saver

    saver = S3Saver("bucket", table="tbl", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
    assert saver.stats.round_trips == 0
    saver.close()


def test_copy_thread_is_independent_of_its_source(endpoint, saver) -> None:
    from helpers import grow_thread

    grow_thread(saver, "src", 4)
    big = b"b" * 200_000  # over inline_threshold: its own blob object
    last = saver.get_tuple(config("src"))
    saver.put(
        last.config,
        checkpoint({"counter": 9, "doc": "a document", "big": big}, {**last.checkpoint["channel_versions"], "big": "1"}),
        {"source": "update"},
        {"big": "1"},
    )
    saver.put_writes(config("src", checkpoint_id=last.config["configurable"]["checkpoint_id"]), [("x", 1)], "t")
    before = [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config("src"))]
    saver.stats.reset()
    saver.copy_thread("src", "dst")
    assert not [op for op in saver.stats.requests if "list" in op[1]]
    saver.copy_thread("src", "dst")  # a target holding only copies of src: brought up to date
    saver.delete_thread("src")
    after = [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config("dst"))]
    assert after == before
    assert all(key.startswith("live/dst/") for key in _objects(endpoint) if key.startswith("live/"))


def test_an_interrupted_copy_leaves_the_latest_state_and_completes_when_called_again(
    dynamo_saver, monkeypatch
) -> None:
    """DynamoDB: a copy writes every writes item and link first, then the checkpoint
    items newest first, so a copy cut short shows whole checkpoints, the latest state first."""
    saver = dynamo_saver
    from helpers import grow_thread

    from s3_saver._index.dynamodb.backend import DynamoIndex

    grow_thread(saver, "src", 12)
    for t in list(saver.list(config("src")))[:3]:
        saver.put_writes(t.config, [("x", t.checkpoint["id"])], "task")
    expected = [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config("src"))]
    write_batches = DynamoIndex.write_batches
    calls = []

    def cut_short(index, requests, what):
        calls.append(what)
        if len(calls) == 1:  # the writes and links: whole
            yield from write_batches(index, requests, what)
            return
        yield from write_batches(index, requests[:5], what)  # then 5 checkpoint items, newest first
        raise ConnectionError("the Lambda timed out")

    monkeypatch.setattr(DynamoIndex, "write_batches", cut_short)
    with pytest.raises(ConnectionError):
        saver.copy_thread("src", "dst")
    partial = [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config("dst"))]
    assert 0 < len(partial) < len(expected)
    assert partial[0] == expected[0]  # the newest state is there; every object it needs too

    monkeypatch.setattr(DynamoIndex, "write_batches", write_batches)
    saver.copy_thread("src", "dst")
    assert [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config("dst"))] == expected

    # Once the target has a checkpoint of its own, a copy would mix two histories.
    latest = saver.get_tuple(config("dst"))
    versions = {**latest.checkpoint["channel_versions"], "counter": "99"}
    saver.put(latest.config, checkpoint({"counter": 99, "doc": "a document"}, versions), {}, {"counter": "99"})
    with pytest.raises(ConfigurationError, match="already has checkpoints of its own"):
        saver.copy_thread("src", "dst")
    assert saver.get_tuple(config("dst")).checkpoint["channel_values"]["counter"] == 99


def test_compressible_objects_are_stored_compressed(endpoint, saver) -> None:
    import zlib

    text = "the same sentence again. " * 2000  # 50 KB, compresses well
    cfg = saver.put(config("z"), checkpoint({"text": text}, {"text": "1"}), {}, {"text": "1"})
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    (key,) = [k for k in _objects(endpoint) if k.startswith("live/")]
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert len(body) < 5_000 and zlib.decompress(body)
    assert saver.get_tuple(cfg).checkpoint["channel_values"]["text"] == text


def test_close_closes_the_clients_it_made_and_keeps_the_ones_given(endpoint, dynamo_saver) -> None:
    from s3_saver import S3Saver

    given = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    mixed = S3Saver(BUCKET, table=TABLE, s3_client=given, endpoint_url=endpoint, region_name="us-east-1")
    mixed.put(config("clients"), checkpoint({"n": 1}, {"n": "1"}), {}, {"n": "1"})
    made = mixed._sync._clients["dynamodb"]
    closed = []
    for client in (given, made):
        client.close = lambda c=client: closed.append(c)
    mixed.close()
    assert closed == [made]


def test_async_clients_on_a_new_event_loop_parse_no_service_model_again(endpoint, index_mode, monkeypatch) -> None:
    """An async Lambda handler runs each invocation on a new event loop, so the
    saver makes new aioboto3 clients each time: the S3 and DynamoDB models are
    parsed by the first only (a new session parses them again, ~150 ms of CPU)."""
    import asyncio

    from botocore.loaders import JSONFileLoader

    make_saver(endpoint, index_mode).setup()
    loads: list[str] = []
    real = JSONFileLoader.load_file

    def load_file(self, file_path):
        loads.append(file_path)
        return real(self, file_path)

    monkeypatch.setattr(JSONFileLoader, "load_file", load_file)

    async def invocation(thread_id: str) -> None:
        async with make_saver(endpoint, index_mode) as saver:  # a fresh saver, as in a cold handler
            await saver.aput(config(thread_id), checkpoint({"a": 1}, {"a": "1"}), {}, {"a": "1"})
            assert (await saver.aget_tuple(config(thread_id))) is not None

    asyncio.run(invocation("first"))
    asyncio.run(invocation("second"))  # another loop: new clients, the models already parsed
    loads.clear()
    asyncio.run(invocation("third"))
    assert loads == []
