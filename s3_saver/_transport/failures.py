"""How a failed call becomes the saver's exception: the AWS error codes the saver gives a
meaning, sorted into kinds (``classify`` is the one place that does it), whether a failure is
throttling, and ``translate``, which names the place at fault in the message.

The exceptions themselves are the package's public ``errors``; the transport turns the
failures of its calls into them.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ConnectTimeoutError,
    InvalidRegionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
)

from s3_saver.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ConfigurationError,
    EncryptionKeyError,
    MissingObjectError,
    PrimaryUnavailableError,
    S3SaverError,
    SetupMismatchError,
    StoreUnavailableError,
    TableNotFoundError,
    UnreadableAnswerError,
    Where,
)

# -- AWS error codes, by the meaning the saver gives them --------------------------------
BUCKET_MISSING_CODES = frozenset({"NoSuchBucket"})
# HeadBucket has no body, so a missing bucket is a bare 404.
HEAD_BUCKET_MISSING_CODES = frozenset({"404", "NoSuchBucket", "NotFound"})
TABLE_MISSING_CODES = frozenset({"ResourceNotFoundException"})
OBJECT_MISSING_CODES = frozenset({"NoSuchKey", "404"})
DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "KMS.AccessDeniedException",
    }
)
# Answers that say "slow down": the store is up and asks for fewer requests, for
# seconds (botocore's throttling codes, botocore/retries/standard.py, less those of
# services the saver never calls). ``RetryPolicy.throttle_budget`` rides them out.
THROTTLING_CODES = frozenset(
    {
        "SlowDown", "ThrottlingException", "Throttling", "ThrottledException", "RequestThrottled",
        "RequestThrottledException", "TooManyRequestsException", "429", "RequestLimitExceeded",
        "ProvisionedThroughputExceededException", "BandwidthLimitExceeded", "LimitExceededException",
        # A DynamoDB write that met a transaction in progress on its item.
        "TransactionInProgressException",
        # S3 throttles a HEAD with a bare 503 (no body to name SlowDown). A 503 with a
        # body names it: SlowDown, or ServiceUnavailable (a failure, below).
        "503",
    }
)
# A DynamoDB transaction cancelled because a table throttled one of its actions
# (one reason per action, "None" for those that did not fail).
THROTTLED_REASONS = frozenset({"ThrottlingError", "ProvisionedThroughputExceeded"})
# Answers that say "not now": server errors and throttling, worth sending again.
TRANSIENT_CODES = THROTTLING_CODES | frozenset(
    {"InternalError", "InternalServerError", "ServiceUnavailable", "RequestTimeout",
     "TransactionConflictException", "500", "502", "504",
     # KMS: its own failure, a custom key store's that did not answer, a key whose
     # material is not available now (a custom key store disconnected).
     "KMSInternalException", "DependencyTimeoutException", "KeyUnavailableException"}
)
# KMS answers that say the key-encryption key cannot be used as configured: it does not
# exist (or not in this region), is disabled or pending deletion, is not a symmetric
# encryption key, or is not the key that wrapped the data key (IncorrectKeyException).
KMS_KEY_CODES = frozenset(
    {"NotFoundException", "DisabledException", "KMSInvalidStateException", "InvalidKeyUsageException",
     "IncorrectKeyException", "InvalidArnException"}
)
PRECONDITION_FAILED_CODES = frozenset({"PreconditionFailed", "412"})
# S3 answers 409 when two conditional writes of one key race; the loser retries.
CONDITIONAL_CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "409"})
# DynamoDB's answer to a ConditionExpression that did not hold.
CONDITION_FAILED_CODES = frozenset({"ConditionalCheckFailedException"})
BUCKET_OURS_CODES = frozenset({"BucketAlreadyOwnedByYou"})
TABLE_RACING_CODES = frozenset({"ResourceInUseException"})  # another process is creating it
# DynamoDB's ValidationException texts for a key that does not fit the table's
# key schema (names or types): a table made for something else.
KEY_SCHEMA_MESSAGES = (
    "key element does not match the schema",
    "missing the key",
    "missed key schema element",
    "type mismatch for key",
)
# The key schema the saver needs, in words (``s3_saver.TABLE_KEY_SCHEMA``;
# tests/test_index_mode.py checks the two agree).
KEY_SCHEMA_TEXT = "partition key 'pk' (string) and sort key 'sk' (string)"

# botocore failures raised before anything reached AWS that only the user can fix.
_CONFIGURATION_FAILURES = (
    NoCredentialsError,
    PartialCredentialsError,
    NoRegionError,
    InvalidRegionError,
    ParamValidationError,
)

# Kinds returned by classify().
BUCKET_MISSING = "bucket-missing"
TABLE_MISSING = "table-missing"
OBJECT_MISSING = "object-missing"
DENIED = "denied"
UNAVAILABLE = "unavailable"
MISCONFIGURED = "misconfigured"
KEY_SCHEMA = "key-schema"
KMS_KEY = "kms-key"


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError`` (None for anything else)."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


def classify(exc: BaseException, operation: str = "") -> str | None:
    """The kind of a failed call (one of the module's kind constants), None when the
    failure has no meaning for the saver.

    Args:
        exc: What the call raised (returned by a driver).
        operation: The boto3 method name (``head_bucket``): a bare 404 means a
            missing bucket for HeadBucket and a missing object otherwise.
    """
    if isinstance(exc, UnreadableAnswerError):
        # Not the store's answer: as good as none (retried as a dropped connection is).
        return UNAVAILABLE
    if isinstance(exc, BotoCoreError):
        # Not an AWS answer: nothing came back (connection refused or reset,
        # timeouts, after botocore's retries) or the call could not be made.
        return MISCONFIGURED if isinstance(exc, _CONFIGURATION_FAILURES) else UNAVAILABLE
    code = error_code(exc)
    if operation == "head_bucket" and code in HEAD_BUCKET_MISSING_CODES:
        return BUCKET_MISSING
    if code in BUCKET_MISSING_CODES:
        return BUCKET_MISSING
    if code in TABLE_MISSING_CODES:
        return TABLE_MISSING
    if code in DENIED_CODES:
        return DENIED
    if code in KMS_KEY_CODES:
        return KMS_KEY
    if code == "ValidationException" and _about_key_schema(exc):
        return KEY_SCHEMA
    if code in OBJECT_MISSING_CODES:
        return OBJECT_MISSING
    status = _status(exc)
    if code in TRANSIENT_CODES or status == 429 or status >= 500 or throttled(exc):
        return UNAVAILABLE
    return None


def _about_key_schema(exc: BaseException) -> bool:
    message = str((getattr(exc, "response", None) or {}).get("Error", {}).get("Message") or "").lower()
    return any(text in message for text in KEY_SCHEMA_MESSAGES)


def _status(exc: BaseException) -> int:
    status = (getattr(exc, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return status if isinstance(status, int) else 0


def throttled(exc: BaseException) -> bool:
    """The store answered "slow down" (S3 ``SlowDown``, DynamoDB throttling, a 429):
    it is up. A transient failure that is not throttled (no answer, a timeout,
    another 5xx) may be a store that is down."""
    if isinstance(exc, BotoCoreError):
        return False
    if error_code(exc) == "TransactionCanceledException":
        reasons = (getattr(exc, "response", None) or {}).get("CancellationReasons") or []
        codes = {r.get("Code") or "None" for r in reasons}
        return bool(codes & THROTTLED_REASONS) and codes <= THROTTLED_REASONS | {"None"}
    return error_code(exc) in THROTTLING_CODES or _status(exc) == 429


def unapplied(exc: BaseException) -> bool:
    """The failure proves the call was not applied: the store refused it for throttling
    (it is up and asks for fewer requests), or no connection was made (a connect
    timeout). Any other failure without an answer (a read timeout, a dropped or refused
    connection: aiobotocore reports a connection reset while sending as a connection
    error, a 5xx, an unreadable answer) may have been applied."""
    return isinstance(exc, ConnectTimeoutError) or throttled(exc)


def _message(exc: BaseException) -> str:
    return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Message") or exc)


def translate(
    exc: BaseException,
    *,
    what: str,
    service: str = "",
    operation: str = "",
    where: Where | None = None,
) -> BaseException:
    """Map an AWS failure to the saver's exception, or return it unchanged.

    Args:
        exc: The exception raised by botocore for one call.
        what: A short description of the call (operation and key) for the message.
        service: ``"s3"``, ``"dynamodb"`` or ``"kms"``.
        operation: The boto3 method name.
        where: Bucket, table, regions and endpoints, named in the message.
    """
    if isinstance(exc, S3SaverError):
        return exc  # named already, with its call and place (an unreadable answer)
    kind = classify(exc, operation)
    place = where.describe(service) if where is not None else (service or "AWS")
    code = error_code(exc)
    if kind == BUCKET_MISSING:
        new: S3SaverError = BucketNotFoundError(
            f"{what}: {place} does not exist. Check the bucket name and region_name; "
            "to create it run saver.setup() or deploy infra/"
        )
    elif kind == TABLE_MISSING:
        new = TableNotFoundError(
            f"{what}: {place} was not found. It may live in another region: check region_name "
            "(setup() there would create a second, empty index). If it does not exist yet, "
            "run saver.setup() or deploy infra/"
        )
    elif kind == KEY_SCHEMA and service == "dynamodb":
        # A table of another key schema, used without setup() (which checks it):
        # the first call that touches it says so, whichever call that is.
        new = SetupMismatchError(
            f"{what}: {place} does not have the key schema the saver needs ({KEY_SCHEMA_TEXT}; "
            f"s3_saver.TABLE_KEY_SCHEMA): DynamoDB answered {code}: {_message(exc)}. It was made for "
            "something else: give the saver a table of its own (setup() creates it with that schema)"
        )
    elif kind == KMS_KEY:
        new = EncryptionKeyError(
            f"{what}: the KMS key cannot be used ({code}: {_message(exc)}) in {place}. Check the key id, "
            "alias or ARN given to KmsKey(...), its region, that it is enabled and is a symmetric "
            "encryption key"
        )
    elif kind == DENIED:
        new = AccessDeniedError(f"{what}: access denied ({code}) on {place}; see infra/ for the IAM policy")
    elif kind == OBJECT_MISSING:
        new = MissingObjectError(f"{what}: the object is missing from {place}")
    elif kind == UNAVAILABLE and where is not None and where.fallback:
        new = PrimaryUnavailableError(
            f"{what}: the primary region is unavailable ({place}): {type(exc).__name__}: {exc}. Writes go "
            f"to the replica {where.fallback} only once it is promoted: saver.promote() (see the README's "
            "failover runbook)"
        )
    elif kind == UNAVAILABLE:
        new = StoreUnavailableError(
            f"{what}: the store is unavailable, try again ({place}): {type(exc).__name__}: {exc}"
        )
    elif kind == MISCONFIGURED:
        new = ConfigurationError(f"{what}: {type(exc).__name__}: {exc} ({place})")
    else:
        return exc
    new.__cause__ = exc
    return new
