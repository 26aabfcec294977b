"""Every answer is checked: what a confirmed answer of each call carries, and the one check.

A proxy, a captive portal or a half-compatible store in front of S3 or DynamoDB can
answer 200 with anything: a sign-in page, an empty body, an answer cut short. botocore
does not refuse such an answer. A DynamoDB body that is not JSON parses as an empty
answer (``{}``), which is also what a real PutItem, UpdateItem or TransactWriteItems
answers; an S3 answer without the XML or the headers it should have parses as an answer
without those fields. Read as they come, they mean "stored", "no such item", "nothing
listed" (and a missing ``ETag`` raises a bare ``KeyError`` further on).

So each answer is held against what the real one always carries, per (service, boto3
method), before any operation sees it (``confirm``, called by both drivers on every
answer; ``watch`` sees each answer's raw body first, in every client the saver uses):

* DynamoDB: the body is a JSON object. DynamoDB sends a CRC32 of every body
  (``x-amz-crc32``): where present, the body must match it (a body cut or replaced on
  the way); where absent, it must parse. Plus the fields each answer always has
  (``Items`` of a Query, ``UnprocessedItems`` of a BatchWriteItem...).
* S3: an answer with an XML body names its document (``ListBucketResult``...); an answer
  that has no body has none (a PutObject's ``200`` with a page in it was not S3's);
  plus the fields it always has (the ``ETag`` of a stored or read object).

An answer that fails is an [UnreadableAnswerError][s3_saver.errors.UnreadableAnswerError],
handed to the operation as a failed call is. It is retried as a dropped connection is
(``_transport/retry``: every call the saver sends is safe to send again, and a retry of a write
that did land meets it there): a proxy's hiccup is ridden out, a portal that answers
every request fails the call after the retry policy's attempts, naming the call, the
bucket or table, the region, the key and what the answer lacked. No request is added:
everything checked is in the answer already.

What cannot be confirmed (``Expect.unconfirmed``): the answers of HeadBucket,
PutBucketVersioning and RestoreObject carry nothing every S3-compatible store sends (no
body; not every store sends a request id). setup(), check() and restore_thread() take a
garbage 200 there for "exists", "on" or "asked"; the calls after them meet the truth (a
missing bucket is a BucketNotFoundError at the first object write, setup_replica()
refuses an unversioned bucket, restore_thread() asks S3 again while the archive shows no
restore under way). No checkpoint, value or index entry is reported stored on them.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from s3_saver._transport.protocol import Call
from s3_saver.errors import UnreadableAnswerError

# What ``watch`` learnt of an answer's raw body, carried in the parsed answer under
# this key (botocore merges a ``before-parse`` handler's ``customized_response_dict``
# into it) until ``confirm`` takes it out.
RAW = "S3SaverRawAnswer"
_SAMPLE = 80  # bytes of an unreadable body quoted in the error


@dataclass(frozen=True)
class Expect:
    """What a confirmed answer of one call carries.

    Attributes:
        fields: Keys the parsed answer always has (``a.b``: ``b`` inside ``a``).
        roots: S3: the XML document the body must be (its root element).
        bodyless: S3: the answer has no body.
        returned: Fields the answer has when the call's parameters ask for them
            (``ReturnValues``).
        truncated: Fields a listing page has when it says more follow (``IsTruncated``):
            where the next page starts. Without them a paging loop would start over,
            or stop early and take a partial listing for the whole.
        unconfirmed: Set for an answer that carries nothing every store sends to
            check (no body, no field): what tells the truth after it.
    """

    fields: tuple[str, ...] = ()
    roots: frozenset[str] = frozenset()
    bodyless: bool = False
    returned: Callable[[dict[str, Any]], tuple[str, ...]] | None = None
    truncated: tuple[str, ...] = ()
    unconfirmed: str = ""


def _new_attributes(params: dict[str, Any]) -> tuple[str, ...]:
    # An update always leaves an item: asked for its new attributes, the answer has them.
    return ("Attributes",) if params.get("ReturnValues") in ("ALL_NEW", "UPDATED_NEW") else ()


def _roots(*names: str) -> frozenset[str]:
    return frozenset(names)


# Every call the saver sends (tests/test_answers.py sends each through a proxy that
# answers it with garbage, and checks this table names them all).
ANSWERS: dict[tuple[str, str], Expect] = {
    # -- S3 ----------------------------------------------------------------------------
    # The ETag is the write's receipt (the manifest head's compare-and-swap needs it);
    # S3 answers a PutObject with no body.
    ("s3", "put_object"): Expect(fields=("ETag",), bodyless=True),
    # The body is read by the driver; what it holds is the decoder's to judge
    # (CorruptObjectError). Every stored object has an ETag.
    ("s3", "get_object"): Expect(fields=("ETag", "Body")),
    ("s3", "head_object"): Expect(fields=("ETag",)),
    ("s3", "copy_object"): Expect(fields=("CopyObjectResult.ETag",), roots=_roots("CopyObjectResult")),
    ("s3", "list_objects_v2"): Expect(
        fields=("IsTruncated",), roots=_roots("ListBucketResult"), truncated=("NextContinuationToken",)
    ),
    ("s3", "list_object_versions"): Expect(
        fields=("IsTruncated",), roots=_roots("ListVersionsResult"), truncated=("NextKeyMarker",)
    ),
    # Quiet: a DeleteResult naming only the keys that failed (often none).
    ("s3", "delete_objects"): Expect(roots=_roots("DeleteResult")),
    # An unversioned bucket's answer is an empty VersioningConfiguration (moto's server
    # names the document GetBucketVersioningResponse).
    ("s3", "get_bucket_versioning"): Expect(roots=_roots("VersioningConfiguration", "GetBucketVersioningResponse")),
    # A bucket without rules answers 404 NoSuchLifecycleConfiguration.
    ("s3", "get_bucket_lifecycle_configuration"): Expect(fields=("Rules",), roots=_roots("LifecycleConfiguration")),
    # S3 names the bucket it made (a retry of a create that landed: BucketAlreadyOwnedByYou).
    ("s3", "create_bucket"): Expect(fields=("Location",)),
    ("s3", "restore_object"): Expect(
        bodyless=True, unconfirmed="the next restore_thread() asks again while the archive shows no restore under way"
    ),
    ("s3", "put_bucket_versioning"): Expect(
        bodyless=True, unconfirmed="setup_replica() and promote() refuse a bucket whose versioning is off"
    ),
    ("s3", "head_bucket"): Expect(
        unconfirmed="the first call on the bucket: a missing one is a BucketNotFoundError"
    ),
    # -- DynamoDB: every answer is a JSON object (checked for all) ---------------------
    ("dynamodb", "get_item"): Expect(),  # without Item: no such item
    ("dynamodb", "put_item"): Expect(),
    ("dynamodb", "update_item"): Expect(returned=_new_attributes),
    ("dynamodb", "delete_item"): Expect(),
    ("dynamodb", "transact_write_items"): Expect(),
    ("dynamodb", "batch_write_item"): Expect(fields=("UnprocessedItems",)),
    ("dynamodb", "batch_get_item"): Expect(fields=("Responses", "UnprocessedKeys")),
    ("dynamodb", "query"): Expect(fields=("Items", "Count")),
    ("dynamodb", "scan"): Expect(fields=("Items", "Count")),
    ("dynamodb", "describe_table"): Expect(fields=("Table.TableStatus", "Table.KeySchema")),
    ("dynamodb", "create_table"): Expect(fields=("TableDescription",)),
    ("dynamodb", "describe_time_to_live"): Expect(fields=("TimeToLiveDescription",)),
    ("dynamodb", "update_time_to_live"): Expect(fields=("TimeToLiveSpecification",)),
    # -- KMS (``encryption=KmsKey(...)``): JSON answers, as DynamoDB's ------------------
    # A data key's answer carries it in both forms: without them, nothing to encrypt
    # with, or nothing to keep.
    ("kms", "generate_data_key"): Expect(fields=("CiphertextBlob", "Plaintext", "KeyId")),
    ("kms", "decrypt"): Expect(fields=("Plaintext", "KeyId")),
    ("kms", "re_encrypt"): Expect(fields=("CiphertextBlob", "KeyId")),
    ("kms", "encrypt"): Expect(fields=("CiphertextBlob", "KeyId")),
    # setup() with a replica: whether the key is multi-Region (an answer without the
    # key's description would read as a single-Region key, refused for the wrong reason);
    # rewrap: the new key's ARN, which the records it wraps name.
    ("kms", "describe_key"): Expect(fields=("KeyMetadata", "KeyMetadata.Arn")),
}
_NOTHING = Expect()
_JSON_SERVICES = ("dynamodb", "kms")


# -- the raw body: a botocore hook on every client the saver uses ---------------------------
def watch(client: Any) -> None:
    """Have ``client`` note, on each 2xx answer, what its raw body is (see ``RAW``)."""
    service = client.meta.service_model.service_name
    client.meta.events.register(f"before-parse.{service}.*", _note, unique_id="s3_saver-answers")


# An XML document's first element, after its declaration, comments and whitespace.
_XML_ROOT = re.compile(rb"\s*(?:<\?xml[^>]*\?>)?\s*(?:<!--.*?-->\s*)*<(?:[\w.\-]+:)?([\w.\-]+)", re.DOTALL)


def _note(
    operation_model: Any, response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any
) -> None:
    status = response_dict.get("status_code") or 0
    if not 200 <= status < 300 or operation_model.has_streaming_output:
        return  # an error is botocore's to parse; a GetObject's body is read later
    body = response_dict.get("body") or b""
    headers = response_dict.get("headers") or {}
    raw: dict[str, Any] = {"type": headers.get("content-type") or "no content type", "size": len(body)}
    if operation_model.metadata.get("protocol") == "json":
        crc = headers.get("x-amz-crc32")
        if crc is not None:
            raw["json"] = crc.isdigit() and zlib.crc32(body) & 0xFFFFFFFF == int(crc) and body.lstrip()[:1] == b"{"
            if not raw["json"]:
                raw["why"] = "a body that does not match its CRC32 (x-amz-crc32)"
        else:
            try:
                raw["json"] = isinstance(json.loads(body), dict)
            except ValueError:
                raw["json"] = False
    else:
        found = _XML_ROOT.match(body)
        raw["root"] = found.group(1).decode("ascii", "replace") if found else None
        raw["empty"] = not body.strip()
    if not raw.get("json", True) or not raw.get("empty", True):
        raw["sample"] = body[:_SAMPLE]
    customized_response_dict[RAW] = raw


# -- the check ------------------------------------------------------------------------------
def confirm(call: Call, response: Any) -> Any:
    """``response`` when it is an answer ``call`` can have had; else the
    UnreadableAnswerError that says why (returned, as a driver returns a failure)."""
    if not isinstance(response, dict):
        return _unreadable(call, {}, f"an answer that is not a mapping ({type(response).__name__})", None)
    raw = response.pop(RAW, None) or {}
    expect = ANSWERS.get((call.service, call.operation), _NOTHING)
    why = _problem(call, expect, raw, response)
    if why is None:
        return response
    return _unreadable(call, raw, why, response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def _problem(call: Call, expect: Expect, raw: dict[str, Any], response: dict[str, Any]) -> str | None:
    if call.service in _JSON_SERVICES and raw.get("json") is False:
        return raw.get("why") or "a body that is not a JSON object"
    if expect.roots and "root" in raw and raw["root"] not in expect.roots:
        found = f"<{raw['root']}>" if raw["root"] else "no XML document"
        return f"{found} where S3 answers <{min(expect.roots)}>"
    if expect.bodyless and raw.get("empty") is False:
        return "a body where S3 answers with none"
    wanted = expect.fields + (expect.returned(call.params) if expect.returned else ())
    if response.get("IsTruncated"):
        wanted += expect.truncated
    missing = [name for name in wanted if not _has(response, name)]
    if missing:
        return f"no {', '.join(missing)}"
    return None


def _has(response: dict[str, Any], path: str) -> bool:
    value: Any = response
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def _unreadable(call: Call, raw: dict[str, Any], why: str, status: int | None) -> UnreadableAnswerError:
    where = call.where
    place = where.describe(call.service) if where is not None else call.service
    seen = ""
    if raw:
        sample = f": {raw['sample']!r}" if raw.get("sample") else ""
        seen = f" ({raw['type']}, {raw['size']} bytes{sample})"
    store = {"dynamodb": "DynamoDB", "kms": "KMS"}.get(call.service, "S3")
    return UnreadableAnswerError(
        f"{call.describe()}: {place} answered {status or 'OK'} with {why}{seen}. Not {store}'s answer: a proxy, "
        "captive portal or gateway in between, or a store that does not speak the API? Nothing it "
        "answered is taken as stored",
        service=call.service,
        operation=call.operation,
        bucket=where.bucket if where is not None else None,
        table=where.table if where is not None and call.service == "dynamodb" else None,
        region=where.region(call.service) if where is not None else None,
        key=_target(call),
        missing=why,
    )


def _target(call: Call) -> str | None:
    text = call.describe()
    start = text.find("(")
    return text[start + 1 : -1] if start >= 0 else None
