"""A table's key prefix belongs to one bucket (issue 32): another bucket is refused.

The manifest index lives in the bucket itself, so only the DynamoDB mode can
put two buckets on one index; these tests are of that mode. So are those of a
table made for something else (another key schema), which the owner check's
read, the first call to touch the table, names.
"""

from __future__ import annotations

import asyncio

import boto3
import pytest
from faults import FaultProxy
from botocore.exceptions import ClientError
from conftest import BUCKET, TABLE, make_saver
from helpers import config, grow_thread

from s3_saver import TABLE_ATTRIBUTE_DEFINITIONS, TABLE_KEY_SCHEMA, S3Saver, SetupMismatchError, TableOwnedError
from s3_saver._format.keys import KeyLayout
from s3_saver._transport.failures import KEY_SCHEMA_TEXT

OTHER = "other-app-bucket"


def other_saver(endpoint: str, bucket: str = OTHER, **kw) -> S3Saver:
    return S3Saver(bucket, table=TABLE, endpoint_url=endpoint, region_name="us-east-1", **kw)


def owner_item(endpoint: str, prefix: str = "") -> dict | None:
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    key = {"pk": {"S": KeyLayout(prefix).listing_partition("owner")}, "sk": {"S": "owner"}}
    return ddb.get_item(TableName=TABLE, Key=key, ConsistentRead=True).get("Item")


def test_second_bucket_on_one_table_is_refused_before_it_reads_or_deletes(endpoint, dynamo_saver) -> None:
    grow_thread(dynamo_saver, "user-1", 3)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=OTHER)
    other = other_saver(endpoint)
    with pytest.raises(TableOwnedError) as caught:
        other.get_tuple(config("user-1"))
    text = str(caught.value)
    assert BUCKET in text and OTHER in text and TABLE in text and "prefix ''" in text
    assert "table of its own" in text and "another prefix" in text
    with pytest.raises(TableOwnedError):
        other.delete_thread("user-1")
    with pytest.raises(TableOwnedError):
        list(other.list(config("user-1")))
    # The owner's thread is whole.
    assert dynamo_saver.get_tuple(config("user-1")).checkpoint["channel_values"]["counter"] == 2
    other.close()


def test_setup_of_a_second_bucket_is_refused(endpoint, dynamo_saver) -> None:
    other = other_saver(endpoint)
    with pytest.raises(TableOwnedError, match=OTHER):
        other.setup()
    other.close()


def test_a_fresh_process_of_a_second_bucket_is_refused_async(endpoint, dynamo_saver) -> None:
    grow_thread(dynamo_saver, "user-1", 2)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=OTHER)
    other = other_saver(endpoint)

    async def run() -> None:
        with pytest.raises(TableOwnedError):
            await other.adelete_thread("user-1")
        await other.aclose()

    asyncio.run(run())
    assert dynamo_saver.get_tuple(config("user-1")) is not None
    other.close()


def test_another_prefix_on_one_table_is_its_own(endpoint, dynamo_saver) -> None:
    grow_thread(dynamo_saver, "user-1", 2)
    other = other_saver(endpoint, prefix="app-b/")
    other.setup()
    assert other.get_tuple(config("user-1")) is None
    grow_thread(other, "user-1", 1)
    assert owner_item(endpoint, "app-b/")["bucket"]["S"] == OTHER
    assert owner_item(endpoint)["bucket"]["S"] == BUCKET
    other.close()


def _drop_record(endpoint: str, prefix: str = "") -> None:
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    key = {"pk": {"S": KeyLayout(prefix).listing_partition("owner")}, "sk": {"S": "owner"}}
    ddb.delete_item(TableName=TABLE, Key=key)


def test_a_table_set_up_before_records_is_claimed_by_its_first_user(endpoint, dynamo_saver) -> None:
    grow_thread(dynamo_saver, "user-1", 2)
    _drop_record(endpoint)  # as a table set up by an earlier version
    fresh = make_saver(endpoint)
    assert fresh.get_tuple(config("user-1")).checkpoint["channel_values"]["counter"] == 1
    assert owner_item(endpoint)["bucket"]["S"] == BUCKET
    other = other_saver(endpoint)
    with pytest.raises(TableOwnedError, match=BUCKET):
        other.get_tuple(config("user-1"))
    fresh.close()
    other.close()


def test_two_buckets_racing_for_an_unclaimed_table_one_wins(endpoint, dynamo_saver) -> None:
    """The claim is conditional: the loser reads the winner's record and is refused."""
    _drop_record(endpoint)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=OTHER)
    mine, theirs = make_saver(endpoint), other_saver(endpoint)
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    settle = mine._sites["primary"].owner.settle({})  # mine read "no record" in its first wave
    (claim,) = next(settle)
    assert claim.operation == "put_item"
    assert theirs.get_tuple(config("x")) is None  # theirs claims meanwhile
    with pytest.raises(TableOwnedError, match=OTHER):
        (read,) = settle.send([_send(ddb, claim)])
        settle.send([_send(ddb, read)])
    assert owner_item(endpoint)["bucket"]["S"] == OTHER
    assert not mine._sites["primary"].owner.checked
    mine.close()
    theirs.close()


def _send(client, call):
    try:
        return getattr(client, call.operation)(**call.params)
    except ClientError as exc:
        return exc


def test_setup_records_the_owner(endpoint, dynamo_saver) -> None:
    item = owner_item(endpoint)
    assert item["bucket"]["S"] == BUCKET and item["prefix"]["S"] == ""
    assert item["endpoint"]["S"] == endpoint


