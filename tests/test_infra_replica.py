"""infra/replica.yaml (the replica region's stack) and the global-table mode of
infra/template.yaml, property by property, evaluated as test_infra_template.py
evaluates the primary template.

The replica stack must hold the same data the same way as the primary (its
bucket and table are compared with the primary's, property for property), and
its two managed policies must stay within the replica's bucket, prefix, table
and key. That they grant exactly what the saver calls is test_infra_policy.py's
``test_replica_policies_allow_exactly_what_the_saver_does``.
"""

from __future__ import annotations

import re

import pytest
from infra_support import REPLICA_TEMPLATE, REPO, Stack, load_template, statement_resources

from s3_saver import (
    ARCHIVE_PREFIX,
    LIVE_PREFIX,
    TABLE_ATTRIBUTE_DEFINITIONS,
    TABLE_KEY_SCHEMA,
    TTL_ATTRIBUTE,
)

PRIMARY_REGION = "us-east-1"
REPLICA_REGION = "eu-west-1"
REPLICA_KEY = "arn:aws:kms:eu-west-1:123456789012:key/66666666-7777-8888-9999-000000000000"
PRIMARY_KEY = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
FAILBACK = {
    "FailbackReplication": "Enabled",
    "PrimaryRegion": PRIMARY_REGION,
    "PrimaryBucketName": "checkpoints",
    "PrimaryKmsKeyArn": PRIMARY_KEY,
}
# The primary stack's replica parameters, pointing at a replica stack.
REPLICA = {"ReplicaRegion": REPLICA_REGION, "ReplicaBucketName": "checkpoints-replica", "ReplicaKmsKeyArn": REPLICA_KEY}
MANIFEST_PREFIX = "manifests/"
LISTING_PREFIX = "listing/"
MEMORY_PREFIX = "memory/"

# Parameters both templates take, with the same meaning.
SHARED = (
    "BucketName",
    "KeyPrefix",
    "RetentionDays",
    "NoncurrentVersionDays",
    "ArchiveTransitionDays",
    "ArchiveDeepArchiveDays",
    "ArchiveRetentionDays",
    "KmsKeyArn",
)
# Parameter sets that exercise every lifecycle branch.
LIFECYCLES = [
    {},
    {"KeyPrefix": "agents/prod/", "RetentionDays": "90", "NoncurrentVersionDays": "14"},
    {"ArchiveTransitionDays": "30", "ArchiveDeepArchiveDays": "180", "ArchiveRetentionDays": "3650"},
    {"KeyPrefix": "a/", "ArchiveDeepArchiveDays": "90", "KmsKeyArn": PRIMARY_KEY},
    {"RetentionDays": "30", "ArchiveRetentionDays": "400"},
]


@pytest.fixture(scope="module")
def primary() -> dict:
    return load_template()


@pytest.fixture(scope="module")
def replica() -> dict:
    return load_template(REPLICA_TEMPLATE)


def replica_stack(template: dict, **parameters: str) -> Stack:
    return Stack(template, parameters, region=REPLICA_REGION, stack_name="s3-saver-replica")


def primary_stack(template: dict, **parameters: str) -> Stack:
    return Stack(template, parameters, region=PRIMARY_REGION)


def kms_key(s: Stack) -> str:
    return s.value({"Fn::If": ["CreateKmsKey", {"Fn::GetAtt": ["Key", "Arn"]}, {"Ref": "KmsKeyArn"}]})


def as_list(value: object) -> list:
    return value if isinstance(value, list) else [value]


# -- parameters --------------------------------------------------------------------------
def test_replica_parameters_have_defaults_descriptions_and_readme_entries(primary: dict, replica: dict) -> None:
    params = replica["Parameters"]
    readme = (REPO / "infra" / "README.md").read_text()
    section = readme[readme.index("## Replica region") :]
    for name, spec in params.items():
        assert "Default" in spec, f"{name}: a stack must deploy with no parameters"
        assert spec.get("Description"), name
        assert f"`{name}`" in section, f"infra/README.md's Replica region section does not document {name}"
    # The shared ones are declared exactly as in the primary template (same
    # constraints; the descriptions may say "the primary stack's value").
    for name in SHARED:
        mine = {k: v for k, v in params[name].items() if k != "Description"}
        theirs = {k: v for k, v in primary["Parameters"][name].items() if k != "Description"}
        assert mine == theirs, name
    assert params["IndexMode"]["AllowedValues"] == ["dynamodb", "global-table", "manifest"]
    assert params["IndexMode"]["Default"] == "dynamodb", "the primary template's default is a table"
    assert params["FailbackReplication"]["Default"] == "Disabled"
    assert params["AcceptReplication"]["Default"] == "Enabled"
    assert primary["Parameters"]["GlobalTable"]["Default"] == "Disabled"
    assert "`GlobalTable`" in readme


