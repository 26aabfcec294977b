"""Errors and configuration: every failure is an S3SaverError that says where and what
to do, async clients reach the same store as the sync ones, filters compare JSON values."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.credentials import RefreshableCredentials
from botocore.exceptions import BotoCoreError, ClientError
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from s3_saver import (
    RetryPolicy,
    AccessDeniedError,
    BucketNotFoundError,
    ConfigurationError,
    S3Saver,
    S3SaverError,
    SerializationError,
    SetupTimeoutError,
    StoreUnavailableError,
    TableNotFoundError,
)
from s3_saver._format.entries import CheckpointEntry
from s3_saver._index.dynamodb.table import TABLE_ATTRIBUTE_DEFINITIONS, TABLE_KEY_SCHEMA
from s3_saver._index.dynamodb.backend import DynamoIndex
from s3_saver._format.keys import KeyLayout, encode
from s3_saver._ops import read, setup
from s3_saver._ops.context import Context
from s3_saver._transport.protocol import Call, Emit, Sleep
from s3_saver._transport.s3 import S3Calls
from tests.conftest import BUCKET, TABLE, make_saver
from tests.helpers import checkpoint, config

DRIVERS = ["sync", "async"]


def run(saver: S3Saver, driver: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``saver.method`` (sync) or ``saver.amethod`` in a fresh event loop (async)."""
    if driver == "sync":
        result = getattr(saver, method)(*args, **kwargs)
        return list(result) if method == "list" else result

    async def go() -> Any:
        try:
            if method == "list":
                return [t async for t in saver.alist(*args, **kwargs)]
            return await getattr(saver, "a" + method)(*args, **kwargs)
        finally:
            await saver.aclose()

    return asyncio.run(go())


def _put(saver: S3Saver, driver: str, thread_id: str, values: dict[str, Any], metadata: dict[str, Any]) -> Any:
    versions = {ch: "1" for ch in values}
    return run(saver, driver, "put", config(thread_id), checkpoint(values, versions), metadata, versions)


def _drive(op: Any, respond: Any) -> Any:
    reply = None
    while True:
        try:
            step = op.send(reply)
        except StopIteration as stop:
            return stop.value
        reply = None if isinstance(step, (Sleep, Emit)) else [respond(c) for c in step]


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


# -- 4. sync and async talk to the same store -------------------------------------------------
def _clients(endpoint: str, key: str = "given-key") -> dict[str, Any]:
    return {
        f"{service}_client": boto3.client(
            service,
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=key,
            aws_secret_access_key="given-secret",
        )
        for service in ("s3", "dynamodb")
    }


def _async_credentials(saver: S3Saver, service: str) -> Any:
    async def go() -> Any:
        client = await saver._async._client(service)
        try:
            return await client._request_signer._credentials.get_frozen_credentials()
        finally:
            await saver.aclose()

    return asyncio.run(go())


@pytest.fixture
def bogus_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default AWS settings that lead nowhere: only what the saver carries over works."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-bogus-1")
    monkeypatch.setenv("AWS_REGION", "eu-bogus-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")


def test_async_methods_use_the_given_clients(endpoint: str, bogus_defaults: None) -> None:
    saver = S3Saver(BUCKET, table=TABLE, **_clients(endpoint))
    saver.setup()
    stored = _put(saver, "sync", "t", {"c": "from sync"}, {"step": 1})
    got = run(saver, "async", "get_tuple", config("t"))
    assert got.config == stored and got.checkpoint["channel_values"] == {"c": "from sync"}
    cp = checkpoint({"c": "from async"}, {"c": "2"})
    new = run(saver, "async", "put", stored, cp, {"step": 2}, {"c": "2"})
    assert saver.get_tuple(config("t")).config == new
    assert _async_credentials(saver, "s3").access_key == "given-key"
    assert _async_credentials(saver, "dynamodb").secret_key == "given-secret"


