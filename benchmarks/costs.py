"""Request naming, DynamoDB item sizes and the us-east-1 list-price cost model.

Pure standard library: imported by the proxy (main venv) and by the benchmark
child processes, including the peer's own virtualenv.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

# -- prices (us-east-1, S3 Standard, DynamoDB on-demand) ---------------------------
S3_TIER1_PER_REQUEST = 0.005 / 1000  # PUT, COPY, POST, LIST
S3_TIER2_PER_REQUEST = 0.0004 / 1000  # GET, HEAD (and every other read)
DDB_PER_WRITE_UNIT = 0.625 / 1_000_000  # one write unit = 1 KB written
DDB_PER_READ_UNIT = 0.125 / 1_000_000  # 4 KB strongly consistent, 8 KB eventually consistent
S3_STORAGE_PER_GB_MONTH = 0.023
DDB_STORAGE_PER_GB_MONTH = 0.25  # Standard table class, https://aws.amazon.com/dynamodb/pricing/on-demand/

# AWS KMS: $0.03 per 10,000 requests (GenerateDataKey, Decrypt, ...), us-east-1 list price,
# https://aws.amazon.com/kms/pricing/ (the key itself: $1 a month, not per request).
KMS_PER_REQUEST = 0.03 / 10_000
KMS_KEY_PER_MONTH = 1.0

GB = 1024**3  # AWS bills storage per GB of 2^30 bytes
DAYS_PER_MONTH = 365 / 12  # GB-months are prorated by the hour; a year is 12 of them


# -- storage classes (archival and the year cost, benchmarks/yearcost.py) ------------------
# us-east-1 list prices from https://aws.amazon.com/s3/pricing/ (Storage, "Requests &
# data retrievals", "Data management" tabs) and the minimums of
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/storage-class-intro.html
# (both as read for this benchmark; check them before quoting). First price tier only
# (up to 50 TB a month), no free tier, no data transfer out of the region.
@dataclass(frozen=True)
class StorageClass:
    storage_gb_month: float
    put_per_1k: float  # PUT, COPY, POST, LIST
    get_per_1k: float  # GET, SELECT and every other read
    retrieval_per_gb: float = 0.0  # on each GET of an instant-access infrequent class
    min_bytes: int = 0  # each object billed at least this size
    min_days: int = 0  # billed at least this long, even if deleted earlier
    # Glacier Flexible Retrieval and Deep Archive keep 40 KB of index per object:
    # 32 KB billed at the class's rate, 8 KB at S3 Standard's.
    overhead_class_bytes: int = 0
    overhead_standard_bytes: int = 0
    transition_per_1k: float = 0.0  # a lifecycle rule moving one object into the class
    instant: bool = True  # a GET reads it; else RestoreObject first (hours)
    # RestoreObject by tier: ($ per 1,000 requests, $ per GB restored).
    restore: dict[str, tuple[float, float]] = field(default_factory=dict)


KB = 1024
CLASSES: dict[str, StorageClass] = {
    "STANDARD": StorageClass(0.023, 0.005, 0.0004),
    # Frequent Access tier price; the tiers and the monitoring fee are below.
    "INTELLIGENT_TIERING": StorageClass(0.023, 0.005, 0.0004, transition_per_1k=0.01),
    "STANDARD_IA": StorageClass(0.0125, 0.01, 0.001, 0.01, 128 * KB, 30, transition_per_1k=0.01),
    "GLACIER_IR": StorageClass(0.004, 0.02, 0.01, 0.03, 128 * KB, 90, transition_per_1k=0.02),
    "GLACIER": StorageClass(0.0036, 0.03, 0.0004, 0.0, 0, 90, 32 * KB, 8 * KB, transition_per_1k=0.03,
                            instant=False,
                            restore={"Expedited": (10.0, 0.03), "Standard": (0.05, 0.01), "Bulk": (0.0, 0.0)}),
    "DEEP_ARCHIVE": StorageClass(0.00099, 0.05, 0.0004, 0.0, 0, 180, 32 * KB, 8 * KB, transition_per_1k=0.05,
                                 instant=False, restore={"Standard": (0.10, 0.02), "Bulk": (0.025, 0.0025)}),
}
# Intelligent-Tiering moves an object to Infrequent Access after 30 days without
# access and to Archive Instant Access after 90; objects under 128 KB are never
# monitored nor moved (always the Frequent price, no monitoring fee).
IT_INFREQUENT_GB_MONTH = 0.0125
IT_ARCHIVE_INSTANT_GB_MONTH = 0.004
IT_MONITORING_PER_1K_OBJECTS_MONTH = 0.0025
IT_MIN_MONITORED_BYTES = 128 * KB
IT_TO_INFREQUENT_DAYS = 30
IT_TO_ARCHIVE_INSTANT_DAYS = 90

# -- cross-region replication (benchmarks/crossregion.py) ------------------------------
# Primary us-east-1, replica us-west-2 (US West, Oregon), whose S3 and DynamoDB list
# prices equal us-east-1's (so the replica's PUTs, units and storage reuse the prices
# above). Checked on 2026-11-23 against stored copies of these pages; first price tier,
# no free tier. S3 Replication Time Control ($0.015/GB) is optional and not included.
REPLICA_REGION = "us-west-2"
# https://aws.amazon.com/s3/pricing/ ("Data transfer" tab: Data Transfer OUT from
# US East (N. Virginia) to another AWS Region, $0.02 per GB; us-east-2 would be $0.01;
# "Replication" tab: for CRR you also pay inter-Region Data Transfer OUT from S3 to
# each destination Region) - charged on every replicated byte.
S3_INTER_REGION_PER_GB = 0.02
# https://aws.amazon.com/s3/pricing/ ("Replication" tab): the replica is written by
# replication PUT requests, billed at the destination storage class's PUT price
# (S3 Standard in us-west-2: $0.005 per 1,000), plus the replica's storage.
S3_REPLICATION_PUT_PER_REQUEST = 0.005 / 1000
S3_REPLICA_STORAGE_PER_GB_MONTH = 0.023  # S3 Standard, us-west-2
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/global-tables-billing.html
# ("one rWRU per replica table is charged for each write up to 1KB"; "Replicated write
# units (rWCUs and rWRUs) are priced the same as single-Region write units"; "Cross-Region
# data transfer fees apply") and https://aws.amazon.com/dynamodb/pricing/on-demand/
# (on-demand, us-west-2: $0.625 per million rWRU; data transfer out to another AWS Region
# $0.02 per GB; storage $0.25/GB-month). The primary's own writes become rWRUs at the same
# price, so its request cost is unchanged; each replica pays 1 rWRU per KB of every item
# written there by replication.
DDB_PER_REPLICATED_WRITE_UNIT = 0.625 / 1_000_000
DDB_INTER_REGION_PER_GB = 0.02
DDB_REPLICA_STORAGE_PER_GB_MONTH = 0.25  # Standard table class, us-west-2

S3_LIST_OPERATIONS = frozenset(
    {"ListObjects", "ListObjectsV2", "ListObjectVersions", "ListMultipartUploads", "ListParts", "ListBuckets"}
)


def s3_tier(method: str, operation: str) -> int:
    """0 = free (DELETE), 1 = PUT/COPY/POST/LIST, 2 = GET/HEAD."""
    if method == "DELETE":
        return 0
    if method in ("PUT", "POST") or operation in S3_LIST_OPERATIONS:
        return 1
    return 2


def s3_request_cost(method: str, operation: str, storage_class: str = "", retrieved: int = 0,
                    restore_tier: str = "") -> float:
    """One S3 request at list price. With no storage class (every live object the
    workload writes) it is the tier price above; an object of another class (an
    archive) pays that class's request price, its per-GB retrieval fee on the
    ``retrieved`` bytes, and a ``RestoreObject`` the cold class's restore price."""
    tier = s3_tier(method, operation)
    if not storage_class or storage_class == "STANDARD" or tier == 0:
        return {0: 0.0, 1: S3_TIER1_PER_REQUEST, 2: S3_TIER2_PER_REQUEST}[tier]
    cls = CLASSES[storage_class]
    if operation == "RestoreObject":
        per_1k, per_gb = cls.restore.get(restore_tier or "Standard", (0.0, 0.0))
        return per_1k / 1000 + retrieved / GB * per_gb
    if tier == 1:
        return cls.put_per_1k / 1000
    return cls.get_per_1k / 1000 + retrieved / GB * cls.retrieval_per_gb


