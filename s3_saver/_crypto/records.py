"""The key store's records: one per thread, the thread's data key wrapped, or its erasure.

A record is a small msgpack map::

    {"format": "s3_saver.key/1", "state": "live" | "erased", "key_id": 16 bytes,
     "wrapped": the data key wrapped by the key-encryption key (live only),
     "kek": what wrapped it ("kms:<key ARN>" or "local:<fingerprint>"),
     "created": Unix seconds, "erased_at": Unix seconds (erased only),
     "settled": whether the erase that destroyed the key has made the thread gone in
     its index (erased only),
     "earlier": [[key id, erased_at], ...] (the keys of the thread's earlier lives),
     "pending_replica": true when the replica region's key store did not answer as the
     key was made there too (live only; absent otherwise)}

An erased record keeps no key material: it lets a reader say when the key was destroyed,
and a new life of the thread replaces it (compare-and-swap on its ETag) with a key of a
new id, naming the ids of the keys it replaced (``earlier``): a ciphertext restored from
an earlier life is then told apart (erased) from one copied from another thread (foreign).
It lives in a bucket that keeps no old version, so overwriting a live record with its
erasure destroys the key.

An erasure is written unsettled: the erase that wrote it has still to make the thread
gone in its index (the delete's switch, which records the destroyed key ids so that a
process still holding one in its cache commits nothing under it). Until the erase
settles it, no new life may begin: a key made then could seal content the erase is
about to delete, and what a lock keeps of that content would stay readable under a
live key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import ormsgpack

from s3_saver._crypto.envelope import KEY_ID_BYTES
from s3_saver._format.key_codec import encode
from s3_saver.errors import CorruptObjectError

KEY_FORMAT = "s3_saver.key/1"
LIVE = "live"
ERASED = "erased"
# The folder of thread records in the key store, under the saver's prefix.
THREAD_FOLDER = "t/"
# KMS encryption context keys (and the local keyring's associated data): what a wrapped
# key is bound to.
CONTEXT_PREFIX = "s3_saver:prefix"
CONTEXT_THREAD = "s3_saver:thread"
CONTEXT_KEY_ID = "s3_saver:key_id"
# The earlier lives a record names (a thread erased and written anew this many times
# more reads its oldest copies as foreign, not erased: refused either way).
EARLIER_KEPT = 100


@dataclass(frozen=True)
class KeyRecord:
    """One thread's key record as stored (``etag``: the stored object's, for the
    compare-and-swap that replaces it; None for a record not read from the store)."""

    state: str
    key_id: bytes
    created: int
    wrapped: bytes | None = None
    kek: str | None = None
    erased_at: int | None = None
    # The ids of the thread's earlier keys (all destroyed), with when (oldest first).
    earlier: tuple[tuple[bytes, int | None], ...] = ()
    etag: str | None = None
    # Erased only: the erase has made the thread gone in its index (a new life may
    # begin). A record written before this field existed counts as settled.
    settled: bool = True
    # Live only, with a replica: the replica region's key store has not got this key yet
    # (it did not answer when the key was made): the next process that reads the record
    # copies it there (``keys.Crypt.load``).
    pending_replica: bool = False

    @property
    def live(self) -> bool:
        return self.state == LIVE

    def erased_ids(self) -> dict[bytes, int | None]:
        """Every destroyed key of the thread: id -> when (None: unknown)."""
        found = dict(self.earlier)
        if not self.live:
            found[self.key_id] = self.erased_at
        return found


def next_life(erased: KeyRecord | None) -> tuple[tuple[bytes, int | None], ...]:
    """What a new record made over ``erased`` names of the keys before it."""
    if erased is None:
        return ()
    return (*erased.earlier, (erased.key_id, erased.erased_at))[-EARLIER_KEPT:]


@dataclass(frozen=True)
class KeyKind:
    """What the records of a key store name, and how: the saver's threads (``t/``), or
    the memory store's namespaces (``m/<namespace id>``, and its store-wide key
    ``@store``). ``context``: the encryption context key that binds a wrapped key to
    its name (a record moved from one kind to the other does not unwrap); ``cache``: the
    name of the key cache in the budget (a thread id and a namespace id never meet)."""

    name: str
    context: str
    cache: str

    def record_key(self, prefix: str, name: str) -> str:
        if self is THREADS:
            return f"{prefix}{THREAD_FOLDER}{encode(name)}"
        if name == STORE_KEY:
            return f"{prefix}{STORE_KEY}"
        if not _NODE_ID.fullmatch(name):
            raise ValueError(f"{name!r} is not a namespace id (64 hex digits)")
        return f"{prefix}{MEMORY_FOLDER}{name}"


# The memory store's records: a key per namespace, named by its id (hex SHA-256 of the
# namespace, as the store's folders), and the store-wide key (``STORE_KEY``: namespace
# names, the node cache), which no erase of a namespace destroys.
MEMORY_FOLDER = "m/"
STORE_KEY = "@store"
CONTEXT_NAMESPACE = "s3_saver:namespace"
_NODE_ID = re.compile(r"[0-9a-f]{64}")
THREADS = KeyKind("thread", CONTEXT_THREAD, "keys")
MEMORY = KeyKind("namespace", CONTEXT_NAMESPACE, "mem-keys")


def record_key(prefix: str, thread_id: str) -> str:
    """Where a thread's record lives in the key store (the thread id encoded as in
    object keys: injective, whatever characters it holds)."""
    return THREADS.record_key(prefix, thread_id)


def context(prefix: str, thread_id: str, key_id: bytes, kind: KeyKind | None = None) -> dict[str, str]:
    """What a wrapped data key is bound to: the saver's prefix (left out when empty, so
    no context value is ever empty), the thread (or, ``kind``, the memory store's
    namespace id) and the key id. The bucket is not in it: a replica bucket of another
    name holds the same threads under the same keys."""
    found = {(kind or THREADS).context: thread_id, CONTEXT_KEY_ID: key_id.hex()}
    if prefix:
        found[CONTEXT_PREFIX] = prefix
    return found


def canonical(ctx: dict[str, str]) -> bytes:
    """A context as bytes (the local keyring's associated data): one encoding per context."""
    return ormsgpack.packb(sorted(ctx.items()))


def encode_record(record: KeyRecord) -> bytes:
    doc: dict[str, Any] = {
        "format": KEY_FORMAT,
        "state": record.state,
        "key_id": record.key_id,
        "created": record.created,
        "kek": record.kek,
    }
    if record.live:
        doc["wrapped"] = record.wrapped
        if record.pending_replica:
            doc["pending_replica"] = True
    else:
        doc["erased_at"] = record.erased_at
        doc["settled"] = record.settled
    if record.earlier:
        doc["earlier"] = [[k, t] for k, t in record.earlier]
    return ormsgpack.packb(doc)


def decode_record(data: bytes, etag: str | None, where: str) -> KeyRecord:
    """A stored record; CorruptObjectError for anything the saver did not write."""
    try:
        doc = ormsgpack.unpackb(data)
        if not isinstance(doc, dict) or doc.get("format") != KEY_FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"expected format {KEY_FORMAT!r}, found {found!r}")
        state, key_id = doc["state"], bytes(doc["key_id"])
        if state not in (LIVE, ERASED) or len(key_id) != KEY_ID_BYTES:
            raise ValueError(f"state {state!r}, key id of {len(key_id)} bytes")
        wrapped = bytes(doc["wrapped"]) if state == LIVE else None
        earlier = tuple((bytes(k), t) for k, t in doc.get("earlier") or ())
        settled = doc.get("settled", True)
        pending = doc.get("pending_replica", False)
        if not isinstance(settled, bool) or not isinstance(pending, bool):
            raise TypeError(f"settled {settled!r}, pending_replica {pending!r}")
        return KeyRecord(
            state, key_id, int(doc["created"]), wrapped, doc.get("kek"), doc.get("erased_at"), earlier, etag, settled,
            pending and state == LIVE,
        )
    except (ormsgpack.MsgpackDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CorruptObjectError(f"{where}: not a key record ({exc})") from exc


def erasure(record: KeyRecord, now: int) -> KeyRecord:
    """The record that replaces ``record`` when its key is destroyed: no key material,
    and not settled (its erase has still to make the thread gone in its index)."""
    return KeyRecord(ERASED, record.key_id, record.created, None, record.kek, now, record.earlier, settled=False)
