"""infra/template.yaml, property by property: the template is loaded with
CloudFormation's short tags and evaluated for several parameter sets (conditions
decided, ``!Sub``/``!If`` resolved), then checked against what issue 4 asks and
against the constants the saver itself uses."""

from __future__ import annotations

import re

import pytest
from infra_support import REPO, Stack, load_template, statement_resources

from s3_saver._format.key_codec import MEMORY_PREFIX, NODE_CACHE_PREFIX
from s3_saver._format.keys import LISTING_PREFIX, MANIFEST_PREFIX, SET_ASIDE_PREFIX, KeyLayout

from s3_saver import (
    ARCHIVE_PREFIX,
    ConfigurationError,
    LIVE_PREFIX,
    TABLE_ATTRIBUTE_DEFINITIONS,
    TABLE_GLOBAL_SECONDARY_INDEXES,
    TABLE_KEY_SCHEMA,
    TTL_ATTRIBUTE,
)

KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
REPLICA = {
    "ReplicaRegion": "eu-west-1",
    "ReplicaBucketName": "checkpoints-replica",
    "ReplicaKmsKeyArn": "arn:aws:kms:eu-west-1:123456789012:key/66666666-7777-8888-9999-000000000000",
}


@pytest.fixture(scope="module")
def template() -> dict:
    return load_template()


def stack(template: dict, **parameters: str) -> Stack:
    return Stack(template, parameters)


def kms_key(s: Stack) -> str:
    return s.value({"Fn::If": ["CreateKmsKey", {"Fn::GetAtt": ["Key", "Arn"]}, {"Ref": "KmsKeyArn"}]})


# -- parameters ------------------------------------------------------------------------
def test_parameters_have_defaults_descriptions_and_readme_entries(template: dict) -> None:
    params = template["Parameters"]
    # The list; more may exist.
    for name in (
        "BucketName",
        "TableName",
        "KeyPrefix",
        "RetentionDays",
        "ArchiveTransitionDays",
        "KmsKeyArn",
        "ReplicaRegion",
        "ReplicaBucketName",
    ):
        assert name in params, name
    readme = (REPO / "infra" / "README.md").read_text()
    for name, spec in params.items():
        assert "Default" in spec, f"{name}: a stack must deploy with no parameters"
        assert spec.get("Description"), name
        assert f"`{name}`" in readme, f"infra/README.md does not document {name}"
    assert params["RetentionDays"]["Default"] == 0, "0 = keep forever is the default"
    for name in ("RetentionDays", "ArchiveTransitionDays", "ArchiveDeepArchiveDays", "ArchiveRetentionDays"):
        assert params[name]["Type"] == "Number" and params[name]["MinValue"] == 0


@pytest.mark.parametrize("prefix", ["", "agents/", "agents/prod-1/", "a.b_c(d)/x/", "lives/", "archive-2/", "memories/"])
def test_key_prefix_accepts_what_the_saver_uses_as_is(template: dict, prefix: str) -> None:
    assert re.fullmatch(template["Parameters"]["KeyPrefix"]["AllowedPattern"], prefix)


@pytest.mark.parametrize("prefix", ["agents", "/agents/", "agents//", "a*/", "a?/", "a b/"])
def test_key_prefix_rejects_what_would_widen_or_shift_the_iam_resource(template: dict, prefix: str) -> None:
    # The saver appends "/" to a prefix without one; the template pastes the prefix
    # into ARNs, where "*" and "?" are wildcards.
    assert not re.fullmatch(template["Parameters"]["KeyPrefix"]["AllowedPattern"], prefix)


@pytest.mark.parametrize(
    "prefix", ["live/", "agents/archive/", "x/Manifests/", "listing/a/", "set-aside/", "memory/", "node-cache/", "a/Node-Cache/", "./", "a/../"]
)
def test_key_prefix_rejects_what_the_saver_refuses(template: dict, prefix: str) -> None:
    # A prefix that lies inside another saver's folders (or has a "." or ".." segment)
    # is refused by S3Saver: the stack refuses it at deploy time, not at the first call.
    assert not re.fullmatch(template["Parameters"]["KeyPrefix"]["AllowedPattern"], prefix)
    with pytest.raises(ConfigurationError):
        KeyLayout(prefix)