def ddb_cost(read_units: float, write_units: float) -> float:
    return read_units * DDB_PER_READ_UNIT + write_units * DDB_PER_WRITE_UNIT


def priced(s3_tier1: int, s3_tier2: int, read_units: float, write_units: float) -> float:
    """Request cost from counts alone: the runner checks that every run's per-request
    costs add up to this (a manifest-index run has S3 requests only, no units)."""
    return s3_tier1 * S3_TIER1_PER_REQUEST + s3_tier2 * S3_TIER2_PER_REQUEST + ddb_cost(read_units, write_units)


# -- S3 operation names from the HTTP request ------------------------------------------
def s3_operation(method: str, path: str, query: str, headers: dict[str, str]) -> str:
    """Name the S3 API operation of a path-style request (``/bucket/key?query``)."""
    params = dict(parse_qsl(query, keep_blank_values=True))
    has_key = len(path.lstrip("/").split("/", 1)) == 2 and path.lstrip("/").split("/", 1)[1] != ""
    h = {k.lower(): v for k, v in headers.items()}
    if not path.strip("/"):
        return "ListBuckets" if method == "GET" else f"{method}Service"
    if not has_key:
        sub = next((p for p in params if p not in ("list-type", "prefix", "delimiter", "max-keys",
                                                   "continuation-token", "start-after", "encoding-type",
                                                   "fetch-owner", "marker", "x-id")), None)
        if method == "GET":
            if sub == "versions":
                return "ListObjectVersions"
            if sub == "uploads":
                return "ListMultipartUploads"
            if sub:
                return f"GetBucket{sub.title()}"
            return "ListObjectsV2" if params.get("list-type") == "2" else "ListObjects"
        if method == "HEAD":
            return "HeadBucket"
        if method == "PUT":
            return f"PutBucket{sub.title()}" if sub else "CreateBucket"
        if method == "DELETE":
            return f"DeleteBucket{sub.title()}" if sub else "DeleteBucket"
        if method == "POST":
            return "DeleteObjects" if "delete" in params else f"PostBucket{(sub or '').title()}"
        return f"{method}Bucket"
    if method == "GET":
        if "uploadId" in params:
            return "ListParts"
        for sub, name in (("tagging", "GetObjectTagging"), ("acl", "GetObjectAcl"),
                          ("attributes", "GetObjectAttributes"), ("retention", "GetObjectRetention"),
                          ("legal-hold", "GetObjectLegalHold")):
            if sub in params:
                return name
        return "GetObject"
    if method == "HEAD":
        return "HeadObject"
    if method == "PUT":
        if "uploadId" in params:
            return "UploadPartCopy" if "x-amz-copy-source" in h else "UploadPart"
        if "tagging" in params:
            return "PutObjectTagging"
        if "acl" in params:
            return "PutObjectAcl"
        return "CopyObject" if "x-amz-copy-source" in h else "PutObject"
    if method == "POST":
        if "uploads" in params:
            return "CreateMultipartUpload"
        if "uploadId" in params:
            return "CompleteMultipartUpload"
        if "restore" in params:
            return "RestoreObject"
        return "PostObject"
    if method == "DELETE":
        if "uploadId" in params:
            return "AbortMultipartUpload"
        if "tagging" in params:
            return "DeleteObjectTagging"
        return "DeleteObject"
    return f"{method}Object"