def test_async_methods_use_the_profile_of_boto3_session(
    endpoint: str, bogus_defaults: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config").write_text(
        "[profile app]\naws_access_key_id = profile-key\naws_secret_access_key = profile-secret\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    session = boto3.Session(profile_name="app", region_name="us-east-1")
    saver = S3Saver(BUCKET, table=TABLE, boto3_session=session, endpoint_url=endpoint)
    saver.setup()
    stored = _put(saver, "sync", "t", {"c": 1}, {})
    assert run(saver, "async", "get_tuple", config("t")).config == stored
    assert _async_credentials(saver, "dynamodb").access_key == "profile-key"


def _refreshing(client: Any) -> Any:
    client._request_signer._credentials = RefreshableCredentials.create_from_metadata(
        {"access_key": "k", "secret_key": "s", "token": "t", "expiry_time": "2999-01-01T00:00:00Z"},
        refresh_using=lambda: {},
        method="container-role",
    )
    return client


def test_refreshable_credentials_are_refused_at_the_first_async_call(endpoint: str) -> None:
    clients = {name: _refreshing(c) for name, c in _clients(endpoint).items()}
    saver = S3Saver(BUCKET, table=TABLE, **clients)  # constructing is fine
    with pytest.raises(ConfigurationError, match="aioboto3_session="):
        run(saver, "async", "get_tuple", config("t"))


def test_an_explicit_aioboto3_session_wins(endpoint: str, bogus_defaults: None) -> None:
    import aioboto3

    clients = {name: _refreshing(c) for name, c in _clients(endpoint).items()}
    session = aioboto3.Session(aws_access_key_id="aio-key", aws_secret_access_key="aio-secret")
    saver = S3Saver(BUCKET, table=TABLE, aioboto3_session=session, **clients)
    run(saver, "async", "setup")
    assert run(saver, "async", "get_tuple", config("t")) is None
    assert _async_credentials(saver, "s3").access_key == "aio-key"


# -- 9. not-found errors name bucket, table, region, endpoint ---------------------------------
@pytest.mark.parametrize("driver", DRIVERS)
def test_missing_table_says_it_may_live_in_another_region(endpoint: str, driver: str) -> None:
    make_saver(endpoint).setup()  # bucket and table in us-east-1
    saver = S3Saver(BUCKET, table=TABLE, endpoint_url=endpoint, region_name="eu-west-1")
    with pytest.raises(TableNotFoundError) as caught:
        run(saver, driver, "get_tuple", config("t"))
    message = str(caught.value)
    for part in (repr(TABLE), "eu-west-1", endpoint, "another region", "region_name", "setup()"):
        assert part in message
    assert message.index("another region") < message.index("setup()")


@pytest.mark.parametrize("driver", DRIVERS)
def test_missing_bucket_names_bucket_region_and_endpoint(endpoint: str, driver: str) -> None:
    saver = make_saver(endpoint)
    with pytest.raises(BucketNotFoundError) as caught:
        _put(saver, driver, "t", {"c": 1}, {})
    message = str(caught.value)
    for part in (f"bucket {BUCKET!r}", "us-east-1", endpoint):
        assert part in message


@pytest.mark.parametrize("driver", DRIVERS)
def test_setup_in_another_region_than_the_bucket_creates_nothing(endpoint: str, driver: str) -> None:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="eu-west-1")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    # What moto answers (as S3 does): HeadBucket from another region names the bucket's region.
    head = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").head_bucket(Bucket=BUCKET)
    assert head["BucketRegion"] == "eu-west-1"
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "eu-west-1"

    saver = make_saver(endpoint)  # region us-east-1
    with pytest.raises(ConfigurationError) as caught:
        run(saver, driver, "setup")
    assert "eu-west-1" in str(caught.value) and "us-east-1" in str(caught.value)
    for region in ("us-east-1", "eu-west-1"):
        ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=region)
        assert ddb.list_tables()["TableNames"] == []