# -- bucket ------------------------------------------------------------------------------
@pytest.mark.parametrize("kms", ["", KEY_ARN], ids=["created-key", "given-key"])
def test_bucket_is_private_owner_enforced_versioned_and_kms_encrypted(template: dict, kms: str) -> None:
    s = stack(template, KmsKeyArn=kms)
    resources = s.resources
    bucket = resources["Bucket"]
    assert bucket["Type"] == "AWS::S3::Bucket"
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"
    props = bucket["Properties"]
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": kms_key(s)}
    assert rule["BucketKeyEnabled"] is True
    if kms:
        assert kms_key(s) == KEY_ARN
        assert "Key" not in resources and "KeyAlias" not in resources
    else:
        assert kms_key(s) == "<Key.Arn>"
        key = resources["Key"]
        assert key["Properties"]["EnableKeyRotation"] is True
        assert key["DeletionPolicy"] == "Retain"
        for statement in key["Properties"]["KeyPolicy"]["Statement"]:
            assert statement["Principal"] == {"AWS": "arn:aws:iam::123456789012:root"}, statement
    assert s.outputs["KmsKeyArn"] == kms_key(s)


def test_bucket_policy_denies_requests_without_tls(template: dict) -> None:
    s = stack(template)
    policy = s.properties("BucketPolicy")
    assert policy["Bucket"] == "<Bucket>"
    denies = [
        st
        for st in policy["PolicyDocument"]["Statement"]
        if st["Effect"] == "Deny"
        and st["Principal"] == "*"
        and st["Action"] == "s3:*"
        and st.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
    ]
    assert len(denies) == 1
    assert sorted(denies[0]["Resource"]) == ["<Bucket.Arn>", "<Bucket.Arn>/*"]


def lifecycle(s: Stack) -> dict[str, dict]:
    rules = s.properties("Bucket")["LifecycleConfiguration"]["Rules"]
    return {rule["Id"]: rule for rule in rules}


def expiring_rules_over(rules: dict[str, dict], key: str) -> list[str]:
    """Ids of enabled rules that expire current versions of ``key``."""
    return [
        rid
        for rid, rule in rules.items()
        if rule["Status"] == "Enabled" and "ExpirationInDays" in rule and key.startswith(rule.get("Prefix", ""))
    ]


@pytest.mark.parametrize("prefix", ["", "agents/prod/"])
def test_live_prefix_expires_after_retention_days_only_when_set(template: dict, prefix: str) -> None:
    live_object = f"{prefix}{LIVE_PREFIX}thread/ns/checkpoints/1"
    rules = lifecycle(stack(template, KeyPrefix=prefix, RetentionDays="0"))
    assert expiring_rules_over(rules, live_object) == [], "RetentionDays=0 keeps checkpoints forever"

    rules = lifecycle(stack(template, KeyPrefix=prefix, RetentionDays="30"))
    (rid,) = expiring_rules_over(rules, live_object)
    assert rules[rid]["Prefix"] == f"{prefix}{LIVE_PREFIX}"
    assert int(rules[rid]["ExpirationInDays"]) == 30
    # Expiry of the live prefix never touches archived threads.
    assert expiring_rules_over(rules, f"{prefix}{ARCHIVE_PREFIX}thread/x") == []


@pytest.mark.parametrize(
    ("ir", "deep", "keep", "transitions"),
    [
        ("30", "0", "0", [("GLACIER_IR", 30)]),
        ("30", "180", "3650", [("GLACIER_IR", 30), ("DEEP_ARCHIVE", 180)]),
        ("0", "90", "0", [("DEEP_ARCHIVE", 90)]),
        ("0", "0", "400", []),
        ("0", "0", "0", None),
    ],
)
def test_archive_prefix_moves_to_glacier_classes(
    template: dict, ir: str, deep: str, keep: str, transitions: list | None
) -> None:
    prefix = "agents/"
    rules = lifecycle(
        stack(
            template,
            KeyPrefix=prefix,
            ArchiveTransitionDays=ir,
            ArchiveDeepArchiveDays=deep,
            ArchiveRetentionDays=keep,
        )
    )
    config = stack(template).properties("Bucket")["LifecycleConfiguration"]
    assert config["TransitionDefaultMinimumObjectSize"] == "all_storage_classes_128K"
    archive = [r for r in rules.values() if r.get("Prefix") == f"{prefix}{ARCHIVE_PREFIX}"]
    if transitions is None:
        assert archive == []
        return
    (rule,) = archive
    assert rule["Status"] == "Enabled"
    got = [(t["StorageClass"], int(t["TransitionInDays"])) for t in rule.get("Transitions", [])]
    assert got == transitions
    if keep == "0":
        assert "ExpirationInDays" not in rule
    else:
        assert int(rule["ExpirationInDays"]) == int(keep)


