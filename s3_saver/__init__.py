"""s3_saver: a LangGraph checkpoint saver on S3 immutable objects, indexed by a DynamoDB
table or by manifests in the bucket, with LangGraph's long-term memory (``S3Store``) and
node cache (``S3Cache``) on the same bucket."""

from s3_saver._cache.cache import S3Cache
from s3_saver._crypto.config import KmsKey, LocalKey
from s3_saver._crypto.rotate import RewrapReport
from s3_saver._format.keys import ARCHIVE_PREFIX, LIVE_PREFIX
from s3_saver._index.dynamodb.table import (
    PARTITION_KEY,
    SORT_KEY,
    TABLE_ATTRIBUTE_DEFINITIONS,
    TABLE_GLOBAL_SECONDARY_INDEXES,
    TABLE_KEY_SCHEMA,
    TTL_ATTRIBUTE,
)
from s3_saver._migrate.run import MigrationProgress, MigrationReport, migrate
from s3_saver._migrate.urls import open_saver
from s3_saver._ops.archived import ArchiveStatus
from s3_saver._ops.audit import StoreProblem, StoreReport
from s3_saver._ops.bucket import RemainingVersion
from s3_saver._ops.encrypt import EncryptStatus
from s3_saver._ops.erase import EraseReport
from s3_saver._ops.idle import IdleReport
from s3_saver._ops.memory.encrypt import NamespaceEncryptStatus
from s3_saver._ops.memory.erase import NamespaceEraseReport
from s3_saver._ops.rebuild_keys import Rebuilt, Unindexed
from s3_saver._ops.source import ReadSource
from s3_saver._ops.threads import ThreadInfo
from s3_saver._regions.replica import (
    Promotion,
    Replica,
    ReplicationGap,
    ReplicationReport,
)
from s3_saver._saver.saver import S3Saver
from s3_saver._store.store import S3Store
from s3_saver._ops.memory.transfer import MemoryImportReport
from s3_saver._ops.memory.gc import MemoryGarbageReport
from s3_saver._transport.budget import CacheStats, CacheUse
from s3_saver._transport.protocol import RequestStats
from s3_saver._transport.retry import RetryPolicy
from s3_saver.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    CheckpointTooLargeError,
    ConfigurationError,
    CorruptObjectError,
    EmbeddingError,
    EncryptedObjectError,
    EncryptionKeyError,
    ForeignCiphertextError,
    ImmutableObjectConflictError,
    IndexModeMismatchError,
    InvalidFilterError,
    KeyTooLongError,
    MigrationError,
    MissingObjectError,
    NamespaceError,
    NamespaceErasedError,
    PlaintextObjectError,
    PrimaryUnavailableError,
    ReplicationLagError,
    ResourceMissingError,
    RunDeletedError,
    S3SaverError,
    SerializationError,
    SetupMismatchError,
    SetupTimeoutError,
    StoreUnavailableError,
    TableNotFoundError,
    TableOwnedError,
    ThreadArchivedError,
    ThreadDeletedError,
    ThreadErasedError,
    UnreadableAnswerError,
)

__all__ = [
    "ARCHIVE_PREFIX",
    "LIVE_PREFIX",
    "PARTITION_KEY",
    "SORT_KEY",
    "TABLE_ATTRIBUTE_DEFINITIONS",
    "TABLE_GLOBAL_SECONDARY_INDEXES",
    "TABLE_KEY_SCHEMA",
    "TTL_ATTRIBUTE",
    "AccessDeniedError",
    "ArchiveStatus",
    "IdleReport",
    "BucketNotFoundError",
    "CacheStats",
    "CacheUse",
    "CheckpointTooLargeError",
    "ConfigurationError",
    "CorruptObjectError",
    "EmbeddingError",
    "EncryptedObjectError",
    "EncryptionKeyError",
    "EncryptStatus",
    "EraseReport",
    "ForeignCiphertextError",
    "ImmutableObjectConflictError",
    "IndexModeMismatchError",
    "InvalidFilterError",
    "KeyTooLongError",
    "KmsKey",
    "LocalKey",
    "MigrationError",
    "MigrationProgress",
    "MigrationReport",
    "MissingObjectError",
    "NamespaceEncryptStatus",
    "NamespaceEraseReport",
    "NamespaceError",
    "PlaintextObjectError",
    "PrimaryUnavailableError",
    "Promotion",
    "RemainingVersion",
    "ReadSource",
    "Rebuilt",
    "Replica",
    "ReplicationGap",
    "ReplicationLagError",
    "ReplicationReport",
    "RequestStats",
    "RetryPolicy",
    "RewrapReport",
    "ResourceMissingError",
    "RunDeletedError",
    "S3Cache",
    "S3Saver",
    "S3Store",
    "MemoryImportReport",
    "MemoryGarbageReport",
    "S3SaverError",
    "SerializationError",
    "SetupMismatchError",
    "SetupTimeoutError",
    "StoreProblem",
    "StoreReport",
    "StoreUnavailableError",
    "TableNotFoundError",
    "TableOwnedError",
    "ThreadArchivedError",
    "ThreadDeletedError",
    "ThreadErasedError",
    "NamespaceErasedError",
    "ThreadInfo",
    "Unindexed",
    "UnreadableAnswerError",
    "migrate",
    "open_saver",
]
