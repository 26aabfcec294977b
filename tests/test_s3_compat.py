"""Guard suite: the S3 facts the "manifest" index mode relies on, on moto and SeaweedFS.

The manifest keeps, per thread, a small mutable head object replaced only by
compare-and-swap (PutObject If-Match: <etag>, created with If-None-Match: *), beside
immutable objects written with If-None-Match: *. A server that ignores those
conditions would let a test of the manifest pass while it loses writes, so every
condition is checked here on each server the tests use: a server that does not honour
one fails its test. Facts that are only recorded (the two servers differ, or real S3
differs) are asserted per server, so a change of behaviour is noticed.
Findings and the table: tests/SEAWEEDFS.md.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
import uuid
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from conftest import seaweedfs_client

SERVERS = ["moto", "seaweedfs"]
# Retries off: a retried request could hide or fake an outcome (a retried CAS write).
CLIENT_CONFIG = {"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 1}, "max_pool_connections": 16}


@dataclass
class Store:
    server: str
    client: Any
    bucket: str

    def put(self, key: str, body: bytes, **kwargs) -> str:
        return self.client.put_object(Bucket=self.bucket, Key=key, Body=body, **kwargs)["ETag"]

    def body(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def etag(self, key: str) -> str:
        return self.client.head_object(Bucket=self.bucket, Key=key)["ETag"]

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
                return False
            raise


@pytest.fixture(params=SERVERS)
def store(request) -> Store:
    if request.param == "moto":
        endpoint = request.getfixturevalue("endpoint")
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=Config(**CLIENT_CONFIG))
        bucket = f"compat-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
    else:
        endpoint, bucket = request.getfixturevalue("seaweedfs_bucket")
        client = seaweedfs_client(endpoint, **CLIENT_CONFIG)
    request.addfinalizer(client.close)
    return Store(request.param, client, bucket)


def error_of(exc_info) -> tuple[int, str]:
    return error_of_response(exc_info.value)


def error_of_response(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"].get("Code", "")


def md5_etag(body: bytes) -> str:
    return f'"{hashlib.md5(body).hexdigest()}"'


# --- PutObject If-None-Match: * (create-only) ---------------------------------------


def test_put_if_none_match_creates_a_new_key(store: Store) -> None:
    etag = store.put("new", b"v1", IfNoneMatch="*")
    assert etag == store.etag("new")
    assert store.body("new") == b"v1"


def test_put_if_none_match_on_existing_key_is_412_and_changes_nothing(store: Store) -> None:
    etag = store.put("k", b"first")
    with pytest.raises(ClientError) as exc_info:
        store.put("k", b"second", IfNoneMatch="*")
    assert error_of(exc_info) == (412, "PreconditionFailed")
    assert store.body("k") == b"first"
    assert store.etag("k") == etag


# --- PutObject If-Match: <etag> (compare-and-swap) ----------------------------------


def test_put_if_match_current_etag_succeeds_and_returns_the_new_etag(store: Store) -> None:
    old = store.put("head", b"v1", IfNoneMatch="*")
    new = store.put("head", b"v2", IfMatch=old)
    assert new != old
    assert new == store.etag("head")
    assert store.body("head") == b"v2"


def test_put_if_match_stale_etag_is_412_and_changes_nothing(store: Store) -> None:
    stale = store.put("head", b"v1")
    current = store.put("head", b"v2", IfMatch=stale)
    with pytest.raises(ClientError) as exc_info:
        store.put("head", b"v3", IfMatch=stale)
    assert error_of(exc_info) == (412, "PreconditionFailed")
    assert store.body("head") == b"v2"
    assert store.etag("head") == current


# Recorded: real S3 documents 404 NoSuchKey for If-Match on a missing key.
IF_MATCH_MISSING_KEY = {"moto": (404, "NoSuchKey"), "seaweedfs": (412, "PreconditionFailed")}


def test_put_if_match_on_missing_key_fails_and_creates_nothing(store: Store) -> None:
    some_etag = store.put("other", b"x")
    with pytest.raises(ClientError) as exc_info:
        store.put("missing", b"v1", IfMatch=some_etag)
    status_code = error_of(exc_info)
    assert status_code[0] in (404, 412)  # the guard: it fails
    assert status_code == IF_MATCH_MISSING_KEY[store.server]  # the record: how
    assert not store.exists("missing")


# --- ETags as the CAS token ---------------------------------------------------------


def test_get_and_head_return_the_etag_put_returned_quoted(store: Store) -> None:
    etag = store.put("k", b"some bytes", IfNoneMatch="*")
    assert etag.startswith('"') and etag.endswith('"') and len(etag) > 2
    got = store.client.get_object(Bucket=store.bucket, Key="k")
    got["Body"].read()
    assert got["ETag"] == etag
    assert store.etag("k") == etag


def test_etag_is_the_quoted_md5_of_the_body(store: Store) -> None:
    """Recorded, both servers (and S3 for single-part, non-KMS objects): equal bodies have
    equal ETags, so a head rewritten with the same bytes keeps its ETag (ABA). The head's
    bytes must change on every swap (a counter or nonce in it) for If-Match to mean
    "nobody wrote since"."""
    first = store.put("head", b"same")
    assert first == md5_etag(b"same")
    again = store.put("head", b"same", IfMatch=first)
    assert again == first


def test_get_if_none_match_current_etag_is_304(store: Store) -> None:
    etag = store.put("k", b"v1")
    with pytest.raises(ClientError) as exc_info:
        store.client.get_object(Bucket=store.bucket, Key="k", IfNoneMatch=etag)
    assert exc_info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    got = store.client.get_object(Bucket=store.bucket, Key="k", IfNoneMatch=md5_etag(b"other"))
    assert got["Body"].read() == b"v1"


# --- CopyObject If-None-Match: * (recorded) -----------------------------------------

# Real S3 honours it (412). moto 5.2.5 ignores it and overwrites.
COPY_IF_NONE_MATCH_ONTO_EXISTING = {"moto": "overwritten", "seaweedfs": "412"}


def test_copy_if_none_match_onto_existing_key_recorded(store: Store) -> None:
    store.put("src", b"source")
    store.put("dst", b"destination")
    try:
        store.client.copy_object(
            Bucket=store.bucket, Key="dst", CopySource={"Bucket": store.bucket, "Key": "src"}, IfNoneMatch="*"
        )
        outcome = "overwritten" if store.body("dst") == b"source" else "ok-but-unchanged"
    except ClientError as exc:
        outcome = str(exc.response["ResponseMetadata"]["HTTPStatusCode"])
        assert store.body("dst") == b"destination"
    assert outcome == COPY_IF_NONE_MATCH_ONTO_EXISTING[store.server]


# Recorded: the ETag inside CopyObjectResult. S3 and moto quote it; SeaweedFS 4.48 does
# not (HeadObject/GetObject of the copy do). Normalise before comparing with If-Match.
COPY_RESULT_ETAG_QUOTED = {"moto": True, "seaweedfs": False}


def test_copy_if_none_match_onto_new_key_copies(store: Store) -> None:
    store.put("src", b"source")
    result = store.client.copy_object(
        Bucket=store.bucket, Key="dst", CopySource={"Bucket": store.bucket, "Key": "src"}, IfNoneMatch="*"
    )
    assert store.body("dst") == b"source"
    assert store.etag("dst") == md5_etag(b"source")
    etag = result["CopyObjectResult"]["ETag"]
    assert etag.strip('"') == md5_etag(b"source").strip('"')
    assert etag.startswith('"') is COPY_RESULT_ETAG_QUOTED[store.server]


# --- The admin path: batch delete, prefix listing with pages ------------------------


def test_delete_objects_removes_several_keys(store: Store) -> None:
    for key in ("a/1", "a/2", "a/3", "b/1"):
        store.put(key, key.encode())
    response = store.client.delete_objects(
        Bucket=store.bucket, Delete={"Objects": [{"Key": "a/1"}, {"Key": "a/2"}, {"Key": "a/3"}]}
    )
    assert sorted(d["Key"] for d in response.get("Deleted", [])) == ["a/1", "a/2", "a/3"]
    assert not response.get("Errors")
    assert [store.exists(k) for k in ("a/1", "a/2", "a/3", "b/1")] == [False, False, False, True]


def test_list_objects_v2_prefix_pages_of_two(store: Store) -> None:
    inside = [f"threads/t1/{i:02d}" for i in range(5)]
    for key in inside + ["threads/t10/00", "threads/t2/00", "other/00"]:
        store.put(key, b"x")
    pages, token = [], None
    while True:
        kwargs = {"ContinuationToken": token} if token else {}
        page = store.client.list_objects_v2(Bucket=store.bucket, Prefix="threads/t1/", MaxKeys=2, **kwargs)
        keys = [o["Key"] for o in page.get("Contents", [])]
        assert page["KeyCount"] == len(keys) <= 2
        pages.append(keys)
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
        assert len(pages) < 10
    assert pages == [inside[0:2], inside[2:4], inside[4:5]]


# --- Races: exactly one writer wins -------------------------------------------------

ROUNDS = 20


def _race(store: Store, writers: int, attempt) -> list[tuple[str, Any]]:
    """Run ``attempt(i)`` in ``writers`` threads released together; collect outcomes."""
    barrier = threading.Barrier(writers)
    outcomes: list[tuple[str, Any]] = [("none", None)] * writers

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = ("won", attempt(i))
        except ClientError as exc:
            outcomes[i] = ("lost", error_of_response(exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_concurrent_compare_and_swap_has_exactly_one_winner(store: Store) -> None:
    etag = store.put("head", b"round -1", IfNoneMatch="*")
    for r in range(ROUNDS):
        bodies = [f"round {r} writer {i}".encode() for i in range(2)]
        outcomes = _race(store, 2, lambda i: store.put("head", bodies[i], IfMatch=etag))
        winners = [i for i, (kind, _) in enumerate(outcomes) if kind == "won"]
        assert len(winners) == 1, (r, outcomes)
        loser = 1 - winners[0]
        assert outcomes[loser] == ("lost", (412, "PreconditionFailed")), (r, outcomes)
        etag = outcomes[winners[0]][1]
        assert store.etag("head") == etag
        assert store.body("head") == bodies[winners[0]]


def test_concurrent_create_only_has_exactly_one_winner(store: Store) -> None:
    losses: Counter = Counter()
    for r in range(ROUNDS):
        key = f"heads/{r}"
        bodies = [f"round {r} writer {i}".encode() for i in range(2)]
        outcomes = _race(store, 2, lambda i: store.put(key, bodies[i], IfNoneMatch="*"))
        winners = [i for i, (kind, _) in enumerate(outcomes) if kind == "won"]
        assert len(winners) == 1, (r, outcomes)
        # S3 documents 409 ConditionalRequestConflict for a create racing another
        # in flight, 412 once the other has completed: either is a loss.
        kind, status_code = outcomes[1 - winners[0]]
        assert kind == "lost" and status_code in ((409, "ConditionalRequestConflict"), (412, "PreconditionFailed"))
        losses[status_code] += 1
        assert store.body(key) == bodies[winners[0]]
    print(f"{store.server}: losing create-only writers got {dict(losses)}")
