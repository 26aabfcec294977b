"""The two-regions harness itself (tests/regions.py): the switchable proxy and the replicator."""

from __future__ import annotations

import http.client
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from helpers import config, grow_thread
from regions import PRIMARY_BUCKET, REPLICA_BUCKET, TABLE_NAME, Proxy

FAST = Config(
    connect_timeout=1, read_timeout=1, retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}
)
CONNECTION_ERRORS = (EndpointConnectionError, ConnectionClosedError)


def through_proxy(regions, service: str = "s3"):
    return boto3.client(service, endpoint_url=regions.proxy.url, region_name="us-east-1", config=FAST)


def status_of(exc: ClientError) -> int:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"]


# --- Proxy, with boto3 and moto -------------------------------------------------------


def test_up_forwards_s3_and_dynamodb(regions):
    s3, ddb = through_proxy(regions), through_proxy(regions, "dynamodb")
    s3.put_object(Bucket=PRIMARY_BUCKET, Key="a", Body=b"through")
    assert s3.get_object(Bucket=PRIMARY_BUCKET, Key="a")["Body"].read() == b"through"
    assert regions.primary.read("a") == b"through"
    assert ddb.list_tables()["TableNames"] == []
    assert regions.proxy.connections >= 3
    assert regions.proxy.requests == 0  # counted only while down


def test_refuse_fails_at_once_then_up_again_on_the_same_client(regions):
    s3 = through_proxy(regions)
    s3.head_bucket(Bucket=PRIMARY_BUCKET)
    regions.proxy.refuse()
    for client in (s3, through_proxy(regions)):
        refused = regions.proxy.refused
        # "At once": the connection is refused, not left to time out. Told by the
        # error's kind and the proxy's count, not by a clock (a loaded machine
        # stretches any duration).
        with pytest.raises(CONNECTION_ERRORS) as raised:
            client.head_bucket(Bucket=PRIMARY_BUCKET)
        assert not isinstance(raised.value, ConnectTimeoutError), raised.value
        assert regions.proxy.refused > refused
    regions.proxy.up()
    s3.head_bucket(Bucket=PRIMARY_BUCKET)


def test_hang_times_out_then_up_again_on_the_same_client(regions):
    s3 = through_proxy(regions)
    regions.proxy.hang()
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        s3.put_object(Bucket=PRIMARY_BUCKET, Key="hung", Body=b"x")
    assert 0.9 < time.monotonic() - started < 4  # botocore waits 1 s for "100 Continue" first
    assert regions.proxy.requests == 1
    regions.proxy.up()
    s3.put_object(Bucket=PRIMARY_BUCKET, Key="later", Body=b"y")
    assert regions.primary.keys() == ["later"]  # the hung write never reached the primary


def test_fail_answers_503_on_kept_alive_connections_then_up_on_the_same_one(regions):
    s3, ddb = through_proxy(regions), through_proxy(regions, "dynamodb")
    s3.put_object(Bucket=PRIMARY_BUCKET, Key="a", Body=b"1")
    regions.proxy.fail()
    before = regions.proxy.connections
    calls = [
        lambda: s3.get_object(Bucket=PRIMARY_BUCKET, Key="a"),
        lambda: s3.put_object(Bucket=PRIMARY_BUCKET, Key="b", Body=b"2" * 100_000),
        lambda: s3.head_object(Bucket=PRIMARY_BUCKET, Key="a"),  # no body: keep-alive must hold
        lambda: s3.list_objects_v2(Bucket=PRIMARY_BUCKET),
    ]
    for call in calls:
        with pytest.raises(ClientError) as caught:
            call()
        assert status_of(caught.value) == 503
    assert caught.value.response["Error"]["Code"] in ("ServiceUnavailable", "503")
    with pytest.raises(ClientError) as caught:
        s3.get_object(Bucket=PRIMARY_BUCKET, Key="a")
    assert caught.value.response["Error"]["Code"] == "ServiceUnavailable"
    with pytest.raises(ClientError) as caught:
        ddb.list_tables()
    assert status_of(caught.value) == 503
    assert caught.value.response["Error"]["Code"] == "ServiceUnavailable"
    assert regions.proxy.connections - before == 2  # one per client: kept alive
    assert regions.proxy.requests == regions.proxy.answered == len(calls) + 2
    regions.proxy.up()
    assert s3.get_object(Bucket=PRIMARY_BUCKET, Key="a")["Body"].read() == b"1"
    assert regions.proxy.connections - before == 2  # the pooled connection, forwarding again
    assert regions.primary.keys() == ["a"]


