"""Exceptions raised by s3_saver.

Every exception derives from [S3SaverError][s3_saver.errors.S3SaverError]. Failures that come from an
AWS call keep the original ``botocore`` error as ``__cause__``; AWS error codes
that have no meaning for the saver are not wrapped and pass through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import InvalidNamespaceError


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


class TableOwnedError(ConfigurationError):
    """The DynamoDB table's key prefix belongs to another bucket.

    A table's threads are keyed by prefix and thread id, not by bucket: two
    buckets on one table and prefix would read and delete each other's
    threads. ``setup()`` (or the first saver on a table set up by an earlier
    version) records the owner; the message names both buckets, the table
    and the prefix. Give the saver its own table, or another prefix.
    """


class IndexModeMismatchError(ConfigurationError):
    """The bucket prefix belongs to the other index mode, or to another DynamoDB table.

    Both modes keep the same objects under ``<prefix>live/``; a saver of the
    other mode (or of another table) would read no threads there, start second
    histories under the same thread ids, and collect the other index's objects
    as garbage. A marker written by ``setup()`` (or the first write) records the
    prefix's mode and table; a saver of another is refused before it reads,
    writes or deletes (its ``Replica``'s table is accepted). The message names
    the bucket, the prefix, the mode found (and its table) and what to pass instead.

    Attributes:
        bucket: The bucket.
        prefix: The saver's prefix.
        found: The prefix's index mode: ``"dynamodb"`` or ``"manifest"``.
        table: The table the marker names (DynamoDB mode), when known.
    """

    def __init__(self, message: str, bucket: str = "", prefix: str = "", found: str = "", table: str | None = None) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.prefix = prefix
        self.found = found
        self.table = table

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.bucket, self.prefix, self.found, self.table))


class ResourceMissingError(S3SaverError):
    """The bucket or the table does not exist: run ``setup()`` first."""


class BucketNotFoundError(ResourceMissingError):
    """The S3 bucket does not exist: run ``setup()`` (or deploy ``infra/``)."""


class TableNotFoundError(ResourceMissingError):
    """The DynamoDB table does not exist: run ``setup()`` (or deploy ``infra/``)."""


class SetupMismatchError(S3SaverError):
    """The table exists but its key schema is not the one the saver uses
    (``s3_saver.TABLE_KEY_SCHEMA``): raised by ``setup()``, and by the first call
    that touches such a table without it. The message names the table and its
    region."""


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


class RunDeletedError(ThreadDeletedError):
    """A run went on writing checkpoints after ``delete_for_runs`` deleted it.

    Its ``put`` raises this and leaves nothing behind, so a deleted run cannot
    leave a checkpoint that points at what was deleted with it.
    """


class ThreadArchivedError(S3SaverError):
    """The thread is archived in a storage class that cannot be read at once
    (``GLACIER``, ``DEEP_ARCHIVE``), or it was archived while this write ran.

    ``restore_thread`` (or ``arestore_thread``) brings it back: it requests the
    object's restore from the cold class, and once S3 has done that (hours for
    Deep Archive) a call again makes the thread live. Threads archived in an
    instant-access class (``GLACIER_IR``, ``STANDARD_IA``, ``INTELLIGENT_TIERING``)
    are read transparently and restored by the next write, without this error.

    Attributes:
        thread_id: The archived thread.
        storage_class: The archive object's storage class.
        key: The archive object's key in the bucket.
    """

    def __init__(self, message: str, thread_id: str = "", storage_class: str = "", key: str = "") -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.storage_class = storage_class
        self.key = key


class SerializationError(S3SaverError):
    """A stored value, checkpoint or metadata could not be decoded by the saver's ``serde``.

    Usually the thread was written with another serializer (for example an
    ``EncryptedSerializer``, whose type tags end in ``+aesgcm``) or another key.
    """


class StoreUnavailableError(S3SaverError):
    """S3 or DynamoDB could not be reached, did not answer in time, answered with
    a server error or kept throttling: try again.

    Raised once the saver's retries are spent (see ``RetryPolicy``). The botocore
    error is the ``__cause__``.
    """


class UnreadableAnswerError(StoreUnavailableError):
    """S3 or DynamoDB "answered" 200 with something that is not their answer: a body
    that is not the document the call returns (a sign-in page, an empty or truncated
    body), or without what every real answer carries (a stored object's ``ETag``).

    Something between the saver and the store answered in its place: a captive
    portal, a proxy or gateway, a store that does not speak the API. Such an answer
    confirms nothing: a write it answered is not reported saved. The call is sent
    again first, as after a dropped connection (every call the saver sends is safe
    to send again); this is raised once the retries are spent.

    Attributes:
        service: ``"s3"`` or ``"dynamodb"``.
        operation: The boto3 method (``put_object``, ``transact_write_items``).
        bucket: The bucket of the saver.
        table: The DynamoDB table (DynamoDB calls).
        region: The region of the service's client.
        key: The object key, or the thread's partition key, the call named.
        missing: What the answer lacked, in words.
    """

    def __init__(
        self,
        message: str,
        *,
        service: str = "",
        operation: str = "",
        bucket: str | None = None,
        table: str | None = None,
        region: str | None = None,
        key: str | None = None,
        missing: str = "",
    ) -> None:
        super().__init__(message)
        self.service = service
        self.operation = operation
        self.bucket = bucket
        self.table = table
        self.region = region
        self.key = key
        self.missing = missing

    def __reduce__(self) -> tuple[Any, ...]:
        fields = ("service", "operation", "bucket", "table", "region", "key", "missing")
        return (_rebuild_unreadable, (str(self), {f: getattr(self, f) for f in fields}))


def _rebuild_unreadable(message: str, fields: dict[str, Any]) -> UnreadableAnswerError:
    return UnreadableAnswerError(message, **fields)


class PrimaryUnavailableError(StoreUnavailableError):
    """The primary region failed and the saver has a replica: reads went there,
    but a write cannot (the replica is read-only until ``promote()``).

    Raised by writes (``put``, ``put_writes``, deletes...) once the primary's
    retries are spent. The message names the primary, the replica and the
    runbook's next step.
    """


class ReplicationLagError(S3SaverError):
    """A replica read met what S3 replication has not copied yet.

    S3 replication copies each object on its own, in no particular order,
    usually within seconds and sometimes minutes later: the replica's index can
    name a checkpoint whose objects have not arrived. Raised when no complete
    checkpoint can stand in (a checkpoint asked for by id, a gap inside a
    history, ``Replica(on_lag="raise")``), and by ``promote()`` when the region
    it leaves holds writes the new one lacks. A memory store (``S3Store.from_saver``)
    raises it when a replica read needs an item whose value object has not arrived.
    """


class SetupTimeoutError(S3SaverError, TimeoutError):
    """``setup()`` created the table but it did not become ACTIVE in time."""


class MigrationError(S3SaverError):
    """``migrate()`` found the target different from the source (verification), or a
    target that did not store a checkpoint under the id it was given.

    Attributes:
        thread_id: The thread.
        checkpoint_ns: The namespace ("" for the root graph).
        checkpoint_id: The checkpoint that differs (None when a whole namespace does).
        difference: What differs, in words.
    """

    def __init__(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, difference: str
    ) -> None:
        where = f"thread {thread_id!r}, namespace {checkpoint_ns!r}"
        if checkpoint_id is not None:
            where += f", checkpoint {checkpoint_id}"
        super().__init__(f"{where}: {difference}")
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.checkpoint_id = checkpoint_id
        self.difference = difference

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.checkpoint_ns, self.checkpoint_id, self.difference))


# -- Encryption (``encryption=``) -------------------------------------------------------------


class _Placed(S3SaverError):
    """An encryption error about one stored thing: its bucket, key and thread."""

    def __init__(self, message: str, *, bucket: str = "", key: str = "", thread_id: str = "") -> None:
        super().__init__(message)
        self.bucket = bucket
        self.key = key
        self.thread_id = thread_id

    def _fields(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "key": self.key, "thread_id": self.thread_id}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_placed, (type(self), str(self), self._fields()))


def _rebuild_placed(cls: type, message: str, fields: dict[str, Any]) -> Any:
    return cls(message, **fields)


class ThreadErasedError(_Placed):
    """The thread's data key was destroyed: what is stored of it cannot be read, by
    anyone, from any copy (an old version, an archive, a replica, a backup).

    Raised by a read of a thread whose key record says "erased", or whose stored
    bytes name a key that is not the thread's key any more (a copy restored from
    history after the thread was erased and written anew). Never garbage: a read
    either returns what was written or raises this.

    Attributes:
        bucket: The bucket of the object (or of the key record).
        key: The object key (or the key record's).
        thread_id: The thread.
        erased_at: When its key was destroyed (Unix seconds), when known.
    """

    def __init__(
        self, message: str, *, bucket: str = "", key: str = "", thread_id: str = "", erased_at: int | None = None
    ) -> None:
        super().__init__(message, bucket=bucket, key=key, thread_id=thread_id)
        self.erased_at = erased_at

    def _fields(self) -> dict[str, Any]:
        return {**super()._fields(), "erased_at": self.erased_at}


class NamespaceErasedError(ThreadErasedError):
    """A memory namespace's data key was destroyed (``S3Store.erase_namespace``): what
    is stored of its items cannot be read, by anyone, from any copy (an old version of
    a head, a segment or a value object, a replica, a backup, a table restored to a
    point in time). A ``ThreadErasedError`` for memory: one ``except`` catches both.

    Attributes:
        bucket: The bucket of the store (or of the key record).
        key: Where the content was read (the object key or the table item), or the key record's.
        namespace: The namespace (empty when not known, e.g. from a key record alone).
        erased_at: When its key was destroyed (Unix seconds), when known.
    """

    def __init__(
        self,
        message: str,
        *,
        bucket: str = "",
        key: str = "",
        thread_id: str = "",
        erased_at: int | None = None,
        namespace: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, bucket=bucket, key=key, thread_id=thread_id, erased_at=erased_at)
        self.namespace = tuple(namespace)

    def _fields(self) -> dict[str, Any]:
        return {**super()._fields(), "namespace": self.namespace}


class PlaintextObjectError(_Placed):
    """A saver with ``encryption=`` met stored content that is not encrypted: an
    object, an index attribute or an archive written without encryption (or put
    there by hand). It is refused, never served: an encrypting saver reads nothing
    it cannot prove was written for that place under the thread's key.

    Attributes:
        bucket: The bucket (the object's, or the one the index belongs to).
        key: The object key, or the index item that carries the content.
        thread_id: The thread.
    """


class ForeignCiphertextError(_Placed):
    """Encrypted bytes that do not open where they are: an object copied or moved
    to another key or thread, bytes changed after they were written, or a key
    record moved to another thread. The associated data of every ciphertext is its
    own place (the object's key within the saver's prefix and the thread id), so a
    copy anywhere else fails its authentication tag.

    Attributes:
        bucket: The bucket (the object's, or the key store's).
        key: The object key, the index item, or the key record.
        thread_id: The thread it was read for.
    """


class EncryptionKeyError(S3SaverError):
    """The saver's key-encryption key cannot be used: the KMS key is missing,
    disabled, pending deletion or not for encryption, or a thread's data key was
    wrapped by another key than the one configured (another KMS key, another
    local master key). The message names the key and the key record.
    """


class EncryptedObjectError(ConfigurationError):
    """A saver without ``encryption=`` met encrypted content: the thread was written
    by a saver with encryption. Pass the same ``encryption=`` (key and key store)
    to read it. The message names the object and the thread.
    """


@dataclass
class Where:
    """What the saver talks to, for error messages: names, regions, custom endpoints.

    A region or endpoint is None when the AWS defaults decide it; the saver
    fills in the region once a client has resolved it.
    """

    bucket: str
    table: str | None
    regions: dict[str, str | None] = field(default_factory=dict)
    endpoints: dict[str, str | None] = field(default_factory=dict)
    # Which region's clients send the call ("primary" or "replica", as configured).
    site: str = "primary"
    # Set on the region written to when a replica can serve reads: its failures
    # then say so, and how to make the replica writable.
    fallback: str | None = None

    def region(self, service: str) -> str | None:
        return self.regions.get(service)

    def describe(self, service: str) -> str:
        if service == "kms":
            name = "KMS"
        else:
            name = f"bucket {self.bucket!r}" if service == "s3" else f"DynamoDB table {self.table!r}"
        text = f"{name} in region {self.region(service) or '(AWS default)'}"
        endpoint = self.endpoints.get(service)
        return f"{text} at endpoint {endpoint}" if endpoint else text


# -- The store (long-term memory) -------------------------------------------------------------


class NamespaceError(ConfigurationError, InvalidNamespaceError):
    """A memory namespace the store refuses: one LangGraph refuses (empty where an item
    is put, a label that is not a string, is empty, or holds a ``.`` or a NUL), or a
    label that is not valid Unicode text or holds U+10FFFF (a noncharacter the store
    reserves as the upper bound of its namespace ranges).

    It is LangGraph's ``InvalidNamespaceError`` as well, so code written for
    ``InMemoryStore`` catches it. Raised before anything is sent.

    Attributes:
        namespace: The namespace (or namespace prefix, or match path) at fault.
    """

    def __init__(self, message: str, namespace: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.namespace = namespace

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.namespace))


class InvalidFilterError(ConfigurationError):
    """A search filter the store cannot evaluate: an unknown operator (the store knows
    ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``), a ``$gt``-like operator whose
    operand is not a number, or a key that is not a string.

    A ``ValueError``, as ``InMemoryStore``'s "Unsupported operator" is; raised for the
    whole filter before anything is read, whether or not an item would have reached
    the bad part.

    Attributes:
        namespace: The searched namespace prefix.
        filter: The filter as given.
    """

    def __init__(self, message: str, namespace: tuple[Any, ...] = (), filter: Any = None) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.filter = filter

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.namespace, self.filter))


class EmbeddingError(ConfigurationError):
    """The store's embedder returned vectors that cannot be stored: not one vector per
    text, or a vector whose length is not the index's ``dims``, or whose values are not
    numbers, or (in DynamoDB mode) more vectors for one item than a table item holds.
    Raised before anything is sent: nothing of the batch is stored.

    Attributes:
        namespace: The item's namespace (the searched prefix for a query), when one is at fault.
        key: The item's key, when one is at fault.
    """

    def __init__(self, message: str, namespace: tuple[Any, ...] | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.namespace, self.key))
