"""Smoke test: infra/template.yaml deployed into moto's CloudFormation (server mode),
and a saver built from the stack's outputs runs real graphs on invoke and ainvoke.

moto applies only part of the template (no bucket policy, versioning, lifecycle,
public access block or RolePolicy, for instance): the property-by-property checks are in
test_infra_template.py. This shows the template deploys as a whole, its outputs
are what a saver needs, and the resources it creates replace ``setup()``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta


import boto3
import pytest
from infra_support import (
    REGION,
    TEMPLATE,
    Stack,
    load_template,
    report_graph,
    run_report_async,
    run_report_sync,
)

import s3_saver

RETENTION_DAYS = 30
# moto names each resource type it does not deploy (AWS::S3::BucketPolicy...).
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS.* not supported by moto:UserWarning")


def deploy(endpoint: str, name: str, parameters: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Create the stack; return its outputs and {logical id: physical id}."""
    cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name=REGION)
    cfn.create_stack(
        StackName=name,
        TemplateBody=TEMPLATE.read_text(),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        Capabilities=["CAPABILITY_IAM"],
    )
    for _ in range(100):
        stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
        if not stack["StackStatus"].endswith("_IN_PROGRESS"):
            break
        time.sleep(0.1)
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack.get("StackStatusReason")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
    physical = {
        r["LogicalResourceId"]: r["PhysicalResourceId"]
        for r in cfn.list_stack_resources(StackName=name)["StackResourceSummaries"]
        if r["LogicalResourceId"]
    }
    return outputs, physical


def test_stack_deploys_with_no_parameters(endpoint: str) -> None:
    outputs, physical = deploy(endpoint, "s3-saver-defaults", {})
    assert {"BucketName", "TableName", "Region", "PolicyArn", "KmsKeyArn"} <= set(outputs)
    assert "KeyPrefix" not in outputs
    assert outputs["BucketName"] == physical["Bucket"]
    assert outputs["TableName"] == physical["Table"]
    assert outputs["KmsKeyArn"].endswith(physical["Key"])


def test_saver_from_stack_outputs_runs_graphs(endpoint: str) -> None:
    parameters = {
        "BucketName": "stack-checkpoints",
        "TableName": "stack-checkpoints-index",
        "KeyPrefix": "agents/prod/",
        "RetentionDays": str(RETENTION_DAYS),
        "ArchiveDeepArchiveDays": "180",
    }
    outputs, _ = deploy(endpoint, "s3-saver", parameters)
    clients = {"endpoint_url": endpoint, "region_name": outputs["Region"]}
    s3 = boto3.client("s3", **clients)
    dynamodb = boto3.client("dynamodb", **clients)
    iam = boto3.client("iam", **clients)
    bucket, table = outputs["BucketName"], outputs["TableName"]

    # What moto applied matches the template.
    (rule,) = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms",
        "KMSMasterKeyID": outputs["KmsKeyArn"],
    }
    description = dynamodb.describe_table(TableName=table)["Table"]
    assert description["KeySchema"] == list(s3_saver.TABLE_KEY_SCHEMA)
    assert description["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert description.get("GlobalSecondaryIndexes", []) == list(s3_saver.TABLE_GLOBAL_SECONDARY_INDEXES)
    # moto's resolution of the policy equals the test suite's evaluator's (which
    # test_infra_policy.py relies on).
    version = iam.get_policy(PolicyArn=outputs["PolicyArn"])["Policy"]["DefaultVersionId"]
    deployed = iam.get_policy_version(PolicyArn=outputs["PolicyArn"], VersionId=version)["PolicyVersion"]["Document"]
    evaluated = Stack(
        load_template(),
        parameters,
        physical={
            "Bucket": {"Ref": bucket, "Arn": outputs["BucketArn"]},
            "Table": {"Ref": table, "Arn": outputs["TableArn"]},
            "Key": {"Arn": outputs["KmsKeyArn"]},
        },
        stack_name="s3-saver",
    ).properties("SaverPolicy")["PolicyDocument"]
    assert deployed == evaluated

    # A saver from the outputs alone; no setup(): the stack made the bucket and table.
    saver = s3_saver.S3Saver(
        bucket,
        table=table,
        prefix=outputs.get("KeyPrefix", ""),
        region_name=outputs["Region"],
        endpoint_url=endpoint,
        ttl=timedelta(days=RETENTION_DAYS / 1.5),  # the rule of infra/README.md
    )
    graph = report_graph(saver)
    started = int(time.time())
    run_report_sync(graph, "sync-user")

    async def async_part() -> None:
        await run_report_async(graph, "async-user")
        await saver.aclose()

    asyncio.run(async_part())
    saver.close()

    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert keys and all(k.startswith(f"agents/prod/{s3_saver.LIVE_PREFIX}") for k in keys), keys[:5]
    head = s3.head_object(Bucket=bucket, Key=keys[0])
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", outputs["KmsKeyArn"])

    items = dynamodb.scan(TableName=table)["Items"]
    assert items
    ttl_attribute = s3_saver.TTL_ATTRIBUTE
    # Every checkpoint and writes item (a thread's own item and its listing entry
    # point at no object, and outlive the thread's checkpoints: see list_threads).
    for item in (i for i in items if "kind" in i):
        expires_at = int(item[ttl_attribute]["N"])
        # No later than the lifecycle rule deletes the objects it points at.
        assert started < expires_at <= int(time.time()) + RETENTION_DAYS * 86400 / 1.5, item


@pytest.mark.parametrize("kms", ["given", "created"])
def test_replica_and_given_key_deploy(endpoint: str, kms: str) -> None:
    parameters = {
        "ReplicaRegion": "eu-west-1",
        "ReplicaBucketName": "checkpoints-replica",
        "ReplicaKmsKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/66666666-7777-8888-9999-000000000000",
    }
    if kms == "given":
        key = boto3.client("kms", endpoint_url=endpoint, region_name=REGION).create_key()["KeyMetadata"]["Arn"]
        parameters["KmsKeyArn"] = key
    outputs, physical = deploy(endpoint, f"s3-saver-replica-{kms}", parameters)
    assert "ReplicationRoleArn" in outputs
    if kms == "given":
        assert outputs["KmsKeyArn"] == parameters["KmsKeyArn"]
        assert "Key" not in physical


