"""Exceptions raised by s3_saver.

Every exception derives from :class:`S3SaverError`. Failures that come from an
AWS call keep the original ``botocore`` error as ``__cause__``; AWS error codes
that have no meaning for the saver are not wrapped and pass through unchanged.
"""

from __future__ import annotations

from typing import Any


class S3SaverError(Exception):
    """Base class of every error the saver raises."""


class ConfigurationError(S3SaverError, ValueError):
    """The saver or a call was configured wrongly (for example no ``thread_id``)."""


class KeyTooLongError(ConfigurationError):
    """An id is too long for an S3 object key or a DynamoDB key.

    Raised before anything is written.
    """


class CheckpointTooLargeError(ConfigurationError):
    """A checkpoint's index entry cannot fit DynamoDB's item size limit.

    Raised before anything is written. Values and metadata never cause it (they
    move to S3 when large); only an extreme number of channels does.
    """


class ResourceMissingError(S3SaverError):
    """The bucket or the table does not exist: run ``setup()`` first."""


class BucketNotFoundError(ResourceMissingError):
    """The S3 bucket does not exist: run ``setup()`` (or deploy ``infra/``)."""


class TableNotFoundError(ResourceMissingError):
    """The DynamoDB table does not exist: run ``setup()`` (or deploy ``infra/``)."""


class SetupMismatchError(S3SaverError):
    """The table exists but its key schema is not the one the saver uses."""


class AccessDeniedError(S3SaverError, PermissionError):
    """AWS refused the call; the IAM policy in ``infra/`` lists what is needed."""


class ImmutableObjectConflictError(S3SaverError):
    """A different body was about to be stored under an existing immutable key.

    The stored object is left untouched.
    """


class MissingObjectError(S3SaverError):
    """The index refers to an object that is not in the bucket.

    Seen while a thread is being deleted, or when objects were removed by hand or
    by a lifecycle rule shorter than the saver's ``ttl``.
    """


class CorruptObjectError(S3SaverError):
    """An object or index item could not be decoded as the saver wrote it."""


class ThreadDeletedError(S3SaverError):
    """A write continued a thread that ``delete_thread`` removed meanwhile.

    A run that was in flight when its thread was deleted cannot bring it back:
    its ``put`` / ``put_writes`` raise this and leave nothing behind. The thread
    id itself can be used again by a run that starts afresh.
    """


# DynamoDB's answer to a ConditionExpression that did not hold.
CONDITION_FAILED = {"ConditionalCheckFailedException"}
_BUCKET_CODES = {"NoSuchBucket"}
_TABLE_CODES = {"ResourceNotFoundException"}
_DENIED_CODES = {
    "AccessDenied",
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "KMS.AccessDeniedException",
}


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError`` (None for anything else)."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


def translate(exc: BaseException, *, what: str) -> BaseException:
    """Map an AWS failure to the saver's exception, or return it unchanged.

    Args:
        exc: The exception raised by botocore for one call.
        what: A short description of the call (operation and target) for the message.
    """
    code = error_code(exc)
    if code in _BUCKET_CODES:
        new: S3SaverError = BucketNotFoundError(
            f"{what}: the bucket does not exist; run saver.setup() or deploy infra/"
        )
    elif code in _TABLE_CODES:
        new = TableNotFoundError(
            f"{what}: the DynamoDB table does not exist; run saver.setup() or deploy infra/"
        )
    elif code in _DENIED_CODES:
        new = AccessDeniedError(f"{what}: access denied ({code}); see infra/ for the IAM policy")
    elif code in {"NoSuchKey", "404"}:
        new = MissingObjectError(f"{what}: the object is missing from the bucket")
    else:
        return exc
    new.__cause__ = exc
    return new