def test_check_rides_on_the_first_wave_once(endpoint, dynamo_saver) -> None:
    """Cold: one more request in a round trip already sent; then nothing."""
    grow_thread(dynamo_saver, "t", 3)
    fresh = make_saver(endpoint)
    fresh._sites["primary"].mode.checked = True  # the index-mode check's own request aside (test_index_mode)
    fresh.get_tuple(config("t"))
    cold = fresh.stats.snapshot()
    warm_ref = make_saver(endpoint)
    warm_ref._sites["primary"].mode.checked = True
    warm_ref._sites["primary"].owner.checked = True  # as if checked before
    warm_ref.get_tuple(config("t"))
    base = warm_ref.stats.snapshot()
    assert cold.round_trips == base.round_trips
    assert cold.total_requests == base.total_requests + 1
    fresh.stats.reset()
    fresh.get_tuple(config("t"))
    again = fresh.stats.snapshot()
    assert (again.round_trips, again.total_requests) == (base.round_trips, base.total_requests)
    fresh.close()
    warm_ref.close()


def test_a_replica_bucket_is_accepted_and_listed_a_stranger_is_not(endpoint, dynamo_saver) -> None:
    """One table as a global table's replica holds it: the primary's record, read by
    a saver of the replica bucket that names the primary as its Replica."""
    from s3_saver import Replica

    grow_thread(dynamo_saver, "user-1", 2)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=OTHER)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):  # replication, by hand
            s3.copy_object(Bucket=OTHER, Key=obj["Key"], CopySource={"Bucket": BUCKET, "Key": obj["Key"]})
    replica = Replica(BUCKET, region_name="us-east-1", endpoint_url=endpoint, global_table=True)
    reader = other_saver(endpoint, replica=replica)
    assert reader.get_tuple(config("user-1")).checkpoint["channel_values"]["counter"] == 1
    item = owner_item(endpoint)
    assert item["bucket"]["S"] == BUCKET  # the primary's record stays, and lists the pair
    assert item["replicas"]["SS"] == [OTHER]
    # A process of the replica region configured without a Replica (active in both
    # regions on a global table) is accepted now; a third bucket is not.
    listed = other_saver(endpoint)
    assert listed.get_tuple(config("user-1")) is not None
    listed.close()
    s3.create_bucket(Bucket="third-bucket")
    stranger = other_saver(endpoint, bucket="third-bucket")
    with pytest.raises(TableOwnedError, match="third-bucket"):
        stranger.get_tuple(config("user-1"))
    reader.close()
    stranger.close()


def test_a_whole_rebuild_records_the_bucket(endpoint, dynamo_saver) -> None:
    """rebuild_index() of every thread makes the table this bucket's (promote's rebuild
    of the other region's table, whose record names the primary)."""
    grow_thread(dynamo_saver, "user-1", 2)
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    key = {"pk": {"S": KeyLayout("").listing_partition("owner")}, "sk": {"S": "owner"}}
    ddb.update_item(TableName=TABLE, Key=key, UpdateExpression="SET #b = :b", ExpressionAttributeNames={"#b": "bucket"}, ExpressionAttributeValues={":b": {"S": OTHER}})
    from s3_saver import Replica

    replica = Replica(OTHER, region_name="us-east-1", endpoint_url=endpoint)
    promoted = make_saver(endpoint, replica=replica)  # the paired region's record is accepted
    assert promoted.rebuild_index() == 2
    assert owner_item(endpoint)["bucket"]["S"] == BUCKET
    promoted.close()


def test_one_bucket_through_two_endpoints_is_one_bucket(endpoint, dynamo_saver) -> None:
    """A bucket reached through another endpoint (a proxy, a VPC endpoint, a store's
    internal and public names) is the same bucket: its saver reads the thread."""
    grow_thread(dynamo_saver, "user-1", 2)
    with FaultProxy(endpoint) as proxy:
        through = S3Saver(BUCKET, table=TABLE, endpoint_url=proxy.url, region_name="us-east-1")
        assert through.get_tuple(config("user-1")) is not None
        through.delete_thread("user-1")
        through.close()
    assert dynamo_saver.get_tuple(config("user-1")) is None


# -- a table of another key schema, used without setup() --------------------------------
def test_the_key_schema_in_words_is_the_tables() -> None:
    for key, attribute in zip(TABLE_KEY_SCHEMA, TABLE_ATTRIBUTE_DEFINITIONS):
        assert f"key {key['AttributeName']!r} (string)" in KEY_SCHEMA_TEXT and attribute["AttributeType"] == "S"


@pytest.mark.parametrize(
    "schema",
    [
        ([{"AttributeName": "id", "KeyType": "HASH"}], [{"AttributeName": "id", "AttributeType": "S"}]),
        (TABLE_KEY_SCHEMA, [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "N"}]),
    ],
    ids=["other-names", "other-types"],
)
def test_a_table_of_another_key_schema_without_setup_is_named(endpoint, schema) -> None:
    """The Lambda guide drops setup() from the handler: the first call that touches a
    table made for something else names it (sync and async), whichever call it is."""
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    key_schema, attributes = schema
    boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1").create_table(
        TableName=TABLE, KeySchema=list(key_schema), AttributeDefinitions=list(attributes), BillingMode="PAY_PER_REQUEST"
    )
    saver = make_saver(endpoint)
    for call in (lambda: saver.get_tuple(config("t")), lambda: grow_thread(saver, "t", 1)):
        with pytest.raises(SetupMismatchError) as exc:
            call()
        text = str(exc.value)
        assert f"table {TABLE!r}" in text and "us-east-1" in text and KEY_SCHEMA_TEXT in text, text
        assert "TABLE_KEY_SCHEMA" in text
    saver.close()
    fresh = make_saver(endpoint)

    async def asynchronous() -> None:
        with pytest.raises(SetupMismatchError):
            await fresh.aget_tuple(config("t"))
        await fresh.aclose()

    asyncio.run(asynchronous())
    fresh.close()