def test_versions_and_uploads_are_cleaned_up(template: dict) -> None:
    rules = lifecycle(stack(template, NoncurrentVersionDays="14"))
    cleanup = [r for r in rules.values() if "Prefix" not in r and "Filter" not in r]
    assert len(cleanup) == 1, "one bucket-wide rule"
    (rule,) = cleanup
    assert rule["Status"] == "Enabled"
    assert int(rule["NoncurrentVersionExpiration"]["NoncurrentDays"]) == 14
    assert rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] >= 1
    assert rule["ExpiredObjectDeleteMarker"] is True


@pytest.mark.parametrize("prefix", ["", "agents/"])
def test_replaced_manifest_heads_expire_after_a_day_and_nothing_else_does(template: dict, prefix: str) -> None:
    """The rule setup() and verify look for (``_ops/versioning``): noncurrent
    versions under the manifest prefix go after 1 day; other prefixes keep the
    bucket-wide NoncurrentVersionDays."""
    from s3_saver._format.keys import MANIFEST_PREFIX
    from s3_saver._ops.versioning import _expires_noncurrent

    rules = lifecycle(stack(template, KeyPrefix=prefix, NoncurrentVersionDays="30"))
    heads = rules["ExpireReplacedManifestHeads"]
    assert heads["Prefix"] == f"{prefix}{MANIFEST_PREFIX}"
    assert int(heads["NoncurrentVersionExpiration"]["NoncurrentDays"]) == 1
    assert set(heads) == {"Id", "Status", "Prefix", "NoncurrentVersionExpiration"}, "it expires no current object"
    assert _expires_noncurrent(heads, f"{prefix}{MANIFEST_PREFIX}")
    assert not _expires_noncurrent(heads, f"{prefix}{LIVE_PREFIX}")


@pytest.mark.parametrize("prefix", ["", "agents/"])
def test_node_cache_expires_after_31_days_and_its_replaced_entries_after_one(template: dict, prefix: str) -> None:
    """S3Cache takes an entry older than MAX_AGE_SECONDS (30 days) for a miss, so the
    rule may remove its objects, the generations document included, a day later."""
    from s3_saver._format.node_cache import GENS_NAME, MAX_AGE_SECONDS

    rules = lifecycle(stack(template, KeyPrefix=prefix, RetentionDays="0"))
    gens, entry = f"{prefix}{NODE_CACHE_PREFIX}{GENS_NAME}", f"{prefix}{NODE_CACHE_PREFIX}e/ns/key"
    assert expiring_rules_over(rules, gens) == expiring_rules_over(rules, entry) == ["ExpireNodeCache"]
    rule = rules["ExpireNodeCache"]
    assert rule["Prefix"] == f"{prefix}{NODE_CACHE_PREFIX}"
    assert int(rule["ExpirationInDays"]) * 86400 > MAX_AGE_SECONDS
    assert int(rule["NoncurrentVersionExpiration"]["NoncurrentDays"]) == 1
    # It touches no thread's objects.
    for sub in (LIVE_PREFIX, ARCHIVE_PREFIX, MANIFEST_PREFIX, LISTING_PREFIX, SET_ASIDE_PREFIX):
        assert expiring_rules_over(rules, f"{prefix}{sub}x") == []


