"""The key store: where each thread's data key lives, wrapped, in a bucket that keeps no
old copy of anything (unversioned: no Object Lock, no replication), holding nothing else.

Its operations are written as every operation is (``_transport/protocol``): generators of
S3 calls on the key bucket, one wave for all the threads asked at once.

* ``read``: the records of some threads (None: no key yet).
* ``create``: a new record, written only if none is there (``IfNoneMatch``), or over the
  erased record of a thread's earlier life (``IfMatch`` its ETag). Two processes that make
  a thread's first key at once agree on one: the loser's write is refused (412), it reads
  the winner's record and uses that key.
* ``destroy``: the live record replaced by its erasure (``IfMatch`` the ETag read). The
  bucket keeps no old version, so the wrapped key is gone once the answer comes. The
  erasure is unsettled until its erase has made the thread gone in the index
  (``settle``): until then no new key is made for the thread (``create`` refuses).
"""

from __future__ import annotations

from dataclasses import replace

from s3_saver._crypto.records import (
    KeyRecord,
    decode_record,
    encode_record,
    erasure,
    record_key,
)
from s3_saver._transport.failures import (
    BUCKET_MISSING,
    BUCKET_OURS_CODES,
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Call, Op, raise_failure, request_one
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import ConfigurationError, S3SaverError, ThreadErasedError

# A record another writer keeps replacing between our read and our write: each round
# has a reason (a create, an erase), which does not repeat without end.
_ATTEMPTS = 6


class KeyStore:
    """The records of one saver prefix in the key bucket."""

    def __init__(self, s3: S3Calls, prefix: str) -> None:
        self.s3 = s3
        self.prefix = prefix

    @property
    def bucket(self) -> str:
        return self.s3.bucket

    def key_of(self, thread_id: str) -> str:
        return record_key(self.prefix, thread_id)

    def where(self, thread_id: str) -> str:
        return f"s3://{self.bucket}/{self.key_of(thread_id)}"

    # -- read ------------------------------------------------------------------------------
    def read(self, thread_ids: list[str]) -> Op[dict[str, KeyRecord | None]]:
        """The record of each thread (None: none stored), in one wave."""
        if not thread_ids:
            return {}
        calls = tuple(self.s3.get(self.key_of(t)) for t in thread_ids)
        answers = yield calls
        return {t: self._record(t, call, answer) for t, call, answer in zip(thread_ids, calls, answers)}

    def read_one(self, thread_id: str) -> Op[KeyRecord | None]:
        return (yield from self.read([thread_id]))[thread_id]

    def _record(self, thread_id: str, call: Call, answer: object) -> KeyRecord | None:
        if isinstance(answer, BaseException):
            if classify(answer, "get_object") == OBJECT_MISSING:
                return None
            raise_failure(call, answer)
        assert isinstance(answer, dict)
        return decode_record(answer["Body"], answer.get("ETag"), self.where(thread_id))

    # -- create ----------------------------------------------------------------------------
    def create(self, thread_id: str, record: KeyRecord, over: KeyRecord | None = None) -> Op[KeyRecord]:
        """Store ``record`` as the thread's key, unless one is there: then the one there
        (the winner's, when another process made the thread's key first). ``over``: the
        erased record of the thread's earlier life, replaced only as read.

        Returns:
            The thread's live record (``record`` or the winner's), with its ETag.
        """
        key = self.key_of(thread_id)
        body = encode_record(record)
        for _ in range(_ATTEMPTS):
            if over is not None and not over.settled:
                raise self.being_erased(thread_id, over)
            call = self.s3.put_swap(key, body, over.etag if over is not None else None)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                return replace(record, etag=answer["ETag"])
            code = error_code(answer)
            if code in CONDITIONAL_CONFLICT_CODES:
                continue  # two conditional writes met: send again, one of them wins
            if code not in PRECONDITION_FAILED_CODES:
                raise_failure(call, answer)
            # Refused: a record is there (or not the one read). What is there decides.
            found = yield from self.read_one(thread_id)
            if found is None:
                over = None  # removed meanwhile (by hand): create it again
            elif found.live:
                # The winner's key (or ours, if this is our own write sent again after a
                # lost answer: the same bytes, so the same key): everyone uses it.
                return found
            else:
                over = found  # an erased record: this thread's new life replaces it
        raise S3SaverError(f"{self.where(thread_id)}: the key record kept changing while it was created; nothing was written")

    def being_erased(self, thread_id: str, record: KeyRecord) -> ThreadErasedError:
        """A writer's refusal while an erase of the thread is under way (its key
        destroyed, the thread not yet gone in the index): no new key until then."""
        return ThreadErasedError(
            f"thread {thread_id!r} is being erased: its key was destroyed at {record.erased_at} (Unix seconds) "
            f"and the erase has not finished ({self.where(thread_id)} is not settled). It can be written again "
            "once erase_thread returns; if an erase was cut short, call erase_thread again",
            bucket=self.bucket, key=self.key_of(thread_id), thread_id=thread_id, erased_at=record.erased_at,
        )

    # -- destroy ---------------------------------------------------------------------------
    def destroy(self, thread_id: str, now: int) -> Op[KeyRecord | None]:
        """Replace the thread's live record by its erasure (the data key destroyed),
        unsettled (see ``settle``).

        Returns:
            The erased record (an earlier erasure when the key was destroyed already),
            or None when the thread never had a key.
        """
        key = self.key_of(thread_id)
        for _ in range(_ATTEMPTS):
            found = yield from self.read_one(thread_id)
            if found is None or not found.live:
                return found
            gone = erasure(found, now)
            call = self.s3.put_swap(key, encode_record(gone), found.etag)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                return replace(gone, etag=answer["ETag"])
            if error_code(answer) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
                raise_failure(call, answer)
            # Replaced meanwhile (a new life's create, our own erasure sent again): read again.
        raise S3SaverError(f"{self.where(thread_id)}: the key record kept changing while it was destroyed; call again")

    def settle(self, thread_id: str, erased: KeyRecord) -> Op[KeyRecord | None]:
        """Mark the erasure ``erased`` (as the erase destroyed or read it, with its
        ETag) settled: its erase has made the thread gone in the index (the destroyed
        ids recorded there), so a new life may begin. Swapped on that ETag first (no
        read); refused, the record is read and decided again.

        Returns:
            The record as it is now (None: none; a live one: a new life began).
        """
        key = self.key_of(thread_id)
        found: KeyRecord | None = erased
        for attempt in range(_ATTEMPTS):
            if attempt or erased.etag is None:
                found = yield from self.read_one(thread_id)
            if found is None or found.live or found.settled or found.key_id != erased.key_id:
                return found
            done = replace(found, settled=True, etag=None)
            call = self.s3.put_swap(key, encode_record(done), found.etag)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                return replace(done, etag=answer["ETag"])
            if error_code(answer) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
                raise_failure(call, answer)
        raise S3SaverError(f"{self.where(thread_id)}: the key record kept changing while its erase settled; call again")

    # -- setup ---------------------------------------------------------------------------
    def setup(self, region: str | None) -> Op[None]:
        """Create the key bucket when missing (unversioned); refuse one that is versioned.

        A versioned bucket keeps every record it replaces as a noncurrent version: a
        destroyed key would stay readable there. Object Lock and replication both need
        versioning, so refusing it refuses them too. (A backup plan cannot be seen from
        here: keep the bucket out of them.)
        """
        (head,) = yield (self.s3.head_bucket(),)
        if isinstance(head, BaseException):
            if classify(head, "head_bucket") != BUCKET_MISSING:
                raise_failure(self.s3.head_bucket(), head)
            (created,) = yield (self.s3.create_bucket(region),)
            if isinstance(created, BaseException) and error_code(created) not in BUCKET_OURS_CODES:
                raise_failure(self.s3.create_bucket(region), created)
        state = yield from request_one(self.s3.versioning())
        status = state.get("Status")
        if status:
            raise ConfigurationError(
                f"the key store s3://{self.bucket} has versioning {status}: every key record it replaced would stay "
                "as a noncurrent version, so a destroyed key could be read back. Give the saver a bucket of its own "
                "that was never versioned (key_bucket=), with no Object Lock, no replication and no backup plan"
            )
