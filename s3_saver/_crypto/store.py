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
* ``page``, ``swap``: a rotation's walk (an admin call: listing the key bucket) and its
  rewrite of a live record with the same key wrapped anew (``IfMatch`` the ETag read:
  a record another process changed meanwhile is read again, never overwritten).
* ``mirror``: with a replica, the replica region's key store (a store of its own, in
  that region: a key bucket is never replicated) is given the record the region written
  to decided on, in the same wave as the create there; it replaces whatever other record
  it holds (a key another process made and lost with, an earlier life's erasure).
"""

from __future__ import annotations

from dataclasses import replace

from s3_saver._crypto.records import (
    MEMORY_FOLDER,
    STORE_KEY,
    THREAD_FOLDER,
    THREADS,
    KeyKind,
    KeyRecord,
    decode_record,
    encode_record,
    erasure,
)
from s3_saver._format.key_codec import decode, encode
from s3_saver._transport.failures import (
    BUCKET_MISSING,
    BUCKET_OURS_CODES,
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    UNAVAILABLE,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Call, Op, raise_failure, request_one
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import (
    ConfigurationError,
    NamespaceErasedError,
    S3SaverError,
    ThreadErasedError,
)

# A record another writer keeps replacing between our read and our write: each round
# has a reason (a create, an erase), which does not repeat without end.
_ATTEMPTS = 6


class KeyStore:
    """The records of one saver prefix in the key bucket."""

    def __init__(self, s3: S3Calls, prefix: str, kind: KeyKind = THREADS) -> None:
        self.s3 = s3
        self.prefix = prefix
        self.kind = kind

    @property
    def bucket(self) -> str:
        return self.s3.bucket

    def key_of(self, thread_id: str) -> str:
        return self.kind.record_key(self.prefix, thread_id)

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

    # -- rotation --------------------------------------------------------------------------
    def page(self, token: str | None, size: int) -> Op[tuple[list[str], str | None]]:
        """One page of the threads that have a record here (listing the key bucket: an
        admin call), and the token of the next page (None: the last).

        Key parsing is exact: a key under ``<prefix>t/`` that is not one encoded thread id
        (another saver's, whose prefix lies in this one's tree) is not this saver's record."""
        if self.kind is not THREADS:
            return (yield from self._memory_page(token, size))
        folder = f"{self.prefix}{THREAD_FOLDER}"
        listed = yield from request_one(self.s3.list_keys(folder, token, max_keys=size))
        threads = []
        for item in listed.get("Contents", []):
            rest = item["Key"][len(folder) :]
            try:
                thread_id = decode(rest)
            except UnicodeDecodeError:
                continue
            if not rest or "/" in rest:
                continue
            try:
                exact = encode(thread_id) == rest
            except ConfigurationError:
                exact = False
            if exact:
                threads.append(thread_id)
        return threads, listed.get("NextContinuationToken") or None

    def _memory_page(self, token: str | None, size: int) -> Op[tuple[list[str], str | None]]:
        """``page`` of the memory store's records: the namespace ids under ``<prefix>m/``
        (64 hex digits, exactly), and on the first page the store-wide key's name (its
        record read like the others: absent, it is skipped)."""
        folder = f"{self.prefix}{MEMORY_FOLDER}"
        listed = yield from request_one(self.s3.list_keys(folder, token, max_keys=size))
        names = [] if token is not None else [STORE_KEY]
        for item in listed.get("Contents", []):
            rest = item["Key"][len(folder) :]
            if len(rest) == 64 and all(c in "0123456789abcdef" for c in rest):
                names.append(rest)
        return names, listed.get("NextContinuationToken") or None

    def swap(self, thread_id: str, record: KeyRecord, read: KeyRecord) -> Op[KeyRecord | None]:
        """``record`` in place of ``read`` (as read, with its ETag), only if it is still
        there: the stored record with its new ETag, or None when another writer changed
        it meanwhile (an erase, a new life, a mark): nothing was written."""
        assert read.etag is not None
        call = self.s3.put_swap(self.key_of(thread_id), encode_record(replace(record, etag=None)), read.etag)
        (answer,) = yield (call,)
        if not isinstance(answer, BaseException):
            return replace(record, etag=answer["ETag"])
        if error_code(answer) in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
            return None
        raise_failure(call, answer)
        raise AssertionError("unreachable")

    # -- create ----------------------------------------------------------------------------
    def create(
        self, thread_id: str, record: KeyRecord, over: KeyRecord | None = None, subject: str | None = None
    ) -> Op[KeyRecord]:
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
                raise self.being_erased(thread_id, over, subject)
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

    def offer(self, thread_id: str, record: KeyRecord) -> Op[tuple[str, str | None]]:
        """``record`` written here only where no record is (the replica region's store,
        in the wave of the create in the region written to): ``("written", etag)``,
        ``("taken", None)`` (a record is there) or ``("out", None)`` (no answer)."""
        call = self.s3.put_swap(self.key_of(thread_id), encode_record(replace(record, pending_replica=False)), None)
        (answer,) = yield (call,)
        if not isinstance(answer, BaseException):
            return "written", answer.get("ETag")
        code = error_code(answer)
        if code in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
            return "taken", None
        if classify(answer, "put_object") == UNAVAILABLE:
            return "out", None
        raise_failure(call, answer)
        raise AssertionError("unreachable")

    def mirror(self, thread_id: str, record: KeyRecord, mine: bytes | None = None) -> Op[bool]:
        """Make this store (the replica region's) hold ``record``, the thread's live
        record as the region written to holds it: written where none is, in place of an
        earlier life's erasure, or of ``mine`` (the key id of a record this process
        wrote here in the same wave, for a create it lost in the region written to).
        Never in place of another live key: one made in this region while it was the one
        written to (a failover) stays, for the operator to see; the caller leaves the
        copy pending. The record's bytes as they are (with KMS, a multi-Region key
        unwraps them in either region).

        Returns:
            True once it holds the record's key; False when the store did not answer
            (its region out) or holds another live key.
        """
        key = self.key_of(thread_id)
        body = encode_record(replace(record, pending_replica=False))
        etag: str | None = None  # None: only where there is no record
        for _ in range(_ATTEMPTS):
            call = self.s3.put_swap(key, body, etag)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                return True
            code = error_code(answer)
            if code in CONDITIONAL_CONFLICT_CODES:
                continue
            if code not in PRECONDITION_FAILED_CODES:
                if classify(answer, "put_object") == UNAVAILABLE:
                    return False
                raise_failure(call, answer)
            read = self.s3.get(key)
            (found_answer,) = yield (read,)
            if isinstance(found_answer, BaseException) and classify(found_answer, "get_object") == UNAVAILABLE:
                return False
            found = self._record(thread_id, read, found_answer)
            if found is not None and found.key_id == record.key_id:
                # Held already; or erased: an erase destroyed this key (its erasure
                # written here first), and a copy now would bring it back.
                return found.live
            if found is not None and found.live and found.key_id != mine:
                return False
            etag = None if found is None else found.etag
        raise S3SaverError(f"{self.where(thread_id)}: the key record kept changing while it was copied here; call again")

    def bury(self, thread_id: str, erased: KeyRecord) -> Op[KeyRecord]:
        """Make this store (the replica region's) hold ``erased``, the erasure the region
        written to just wrote: over the live copy of that key, over any other key of the
        thread (named among the record's destroyed ones), and where no record is, so that
        a copy of the key still pending (``mirror``) can never land after the erase.
        Raises when the store does not answer: the erase cannot go on to delete anything
        while the key may live here.

        Returns:
            The erasure as stored here (with its ETag, for ``settle``).
        """
        key = self.key_of(thread_id)
        record, etag = replace(erased, etag=None), None
        for _ in range(_ATTEMPTS):
            call = self.s3.put_swap(key, encode_record(record), etag)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                return replace(record, etag=answer["ETag"])
            if error_code(answer) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
                raise_failure(call, answer)
            found = yield from self.read_one(thread_id)
            if found is None:
                etag = None
                continue
            if not found.live and found.key_id == erased.key_id:
                return found  # buried already (a call again after a cut)
            # Another key of the thread here: destroyed too, and named.
            ids = {**found.erased_ids(), **dict(record.earlier)}
            ids.pop(erased.key_id, None)
            if found.key_id != erased.key_id:
                ids.setdefault(found.key_id, erased.erased_at)
            record, etag = replace(record, earlier=tuple(ids.items())), found.etag
        raise S3SaverError(f"{self.where(thread_id)}: the key record kept changing while the key was destroyed here; call again")

    def mark_pending(self, thread_id: str, record: KeyRecord, pending: bool) -> Op[None]:
        """Record on ``record`` (as read or written, with its ETag) whether its copy in
        the replica region's store is still to make. Refused (the record changed
        meanwhile: another process's mark, an erase), it is left as it is now."""
        if record.etag is None or record.pending_replica == pending:
            return
        call = self.s3.put_swap(self.key_of(thread_id), encode_record(replace(record, pending_replica=pending)), record.etag)
        (answer,) = yield (call,)
        if isinstance(answer, BaseException) and error_code(answer) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
            raise_failure(call, answer)

    def being_erased(self, thread_id: str, record: KeyRecord, subject: str | None = None) -> ThreadErasedError:
        """A writer's refusal while an erase of the thread is under way (its key
        destroyed, the thread not yet gone in the index): no new key until then.
        ``subject``: what the key is of, in words (``Crypt.subject``)."""
        if self.kind is not THREADS:
            return NamespaceErasedError(
                f"{subject or f'the namespace of id {thread_id}'} is being erased: its key was destroyed at {record.erased_at} (Unix "
                f"seconds) and the erase has not finished ({self.where(thread_id)} is not settled). It can be written "
                "again once erase_namespace returns; if an erase was cut short, call erase_namespace again",
                bucket=self.bucket, key=self.key_of(thread_id), erased_at=record.erased_at,
            )
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