@pytest.mark.parametrize("retention", ["0", "30"])
@pytest.mark.parametrize("prefix", ["", "agents/"])
def test_memory_is_never_expired_and_its_replaced_heads_go_after_a_day(template: dict, prefix: str, retention: str) -> None:
    """S3Store's objects are a user's memory: no rule expires a current one (not the
    checkpoints' RetentionDays: an item's own ttl is the store's to keep); each put
    replaces its namespace's head, and the replaced versions go after a day."""
    for name, doc in (("template", template), ("replica", load_template(REPO / "infra" / "replica.yaml"))):
        rules = lifecycle(stack(doc, KeyPrefix=prefix, RetentionDays=retention))
        for key in ("n/0123/@head", "@reg/head", "n/0123/@v/token"):
            assert expiring_rules_over(rules, f"{prefix}{MEMORY_PREFIX}{key}") == [], (name, key)
        heads = rules["ExpireReplacedMemoryHeads"]
        assert heads["Prefix"] == f"{prefix}{MEMORY_PREFIX}"
        assert int(heads["NoncurrentVersionExpiration"]["NoncurrentDays"]) == 1
        assert set(heads) == {"Id", "Status", "Prefix", "NoncurrentVersionExpiration"}, "it expires no current object"


@pytest.mark.parametrize("prefix", ["", "agents/"])
def test_replication_only_with_a_replica_and_then_complete(template: dict, prefix: str) -> None:
    plain = stack(template, KeyPrefix=prefix)
    assert "ReplicationConfiguration" not in plain.properties("Bucket")
    assert "ReplicationRole" not in plain.resources and "ReplicationRole" not in plain.outputs

    s = stack(template, KeyPrefix=prefix, **REPLICA)
    props = s.properties("Bucket")
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}, "replication needs versioning"
    config = props["ReplicationConfiguration"]
    assert config["Role"] == "<ReplicationRole.Arn>"
    (rule,) = config["Rules"]
    assert rule["Status"] == "Enabled"
    assert rule["Filter"] == {"Prefix": prefix}, "replicates live/ and archive/ of this saver"
    assert rule["SourceSelectionCriteria"] == {"SseKmsEncryptedObjects": {"Status": "Enabled"}}
    assert rule["Destination"] == {
        "Bucket": f"arn:aws:s3:::{REPLICA['ReplicaBucketName']}",
        "EncryptionConfiguration": {"ReplicaKmsKeyID": REPLICA["ReplicaKmsKeyArn"]},
    }
    assert rule["DeleteMarkerReplication"] == {"Status": "Enabled"}

    role = s.properties("ReplicationRole")
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "s3.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}
    policy = s.properties("ReplicationPolicy")
    assert policy["RoleName"] == "<ReplicationRole>"
    grants = statement_resources(policy["PolicyDocument"])
    assert ("s3:ReplicateObject", f"arn:aws:s3:::{REPLICA['ReplicaBucketName']}/{prefix}*") in grants
    assert ("s3:GetObjectVersionForReplication", f"<Bucket.Arn>/{prefix}*") in grants
    assert ("kms:Decrypt", "<Key.Arn>") in grants
    assert ("kms:Encrypt", REPLICA["ReplicaKmsKeyArn"]) in grants
    encrypt = next(st for st in policy["PolicyDocument"]["Statement"] if st["Action"] == "kms:Encrypt")
    assert encrypt["Condition"] == {"StringEquals": {"kms:ViaService": "s3.eu-west-1.amazonaws.com"}}


@pytest.mark.parametrize("missing", sorted(REPLICA))
def test_a_partial_replica_is_refused_by_the_template_rules(template: dict, missing: str) -> None:
    """ReplicaBucketName without its region or key fails at deploy (Rules), never silently."""
    partial = {k: v for k, v in REPLICA.items() if k != missing}
    s = stack(template, **partial)
    if missing == "ReplicaBucketName":
        assert "ReplicationConfiguration" not in s.properties("Bucket")
        return
    rule = template["Rules"]["ReplicaNeedsRegionAndKey"]
    assert s.value(rule["RuleCondition"]) is True
    assert not all(s.value(a["Assert"]) for a in rule["Assertions"])


