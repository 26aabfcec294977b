"""Rotation: every thread's data key wrapped under another key-encryption key, in place.

A thread's content is sealed with its data key; the key store keeps that key wrapped by
the key-encryption key (KEK). Rotating the KEK rewrites the key records only: each live
record's data key is unwrapped and wrapped again under the new KEK, bound to the same
thread (the same context), and written back over the record read. The data key and its
id stay: no object, index item, archive or export is rewritten, and every process that
holds a thread's key in its cache goes on using it.

How each record is wrapped again:

* KMS to KMS: ``ReEncrypt`` (the data key never leaves KMS);
* anything else (local to local, local to KMS, KMS to local): unwrapped by the saver's
  keyring (the record's KEK), then wrapped by the new one (``Encrypt`` for KMS).

Resumable without a cursor: the walk lists the key store (an admin call) page by page,
reads each page's records in one wave, wraps in one wave, and writes in one wave. A
record already under the new KEK is skipped, an erased one (no key material) is left as
it is, so a run cut anywhere and run again finishes, and a run that finds nothing to do
writes nothing.

Invariant: a record is only ever replaced as read (``KeyStore.swap``: ``IfMatch`` its
ETag). A record another process changed between the read and the write (an erase that
destroyed the key, a new life after one, a replica copy's mark) is read again and decided
again: an erasure is never overwritten by a live key, which would bring a destroyed key
back.

With a replica, each region's key store is walked with that region's keyring (KMS calls
in its region, naming its replica of a multi-Region key); the new KMS key must be
multi-Region too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from s3_saver._crypto.config import Encryption
from s3_saver._crypto.keyrings import (
    KMS_PREFIX,
    Keyring,
    KmsKeyring,
    keyring_for,
    unwrap_with,
)
from s3_saver._crypto.keys import Crypt
from s3_saver._crypto.records import KeyRecord, context
from s3_saver._transport.protocol import Op, gather
from s3_saver.errors import S3SaverError

# Records per page: one listing, one wave of GETs, one of KMS calls, one of PUTs.
PAGE = 200
# A record another writer keeps changing between our read and our write: each round has
# a reason (an erase, a new life, a mark), which does not repeat without end.
_ATTEMPTS = 6


@dataclass
class RewrapReport:
    """What [rewrap()][s3_saver.S3Saver.rewrap] did.

    Attributes:
        kek: The key-encryption key every live record is wrapped by now, as records name
            it (``kms:<key ARN>`` or ``local:<fingerprint>``).
        rewrapped: Records wrapped again by this run.
        already: Live records found under the new key already (a run before this one,
            or a process configured with the new key made them).
        erased: Erased threads' records (no key material), left as they are.
        key_stores: The key stores walked (``s3://<key bucket>/<prefix>``): the
            region written to's, and with a replica the replica region's.
    """

    kek: str = ""
    rewrapped: int = 0
    already: int = 0
    erased: int = 0
    key_stores: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        """Every record the run met (live and erased)."""
        return self.rewrapped + self.already + self.erased


def rotate(
    crypt: Crypt, target: Encryption, replicated: bool, report: RewrapReport, prepared: tuple[Keyring, str] | None = None
) -> Op[tuple[Keyring, str]]:
    """Every live record of ``crypt``'s key store wrapped under ``target`` (counted in
    ``report``); ``replicated``: a replica is configured (a KMS key must be multi-Region).
    ``prepared``: the keyring and key name a pass over the same region's store made
    already (the memory store's records after the threads': no second DescribeKey).
    Returns them."""
    if prepared is not None:
        ring, kek = prepared
    else:
        ring = keyring_for(target, crypt.where, crypt.kms_region)
        if replicated and isinstance(ring, KmsKeyring):
            yield from ring.check_multi_region()
        kek = yield from ring.target()
    report.kek = report.kek or kek
    store = f"s3://{crypt.key_bucket}/{crypt.prefix}"
    if store not in report.key_stores:  # the threads' and the memory store's records share it
        report.key_stores.append(store)
    token: str | None = None
    while True:
        threads, token = yield from crypt.store.page(token, PAGE)
        records = yield from crypt.store.read(threads)
        yield from _page(crypt, ring, kek, {t: r for t, r in records.items() if r is not None}, report)
        if token is None:
            return ring, kek


def _under(ring: Keyring, record: KeyRecord, kek: str) -> bool:
    """Whether ``record`` is wrapped by ``kek`` already (a KMS ARN named in another
    region, a multi-Region key's, counts as this region's)."""
    named = ring.names(record.kek) if isinstance(ring, KmsKeyring) else record.kek
    return named == kek


def _page(crypt: Crypt, ring: Keyring, kek: str, records: dict[str, KeyRecord], report: RewrapReport) -> Op[None]:
    for _ in range(_ATTEMPTS):
        todo: dict[str, KeyRecord] = {}
        for t, record in records.items():
            if not record.live:
                report.erased += 1  # no key material: nothing to wrap, and never a key again
            elif _under(ring, record, kek):
                report.already += 1
            else:
                todo[t] = record
        if not todo:
            return
        wrapped = yield from _wrapped(crypt, ring, todo)
        written = yield from gather(
            *(crypt.store.swap(t, replace(r, wrapped=wrapped[t][0], kek=wrapped[t][1]), r) for t, r in todo.items())
        )
        lost = [t for t, stored in zip(todo, written) if stored is None]
        report.rewrapped += len(todo) - len(lost)
        if not lost:
            return
        # Changed by another writer since read: what is there now decides (an erasure
        # is left alone; a new life's key is wrapped again unless made under the new KEK).
        again = yield from crypt.store.read(lost)
        records = {t: r for t, r in again.items() if r is not None}
    raise S3SaverError(
        f"key store s3://{crypt.key_bucket}/{crypt.prefix}: key records kept changing while they were wrapped "
        "again (another process erasing or writing those threads); nothing of them was overwritten: call rewrap again"
    )


def _wrapped(crypt: Crypt, ring: Keyring, records: dict[str, KeyRecord]) -> Op[dict[str, tuple[bytes, str]]]:
    """Each record's data key wrapped under ``ring``'s KEK, bound to its thread as before
    (one wave): KMS to KMS by ``ReEncrypt``, the rest unwrapped by the saver's keyring
    (which names a record wrapped by a key it does not have) and wrapped by ``ring``."""
    kms = [t for t, r in records.items() if isinstance(ring, KmsKeyring) and (r.kek or "").startswith(KMS_PREFIX)]
    other = [t for t in records if t not in kms]
    sealed = {t: crypt.sealed(t, records[t]) for t in records}

    def by_kms() -> Op[list[tuple[bytes, str]]]:
        if not kms or not isinstance(ring, KmsKeyring):
            return []
        return (yield from ring.rewrap([sealed[t] for t in kms], ring.key_id))

    def by_hand() -> Op[list[tuple[bytes, str]]]:
        secrets = yield from unwrap_with(crypt.keyrings, [sealed[t] for t in other])
        return (yield from ring.wrap([(context(crypt.prefix, t, records[t].key_id, crypt.kind), s) for t, s in zip(other, secrets)]))

    moved, made = yield from gather(by_kms(), by_hand())
    return {**dict(zip(kms, moved)), **dict(zip(other, made))}