def test_fail_with_another_status(regions):
    s3 = through_proxy(regions)
    regions.proxy.fail(500)
    with pytest.raises(ClientError) as caught:
        s3.get_object(Bucket=PRIMARY_BUCKET, Key="a")
    assert status_of(caught.value) == 500
    assert caught.value.response["Error"]["Code"] == "InternalError"


# --- Proxy, byte level: connections open across switches -------------------------------


class _KeepAlive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def keepalive_proxy():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    proxy = Proxy(f"127.0.0.1:{server.server_address[1]}")
    yield proxy
    proxy.close()
    server.shutdown()
    server.server_close()


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read()


def test_open_connections_follow_every_switch(keepalive_proxy):
    proxy = keepalive_proxy
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=2)
    assert _get(conn, "/1") == (200, b"/1")
    sock = conn.sock
    assert _get(conn, "/2") == (200, b"/2")
    proxy.fail()
    status, body = _get(conn, "/3")
    assert status == 503 and b"<Code>ServiceUnavailable</Code>" in body
    proxy.up()
    assert _get(conn, "/4") == (200, b"/4")
    assert conn.sock is sock and proxy.connections == 1  # one connection all along

    proxy.hang()
    conn.sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        _get(conn, "/5")
    proxy.fail()  # the hung request is answered now
    assert conn.sock.recv(100).startswith(b"HTTP/1.1 503")
    conn.close()

    proxy.hang()
    hung = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=0.3)
    with pytest.raises(TimeoutError):
        _get(hung, "/6")
    proxy.up()  # a connection that swallowed a request is reset, new ones forward
    with pytest.raises((ConnectionError, http.client.HTTPException, TimeoutError)):
        _get(hung, "/7")
    fresh = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=2)
    assert _get(fresh, "/8") == (200, b"/8")

    proxy.refuse()  # the open connection is cut, new ones too
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        _get(fresh, "/9")
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        _get(http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=2), "/10")
    proxy.up()
    assert _get(http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=2), "/11") == (200, b"/11")


def test_close_is_quick_with_connections_open(keepalive_proxy):
    proxy = keepalive_proxy
    conns = [http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=2) for _ in range(5)]
    for i, conn in enumerate(conns):
        assert _get(conn, f"/{i}")[0] == 200
    proxy.hang()
    conns[0].sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    started = time.monotonic()
    proxy.close()
    assert time.monotonic() - started < 1.5
    assert proxy.open_connections == 0


# --- Replicator -------------------------------------------------------------------------


class _NewestFirst(random.Random):
    """An "rng" whose shuffle puts the newest events first: the worst order."""

    def shuffle(self, x) -> None:
        x.reverse()


def _put_versions(regions, key: str, count: int) -> list[bytes]:
    bodies = [f"v{i}".encode() for i in range(count)]
    for body in bodies:
        regions.primary.s3.put_object(Bucket=PRIMARY_BUCKET, Key=key, Body=body)
    return bodies