# -- table -------------------------------------------------------------------------------
def test_table_matches_the_saver(template: dict) -> None:
    s = stack(template, KmsKeyArn=KEY_ARN)
    table = s.resources["Table"]
    assert table["Type"] == "AWS::DynamoDB::Table"
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    props = table["Properties"]
    assert props["KeySchema"] == list(TABLE_KEY_SCHEMA)
    key = lambda d: d["AttributeName"]  # noqa: E731
    assert sorted(props["AttributeDefinitions"], key=key) == sorted(TABLE_ATTRIBUTE_DEFINITIONS, key=key)
    gsis = props.get("GlobalSecondaryIndexes", [])
    assert [g["IndexName"] for g in gsis] == [g["IndexName"] for g in TABLE_GLOBAL_SECONDARY_INDEXES]
    assert gsis == list(TABLE_GLOBAL_SECONDARY_INDEXES)
    assert "LocalSecondaryIndexes" not in props
    assert props["TimeToLiveSpecification"] == {"AttributeName": TTL_ATTRIBUTE, "Enabled": True}
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"] == {"SSEEnabled": True, "SSEType": "KMS", "KMSMasterKeyId": KEY_ARN}
    assert props["DeletionProtectionEnabled"] is True


def test_manifest_mode_has_no_table(template: dict) -> None:
    """IndexMode manifest: no table, no DynamoDB right, no table output; the default
    (dynamodb) deploys what stacks deployed before the parameter existed."""
    assert template["Parameters"]["IndexMode"]["Default"] == "dynamodb"
    s = stack(template, IndexMode="manifest", KmsKeyArn=KEY_ARN, **REPLICA)
    assert not {"Table", "GlobalIndexTable"} & set(s.resources)
    policy = s.properties("SaverPolicy")["PolicyDocument"]
    assert not [a for a, _ in statement_resources(policy) if not a.startswith(("s3:", "kms:"))]
    assert [st["Sid"] for st in policy["Statement"] if "dynamodb" in str(st)] == []
    assert not {"TableName", "TableArn"} & set(s.outputs)
    assert s.outputs["IndexMode"] == "manifest"
    assert {"Table"} <= set(stack(template).resources) and stack(template).outputs["IndexMode"] == "dynamodb"


@pytest.mark.parametrize(
    ("rule", "params"),
    [
        ("GlobalTableNeedsATable", {"IndexMode": "manifest", "GlobalTable": "Enabled", **REPLICA}),
        ("ManifestModeHasNoTable", {"IndexMode": "manifest", "TableName": "my-index"}),
    ],
)
def test_manifest_mode_refuses_table_parameters(template: dict, rule: str, params: dict) -> None:
    """A table parameter that the manifest mode would ignore fails at deploy (Rules)."""
    s = stack(template, **params)
    spec = template["Rules"][rule]
    assert s.value(spec["RuleCondition"]) is True
    assert not all(s.value(a["Assert"]) for a in spec["Assertions"])
    # The same parameters in DynamoDB mode pass the rule.
    ok = stack(template, **{**params, "IndexMode": "dynamodb"})
    assert not ok.value(spec["RuleCondition"]) or all(ok.value(a["Assert"]) for a in spec["Assertions"])


@pytest.mark.parametrize(("given", "expected"), [("", None), ("my-checkpoints", "my-checkpoints")])
def test_names_are_optional(template: dict, given: str, expected: str | None) -> None:
    s = stack(template, BucketName=given, TableName=given)
    assert s.properties("Bucket").get("BucketName") == expected
    assert s.properties("Table").get("TableName") == expected


# -- IAM -----------------------------------------------------------------------------------
IAM_TYPES = {"AWS::IAM::ManagedPolicy", "AWS::IAM::Policy", "AWS::IAM::RolePolicy", "AWS::IAM::Role"}


def iam_documents(s: Stack) -> list[tuple[str, dict]]:
    docs = []
    for name, resource in s.resources.items():
        if resource["Type"] not in IAM_TYPES:
            continue
        props = resource["Properties"]
        if "PolicyDocument" in props:
            docs.append((name, props["PolicyDocument"]))
        docs += [(name, p["PolicyDocument"]) for p in props.get("Policies", [])]
    return docs


