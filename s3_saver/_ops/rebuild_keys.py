"""What a rebuild of the index opens its threads' objects with, and what it leaves out.

With ``encryption=``, a rebuild reads each thread's key record (one wave of GETs per
batch of threads, sent beside the first reads of the batch's first thread), opens the
objects it must read (checkpoint records, pending writes, archives) under the thread's
key, and writes index entries whose copies of content are sealed as the write path
seals them (``Sealer``: the body is the object's own sealed bytes, the metadata sealed
for its checkpoint).

Invariant (erase's promise): a thread whose key was destroyed is never indexed again.
The records are read from the key store, never taken from this process's cache: a
key cached before another process's erase would open the crypto-erased remnants and
index them. What cannot be opened is left out and reported by thread
(``Unindexed``), never indexed:

* ``erased``: the thread's key was destroyed (its objects are crypto-erased remnants:
  an erase cut short, or versions made current again);
* ``no_key``: sealed objects, and no key record in the key store (another key store,
  or the record lost);
* ``plaintext``: objects written without encryption (a prefix written before
  encryption was turned on);
* ``foreign``: sealed bytes that do not open in their place (moved, or changed);
* ``key_not_arrived``: in a replica region (``promote``), the thread's key has not
  reached that region's key store: its checkpoints count as incomplete.

Objects of a live thread sealed under one of its destroyed keys (an earlier life's
remnants) are left out alone, and reported as ``erased``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Self

from s3_saver._crypto.envelope import is_sealed
from s3_saver._crypto.sealer import ThreadKey
from s3_saver._format.archive import metadata_key_id
from s3_saver._ops.context import Context
from s3_saver._transport.protocol import Op
from s3_saver.errors import (
    EncryptedObjectError,
    ForeignCiphertextError,
    PlaintextObjectError,
    ReplicationLagError,
    ThreadErasedError,
)

ERASED = "erased"
NO_KEY = "no_key"
PLAINTEXT = "plaintext"
FOREIGN = "foreign"
KEY_NOT_ARRIVED = "key_not_arrived"


@dataclass(frozen=True)
class Unindexed:
    """Objects a rebuild of the index left out, because they cannot be opened.

    Attributes:
        thread_id: The thread.
        reason: ``"erased"`` (the key they are encrypted with was destroyed),
            ``"no_key"`` (encrypted, and the key store holds no key of the thread),
            ``"plaintext"`` (not encrypted, and the saver encrypts), ``"foreign"``
            (encrypted for another place or changed) or ``"key_not_arrived"`` (in
            a replica region: the thread's key has not reached its key store).
        keys: The objects left out (every object of the thread listed, when the
            thread is left out whole).
        key_destroyed_at: ``"erased"``: when the key was destroyed (None: unknown).
    """

    thread_id: str
    reason: str
    keys: tuple[str, ...]
    key_destroyed_at: datetime | None = None


class Rebuilt(int):
    """What [S3Saver.rebuild_index()][s3_saver.S3Saver.rebuild_index] did: how many
    checkpoints it indexed (this int), and ``unindexed``: the threads (or objects)
    it left out, each with the reason ([Unindexed][s3_saver.Unindexed]; empty
    without encryption)."""

    unindexed: tuple[Unindexed, ...]

    def __new__(cls, count: int, unindexed: tuple[Unindexed, ...] = ()) -> Self:
        made = super().__new__(cls, count)
        made.unindexed = tuple(unindexed)
        return made

    def __repr__(self) -> str:
        return f"Rebuilt({int(self)}, unindexed={self.unindexed!r})"


def read_keys(ctx: Context, thread_ids: list[str]) -> Op[dict[str, ThreadKey]]:
    """The keys of ``thread_ids`` as the key store holds them now (one wave of GETs,
    then one of KMS ``Decrypt``); {} without encryption."""
    if ctx.crypt is None:
        return {}
    for t in thread_ids:
        # Never the cache (see the module's invariant): each record read again.
        ctx.crypt.forget(t)
    return (yield from ctx.crypt.load(thread_ids))


def keyless(ctx: Context, thread_id: str, stored: dict[str, bytes], keys: tuple[str, ...]) -> Unindexed | None:
    """The thread left out whole when no live key of it is held (None: one is, or no
    encryption): its record says erased, its key has not reached this region, or
    there is none (``stored``: what was read of it tells sealed from plaintext)."""
    if ctx.crypt is None:
        return None
    held = ctx.sealer.keys[thread_id]
    if held.key is not None:
        return None
    if held.erased:
        return Unindexed(thread_id, ERASED, keys, _when(held))
    if ctx.crypt.lags:
        return Unindexed(thread_id, KEY_NOT_ARRIVED, keys)
    sealed = any(is_sealed(data) for data in stored.values())
    return Unindexed(thread_id, NO_KEY if sealed or not stored else PLAINTEXT, keys)


def opened(ctx: Context, thread_id: str, key: str, data: bytes, source: str | None = None) -> bytes | str:
    """``data`` (object ``key`` of ``thread_id``) opened under the thread's key, or why
    it cannot be (a reason of ``Unindexed``). Without encryption: as stored (an
    encrypted object raises ``EncryptedObjectError``: the saver needs its key)."""
    if ctx.crypt is None:
        return ctx.sealer.open(thread_id, key, data, source)
    try:
        return ctx.sealer.open(thread_id, key, data, source)
    except ThreadErasedError:
        return ERASED
    except (PlaintextObjectError, EncryptedObjectError):
        return PLAINTEXT
    except ForeignCiphertextError:
        return FOREIGN
    except ReplicationLagError:
        return KEY_NOT_ARRIVED


def cold_archive(ctx: Context, thread_id: str, key: str, metadata: dict[str, str]) -> str | None:
    """Why a cold archive (read by its HeadObject only) cannot be indexed: the key its
    metadata names is not the thread's live key (None: it is, or no encryption)."""
    if ctx.crypt is None:
        return None
    held = ctx.sealer.keys[thread_id]
    named = metadata_key_id(metadata)
    if named is None:
        return PLAINTEXT  # an archive object of a saver without encryption names no key
    if named in held.erased:
        return ERASED
    if held.key is None or named != held.key.key_id:
        return KEY_NOT_ARRIVED if ctx.crypt.lags else FOREIGN
    return None


def erased_at(ctx: Context, thread_id: str) -> datetime | None:
    """When the thread's newest destroyed key was destroyed (None: unknown)."""
    return _when(ctx.sealer.keys[thread_id]) if ctx.crypt is not None else None


def _when(held: ThreadKey) -> datetime | None:
    times = [t for t in held.erased.values() if t]
    return datetime.fromtimestamp(max(times), UTC) if times else None