def test_shuffled_delivery_can_leave_an_older_head(regions):
    bodies = _put_versions(regions, "head", 5)
    captured = regions.replicator.capture()
    assert [e.body for e in captured] == bodies  # in write order
    applied = regions.replicator.deliver(rng=_NewestFirst())
    assert [e.body for e in applied] == bodies[::-1]
    assert regions.replica.read("head") == b"v0"  # regressed to the oldest
    assert regions.replicator.delivered == 5 and regions.replicator.pending == []

    # A seeded shuffle: the replica holds whatever landed last.
    more = _put_versions(regions, "other", 6)
    regions.replicator.capture()
    applied = regions.replicator.deliver(rng=random.Random(7))
    assert sorted(e.body for e in applied) == sorted(more)
    assert regions.replica.read("other") == applied[-1].body


def test_keep_version_order_never_regresses(regions):
    bodies = _put_versions(regions, "head", 5)
    replicator = regions.replicator
    replicator.capture()
    applied = replicator.deliver(rng=_NewestFirst(), keep_version_order=True)
    assert [e.body for e in applied] == [bodies[-1]]
    assert len(replicator.superseded) == 4
    assert regions.replica.read("head") == b"v4"
    regions.primary.s3.put_object(Bucket=PRIMARY_BUCKET, Key="head", Body=b"v5")
    replicator.run(keep_version_order=True)
    assert regions.replica.read("head") == b"v5"
    # Partial deliveries across calls keep the order too.
    _put_versions(regions, "k", 4)
    replicator.capture()
    newest = replicator.pending[-1]
    replicator.deliver(where=lambda e: e is newest)
    replicator.deliver(keep_version_order=True)
    assert regions.replica.read("k") == b"v3"


def test_drop_pending_loses_the_versions(regions):
    _put_versions(regions, "lost", 3)
    regions.replicator.capture()
    dropped = regions.replicator.drop_pending()
    assert [e.kind for e in dropped] == ["object"] * 3
    assert regions.replicator.deliver() == []
    assert regions.replica.keys() == []
    regions.primary.s3.put_object(Bucket=PRIMARY_BUCKET, Key="kept", Body=b"k")
    regions.replicator.sync()
    assert regions.replica.keys() == ["kept"]  # only what came after


def test_lag_deletes_metadata_and_storage_class(regions):
    s3 = regions.primary.s3
    s3.put_object(Bucket=PRIMARY_BUCKET, Key="meta", Body=b"m", Metadata={"kind": "checkpoint"}, StorageClass="STANDARD_IA")
    s3.put_object(Bucket=PRIMARY_BUCKET, Key="cold", Body=b"c", StorageClass="GLACIER")
    s3.put_object(Bucket=PRIMARY_BUCKET, Key="gone", Body=b"g")
    s3.delete_object(Bucket=PRIMARY_BUCKET, Key="gone")
    s3.put_object(Bucket=PRIMARY_BUCKET, Key="late", Body=b"l")
    applied = regions.replicator.run(lag_events=1)
    assert [e.as_tuple()[:2] for e in applied] == [
        ("object", "meta"), ("object", "cold"), ("object", "gone"), ("delete-object", "gone")
    ]
    assert [e.key for e in regions.replicator.pending] == ["late"]
    assert sorted(regions.replica.keys()) == ["cold", "meta"]
    head = regions.replica.s3.head_object(Bucket=REPLICA_BUCKET, Key="meta")
    assert head["Metadata"] == {"kind": "checkpoint"} and head["StorageClass"] == "STANDARD_IA"
    assert regions.replica.s3.head_object(Bucket=REPLICA_BUCKET, Key="cold")["StorageClass"] == "GLACIER"
    regions.replicator.deliver()
    assert regions.replica.read("late") == b"l"