@pytest.mark.parametrize(
    "params",
    [
        {},
        {
            "KmsKeyArn": KEY_ARN, "KeyPrefix": "a/b/", "ErasePolicy": "Enabled", "ThreadEncryption": "KmsKey",
            "RotationTargetKmsKeyArn": KEY_ARN.replace("1111", "2222"), **REPLICA,
        },
        {"IndexMode": "manifest", "KeyPrefix": "a/b/"},
    ],
    ids=["defaults", "all", "manifest"],
)
def test_no_iam_policy_has_wildcard_actions_or_resources(template: dict, params: dict) -> None:
    s = stack(template, **params)
    docs = iam_documents(s)
    assert {name for name, _ in docs} >= {"SaverPolicy"}
    for name, doc in docs:
        for statement in doc["Statement"]:
            assert statement["Effect"] == "Allow", (name, statement)
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for action in actions:
                assert "*" not in action and "?" not in action, (name, action)
            for resource in resources:
                # A trailing "/*" under the stack's own bucket prefix is the only wildcard.
                assert resource != "*" and not resource.endswith(":*"), (name, resource)
                assert "*" not in resource.removesuffix("/*") and "?" not in resource, (name, resource)


@pytest.mark.parametrize("prefix", ["", "agents/prod/"])
def test_saver_policy_is_scoped_to_the_stack(template: dict, prefix: str, index_mode: str) -> None:
    s = stack(template, KeyPrefix=prefix, IndexMode=index_mode)
    policy = s.resources["SaverPolicy"]
    assert policy["Type"] == "AWS::IAM::ManagedPolicy"
    grants = statement_resources(policy["Properties"]["PolicyDocument"])
    by_service: dict[str, set[str]] = {}
    for action, resource in grants:
        by_service.setdefault(action.split(":")[0], set()).add(resource)
    # The saver's own sub-prefixes of the stack's prefix; the manifest mode's
    # s3:ListBucket is on the bucket (see the template's ManifestListAndMissingHeads).
    objects = [f"<Bucket.Arn>/{prefix}{sub}*" for sub in (LIVE_PREFIX, ARCHIVE_PREFIX)]
    if index_mode == "manifest":
        objects += [f"<Bucket.Arn>/{prefix}{sub}*" for sub in (MANIFEST_PREFIX, LISTING_PREFIX)]
    # The node cache (S3Cache) beside the saver, in both modes.
    objects.append(f"<Bucket.Arn>/{prefix}{NODE_CACHE_PREFIX}*")
    # The long-term memory (S3Store) beside the saver, in both modes.
    objects.append(f"<Bucket.Arn>/{prefix}{MEMORY_PREFIX}*")
    if index_mode == "manifest":
        assert by_service == {"s3": {*objects, "<Bucket.Arn>"}, "kms": {"<Key.Arn>"}}
        assert {r for a, r in grants if r == "<Bucket.Arn>"} == {"<Bucket.Arn>"}
        assert {a for a, r in grants if r == "<Bucket.Arn>"} == {"s3:ListBucket"}
    else:
        assert by_service == {"s3": set(objects), "dynamodb": {"<Table.Arn>"}, "kms": {"<Key.Arn>"}}
    # The key only through S3 for this bucket, and through DynamoDB for this table.
    kms = {
        st["Condition"]["StringEquals"]["kms:ViaService"]: st
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
        if str(st["Action"]).count("kms:")
    }
    through = {"s3.us-east-1.amazonaws.com"}
    if index_mode == "dynamodb":
        through.add("dynamodb.us-east-1.amazonaws.com")
    assert set(kms) == through
    assert kms["s3.us-east-1.amazonaws.com"]["Condition"]["StringLike"] == {
        "kms:EncryptionContext:aws:s3:arn": ["<Bucket.Arn>", *objects]
    }
    if index_mode == "dynamodb":
        assert kms["dynamodb.us-east-1.amazonaws.com"]["Condition"]["StringEquals"][
            "kms:EncryptionContext:aws:dynamodb:tableName"
        ] == "<Table>"
    assert s.outputs["PolicyArn"] == "<SaverPolicy>"


# -- outputs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["", "agents/"])
def test_outputs_build_a_saver(template: dict, prefix: str, index_mode: str) -> None:
    outputs = stack(template, KeyPrefix=prefix, IndexMode=index_mode).outputs
    assert outputs["BucketName"] == "<Bucket>"
    assert outputs.get("TableName") == ("<Table>" if index_mode == "dynamodb" else None)
    assert outputs["IndexMode"] == index_mode
    assert outputs["Region"] == "us-east-1"
    assert {"PolicyArn", "KmsKeyArn"} <= set(outputs)
    assert outputs.get("KeyPrefix") == (prefix or None)