# -- DynamoDB item size (the rules capacity is billed by) --------------------------------
def _number_size(text: str) -> int:
    # Up to 38 significant digits, 2 digits per byte, plus one byte.
    digits = text.lstrip("-").replace(".", "").lstrip("0") or "0"
    return len(digits) // 2 + 1 + (1 if text.startswith("-") else 0)


def attribute_value_size(value: dict[str, Any]) -> int:
    """Size of one wire-format attribute value (``{"S": ...}``, ``{"B": base64}``, ...)."""
    ((kind, v),) = value.items()
    if kind == "S":
        return len(v.encode("utf-8"))
    if kind == "N":
        return _number_size(str(v))
    if kind == "B":
        return len(v) if isinstance(v, (bytes, bytearray)) else len(base64.b64decode(v))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode("utf-8")) for s in v)
    if kind == "NS":
        return sum(_number_size(str(n)) for n in v)
    if kind == "BS":
        return sum(len(b) if isinstance(b, (bytes, bytearray)) else len(base64.b64decode(b)) for b in v)
    if kind == "L":
        return 3 + sum(1 + attribute_value_size(x) for x in v)
    if kind == "M":
        return 3 + sum(len(k.encode("utf-8")) + 1 + attribute_value_size(x) for k, x in v.items())
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: dict[str, Any]) -> int:
    """Billable size of a wire-format DynamoDB item in bytes."""
    return sum(len(name.encode("utf-8")) + attribute_value_size(value) for name, value in item.items())


def write_units(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def read_units(total_size: int, consistent: bool) -> float:
    units = max(1, math.ceil(total_size / 4096))
    return units if consistent else units / 2