# -- 10. fail fast; retries merged key by key ------------------------------------------------
class ClosingServer:
    """A loopback TCP server that accepts connections and closes them unanswered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.accepted = 0
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def closing_server() -> Iterator[ClosingServer]:
    server = ClosingServer()
    yield server
    server.close()


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    "client_config, retry, attempts",
    [
        (None, None, 4),  # the saver's policy; botocore sends once
        (None, RetryPolicy(attempts=2, base=0), 2),
        (Config(retries={"max_attempts": 1}), RetryPolicy(attempts=1), 2),  # botocore's, asked for
        (Config(retries={"total_max_attempts": 1}), RetryPolicy(attempts=3, base=0), 3),
    ],
    ids=["default", "policy=2", "botocore max_attempts=1", "policy=3"],
)
def test_unreachable_store_gives_up_after_the_configured_attempts(
    closing_server: ClosingServer, driver: str, client_config: Config | None, retry: RetryPolicy | None, attempts: int
) -> None:
    saver = S3Saver(
        BUCKET,
        table=TABLE,
        endpoint_url=closing_server.url,
        region_name="us-east-1",
        client_config=client_config,
        retry=retry,
    )
    with pytest.raises(StoreUnavailableError) as caught:
        run(saver, driver, "get_tuple", config("thread-7"))
    # Each attempt is one round trip of four requests: the latest item's Query,
    # the thread's record (GetItem) and, as the saver's first round trip, the
    # table's owner record (GetItem) and the prefix's index-mode marker (an S3
    # GET), each on a connection of its own. aiohttp sends an idempotent request
    # (the GET) once more itself when its connection closes unanswered (RFC 9112
    # 9.3.1.1): one connection more per attempt under the async driver.
    assert closing_server.accepted == (4 if driver == "sync" else 5) * attempts
    assert isinstance(caught.value.__cause__, BotoCoreError)
    message = str(caught.value)
    for part in ("dynamodb.query", "thread-7", repr(TABLE), "us-east-1", closing_server.url, "try again"):
        assert part in message


def test_client_config_retries_are_merged_key_by_key() -> None:
    saver = S3Saver(BUCKET, table=TABLE, region_name="us-east-1", client_config=Config(retries={"max_attempts": 1}))
    for service in ("s3", "dynamodb"):
        client_config = saver._sync._client(service).meta.config
        assert client_config.retries["mode"] == "standard"
        assert client_config.retries["total_max_attempts"] == 2  # max_attempts counts retries
        assert (client_config.connect_timeout, client_config.read_timeout) == (2, 5)
    saver.close()
    default = S3Saver(BUCKET, table=TABLE, region_name="us-east-1")
    # botocore sends once: the saver's RetryPolicy retries, the same for both drivers.
    assert default._sync._client("s3").meta.config.retries == {"mode": "standard", "total_max_attempts": 1}
    default.close()


# -- 11. every error is an S3SaverError ------------------------------------------------------
def test_setup_timeout_is_an_s3_saver_error() -> None:
    ctx = Context(KeyLayout(""), S3Calls("b"), DynamoIndex("t", KeyLayout("")), JsonPlusSerializer(), 1024, None)

    def respond(call: Call) -> Any:
        if call.operation == "describe_table":
            table = {"KeySchema": list(TABLE_KEY_SCHEMA), "AttributeDefinitions": list(TABLE_ATTRIBUTE_DEFINITIONS)}
            return {"Table": {"TableStatus": "CREATING", **table}}
        return {}

    with pytest.raises(SetupTimeoutError) as caught:
        _drive(setup.setup(ctx, "us-east-1"), respond)
    assert isinstance(caught.value, S3SaverError) and isinstance(caught.value, TimeoutError)


def test_bad_ids_are_configuration_errors(saver: S3Saver) -> None:
    with pytest.raises(ConfigurationError):
        encode(5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Unicode"):
        saver.get_tuple(config("\ud800"))


@pytest.mark.parametrize(
    "option, value",
    [
        ("inline_threshold", "64k"),
        ("inline_threshold", True),
        ("max_concurrency", 2.5),
        ("max_concurrency", "8"),
        ("ttl", 3600),
        ("prefix", None),
        ("prefix", 7),
        ("region_name", 1),
        ("endpoint_url", 9000),
        ("endpoint_url", "localhost:9000"),
        ("s3_endpoint_url", b"http://x"),
        ("dynamodb_endpoint_url", ""),
        ("client_config", {"retries": {"max_attempts": 1}}),
    ],
)
def test_wrongly_typed_options_are_refused_by_name(option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=option):
        S3Saver(BUCKET, table=TABLE, **{option: value})


def test_good_options_are_accepted() -> None:
    S3Saver(
        BUCKET,
        table=TABLE,
        prefix="app/",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:1",
        client_config=Config(),
        ttl=timedelta(days=1),
        inline_threshold=0,
        max_concurrency=1,
    ).close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_empty_thread_id_is_refused(saver: S3Saver, driver: str) -> None:
    with pytest.raises(ConfigurationError, match="thread_id"):
        _put(saver, driver, "", {"c": 1}, {})
    with pytest.raises(ConfigurationError, match="thread_id"):
        run(saver, driver, "get_tuple", config(""))
    assert saver.stats.total_requests == 0


KEY = b"0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("inline_threshold", [1024, 0], ids=["inline", "own-object"])
def test_encrypted_thread_read_without_the_key(endpoint: str, driver: str, inline_threshold: int) -> None:
    writer = make_saver(
        endpoint, serde=EncryptedSerializer.from_pycryptodome_aes(key=KEY), inline_threshold=inline_threshold
    )
    writer.setup()
    _put(writer, "sync", "t", {"c": "secret"}, {"step": 1})
    assert writer.get_tuple(config("t")).checkpoint["channel_values"] == {"c": "secret"}

    plain = make_saver(endpoint, inline_threshold=inline_threshold)
    with pytest.raises(SerializationError) as caught:
        run(plain, driver, "get_tuple", config("t"))
    message = str(caught.value)
    assert "'msgpack+aes'" in message and "EncryptedSerializer.from_pycryptodome_aes(key=" in message
    assert "'t'" in message  # the thread

    wrong = make_saver(endpoint, serde=EncryptedSerializer.from_pycryptodome_aes(key=b"x" * 32))
    with pytest.raises(SerializationError, match="key it was written with"):
        run(wrong, driver, "get_tuple", config("t"))
    with pytest.raises(SerializationError):  # metadata is decoded to filter, too
        run(plain, driver, "list", config("t"), filter={"step": 1})


def test_forbidden_object_says_missing_or_denied() -> None:
    ctx = Context(KeyLayout(""), S3Calls("b"), DynamoIndex("t", KeyLayout("")), JsonPlusSerializer(), 1024, None)
    # An index item whose checkpoint lives only in its S3 object.
    item = ctx.index.calls.checkpoint_item(CheckpointEntry("t", "", "c1", None, {}))

    def respond(call: Call) -> Any:
        if call.operation == "query":
            return {"Items": [item]}
        if call.operation == "get_item":
            return {}  # the thread's record: never deleted, not archived
        assert call.operation == "get_object"
        return _client_error("AccessDenied", 403)

    with pytest.raises(AccessDeniedError) as caught:
        _drive(read.get_tuple(ctx, config("t")), respond)
    message = str(caught.value)
    assert "missing" in message and "s3:ListBucket" in message and "live/t/=/checkpoints/c1" in message


# -- 12. metadata filters compare JSON values -------------------------------------------------
FILTER_CASES = [
    ({"v": True}, ["true"]),
    ({"v": 1}, ["one", "one-float"]),
    ({"v": 1.0}, ["one", "one-float"]),
    ({"v": 0}, ["zero"]),
    ({"v": False}, ["false"]),
    ({"v": None}, ["null"]),
    ({"v": [1, True]}, ["list"]),
    ({"v": [True, 1]}, []),
    ({"v": [1.0, True]}, ["list"]),
    ({"v": {"a": 1}}, ["dict"]),
    ({"v": {"a": True}}, []),
    ({"v": "1"}, ["string"]),
]


@pytest.mark.parametrize("driver", DRIVERS)
def test_filters_compare_json_values(saver: S3Saver, driver: str) -> None:
    values = {
        "true": True,
        "one": 1,
        "one-float": 1.0,
        "zero": 0,
        "false": False,
        "null": None,
        "list": [1, True],
        "dict": {"a": 1},
        "string": "1",
    }
    for name, value in values.items():
        _put(saver, "sync", "t", {"c": name}, {"name": name, "v": value})
    _put(saver, "sync", "t", {"c": "absent"}, {"name": "absent"})
    for flt, expected in FILTER_CASES:
        found = run(saver, driver, "list", config("t"), filter=flt)
        assert sorted(t.metadata["name"] for t in found) == sorted(expected), flt
