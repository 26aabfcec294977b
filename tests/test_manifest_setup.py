"""setup() in manifest mode refuses a store that ignores conditional writes.

The manifest's head is replaced only by compare-and-swap (PutObject IfMatch /
IfNoneMatch); a store that drops those headers would let two writers overwrite each
other's commits. The store is simulated by a boto3 client whose PutObject loses both
parameters before the request is built.
"""

from __future__ import annotations

from collections.abc import Callable

import boto3
import pytest

from conftest import BUCKET, make_saver, seaweedfs_client, seaweedfs_saver
from helpers import is_marker
from s3_saver import ConfigurationError


def strip_conditions(client) -> None:
    def drop(params: dict, **_: object) -> None:
        params.pop("IfMatch", None)
        params.pop("IfNoneMatch", None)

    client.meta.events.register("before-parameter-build.s3.PutObject", drop)


@pytest.fixture(params=["moto", "seaweedfs"])
def store(request) -> tuple[str, Callable[[], object], Callable[..., object]]:
    """(bucket, a fresh S3 client, build a manifest-mode saver with a given s3_client)."""
    if request.param == "seaweedfs":
        endpoint, bucket = request.getfixturevalue("seaweedfs_bucket")
        return bucket, lambda: seaweedfs_client(endpoint), lambda **kw: seaweedfs_saver(endpoint, bucket, **kw)
    endpoint = request.getfixturevalue("endpoint")

    def client():
        return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    return BUCKET, client, lambda **kw: make_saver(endpoint, "manifest", **kw)


def keys(client, bucket: str) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_setup_refuses_a_store_that_ignores_conditional_writes(store) -> None:
    bucket, new_client, build = store
    client = new_client()
    strip_conditions(client)
    saver = build(s3_client=client)
    try:
        with pytest.raises(ConfigurationError) as err:
            saver.setup()
    finally:
        saver.close()
        client.close()
    message = str(err.value)
    assert repr(bucket) in message
    assert "conditional writes" in message
    assert "IfNoneMatch" in message  # the first condition the probe found ignored
    plain = new_client()
    try:
        assert keys(plain, bucket) == []  # the probe object is gone
    finally:
        plain.close()


def test_setup_accepts_a_store_that_honours_them(store) -> None:
    bucket, new_client, build = store
    client = new_client()
    saver = build(s3_client=client)
    try:
        saver.setup()
        saver.setup()  # idempotent
    finally:
        saver.close()
    # The probe object is gone (the prefix's index-mode marker stays).
    assert [k for k in keys(client, bucket) if not is_marker(k)] == []
    client.close()


def test_the_stripping_client_really_drops_the_conditions(store) -> None:
    """Guard for the two tests above: the wrapped client overwrites an existing key."""
    bucket, new_client, _ = store
    client = new_client()
    if bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=bucket)  # moto: setup() has not run here
    client.put_object(Bucket=bucket, Key="k", Body=b"1")
    strip_conditions(client)
    client.put_object(Bucket=bucket, Key="k", Body=b"2", IfNoneMatch="*")
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"2"
    client.delete_object(Bucket=bucket, Key="k")
    client.close()