# -- the opt-in erase policy ------------------------------------------------------------------
@pytest.mark.parametrize("replica", [False, True], ids=["alone", "replica"])
def test_erase_policy_is_opt_in_and_scoped_to_the_thread_prefixes(template: dict, replica: bool) -> None:
    """``ErasePolicy=Enabled`` adds what erase_thread (and the memory store's
    erase_namespace) needs beside SaverPolicy: versions listed on the bucket(s),
    deleted and their lock read under the saver's sub-prefixes only; nothing of it
    by default."""
    assert "EraseThreadsPolicy" not in stack(template).resources
    assert "ErasePolicyArn" not in stack(template).outputs
    params = {"ErasePolicy": "Enabled", "KeyPrefix": "agents/", **(REPLICA if replica else {})}
    s = stack(template, **params)
    grants = statement_resources(s.resources["EraseThreadsPolicy"]["Properties"]["PolicyDocument"])
    buckets = ["<Bucket.Arn>"] + (["arn:aws:s3:::checkpoints-replica"] if replica else [])
    subs = (LIVE_PREFIX, ARCHIVE_PREFIX, MANIFEST_PREFIX, LISTING_PREFIX, SET_ASIDE_PREFIX, "memory/")
    objects = {f"{b}/agents/{sub}*" for b in buckets for sub in subs}
    by_action: dict[str, set[str]] = {}
    for action, resource in grants:
        by_action.setdefault(action, set()).add(resource)
    listing = ("s3:GetBucketVersioning", "s3:ListBucket", "s3:ListBucketVersions")
    versions = ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:GetObjectLegalHold", "s3:GetObjectRetention", "s3:GetObjectVersion")
    assert by_action == {**{a: set(buckets) for a in listing}, **{a: objects for a in versions}}
    assert s.outputs["ErasePolicyArn"] == "<EraseThreadsPolicy>"


# -- thread encryption ----------------------------------------------------------------------
@pytest.mark.parametrize("encryption", ["Disabled", "KmsKey", "LocalKey"])
@pytest.mark.parametrize("replica", [False, True])
def test_the_key_store_keeps_no_old_copy_and_is_out_of_backups(template: dict, encryption: str, replica: bool) -> None:
    s = stack(template, BucketName="app", ThreadEncryption=encryption, **(REPLICA if replica else {}))
    assert ("KeyBucket" in s.resources) == ("KeyBucketPolicy" in s.resources) == (encryption != "Disabled")
    assert ("ThreadKey" in s.resources) == (encryption == "KmsKey")
    if encryption == "Disabled":
        return
    bucket = s.properties("KeyBucket")
    assert bucket["BucketName"] == "app-keys"  # the saver's default key_bucket
    # Nothing that keeps old copies: no versioning, Object Lock or replication.
    assert not {"VersioningConfiguration", "ObjectLockEnabled", "ObjectLockConfiguration", "ReplicationConfiguration"} & set(bucket)
    assert all(bucket["PublicAccessBlockConfiguration"].values())
    assert {"Key": "s3_saver:no-backup", "Value": "true"} in bucket["Tags"]
    denied = {
        st["Sid"]: st for st in s.properties("KeyBucketPolicy")["PolicyDocument"]["Statement"] if st["Effect"] == "Deny"
    }
    assert set(denied["DenyKeepingOldCopies"]["Action"]) == {
        "s3:PutBucketVersioning", "s3:PutBucketObjectLockConfiguration", "s3:PutReplicationConfiguration"
    }
    assert {"DenyInsecureTransport", "DenyTlsBelow12"} <= set(denied)
    if encryption == "KmsKey":
        assert s.properties("ThreadKey")["MultiRegion"] is replica
    sids = {st["Sid"] for st in s.properties("SaverPolicy")["PolicyDocument"]["Statement"]}
    assert ("ThreadKeys" in sids) == (encryption == "KmsKey") and "ThreadKeyRecords" in sids
    # Rotation's ReEncrypt is never the application's.
    actions = {a for st in s.properties("SaverPolicy")["PolicyDocument"]["Statement"] for a in (
        st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
    )}
    assert not any(a.startswith("kms:ReEncrypt") for a in actions)
