"""Smoke test: infra/template.yaml deployed into moto's CloudFormation (server mode),
and a saver built from the stack's outputs runs real graphs on invoke and ainvoke.

moto applies only part of the template (no bucket policy, versioning, lifecycle,
public access block, TTL or RolePolicy, for instance): the property-by-property checks are in
test_infra_template.py and test_infra_replica.py. infra/replica.yaml is deployed in a second
region the same way, and both stacks together carry a failover from their outputs alone. This shows the template deploys as a whole, its outputs
are what a saver needs, and the resources it creates replace ``setup()``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from datetime import timedelta
from pathlib import Path


import boto3
import pytest
from infra_support import (
    EXPECTED_LOG,
    REGION,
    REPLICA_TEMPLATE,
    TEMPLATE,
    Stack,
    load_template,
    moto_cloudformation_like_aws,
    report_graph,
    run_report_async,
    run_report_sync,
)
from langgraph.types import Command

import s3_saver
from s3_saver._format.keys import LISTING_PREFIX, LIVE_PREFIX, MANIFEST_PREFIX

RETENTION_DAYS = 30
REPLICA_REGION = "eu-west-1"
# AWS::NoValue in lists, AWS::DynamoDB::GlobalTable (see infra_support).
moto_cloudformation_like_aws()
# moto names each resource type it does not deploy (AWS::S3::BucketPolicy...).
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS.* not supported by moto:UserWarning")


def deploy(
    endpoint: str, name: str, parameters: dict[str, str], template: Path = TEMPLATE, region: str = REGION
) -> tuple[dict[str, str], dict[str, str]]:
    """Create the stack; return its outputs and {logical id: physical id}."""
    cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name=region)
    cfn.create_stack(
        StackName=name,
        TemplateBody=template.read_text(),
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


def test_saver_from_stack_outputs_runs_graphs(endpoint: str, index_mode: str) -> None:
    parameters = {
        "BucketName": "stack-checkpoints",
        "IndexMode": index_mode,
        "KeyPrefix": "agents/prod/",
        "RetentionDays": str(RETENTION_DAYS),
        "ArchiveDeepArchiveDays": "180",
    }
    if index_mode == "dynamodb":
        parameters["TableName"] = "stack-checkpoints-index"
    outputs, physical = deploy(endpoint, "s3-saver", parameters)
    clients = {"endpoint_url": endpoint, "region_name": outputs["Region"]}
    s3 = boto3.client("s3", **clients)
    dynamodb = boto3.client("dynamodb", **clients)
    iam = boto3.client("iam", **clients)
    # The manifest mode's stack has no table, and says so (no TableName output).
    assert outputs["IndexMode"] == index_mode
    assert ("Table" in physical) == ("TableName" in outputs) == (index_mode == "dynamodb")
    bucket, table = outputs["BucketName"], outputs.get("TableName")

    # What moto applied matches the template.
    (rule,) = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms",
        "KMSMasterKeyID": outputs["KmsKeyArn"],
    }
    if table is not None:
        description = dynamodb.describe_table(TableName=table)["Table"]
        assert description["KeySchema"] == list(s3_saver.TABLE_KEY_SCHEMA)
        assert description["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        assert description.get("GlobalSecondaryIndexes", []) == list(s3_saver.TABLE_GLOBAL_SECONDARY_INDEXES)
    if table is None:
        assert dynamodb.list_tables()["TableNames"] == []
    # moto's resolution of the policy equals the test suite's evaluator's (which
    # test_infra_policy.py relies on).
    version = iam.get_policy(PolicyArn=outputs["PolicyArn"])["Policy"]["DefaultVersionId"]
    deployed = iam.get_policy_version(PolicyArn=outputs["PolicyArn"], VersionId=version)["PolicyVersion"]["Document"]
    evaluated = Stack(
        load_template(),
        parameters,
        physical={
            "Bucket": {"Ref": bucket, "Arn": outputs["BucketArn"]},
            "Table": {"Ref": table, "Arn": outputs.get("TableArn")},
            "Key": {"Arn": outputs["KmsKeyArn"]},
        },
        stack_name="s3-saver",
    ).properties("SaverPolicy")["PolicyDocument"]
    assert deployed == evaluated

    # A saver from the outputs alone; no setup(): the stack made the bucket and table
    # (in manifest mode there is no table; setup() would only probe conditional writes).
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
    # Under the prefixes the mode's policy names (the manifest's own beside live/).
    subs = {LIVE_PREFIX} | ({MANIFEST_PREFIX, LISTING_PREFIX} if table is None else set())
    assert keys and {k.removeprefix("agents/prod/").split("/")[0] + "/" for k in keys} == subs, keys[:5]
    head = s3.head_object(Bucket=bucket, Key=keys[0])
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", outputs["KmsKeyArn"])
    if table is None:
        return
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




# -- the replica region (infra/replica.yaml) -------------------------------------------------
FAILBACK = {
    "FailbackReplication": "Enabled",
    "PrimaryRegion": REGION,
    "PrimaryBucketName": "stack-checkpoints",
    "PrimaryKmsKeyArn": "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555",
}


def deployed_policy(iam: object, arn: str) -> dict:
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]  # type: ignore[attr-defined]
    return iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["dynamodb", "global-table", "manifest"])
def test_replica_stack_deploys_in_each_index_mode(endpoint: str, mode: str) -> None:
    parameters = {"KeyPrefix": "agents/prod/", "IndexMode": mode, "TableName": "stack-index", "RetentionDays": "30"}
    if mode == "manifest":
        parameters.update(FAILBACK)
    name = f"s3-saver-replica-{mode}"
    outputs, physical = deploy(endpoint, name, parameters, REPLICA_TEMPLATE, REPLICA_REGION)
    clients = {"endpoint_url": endpoint, "region_name": REPLICA_REGION}
    s3, dynamodb, iam = (boto3.client(s, **clients) for s in ("s3", "dynamodb", "iam"))

    assert outputs["Region"] == REPLICA_REGION
    assert outputs["BucketName"] == physical["Bucket"]
    assert outputs["KeyPrefix"] == "agents/prod/"
    assert s3.get_bucket_location(Bucket=outputs["BucketName"])["LocationConstraint"] == REPLICA_REGION
    (rule,) = s3.get_bucket_encryption(Bucket=outputs["BucketName"])["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": outputs["KmsKeyArn"]}
    assert outputs["KmsKeyArn"].startswith(f"arn:aws:kms:{REPLICA_REGION}:")
    if mode == "dynamodb":
        table = dynamodb.describe_table(TableName=outputs["TableName"])["Table"]
        assert table["KeySchema"] == list(s3_saver.TABLE_KEY_SCHEMA)
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        assert outputs["TableArn"] == table["TableArn"]
    else:
        assert "Table" not in physical
        assert dynamodb.list_tables()["TableNames"] == []  # global-table: the primary stack makes it
    assert ("TableName" in outputs) == (mode != "manifest")
    assert ("FailbackReplicationRoleArn" in outputs) == (mode == "manifest")

    # moto's resolution of both policies equals the evaluator's (test_infra_policy.py's).
    stack = Stack(
        load_template(REPLICA_TEMPLATE),
        parameters,
        physical={
            "Bucket": {"Ref": outputs["BucketName"], "Arn": outputs["BucketArn"]},
            "Table": {"Ref": outputs.get("TableName", ""), "Arn": outputs.get("TableArn", "")},
            "Key": {"Arn": outputs["KmsKeyArn"]},
        },
        stack_name=name,
        region=REPLICA_REGION,
    )
    for policy, output in (("ReplicaReaderPolicy", "ReaderPolicyArn"), ("ReplicaPromotePolicy", "PromotePolicyArn")):
        assert deployed_policy(iam, outputs[output]) == stack.properties(policy)["PolicyDocument"], policy


def test_primary_global_table_deploys_in_both_regions(endpoint: str) -> None:
    replica, _ = deploy(
        endpoint, "replica-side", {"IndexMode": "global-table", "TableName": "g-index"}, REPLICA_TEMPLATE, REPLICA_REGION
    )
    outputs, physical = deploy(
        endpoint,
        "primary-side",
        {
            "TableName": "g-index",
            "GlobalTable": "Enabled",
            "ReplicaRegion": replica["Region"],
            "ReplicaBucketName": replica["BucketName"],
            "ReplicaKmsKeyArn": replica["KmsKeyArn"],
        },
    )
    assert "Table" not in physical and physical["GlobalIndexTable"] == "g-index"
    assert outputs["TableName"] == replica["TableName"] == "g-index"
    for region, arn in ((REGION, outputs["TableArn"]), (REPLICA_REGION, replica["TableArn"])):
        table = boto3.client("dynamodb", endpoint_url=endpoint, region_name=region).describe_table(TableName="g-index")
        assert table["Table"]["TableArn"] == arn
        assert table["Table"]["KeySchema"] == list(s3_saver.TABLE_KEY_SCHEMA)
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION)
    statements = deployed_policy(iam, outputs["PolicyArn"])["Statement"]
    index = next(s for s in statements if s["Sid"] == "CheckpointIndex")
    assert index["Resource"] == outputs["TableArn"]


@pytest.mark.parametrize("mode", ["dynamodb", "global-table", "manifest"])
def test_failover_with_the_two_stacks_outputs(endpoint: str, mode: str) -> None:
    """Both stacks deployed, a saver built from their outputs: a thread interrupted in the
    primary region, replicated, the primary taken down, promote(), the interrupt resumed
    in the replica region."""
    from regions import Proxy, Replicator, Site, saver_client_config, saver_retry

    prefix = "agents/prod/"
    shared = {"KeyPrefix": prefix, "RetentionDays": str(RETENTION_DAYS)}
    replica, _ = deploy(
        endpoint,
        "drill-replica",
        {**shared, "IndexMode": mode, "TableName": "drill-index"},
        REPLICA_TEMPLATE,
        REPLICA_REGION,
    )
    primary_parameters = {
        **shared,
        "TableName": "drill-index",
        "ReplicaRegion": replica["Region"],
        "ReplicaBucketName": replica["BucketName"],
        "ReplicaKmsKeyArn": replica["KmsKeyArn"],
    }
    if mode == "global-table":
        primary_parameters["GlobalTable"] = "Enabled"
    primary, _ = deploy(endpoint, "drill-primary", primary_parameters)

    sites = []
    for outputs in (primary, replica):
        clients = {"endpoint_url": endpoint, "region_name": outputs["Region"]}
        site = Site(
            outputs["BucketName"],
            outputs["Region"],
            outputs.get("TableName", ""),
            boto3.client("s3", **clients),
            boto3.client("dynamodb", **clients),
        )
        # moto's CloudFormation leaves VersioningConfiguration out; replication needs it.
        site.s3.put_bucket_versioning(Bucket=site.bucket, VersioningConfiguration={"Status": "Enabled"})
        sites.append(site)
    replicator = Replicator.between(*sites, tables=mode == "global-table")

    with Proxy(endpoint) as proxy:
        saver = s3_saver.S3Saver(
            primary["BucketName"],
            table=None if mode == "manifest" else primary["TableName"],
            prefix=primary["KeyPrefix"],
            region_name=primary["Region"],
            endpoint_url=proxy.url,
            client_config=saver_client_config(),
            retry=saver_retry(),
            ttl=timedelta(days=RETENTION_DAYS / 1.5),
            replica=s3_saver.Replica(
                replica["BucketName"],
                region_name=replica["Region"],
                endpoint_url=endpoint,
                table=replica.get("TableName"),
                global_table=mode == "global-table",
                recheck_after=3600,
            ),
        )
        try:
            graph = report_graph(saver)
            config = {"configurable": {"thread_id": "drill"}}
            assert "__interrupt__" in graph.invoke({"log": []}, config)
            before = graph.get_state(config)
            replicator.run()
            proxy.refuse()
            if mode != "dynamodb":  # a rebuilt table is empty until promote()
                assert graph.get_state(config).values == before.values
                assert saver.last_read.site == "replica"
            promotion = saver.promote()
            assert promotion.rebuilt is None if mode != "dynamodb" else promotion.rebuilt > 0
            assert graph.get_state(config).next == before.next
            assert graph.invoke(Command(resume="yes"), config)["log"] == EXPECTED_LOG
            keys = sites[1].keys(prefix)
            assert keys and all(k.startswith(prefix) for k in keys)
        finally:
            saver.close()


@pytest.mark.parametrize("encryption", ["KmsKey", "LocalKey"])
def test_thread_encryption_makes_a_key_store_that_keeps_no_old_copy(endpoint: str, encryption: str) -> None:
    """ThreadEncryption: the key store bucket (BucketName-keys) unversioned, public access
    blocked, tagged s3_saver:no-backup; with KmsKey the threads' own KMS key. A saver
    from the outputs alone (no setup()) writes and reads an encrypted thread."""
    import base64
    import os

    parameters = {"BucketName": "stack-encrypted", "IndexMode": "manifest", "ThreadEncryption": encryption}
    outputs, physical = deploy(endpoint, f"s3-saver-{encryption.lower()}", parameters)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=outputs["Region"])
    key_bucket = outputs["KeyBucketName"]
    assert key_bucket == physical["KeyBucket"] == "stack-encrypted-keys"
    assert s3.get_bucket_versioning(Bucket=key_bucket).get("Status") is None
    # (moto's CloudFormation applies no public access block: test_infra_template reads it.)
    tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=key_bucket)["TagSet"]}
    assert tags["s3_saver:no-backup"] == "true"
    assert ("ThreadKmsKeyArn" in outputs) == ("ThreadKey" in physical) == (encryption == "KmsKey")
    assert "KeyRotationPolicyArn" not in outputs  # no rotation under way
    if encryption == "KmsKey":
        assert outputs["ThreadKmsKeyArn"].endswith(physical["ThreadKey"])
        assert outputs["ThreadKmsKeyArn"] != outputs["KmsKeyArn"]  # not the bucket's key
        chosen: Any = s3_saver.KmsKey(outputs["ThreadKmsKeyArn"], key_bucket=key_bucket)
    else:
        chosen = s3_saver.LocalKey(base64.b64encode(os.urandom(32)).decode(), key_bucket=key_bucket)
    saver = s3_saver.S3Saver(outputs["BucketName"], endpoint_url=endpoint, region_name=outputs["Region"], encryption=chosen)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = {"v": 4, "id": "1ef0", "ts": "2026-01-01T00:00:00+00:00", "channel_values": {"doc": "secret"},
                  "channel_versions": {"doc": "1"}, "versions_seen": {}, "updated_channels": ["doc"]}
    saver.put(config, checkpoint, {"source": "input", "step": -1}, {"doc": "1"})
    assert saver.get_tuple(config).checkpoint["channel_values"]["doc"] == "secret"
    assert s3.list_objects_v2(Bucket=key_bucket)["KeyCount"] == 1
    saver.close()
