"""What an operation seals and opens with: the keys of the threads it works on.

An operation loads its threads' keys first (``keys.Crypt.load``: from the cache, at no
request, in the steady state) and carries them in its context as a ``Sealer``. Every
stored byte string of user content goes through it: ``seal`` before it is written,
``open`` after it is read, each naming its place (the object's key, the thread). A saver
without encryption carries ``PLAIN``, which passes bytes through but refuses sealed ones
(the thread was written with encryption: say so, never read it as corrupt).

With encryption nothing opens that was not sealed for its place under the thread's key:
plaintext is refused (``PlaintextObjectError``), bytes of another place or changed fail
the tag (``ForeignCiphertextError``), bytes of a destroyed key say so
(``ThreadErasedError``). Never garbage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import ormsgpack

from s3_saver._crypto.envelope import (
    MALFORMED,
    OTHER_KEY,
    DataKey,
    EnvelopeError,
    is_sealed,
    key_id_of,
    open_sealed,
    place,
    seal,
)
from s3_saver._format.codec import plain
from s3_saver.errors import (
    CorruptObjectError,
    EncryptedObjectError,
    ForeignCiphertextError,
    PlaintextObjectError,
    ReplicationLagError,
    S3SaverError,
    ThreadErasedError,
)


class Crypt(Protocol):
    """What a sealer needs of the saver's encryption (``keys.Crypt``)."""

    bucket: str
    prefix: str
    # The replica region's: a key its store lacks has not arrived (replication lag).
    lags: bool

    def describe(self) -> str: ...

    def forget(self, thread_id: str) -> None: ...


class StaleKey(S3SaverError):
    """A ciphertext names another key than the one this process cached for its thread:
    the thread was erased (and written anew) by another process since. The cached key
    is dropped when this is raised; a read runs again once with the thread's record
    read (``_ops/keyed.rekeying``). Raised out of an operation that does not, it says
    to call again (the next call reads the record)."""

    def __init__(
        self, thread_id: str, where: str, subject: str | None = None, *, instead: S3SaverError | None = None
    ) -> None:
        if instead is None:
            message = (
                f"{where}: {subject or f'thread {thread_id!r}'} is encrypted under another key than the one this "
                "process held for it (another process erased it and wrote it anew): the key held was dropped, call again"
            )
        else:
            message = f"{instead} (or its key was made after this process read the key store: call again)"
        super().__init__(message)
        self.thread_id = thread_id
        # What the read says if the record, read again, still says the same (a thread
        # with no key meeting sealed bytes: the migration may have made the key and
        # sealed them after this read found none; read again, it is the real answer).
        self.instead = instead

# The type tag of a sealed metadata pair in an index entry (its bytes: an envelope of
# the pair as the serializer wrote it). Never one of a serializer's tags.
SEALED_TAG = "s3_saver.sealed"
META_FIELD = "meta"
# The field of an export's sealed record: bound to the saver's prefix and the thread, with
# no object key (the relative key is empty, which no object has).
EXPORT_FIELD = "export"

Typed = tuple[str, bytes]


@dataclass(frozen=True)
class ThreadKey:
    """A thread's key as a sealer holds it: its live data key (None: none, or erased),
    and every destroyed key of the thread (id -> when), so an old copy reads as erased."""

    key: DataKey | None
    erased: dict[bytes, int | None] = field(default_factory=dict)
    # Where the record lives (named when there is none).
    record: str = ""
    # Read from the key store by this operation (False: from the cache, so perhaps
    # replaced since by another process's erase).
    checked: bool = True


