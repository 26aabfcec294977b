"""Uploads carry an integrity check: an Object Lock bucket takes every PutObject the saver
sends, in both index modes, from both drivers, whatever the client's checksum setting.

S3 (and moto, whose check this leans on: moto/s3/responses.py, ``_key_response_put``)
refuses a PutObject into a bucket with a default retention unless it carries Content-MD5 or
a flexible checksum. botocore 1.36+ sends a CRC32 by default; with
``request_checksum_calculation="when_required"`` it sends none, and the saver adds Content-MD5.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, TypedDict

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from langgraph.graph import END, START, StateGraph

from conftest import BUCKET, make_saver, seaweedfs_session
from s3_saver import S3Saver

CHECKSUMS = {
    "default": None,
    # What users of stores that refuse flexible checksums (R2 at one time) set.
    "when_required": Config(request_checksum_calculation="when_required"),
}


class Chat(TypedDict):
    log: Annotated[list, operator.add]


def _graph(checkpointer):
    builder = StateGraph(Chat)
    builder.add_node("reply", lambda state: {"log": [f"reply to {state['log'][-1]}"]})
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=checkpointer)


def _locked_bucket(endpoint: str) -> None:
    """The saver's bucket with Object Lock and a default retention (GOVERNANCE, one day)."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    s3.put_object_lock_configuration(
        Bucket=BUCKET,
        ObjectLockConfiguration={
            "ObjectLockEnabled": "Enabled",
            "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}},
        },
    )
    # The server enforces the rule this test is about: an upload with no check is refused.
    bare = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=CHECKSUMS["when_required"])
    with pytest.raises(ClientError) as refused:
        bare.put_object(Bucket=BUCKET, Key="probe", Body=b"x")
    # AWS's code is InvalidRequest; moto names it MissingUploadObjectWithObjectLockHeaders.
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


@pytest.mark.parametrize("checksums", CHECKSUMS)
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_object_lock_bucket_takes_every_upload(endpoint, index_mode, checksums, driver) -> None:
    _locked_bucket(endpoint)
    saver = make_saver(endpoint, index_mode, client_config=CHECKSUMS[checksums])
    try:
        saver.setup()
        graph = _graph(saver)
        config = {"configurable": {"thread_id": f"locked-{driver}"}}
        turns = ("hello", "again")
        if driver == "sync":
            for turn in turns:
                graph.invoke({"log": [turn]}, config)
        else:

            async def run() -> None:
                for turn in turns:
                    await graph.ainvoke({"log": [turn]}, config)
                await saver.aclose()

            asyncio.run(run())
        assert graph.get_state(config).values["log"] == ["hello", "reply to hello", "again", "reply to again"]
        assert saver.stats.requests[("s3", "put_object")] > 0
    finally:
        saver.close()


def test_seaweedfs_checks_the_content_md5_of_every_upload(seaweedfs_bucket) -> None:
    """SeaweedFS takes an upload with no check even under Object Lock, but refuses a
    Content-MD5 that does not match the body (BadDigest): with checksums off, every
    PutObject of the saver carries one, and SeaweedFS accepts each."""
    endpoint, bucket = seaweedfs_bucket
    session = seaweedfs_session()
    puts: list[dict[str, str]] = []
    session.events.register(
        "before-send.s3.PutObject", lambda request, **_: puts.append({k.lower(): v for k, v in request.headers.items()})
    )
    saver = S3Saver(
        bucket, s3_endpoint_url=endpoint, region_name="us-east-1", boto3_session=session,
        client_config=CHECKSUMS["when_required"],
    )
    try:
        saver.setup()
        graph = _graph(saver)
        config = {"configurable": {"thread_id": "checked"}}
        for turn in ("hello", "again"):
            graph.invoke({"log": [turn]}, config)
        assert graph.get_state(config).values["log"] == ["hello", "reply to hello", "again", "reply to again"]
    finally:
        saver.close()
    assert len(puts) >= 4
    assert all("content-md5" in headers and not any(h.startswith("x-amz-checksum-") for h in headers) for headers in puts)