def _create_primary_table(regions) -> None:
    regions.primary.dynamodb.create_table(
        TableName=TABLE_NAME,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "g", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-g",
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    regions.primary.dynamodb.update_time_to_live(
        TableName=TABLE_NAME, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
    )


def _item(pk: str, sk: str, value: str) -> dict:
    return {"pk": {"S": pk}, "sk": {"S": sk}, "g": {"S": "x"}, "v": {"S": value}}


def test_items_and_their_deletes_replicate_and_never_echo(regions):
    _create_primary_table(regions)
    ddb = regions.primary.dynamodb
    for i in range(3):
        ddb.put_item(TableName=TABLE_NAME, Item=_item("t", str(i), "a"))
    description = regions.create_replica_table()
    assert description["KeySchema"] == ddb.describe_table(TableName=TABLE_NAME)["Table"]["KeySchema"]
    assert [i["IndexName"] for i in description["GlobalSecondaryIndexes"]] == ["by-g"]
    ttl = regions.replica.dynamodb.describe_time_to_live(TableName=TABLE_NAME)["TimeToLiveDescription"]
    assert ttl.get("AttributeName") == "expires_at"

    regions.primary.s3.put_object(Bucket=PRIMARY_BUCKET, Key="obj", Body=b"o")
    applied = regions.replicator.run()
    assert [e.kind for e in applied] == ["object", "item", "item", "item"]  # items after objects
    assert sorted(regions.replica.items(), key=lambda i: i["sk"]["S"]) == [_item("t", str(i), "a") for i in range(3)]

    ddb.put_item(TableName=TABLE_NAME, Item=_item("t", "0", "b"))  # changed
    ddb.delete_item(TableName=TABLE_NAME, Key={"pk": {"S": "t"}, "sk": {"S": "1"}})
    events = regions.replicator.capture()
    assert [(e.kind, e.key["sk"]["S"]) for e in events] == [("item", "0"), ("delete-item", "1")]
    assert events[1].as_tuple() == ("delete-item", {"pk": {"S": "t"}, "sk": {"S": "1"}})
    regions.replicator.deliver(where=lambda e: e.kind == "delete-item")
    assert len(regions.replica.items()) == 2 and regions.replicator.pending == [events[0]]
    regions.replicator.deliver()
    assert sorted(regions.replica.items(), key=lambda i: i["sk"]["S"]) == [_item("t", "0", "b"), _item("t", "2", "a")]

    # The reverse direction does not send the replicated changes back...
    assert regions.reverse.capture() == []
    # ...but does send what is written on the replica itself.
    regions.replica.dynamodb.put_item(TableName=TABLE_NAME, Item=_item("t", "9", "r"))
    regions.replica.s3.put_object(Bucket=REPLICA_BUCKET, Key="written-there", Body=b"w")
    back = regions.reverse.run()
    assert [e.as_tuple()[:2] for e in back] == [("object", "written-there"), ("item", _item("t", "9", "r"))]
    assert regions.primary.read("written-there") == b"w"
    assert regions.replicator.capture() == []  # nor does the first direction echo it


# --- make_saver (needs s3_saver.Replica) --------------------------------------------------


@pytest.mark.parametrize("mode", ["dynamodb", "manifest"])
def test_make_saver_primary_behind_the_proxy_replica_direct(regions, mode):
    import s3_saver

    if not hasattr(s3_saver, "Replica"):
        pytest.skip("s3_saver.Replica is not there yet")
    extra = {"global_table": True} if mode == "dynamodb" else {}
    saver = regions.make_saver(mode, failover_after=1.0, **extra)
    if mode == "dynamodb":
        regions.create_replica_table()
    stored = grow_thread(saver, "t-1", 3)
    regions.replicator.sync()
    assert regions.replica.keys() and sorted(regions.replica.keys()) == sorted(regions.primary.keys())
    assert regions.proxy.connections > 0  # the primary was reached through the proxy
    regions.proxy.refuse()
    got = saver.get_tuple(config("t-1"))
    assert got is not None
    assert got.config["configurable"]["checkpoint_id"] == stored["configurable"]["checkpoint_id"]
    last_read = getattr(saver, "last_read", None)
    if last_read is not None:
        assert last_read.site == "replica"