# -- the bucket: the primary's -------------------------------------------------------------
@pytest.mark.parametrize("parameters", LIFECYCLES, ids=[str(i) for i in range(len(LIFECYCLES))])
def test_replica_bucket_is_the_primary_bucket(primary: dict, replica: dict, parameters: dict) -> None:
    """Private, owner-enforced, versioned, KMS-encrypted, and the same lifecycle rules:
    a thread expires, goes cold and loses its old versions on the same days in both regions."""
    p = primary_stack(primary, **parameters, **REPLICA)
    r = replica_stack(replica, **parameters)
    mine = r.resources["Bucket"]
    theirs = p.resources["Bucket"]
    assert {k: v for k, v in mine.items() if k != "Properties"} == {
        k: v for k, v in theirs.items() if k != "Properties"
    }, "DeletionPolicy, UpdateReplacePolicy, checkov skips"
    mine_props = dict(mine["Properties"])
    theirs_props = {k: v for k, v in theirs["Properties"].items() if k != "ReplicationConfiguration"}
    assert "ReplicationConfiguration" not in mine_props, "no failback replication unless asked for"
    # Each stack encrypts with its own key (created, or the same given ARN here).
    for props, stack in ((mine_props, r), (theirs_props, p)):
        (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert rule["ServerSideEncryptionByDefault"]["KMSMasterKeyID"] == kms_key(stack)
    assert mine_props == theirs_props
    assert mine_props["VersioningConfiguration"] == {"Status": "Enabled"}, "S3 replication needs it"
    assert r.properties("BucketPolicy") == p.properties("BucketPolicy")


def test_the_primary_replicates_into_the_replica_stack(primary: dict, replica: dict) -> None:
    """The replica stack's outputs are exactly the primary stack's replica parameters."""
    r = replica_stack(replica, BucketName="checkpoints-replica", KmsKeyArn=REPLICA_KEY)
    outputs = r.outputs
    assert {
        "ReplicaRegion": outputs["Region"],
        "ReplicaBucketName": outputs["BucketName"],
        "ReplicaKmsKeyArn": outputs["KmsKeyArn"],
    } == {**REPLICA, "ReplicaBucketName": "<Bucket>"}
    assert r.properties("Bucket")["BucketName"] == "checkpoints-replica"
    rule = primary_stack(primary, **REPLICA).properties("Bucket")["ReplicationConfiguration"]["Rules"][0]
    assert rule["Destination"]["EncryptionConfiguration"]["ReplicaKmsKeyID"] == outputs["KmsKeyArn"]


@pytest.mark.parametrize("prefix", ["", "agents/"])
def test_failback_replication_only_when_enabled_and_then_back_to_the_primary(replica: dict, prefix: str) -> None:
    plain = replica_stack(replica, KeyPrefix=prefix)
    assert "ReplicationConfiguration" not in plain.properties("Bucket")
    assert not {"FailbackReplicationRole", "FailbackReplicationPolicy"} & set(plain.resources)
    assert "FailbackReplicationRoleArn" not in plain.outputs

    s = replica_stack(replica, KeyPrefix=prefix, **FAILBACK)
    config = s.properties("Bucket")["ReplicationConfiguration"]
    assert config["Role"] == "<FailbackReplicationRole.Arn>"
    (rule,) = config["Rules"]
    assert rule["Status"] == "Enabled"
    assert rule["Filter"] == {"Prefix": prefix}
    assert rule["DeleteMarkerReplication"] == {"Status": "Enabled"}
    assert rule["SourceSelectionCriteria"] == {"SseKmsEncryptedObjects": {"Status": "Enabled"}}
    assert rule["Destination"] == {
        "Bucket": "arn:aws:s3:::checkpoints",
        "EncryptionConfiguration": {"ReplicaKmsKeyID": PRIMARY_KEY},
    }
    assert s.outputs["FailbackReplicationRoleArn"] == "<FailbackReplicationRole.Arn>"
    role = s.properties("FailbackReplicationRole")
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "s3.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}
    policy = s.properties("FailbackReplicationPolicy")
    assert policy["RoleName"] == "<FailbackReplicationRole>"
    grants = statement_resources(policy["PolicyDocument"])
    assert ("s3:ReplicateObject", f"arn:aws:s3:::checkpoints/{prefix}*") in grants
    assert ("s3:GetObjectVersionForReplication", f"<Bucket.Arn>/{prefix}*") in grants
    assert ("kms:Decrypt", "<Key.Arn>") in grants
    assert ("kms:Encrypt", PRIMARY_KEY) in grants
    encrypt = next(st for st in policy["PolicyDocument"]["Statement"] if st["Action"] == "kms:Encrypt")
    assert encrypt["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}}
    decrypt = next(st for st in policy["PolicyDocument"]["Statement"] if st["Action"] == "kms:Decrypt")
    assert decrypt["Condition"] == {"StringEquals": {"kms:ViaService": "s3.eu-west-1.amazonaws.com"}}


def test_failback_role_mirrors_the_primary_replication_role(primary: dict, replica: dict) -> None:
    """The same statements, with source and destination swapped."""
    p = primary_stack(primary, KmsKeyArn=PRIMARY_KEY, BucketName="checkpoints", **REPLICA)
    r = replica_stack(replica, KmsKeyArn=REPLICA_KEY, BucketName="checkpoints-replica", **FAILBACK)
    p_doc = p.properties("ReplicationPolicy")["PolicyDocument"]
    r_doc = r.properties("FailbackReplicationPolicy")["PolicyDocument"]
    swapped = (
        repr(p_doc)
        .replace("<Bucket.Arn>", "SOURCE")
        .replace("arn:aws:s3:::checkpoints-replica", "DESTINATION")
        .replace(PRIMARY_KEY, "SOURCE_KEY")
        .replace(REPLICA_KEY, "DESTINATION_KEY")
        .replace("s3.us-east-1.", "s3.SOURCE.")
        .replace("s3.eu-west-1.", "s3.DESTINATION.")
    )
    mirrored = (
        repr(r_doc)
        .replace("<Bucket.Arn>", "SOURCE")
        .replace("arn:aws:s3:::checkpoints", "DESTINATION")
        .replace(REPLICA_KEY, "SOURCE_KEY")
        .replace(PRIMARY_KEY, "DESTINATION_KEY")
        .replace("s3.eu-west-1.", "s3.SOURCE.")
        .replace("s3.us-east-1.", "s3.DESTINATION.")
    )
    assert mirrored == swapped
    assert r.properties("FailbackReplicationRole")["AssumeRolePolicyDocument"] == p.properties("ReplicationRole")[
        "AssumeRolePolicyDocument"
    ]


def test_accept_replication_disabled_refuses_the_primarys_queue(replica: dict) -> None:
    """At failover the replica stack (its region is up) refuses replication into its
    bucket: what the primary queued is not applied over the promoted writes."""
    from infra_support import Request, allowed_by

    open_ = replica_stack(replica).properties("BucketPolicy")["PolicyDocument"]
    closed = replica_stack(replica, AcceptReplication="Disabled").properties("BucketPolicy")["PolicyDocument"]
    assert closed["Statement"][: len(open_["Statement"])] == open_["Statement"]
    (refuse,) = closed["Statement"][len(open_["Statement"]) :]
    assert refuse == {
        "Sid": "RefuseReplicationAfterFailover",
        "Effect": "Deny",
        "Principal": "*",
        "Action": ["s3:ReplicateDelete", "s3:ReplicateObject", "s3:ReplicateTags"],
        "Resource": "<Bucket.Arn>/*",
    }
    # A replication write is denied whatever allows it; the saver's calls are not touched.
    allow_all = {"Effect": "Allow", "Action": ["s3:*"], "Resource": ["<Bucket.Arn>/*"]}
    for action, denied in (("s3:ReplicateObject", True), ("s3:PutObject", False), ("s3:GetObject", False)):
        request = Request(action, "<Bucket.Arn>/agents/live/t/=/checkpoints/1")
        assert (allowed_by({"Statement": [allow_all, refuse]}, request) == []) is denied, action


@pytest.mark.parametrize("missing", ["PrimaryRegion", "PrimaryBucketName", "PrimaryKmsKeyArn"])
def test_failback_without_the_primary_is_refused_by_the_rules(replica: dict, missing: str) -> None:
    partial = {k: v for k, v in FAILBACK.items() if k != missing}
    s = replica_stack(replica, **partial)
    rule = replica["Rules"]["FailbackNeedsThePrimary"]
    assert s.value(rule["RuleCondition"]) is True
    assert not all(s.value(a["Assert"]) for a in rule["Assertions"])
    assert "ReplicationConfiguration" not in s.properties("Bucket")


# -- thread encryption: the key store and the threads' key here -------------------------------
PRIMARY_THREAD_KEY = "arn:aws:kms:us-east-1:123456789012:key/mrk-0123456789abcdef0123456789abcdef"
REPLICA_THREAD_KEY = "arn:aws:kms:eu-west-1:123456789012:key/mrk-0123456789abcdef0123456789abcdef"
ENCRYPTIONS = [
    {"ThreadEncryption": "KmsKey", "PrimaryThreadKmsKeyArn": PRIMARY_THREAD_KEY},
    {"ThreadEncryption": "KmsKey", "ThreadKmsKeyArn": REPLICA_THREAD_KEY},
    {"ThreadEncryption": "LocalKey"},
]
ENCRYPTION_IDS = ["kms-replicated-here", "kms-replica-given", "local"]


def test_no_key_store_or_thread_key_without_thread_encryption(replica: dict) -> None:
    s = replica_stack(replica, BucketName="checkpoints-replica")
    assert not {"KeyBucket", "KeyBucketPolicy", "ThreadKey"} & set(s.resources)
    assert not {"KeyBucketName", "ThreadKmsKeyArn"} & set(s.outputs)


@pytest.mark.parametrize("encryption", ENCRYPTIONS, ids=ENCRYPTION_IDS)
def test_replica_key_store_is_the_primary_key_store(primary: dict, replica: dict, encryption: dict) -> None:
    """The replica region's key store: the primary's KeyBucket, property for property,
    named as the saver's Replica(key_bucket=) default and as the primary's SaverPolicy
    grants it (<ReplicaBucketName>-keys); never versioned, replicated or backed up."""
    thread_encryption = {"ThreadEncryption": encryption["ThreadEncryption"]}
    p = primary_stack(primary, BucketName="checkpoints", **thread_encryption, **REPLICA)
    r = replica_stack(replica, BucketName="checkpoints-replica", **encryption)
    mine, theirs = r.resources["KeyBucket"], p.resources["KeyBucket"]
    assert {k: v for k, v in mine.items() if k != "Properties"} == {k: v for k, v in theirs.items() if k != "Properties"}
    mine_props, theirs_props = dict(mine["Properties"]), dict(theirs["Properties"])
    assert (mine_props.pop("BucketName"), theirs_props.pop("BucketName")) == ("checkpoints-replica-keys", "checkpoints-keys")
    for props, stack in ((mine_props, r), (theirs_props, p)):
        (rule,) = props.pop("BucketEncryption")["ServerSideEncryptionConfiguration"]
        assert rule["ServerSideEncryptionByDefault"]["KMSMasterKeyID"] == kms_key(stack)
    assert mine_props == theirs_props
    assert "VersioningConfiguration" not in mine_props and "ObjectLockConfiguration" not in mine_props
    assert "ReplicationConfiguration" not in mine_props
    assert {"Key": "s3_saver:no-backup", "Value": "true"} in mine_props["Tags"]
    assert all(mine_props["PublicAccessBlockConfiguration"].values())
    assert r.properties("KeyBucketPolicy") == p.properties("KeyBucketPolicy")
    deny = r.properties("KeyBucketPolicy")["PolicyDocument"]["Statement"][-1]
    assert deny["Effect"] == "Deny" and set(deny["Action"]) == {
        "s3:PutBucketVersioning",
        "s3:PutBucketObjectLockConfiguration",
        "s3:PutReplicationConfiguration",
    }
    assert r.outputs["KeyBucketName"] == "<KeyBucket>"
    # The primary's SaverPolicy grants this region's key store by the same name.
    granted = {res for _, res in statement_resources(p.properties("SaverPolicy")["PolicyDocument"])}
    assert "arn:aws:s3:::checkpoints-replica-keys" in granted
    assert "arn:aws:s3:::checkpoints-replica-keys/t/*" in granted


@pytest.mark.parametrize("encryption", ENCRYPTIONS, ids=ENCRYPTION_IDS)
def test_the_threads_key_is_replicated_here_from_the_primarys(replica: dict, encryption: dict) -> None:
    r = replica_stack(replica, BucketName="checkpoints-replica", **encryption)
    if encryption["ThreadEncryption"] == "LocalKey":
        assert "ThreadKey" not in r.resources and "ThreadKmsKeyArn" not in r.outputs
        return
    if "PrimaryThreadKmsKeyArn" in encryption:
        key = r.resources["ThreadKey"]
        assert key["Type"] == "AWS::KMS::ReplicaKey"
        assert key["DeletionPolicy"] == key["UpdateReplacePolicy"] == "Retain"
        assert key["Properties"]["PrimaryKeyArn"] == PRIMARY_THREAD_KEY
        assert r.outputs["ThreadKmsKeyArn"] == "<ThreadKey.Arn>"
    else:
        assert "ThreadKey" not in r.resources
        assert r.outputs["ThreadKmsKeyArn"] == REPLICA_THREAD_KEY
    # Only multi-Region keys are accepted (a single-Region key has no replica here).
    pattern = re.compile(replica["Parameters"]["PrimaryThreadKmsKeyArn"]["AllowedPattern"])
    assert pattern.match(PRIMARY_THREAD_KEY) and pattern.match("")
    assert not pattern.match(PRIMARY_KEY)


@pytest.mark.parametrize(
    ("parameters", "refused"),
    [
        ({"ThreadEncryption": "LocalKey"}, "ThreadEncryptionNeedsTheBucketName"),
        ({"ThreadEncryption": "KmsKey", "BucketName": "b-replica"}, "ThreadKeyNeedsThePrimaryKey"),
    ],
)
def test_thread_encryption_without_its_names_is_refused_by_the_rules(replica: dict, parameters: dict, refused: str) -> None:
    s = replica_stack(replica, **parameters)
    for name, rule in replica["Rules"].items():
        holds = s.value(rule["RuleCondition"]) and not all(s.value(a["Assert"]) for a in rule["Assertions"])
        assert holds == (name == refused), name
    complete = replica_stack(replica, **{**parameters, "BucketName": "b-replica", "PrimaryThreadKmsKeyArn": PRIMARY_THREAD_KEY})
    for rule in replica["Rules"].values():
        assert not complete.value(rule["RuleCondition"]) or all(complete.value(a["Assert"]) for a in rule["Assertions"])


@pytest.mark.parametrize("mode", ["dynamodb", "global-table", "manifest"])
@pytest.mark.parametrize("encryption", ENCRYPTIONS, ids=ENCRYPTION_IDS)
def test_replica_policies_grant_this_regions_key_store_and_thread_key(replica: dict, mode: str, encryption: dict) -> None:
    """The reader reads key records (404 for a key not arrived: s3:ListBucket) and unwraps
    them with this region's replica of the threads' key; the promote policy makes and
    destroys them here. The memory store's records (m/) only where its index can be here;
    the node cache's (@store) not at all, as the node cache is not granted."""
    prefix = "agents/"
    s = replica_stack(replica, BucketName="checkpoints-replica", IndexMode=mode, KeyPrefix=prefix, TableName="idx", **encryption)
    reader, promote = reader_and_promote(s)
    records = [f"<KeyBucket.Arn>/{prefix}t/*"] + ([] if mode == "dynamodb" else [f"<KeyBucket.Arn>/{prefix}m/*"])
    key_store = lambda doc: sorted((a, r) for a, r in statement_resources(doc) if "KeyBucket" in r)
    assert key_store(reader) == sorted([("s3:GetObject", r) for r in records] + [("s3:ListBucket", "<KeyBucket.Arn>")])
    assert key_store(promote) == sorted(("s3:PutObject", r) for r in records)
    thread_key = "<ThreadKey.Arn>" if "PrimaryThreadKmsKeyArn" in encryption else encryption.get("ThreadKmsKeyArn")
    contexts = ["s3_saver:thread"] + ([] if mode == "dynamodb" else ["s3_saver:namespace"])
    for doc, action in ((reader, "kms:Decrypt"), (promote, "kms:GenerateDataKey")):
        statements = [st for st in doc["Statement"] if thread_key and st["Resource"] == thread_key]
        bound = sorted(key for st in statements for key, value in st["Condition"]["StringLike"].items() if value == "*")
        assert bound == ([f"kms:EncryptionContext:{c}" for c in sorted(contexts)] if thread_key else [])
        assert all(st["Action"] == action for st in statements)
        # The key store's SSE-KMS: this stack's key, through S3, for the key store only.
        (sse,) = [st for st in doc["Statement"] if st.get("Sid", "").endswith("ThreadKeyRecordsEncryption")]
        assert sse["Action"] == action and sse["Resource"] == "<Key.Arn>"
        assert sse["Condition"]["StringEquals"] == {"kms:ViaService": "s3.eu-west-1.amazonaws.com"}
        assert sse["Condition"]["StringLike"] == {"kms:EncryptionContext:aws:s3:arn": ["<KeyBucket.Arn>", *records]}


# -- the table ---------------------------------------------------------------------------
@pytest.mark.parametrize("kms", ["", REPLICA_KEY], ids=["created-key", "given-key"])
def test_replica_table_is_the_primary_table(primary: dict, replica: dict, kms: str) -> None:
    r = replica_stack(replica, KmsKeyArn=kms, TableName="checkpoints-index")
    p = primary_stack(primary, KmsKeyArn=kms, TableName="checkpoints-index")
    mine, theirs = r.resources["Table"], p.resources["Table"]
    # Each under its own condition (CreateTable here, UsePlainTable there).
    assert {k: v for k, v in mine.items() if k not in ("Properties", "Condition")} == {
        k: v for k, v in theirs.items() if k not in ("Properties", "Condition")
    }
    assert mine["Properties"] == theirs["Properties"], "key schema, billing, TTL, PITR, KMS, deletion protection"
    assert mine["Properties"]["KeySchema"] == list(TABLE_KEY_SCHEMA)
    assert mine["Properties"]["TimeToLiveSpecification"] == {"AttributeName": TTL_ATTRIBUTE, "Enabled": True}
    assert mine["Properties"]["SSESpecification"]["KMSMasterKeyId"] == kms_key(r)
    assert r.outputs["TableName"] == "<Table>"
    assert r.outputs["TableArn"] == "<Table.Arn>"


@pytest.mark.parametrize("mode", ["global-table", "manifest"])
def test_no_table_here_unless_dynamodb_mode(replica: dict, mode: str) -> None:
    s = replica_stack(replica, IndexMode=mode, TableName="checkpoints-index")
    assert "Table" not in s.resources
    if mode == "manifest":
        assert not {"TableName", "TableArn"} & set(s.outputs)
    else:
        # The global table's replica here, created by the primary stack.
        assert s.outputs["TableName"] == "checkpoints-index"
        assert s.outputs["TableArn"] == "arn:aws:dynamodb:eu-west-1:123456789012:table/checkpoints-index"


def test_global_table_mode_needs_the_table_name(replica: dict) -> None:
    rule = replica["Rules"]["GlobalTableNeedsItsName"]
    s = replica_stack(replica, IndexMode="global-table")
    assert s.value(rule["RuleCondition"]) is True
    assert not all(s.value(a["Assert"]) for a in rule["Assertions"])
    named = replica_stack(replica, IndexMode="global-table", TableName="idx")
    assert all(named.value(a["Assert"]) for a in rule["Assertions"])
    assert replica_stack(replica).value(rule["RuleCondition"]) is False


# -- the primary's global-table mode ---------------------------------------------------------
@pytest.mark.parametrize("kms", ["", PRIMARY_KEY], ids=["created-key", "given-key"])
def test_global_table_is_the_table_with_a_replica_in_the_replica_region(primary: dict, kms: str) -> None:
    plain = primary_stack(primary, KmsKeyArn=kms, TableName="checkpoints-index", **REPLICA)
    s = primary_stack(primary, KmsKeyArn=kms, TableName="checkpoints-index", GlobalTable="Enabled", **REPLICA)
    assert "Table" not in s.resources and "GlobalIndexTable" not in plain.resources
    table = plain.resources["Table"]
    global_table = s.resources["GlobalIndexTable"]
    assert global_table["Type"] == "AWS::DynamoDB::GlobalTable"
    assert global_table["DeletionPolicy"] == global_table["UpdateReplacePolicy"] == "Retain"
    g, t = global_table["Properties"], table["Properties"]
    # Table-wide: the same name, keys, billing and TTL as the plain table.
    for name in ("TableName", "BillingMode", "AttributeDefinitions", "KeySchema", "TimeToLiveSpecification"):
        assert g[name] == t[name], name
    key = lambda d: d["AttributeName"]  # noqa: E731
    assert sorted(g["AttributeDefinitions"], key=key) == sorted(TABLE_ATTRIBUTE_DEFINITIONS, key=key)
    assert "GlobalSecondaryIndexes" not in g and "LocalSecondaryIndexes" not in g
    assert g["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}, "required with two replicas"
    assert g["SSESpecification"] == {"SSEEnabled": True, "SSEType": "KMS"}
    # Per region: the plain table's protections, each region with its own key.
    here, there = g["Replicas"]
    assert (here["Region"], there["Region"]) == (PRIMARY_REGION, REPLICA_REGION)
    for replica_spec, key_arn in ((here, kms_key(s)), (there, REPLICA_KEY)):
        assert replica_spec["PointInTimeRecoverySpecification"] == t["PointInTimeRecoverySpecification"]
        assert replica_spec["DeletionProtectionEnabled"] is t["DeletionProtectionEnabled"] is True
        assert replica_spec["SSESpecification"] == {"KMSMasterKeyId": key_arn}
    assert t["SSESpecification"]["KMSMasterKeyId"] == kms_key(s)
    # Everything else still names the table, now the global one.
    assert s.outputs["TableName"] == "<GlobalIndexTable>"
    assert s.outputs["TableArn"] == "<GlobalIndexTable.Arn>"
    policy = repr(s.properties("SaverPolicy"))
    assert policy == repr(plain.properties("SaverPolicy")).replace("<Table", "<GlobalIndexTable")


def test_global_table_only_with_the_replica(primary: dict) -> None:
    s = primary_stack(primary, GlobalTable="Enabled")
    assert "GlobalIndexTable" not in s.resources and "Table" in s.resources
    rule = primary["Rules"]["GlobalTableNeedsTheReplica"]
    assert s.value(rule["RuleCondition"]) is True
    assert not all(s.value(a["Assert"]) for a in rule["Assertions"])
    full = primary_stack(primary, GlobalTable="Enabled", **REPLICA)
    assert all(full.value(a["Assert"]) for a in rule["Assertions"])


def test_replica_stack_in_global_table_mode_names_the_global_table_replica(primary: dict, replica: dict) -> None:
    """The primary's GlobalTable puts a replica in the replica region, encrypted with the
    replica stack's key; the replica stack's policies name that table and that key."""
    p = primary_stack(primary, TableName="idx", GlobalTable="Enabled", **REPLICA)
    r = replica_stack(replica, IndexMode="global-table", TableName="idx", KmsKeyArn=REPLICA_KEY)
    (_, there) = p.properties("GlobalIndexTable")["Replicas"]
    assert there["Region"] == r.outputs["Region"]
    assert there["SSESpecification"]["KMSMasterKeyId"] == r.outputs["KmsKeyArn"]
    assert p.properties("GlobalIndexTable")["TableName"] == r.outputs["TableName"]
    for policy in ("ReplicaReaderPolicy", "ReplicaPromotePolicy"):
        dynamodb = {res for a, res in statement_resources(r.properties(policy)["PolicyDocument"]) if a.startswith("dynamodb:")}
        assert dynamodb == {"arn:aws:dynamodb:eu-west-1:123456789012:table/idx"}, policy


# -- the policies ------------------------------------------------------------------------------
MODES = ["dynamodb", "global-table", "manifest"]


def reader_and_promote(s: Stack) -> tuple[dict, dict]:
    return (
        s.properties("ReplicaReaderPolicy")["PolicyDocument"],
        s.properties("ReplicaPromotePolicy")["PolicyDocument"],
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefix", ["", "agents/prod/"])
def test_replica_policies_are_scoped_to_the_replica_stack(replica: dict, mode: str, prefix: str) -> None:
    s = replica_stack(replica, IndexMode=mode, KeyPrefix=prefix, TableName="idx")
    table = "<Table.Arn>" if mode == "dynamodb" else "arn:aws:dynamodb:eu-west-1:123456789012:table/idx"
    objects = {f"<Bucket.Arn>/{prefix}{sub}*" for sub in (LIVE_PREFIX, ARCHIVE_PREFIX)}
    if mode == "manifest":
        objects.add(f"<Bucket.Arn>/{prefix}{MANIFEST_PREFIX}*")
    if mode != "dynamodb":
        # The memory store, where this region holds its index (a table promote()
        # rebuilds holds none of its items: S3Store.from_saver refuses that replica).
        objects.add(f"<Bucket.Arn>/{prefix}{MEMORY_PREFIX}*")
    reader, promote = reader_and_promote(s)
    assert sorted(statement_resources(reader)) == sorted(
        [("s3:GetObject", o) for o in objects]
        + [("s3:ListBucket", "<Bucket.Arn>")]
        + ([] if mode == "manifest" else [(f"dynamodb:{a}", table) for a in ("BatchGetItem", "GetItem", "Query", "Scan")])
        + [("kms:Decrypt", "<Key.Arn>")] * (1 if mode == "manifest" else 2)
    )
    writable = set(objects)
    if mode == "manifest":
        writable.add(f"<Bucket.Arn>/{prefix}{LISTING_PREFIX}*")
    promote_s3 = {(a, r) for a, r in statement_resources(promote) if a.startswith("s3:")}
    assert promote_s3 == {(a, o) for a in ("s3:PutObject", "s3:DeleteObject") for o in writable} | {
        ("s3:RestoreObject", f"<Bucket.Arn>/{prefix}{ARCHIVE_PREFIX}*")
    }
    promote_dynamodb = {r for a, r in statement_resources(promote) if a.startswith("dynamodb:")}
    assert promote_dynamodb == (set() if mode == "manifest" else {table})
    # KMS only through this region's S3 for this bucket, and DynamoDB for this table.
    for doc in (reader, promote):
        for statement in doc["Statement"]:
            if not str(statement["Action"]).startswith("kms:"):
                continue
            assert statement["Resource"] == "<Key.Arn>"
            condition = statement["Condition"]
            service = condition["StringEquals"]["kms:ViaService"]
            assert service in ("s3.eu-west-1.amazonaws.com", "dynamodb.eu-west-1.amazonaws.com")
            if service.startswith("s3."):
                assert condition["StringLike"] == {
                    "kms:EncryptionContext:aws:s3:arn": ["<Bucket.Arn>", f"<Bucket.Arn>/{prefix}*"]
                }
            else:
                assert condition["StringEquals"]["kms:EncryptionContext:aws:dynamodb:tableName"] == (
                    "<Table>" if mode == "dynamodb" else "idx"
                )
    outputs = s.outputs
    assert (outputs["ReaderPolicyArn"], outputs["PromotePolicyArn"]) == ("<ReplicaReaderPolicy>", "<ReplicaPromotePolicy>")
    assert outputs["BucketArn"] == "<Bucket.Arn>" and outputs["Region"] == REPLICA_REGION
    assert outputs.get("KeyPrefix") == (prefix or None)


@pytest.mark.parametrize("encryption", [{}, *ENCRYPTIONS], ids=["plain", *ENCRYPTION_IDS])
@pytest.mark.parametrize("mode", MODES)
def test_promote_policy_adds_only_what_the_reader_lacks(replica: dict, mode: str, encryption: dict) -> None:
    """The two are attached together: a grant in both would hide which one needs it."""
    s = replica_stack(replica, IndexMode=mode, TableName="idx", BucketName="b-replica", **encryption)
    reader, promote = reader_and_promote(s)
    assert {a for a, _ in statement_resources(reader)}.isdisjoint({a for a, _ in statement_resources(promote)})


@pytest.mark.parametrize("encryption", ["Disabled", "KmsKey", "LocalKey"])
@pytest.mark.parametrize("mode", ["dynamodb", "global-table"])
def test_reader_and_promote_together_are_the_saver_policy_plus_list_bucket(
    primary: dict, replica: dict, mode: str, encryption: str
) -> None:
    """In DynamoDB mode a promoted replica runs the same saver as the primary: the
    primary's SaverPolicy, on the replica's bucket, table and key, plus s3:ListBucket
    (rebuild; missing objects answered 404 during replication lag), minus the node
    cache's grants (the replica policies are the saver's and, with a global table, the
    memory store's; infra/README.md, "Replica region")."""
    prefix = "agents/"
    # With ThreadEncryption, the primary stack without a replica (its SaverPolicy grants
    # only its own key store and key): the replica's grant the same on their own.
    threads = {} if encryption == "Disabled" else {"ThreadEncryption": encryption}
    primary_key = {"PrimaryThreadKmsKeyArn": PRIMARY_THREAD_KEY} if encryption == "KmsKey" else {}
    p = primary_stack(primary, KeyPrefix=prefix, TableName="idx", **threads)
    r = replica_stack(replica, KeyPrefix=prefix, IndexMode=mode, TableName="idx", BucketName="b-replica", **threads, **primary_key)
    table_arn = "<Table.Arn>" if mode == "dynamodb" else "arn:aws:dynamodb:eu-west-1:123456789012:table/idx"
    saver = {(a, res.replace("<Table.Arn>", table_arn)) for a, res in statement_resources(p.properties("SaverPolicy")["PolicyDocument"])}
    reader, promote = reader_and_promote(r)
    together = set(statement_resources(reader)) | set(statement_resources(promote))
    node_cache = {(a, res) for a, res in saver if res == "<Bucket.Arn>/agents/node-cache/*"}
    assert node_cache == {("s3:GetObject", "<Bucket.Arn>/agents/node-cache/*"), ("s3:PutObject", "<Bucket.Arn>/agents/node-cache/*")}
    memory = {(a, res) for a, res in saver if res == "<Bucket.Arn>/agents/memory/*"}
    assert memory == {(a, "<Bucket.Arn>/agents/memory/*") for a in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")}
    # A table promote() rebuilds holds no memory item: no store lives in that region.
    without = node_cache | (memory if mode == "dynamodb" else set())
    # Nor its keys (m/); the node cache's store-wide key (@store) nowhere.
    key_records = {(a, res) for a, res in saver if res.startswith("<KeyBucket.Arn>/agents/")}
    without |= {(a, res) for a, res in key_records if res.endswith("@store") or (mode == "dynamodb" and res.endswith("/m/*"))}
    if encryption != "Disabled":
        assert {res for _, res in key_records} == {f"<KeyBucket.Arn>/agents/{r}" for r in ("t/*", "m/*", "@store")}
        assert ("s3:ListBucket", "<KeyBucket.Arn>") in saver
    assert ("kms:Decrypt", "<ThreadKey.Arn>") in saver if encryption == "KmsKey" else "<ThreadKey.Arn>" not in repr(saver)
    assert together == (saver - without) | {("s3:ListBucket", "<Bucket.Arn>")}


@pytest.mark.parametrize("mode", MODES)
def test_replica_policies_have_no_wildcard_actions_or_resources(replica: dict, mode: str) -> None:
    s = replica_stack(replica, IndexMode=mode, TableName="idx", KeyPrefix="a/b/", BucketName="b-replica", **FAILBACK, **ENCRYPTIONS[0])
    assert "ThreadKey" in s.resources
    for name, resource in s.resources.items():
        props = resource["Properties"]
        if "PolicyDocument" not in props or resource["Type"] == "AWS::S3::BucketPolicy":
            continue
        for statement in props["PolicyDocument"]["Statement"]:
            assert statement["Effect"] == "Allow", (name, statement)
            for action in as_list(statement["Action"]):
                assert "*" not in action and "?" not in action, (name, action)
            for res in as_list(statement["Resource"]):
                assert res != "*" and not res.endswith(":*"), (name, res)
                assert "*" not in res.removesuffix("/*") and "?" not in res, (name, res)


def test_template_text_names_every_saver_sub_prefix() -> None:
    """The sub-prefixes are pasted into the template as text: they must be the saver's."""
    from s3_saver._format.key_codec import MEMORY_PREFIX as saver_memory
    from s3_saver._format.keys import LISTING_PREFIX as saver_listing
    from s3_saver._format.keys import MANIFEST_PREFIX as saver_manifests

    assert (MANIFEST_PREFIX, LISTING_PREFIX, MEMORY_PREFIX) == (saver_manifests, saver_listing, saver_memory)
    text = REPLICA_TEMPLATE.read_text()
    for sub in (LIVE_PREFIX, ARCHIVE_PREFIX, MANIFEST_PREFIX, LISTING_PREFIX, MEMORY_PREFIX):
        assert re.search(r"\$\{KeyPrefix\}" + re.escape(sub) + r"\*", text), sub