class Sealer:
    """Seals and opens the content of the threads an operation loaded (``keys``)."""

    def __init__(
        self, crypt: Crypt | None = None, keys: dict[str, ThreadKey] | None = None, *, migrating: bool = False
    ) -> None:
        self.crypt = crypt
        self.keys = keys or {}
        # The migration's reader (``_ops/encrypt``) alone: plaintext is what it has come
        # to encrypt, so it opens as it is. Every other sealer refuses it.
        self.migrating = migrating

    @property
    def enabled(self) -> bool:
        return self.crypt is not None

    def with_keys(self, keys: dict[str, ThreadKey]) -> Sealer:
        """This sealer holding ``keys`` too (an operation that loads more threads)."""
        return Sealer(self.crypt, {**self.keys, **keys}, migrating=self.migrating)

    def without(self, thread_id: str) -> Sealer:
        """This sealer without the thread's key (to be read again)."""
        return Sealer(self.crypt, {t: k for t, k in self.keys.items() if t != thread_id}, migrating=self.migrating)

    def for_migration(self) -> Sealer:
        """This sealer opening plaintext too (as it is), for the migration that
        encrypts a store written without encryption; it seals as this one does."""
        return Sealer(self.crypt, self.keys, migrating=True)

    def key_id(self, thread_id: str) -> str | None:
        """The id (hex) of the live key this sealer seals the thread's content with:
        what a commit's fence checks against the ids an erase destroyed (None: no
        encryption, or no live key held)."""
        held = self.keys.get(thread_id)
        if self.crypt is None or held is None or held.key is None:
            return None
        return held.key.key_id.hex()

    # -- objects ---------------------------------------------------------------------------
    def seal(self, thread_id: str, key: str, data: bytes) -> bytes:
        """``data``, to be stored at object ``key`` of ``thread_id``."""
        if self.crypt is None:
            return data
        return seal(self._live(thread_id, key), place(self.crypt.prefix, key, thread_id), data)

    def open(self, thread_id: str, key: str, data: bytes, source: str | None = None) -> bytes:
        """What was sealed for object ``key`` of ``thread_id`` (read from the object, or
        from ``source``: an index attribute carrying its bytes)."""
        return self._open(thread_id, key, data, None, source)

    def seal_field(self, thread_id: str, key: str, field_: str, data: bytes) -> bytes:
        """``data`` standing for ``field_`` of object (or folder) ``key`` of ``thread_id``:
        what is not an object's own bytes (a memory item's value in a namespace's rows,
        bound to the namespace's folder and the field naming the item)."""
        if self.crypt is None:
            return data
        return seal(self._live(thread_id, key), place(self.crypt.prefix, key, thread_id, field_), data)

    def open_field(self, thread_id: str, key: str, field_: str, data: bytes, source: str) -> bytes:
        """What ``seal_field`` sealed (``source``: where it was read, for errors)."""
        return self._open(thread_id, key, data, field_, source)

    # -- metadata in index entries ---------------------------------------------------------
    def seal_meta(self, thread_id: str, key: str, pair: Typed) -> Typed:
        """A checkpoint's metadata as its index entry carries it (``key``: the
        checkpoint object's): sealed, bound to that object and to the field."""
        if self.crypt is None:
            return pair
        aad = place(self.crypt.prefix, key, thread_id, META_FIELD)
        return (SEALED_TAG, seal(self._live(thread_id, key), aad, ormsgpack.packb(list(pair))))

    def open_meta(self, thread_id: str, key: str, pair: Typed, source: str) -> Typed:
        """The metadata pair an index entry carries, as the serializer wrote it."""
        if pair[0] != SEALED_TAG:
            if self.crypt is not None and not self.migrating:
                raise self._plaintext(thread_id, source)
            return pair
        opened = self._open(thread_id, key, pair[1], META_FIELD, source)
        try:
            tag, data = ormsgpack.unpackb(opened)
            return (str(tag), bytes(data))
        except (ormsgpack.MsgpackDecodeError, TypeError, ValueError) as exc:
            raise CorruptObjectError(f"{source}: its metadata is not a serialized pair ({exc})") from exc

    # -- exports ---------------------------------------------------------------------------
    def seal_export(self, thread_id: str, record: bytes) -> bytes:
        """A thread's record (its archive's bytes) as an export carries it: sealed under
        the thread's key, bound to the saver's prefix and the thread (no object: an
        export lives outside the bucket)."""
        assert self.crypt is not None
        aad = place(self.crypt.prefix, self.crypt.prefix, thread_id, EXPORT_FIELD)
        return seal(self._live(thread_id, self.crypt.prefix), aad, record)

    def open_export(self, thread_id: str, sealed: bytes, where: str) -> bytes:
        """What ``seal_export`` sealed (``where``: the export, for errors)."""
        assert self.crypt is not None
        return self._open(thread_id, self.crypt.prefix, sealed, EXPORT_FIELD, where)

    # -- immutable writes met again --------------------------------------------------------
    def same(self, thread_id: str) -> Callable[[str, bytes, bytes], bool]:
        """Whether a stored object holds what a write meant to store there (a put sent
        again meets its first write): the same bytes, or, sealed, the same plaintext
        (every sealing draws a new nonce)."""

        def same(key: str, stored: bytes, wanted: bytes) -> bool:
            if stored == wanted:
                return True
            if self.crypt is None:
                return plain(stored, key) == plain(wanted, key)
            try:
                return plain(self.open(thread_id, key, stored), key) == plain(self.open(thread_id, key, wanted), key)
            except S3SaverError:
                return False

        return same

    # -- the refusals ----------------------------------------------------------------------
    def _open(self, thread_id: str, key: str, data: bytes, field_: str | None, source: str | None) -> bytes:
        where = source or self._object(key)
        if self.crypt is None:
            if is_sealed(data):
                raise EncryptedObjectError(
                    f"{where}: {self._subject(thread_id)} was written encrypted (key id "
                    f"{(key_id_of(bytes(data)) or b'').hex()}); this saver has no encryption=: pass the "
                    "KmsKey(...) or LocalKey(...) it was written with"
                )
            return data
        if not is_sealed(data):
            if self.migrating:
                return data
            raise self._plaintext(thread_id, where, key)
        held = self.keys.get(thread_id)
        if held is None:
            raise S3SaverError(f"{where}: the key of {self._subject(thread_id)} was not loaded before it was read")
        found = key_id_of(bytes(data)) or b""
        if found in held.erased:
            raise self._erased(thread_id, key, where, held.erased[found])
        if held.key is not None and found != held.key.key_id and not held.checked:
            # A key from the cache, and bytes sealed under another one: the thread's
            # record may have changed since (erased by another process, written anew).
            # Never decided on the cache: the record is read again first.
            self.crypt.forget(thread_id)
            raise StaleKey(thread_id, where, self._subject(thread_id))
        if held.key is None:
            if self.crypt.lags:
                raise self._lagging(thread_id, where, held)
            if held.erased:
                # Erased, and this was sealed by no key the thread ever had.
                raise self._foreign(thread_id, key, where, "it names a key that was never this thread's")
            keyless = ThreadErasedError(
                f"{where}: {self._subject(thread_id)} has no key in the key store ({held.record}): it was destroyed, or "
                "the saver is configured with another key store than the one the thread was written with",
                bucket=self.crypt.bucket, key=key, thread_id=thread_id,
            )
            # No key when this process read the record, and sealed bytes now: the
            # migration (``encrypt``) may have made the key and sealed them in between.
            # Never decided on that read: the record is read again first (``rekeying``),
            # and only a second read without a key answers ``keyless``.
            self.crypt.forget(thread_id)
            raise StaleKey(thread_id, where, self._subject(thread_id), instead=keyless)
        try:
            return open_sealed(held.key, place(self.crypt.prefix, key, thread_id, field_), data)
        except EnvelopeError as exc:
            if exc.reason == OTHER_KEY:
                if self.crypt.lags:
                    raise self._lagging(thread_id, where, held) from None
                raise self._foreign(thread_id, key, where, f"{exc.detail}, a key that was never this thread's") from None
            if exc.reason == MALFORMED:
                raise CorruptObjectError(f"{where}: {exc.detail}") from None
            raise self._foreign(thread_id, key, where, exc.detail) from None

    def _live(self, thread_id: str, key: str) -> DataKey:
        held = self.keys.get(thread_id)
        if held is None or held.key is None:
            raise S3SaverError(f"{self._object(key)}: no live key of {self._subject(thread_id)} was loaded to seal it")
        return held.key

    def _subject(self, thread_id: str) -> str:
        """What ``thread_id`` names, in words: a thread, or the memory store's namespace
        (by its id: the sealer knows no name) with the store's bucket and prefix."""
        return self.crypt.subject(thread_id) if self.crypt is not None else f"thread {thread_id!r}"

    def _object(self, key: str) -> str:
        bucket = self.crypt.bucket if self.crypt is not None else ""
        return f"s3://{bucket}/{key}" if bucket else key

    def _plaintext(self, thread_id: str, where: str, key: str = "") -> PlaintextObjectError:
        assert self.crypt is not None
        return PlaintextObjectError(
            f"{where}: not encrypted, and this saver encrypts (encryption={self.crypt.describe()}): "
            f"{self._subject(thread_id)} holds content written without encryption (or put there by hand). It is refused, "
            "not read",
            bucket=self.crypt.bucket, key=key or where, thread_id=thread_id,
        )

    def _lagging(self, thread_id: str, where: str, held: ThreadKey) -> ReplicationLagError:
        return ReplicationLagError(
            f"{where}: the key it is encrypted with has not reached this region's key store ({held.record}) yet: "
            f"the key of {self._subject(thread_id)} is made in the region written to and copied here beside it; a copy that "
            "found this region out is made by the next process there that reads the thread's key"
        )

    def _foreign(self, thread_id: str, key: str, where: str, why: str) -> ForeignCiphertextError:
        assert self.crypt is not None
        return ForeignCiphertextError(
            f"{where}: encrypted content that does not belong here ({why}): it was copied or moved from another "
            f"key or thread, or changed. Refused for {self._subject(thread_id)}",
            bucket=self.crypt.bucket, key=key, thread_id=thread_id,
        )

    def _erased(self, thread_id: str, key: str, where: str, when: int | None) -> ThreadErasedError:
        assert self.crypt is not None
        at = f" at {_iso(when)} ({when} Unix seconds)" if when else ""
        return ThreadErasedError(
            f"{where}: {self._subject(thread_id)} of bucket {self.crypt.bucket!r} was erased: the key this was encrypted "
            f"with was destroyed{at}, so no copy of it can be read",
            bucket=self.crypt.bucket, key=key, thread_id=thread_id, erased_at=when,
        )


def _iso(when: int) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat()


PLAIN = Sealer()
