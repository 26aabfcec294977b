"""The test harness's fixes to moto behave as the AWS service does (tests/moto_fixes.py)."""

from __future__ import annotations

import uuid

import boto3
import pytest
from botocore.exceptions import ClientError


def _table(endpoint: str) -> tuple[object, str]:
    client = boto3.client(
        "dynamodb", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    name = f"tokens-{uuid.uuid4().hex[:8]}"
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return client, name


def test_a_transaction_sent_again_with_its_token_is_applied_once(moto_endpoint: str) -> None:
    """As DynamoDB: the same ClientRequestToken and parameters answer success and apply
    nothing (a conditional Put sent again does not meet its own item); other parameters
    under that token are refused; a new token is a new transaction."""
    client, table = _table(moto_endpoint)

    def put(token: str, value: str) -> dict:
        item = {"TableName": table, "Item": {"pk": {"S": "a"}, "v": {"S": value}, "b": {"B": b"\x00\xff"}}, "ConditionExpression": "attribute_not_exists(pk)"}
        return client.transact_write_items(TransactItems=[{"Put": item}], ClientRequestToken=token)  # type: ignore[attr-defined]

    put("t1", "first")
    put("t1", "first")  # applied once: its condition never meets its own item
    assert client.get_item(TableName=table, Key={"pk": {"S": "a"}})["Item"]["v"] == {"S": "first"}  # type: ignore[attr-defined]
    with pytest.raises(ClientError) as mismatch:
        put("t1", "other")
    assert mismatch.value.response["Error"]["Code"] == "IdempotentParameterMismatchException"
    with pytest.raises(ClientError) as refused:
        put("t2", "first")
    assert refused.value.response["Error"]["Code"] == "TransactionCanceledException"


def test_a_multi_region_kms_key_decrypts_in_its_replica_s_region(moto_endpoint: str) -> None:
    """As KMS: a data key made under a multi-Region key decrypts in its region and, with
    the same encryption context, in the region of its replica (the key's ARN there)."""
    kw = {"endpoint_url": moto_endpoint, "aws_access_key_id": "x", "aws_secret_access_key": "x"}
    here, there = boto3.client("kms", region_name="us-east-1", **kw), boto3.client("kms", region_name="eu-west-1", **kw)
    key = here.create_key(MultiRegion=True)["KeyMetadata"]
    here.replicate_key(KeyId=key["KeyId"], ReplicaRegion="eu-west-1")
    made = here.generate_data_key(KeyId=key["KeyId"], KeySpec="AES_256", EncryptionContext={"t": "1"})
    replica_arn = made["KeyId"].replace("us-east-1", "eu-west-1")
    for client, key_id in ((here, made["KeyId"]), (there, replica_arn)):
        found = client.decrypt(CiphertextBlob=made["CiphertextBlob"], EncryptionContext={"t": "1"}, KeyId=key_id)
        assert found["Plaintext"] == made["Plaintext"] and found["KeyId"].endswith(key["KeyId"])
    with pytest.raises(ClientError):
        there.decrypt(CiphertextBlob=made["CiphertextBlob"], EncryptionContext={"t": "2"}, KeyId=replica_arn)


def test_a_disabled_kms_key_neither_encrypts_nor_decrypts(moto_endpoint: str) -> None:
    """As KMS: a disabled key refuses GenerateDataKey, Decrypt and ReEncrypt (to or from
    it) with DisabledException; enabled again, it works."""
    kms = boto3.client("kms", region_name="us-east-1", endpoint_url=moto_endpoint, aws_access_key_id="x", aws_secret_access_key="x")
    key, other = (kms.create_key()["KeyMetadata"]["KeyId"] for _ in range(2))
    made = kms.generate_data_key(KeyId=key, KeySpec="AES_256", EncryptionContext={"t": "1"})
    kms.disable_key(KeyId=key)
    for refused in (
        lambda: kms.generate_data_key(KeyId=key, KeySpec="AES_256"),
        lambda: kms.decrypt(CiphertextBlob=made["CiphertextBlob"], EncryptionContext={"t": "1"}),
        lambda: kms.re_encrypt(CiphertextBlob=made["CiphertextBlob"], SourceEncryptionContext={"t": "1"}, DestinationKeyId=other),
    ):
        with pytest.raises(ClientError) as error:
            refused()
        assert error.value.response["Error"]["Code"] == "DisabledException"
    kms.enable_key(KeyId=key)
    assert kms.decrypt(CiphertextBlob=made["CiphertextBlob"], EncryptionContext={"t": "1"})["Plaintext"] == made["Plaintext"]
