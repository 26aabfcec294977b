"""How a data key is made, wrapped and unwrapped: by AWS KMS, or by a local master key.

Both keyrings are written as operations (``_transport/protocol``): the KMS keyring yields
its ``GenerateDataKey``, ``Decrypt`` and ``ReEncrypt`` calls like any S3 or DynamoDB call,
so the sync and async drivers send them, retry them and count them; the local keyring
sends nothing (it returns without yielding). Each works on a batch, one wave for all:
the keys of every thread a read needs are unwrapped together.

A wrapped key is bound to its thread (``records.context``): KMS checks the encryption
context on ``Decrypt``; the local keyring uses its canonical bytes as associated data.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from s3_saver._crypto.config import KmsKey, LocalKey
from s3_saver._crypto.envelope import DATA_KEY_BYTES, aesgcm
from s3_saver._crypto.records import KeyRecord, canonical
from s3_saver._transport.failures import DENIED, KMS_KEY, classify, error_code
from s3_saver._transport.protocol import Call, Op, failure, gather, raise_failure, request, request_one
from s3_saver.errors import (
    ConfigurationError,
    CorruptObjectError,
    EncryptionKeyError,
    ForeignCiphertextError,
    Where,
)

KMS_PREFIX = "kms:"
LOCAL_PREFIX = "local:"
_LOCAL_VERSION = b"\x01"
_NONCE = 12
# KMS's answer to a wrapped key that does not open under the context given: bound to
# another thread or prefix, or changed.
_NOT_OURS = frozenset({"InvalidCiphertextException"})
# A KMS ARN, its region apart: arn:<partition>:kms:<region>:<account>:key/... or alias/...
_ARN_REGION = re.compile(r"^(arn:aws[\w-]*:kms:)([a-z0-9-]+)(:\d{12}:.+)$")


@dataclass(frozen=True)
class Wrapped:
    """A data key made by a keyring: in the clear (to use) and wrapped (to keep)."""

    secret: bytes
    wrapped: bytes
    kek: str  # what wrapped it, as records name it


@dataclass(frozen=True)
class Sealed:
    """A key record to unwrap, with what it is bound to and where it was read (named
    in errors)."""

    record: KeyRecord
    context: dict[str, str]
    bucket: str
    key: str
    thread_id: str
    # What the record is the key of, in words (``Crypt.subject``: a thread, or for the
    # memory store a namespace with its store's bucket and prefix); ``noun``: its kind.
    subject: str = ""
    noun: str = "thread"

    def where(self) -> str:
        return f"key record s3://{self.bucket}/{self.key} of {self.subject or f'thread {self.thread_id!r}'}"


class Keyring(ABC):
    """Makes and unwraps data keys under one key-encryption key."""

    @abstractmethod
    def describe(self) -> str: ...

    @abstractmethod
    def generate(self, contexts: list[dict[str, str]]) -> Op[list[Wrapped]]:
        """A new data key per context, each wrapped bound to its context (one wave)."""

    @abstractmethod
    def unwrap(self, sealed: list[Sealed]) -> Op[list[bytes]]:
        """The data keys of live records (one wave).

        Raises:
            ForeignCiphertextError: A wrapped key bound to another place (a record
                moved to another thread), or changed.
            EncryptionKeyError: A record wrapped by another key-encryption key.
        """

    @abstractmethod
    def wrap(self, items: list[tuple[dict[str, str], bytes]]) -> Op[list[tuple[bytes, str]]]:
        """Data keys in the clear (each with its context) wrapped under this keyring's
        key-encryption key, bound to their contexts (one wave): (wrapped, kek) each."""

    @abstractmethod
    def target(self) -> Op[str]:
        """The name records give this keyring's key-encryption key (``kek``), as a
        rotation compares it: KMS asked for the key's ARN (``DescribeKey``, once)."""

    @abstractmethod
    def owns(self, kek: str | None) -> bool:
        """Whether this keyring unwraps what ``kek`` (a record's) wrapped."""

    def _check_kek(self, item: Sealed, prefix: str) -> None:
        if not (item.record.kek or "").startswith(prefix):
            raise self._wrong_kek(item)

    def _wrong_kek(self, item: Sealed) -> EncryptionKeyError:
        return EncryptionKeyError(
            f"{item.where()} was wrapped by {item.record.kek or 'an unknown key'}; this saver's encryption is "
            f"{self.describe()}: configure the key that wrapped it. After a key rotation (rewrap), configure the "
            "new key, with the old one as previous=[...] for reads until every record is wrapped anew"
        )


class KmsKeyring(Keyring):
    """Data keys from KMS ``GenerateDataKey``, unwrapped by ``Decrypt`` (the key the
    record names: a record re-wrapped under a new key opens with that one).

    ``region``: the region its calls go to. A key ARN (the configured one, or the one a
    record names) of another region is named in this one: with a replica, the replica
    region's saver unwraps with the replica of a multi-Region key, whose ARN differs from
    the primary's by its region only (``mrk-`` key ids are the same in every region)."""

    def __init__(self, config: KmsKey, where: Where, region: str | None = None) -> None:
        self.region = region
        self.key_id = self._here(config.key_id)
        self.where = where

    def _here(self, key_id: str) -> str:
        """``key_id`` as this region names it: the ARN of a multi-Region key (or of an
        alias) in another region, with this region in it; anything else as it is (a
        single-Region key is only in its own region)."""
        found = _ARN_REGION.match(key_id)
        if found is None or self.region is None or found.group(2) == self.region:
            return key_id
        if ":key/mrk-" not in found.group(3) and ":alias/" not in found.group(3):
            return key_id
        return f"{found.group(1)}{self.region}{found.group(3)}"

    def describe(self) -> str:
        return f"KMS key {self.key_id!r}"

    def owns(self, kek: str | None) -> bool:
        # Any KMS key: Decrypt is sent to the key the record names.
        return (kek or "").startswith(KMS_PREFIX)

    def _call(self, operation: str, params: dict[str, Any]) -> Call:
        return Call("kms", operation, params, self.where)

    def generate(self, contexts: list[dict[str, str]]) -> Op[list[Wrapped]]:
        if not contexts:
            return []
        calls = [
            self._call("generate_data_key", {"KeyId": self.key_id, "KeySpec": "AES_256", "EncryptionContext": c})
            for c in contexts
        ]
        answers = yield from request(*calls)
        made = []
        for call, answer in zip(calls, answers):
            secret = bytes(answer["Plaintext"])
            if len(secret) != DATA_KEY_BYTES:
                raise CorruptObjectError(f"{call.describe()}: KMS answered a data key of {len(secret)} bytes, not 32")
            made.append(Wrapped(secret, bytes(answer["CiphertextBlob"]), KMS_PREFIX + answer["KeyId"]))
        return made

    def unwrap(self, sealed: list[Sealed]) -> Op[list[bytes]]:
        if not sealed:
            return []
        for item in sealed:
            self._check_kek(item, KMS_PREFIX)
        calls = tuple(
            self._call(
                "decrypt",
                {
                    "CiphertextBlob": item.record.wrapped,
                    "EncryptionContext": item.context,
                    "KeyId": self._here((item.record.kek or "")[len(KMS_PREFIX) :]),
                },
            )
            for item in sealed
        )
        answers = yield calls
        keys = []
        for item, call, answer in zip(sealed, calls, answers):
            if isinstance(answer, BaseException):
                if error_code(answer) in _NOT_OURS:
                    raise ForeignCiphertextError(
                        f"{item.where()}: KMS does not unwrap its data key for this {item.noun} "
                        f"({error_code(answer)}): the record was moved from another {item.noun} or prefix, or changed",
                        bucket=item.bucket, key=item.key, thread_id=item.thread_id,
                    ) from answer
                if classify(answer, call.operation) in (KMS_KEY, DENIED):
                    # Name the record and both keys: after a rotation the record names
                    # another key than this process is configured with.
                    raise EncryptionKeyError(
                        f"{item.where()} is wrapped by {item.record.kek}; KMS refused to unwrap it with that key "
                        f"({error_code(answer)}: {failure(call, answer)}). This saver's encryption is {self.describe()}: "
                        "a process needs kms:Decrypt on the key a record names (after a key rotation, rewrap, the new one)"
                    ) from answer
                raise_failure(call, answer)
            secret = bytes(answer["Plaintext"])
            if len(secret) != DATA_KEY_BYTES:
                raise CorruptObjectError(f"{item.where()}: KMS unwrapped {len(secret)} bytes, not a 32-byte data key")
            keys.append(secret)
        return keys

    def check_multi_region(self) -> Op[None]:
        """With a replica: the key must be a multi-Region key (the replica region unwraps
        the same wrapped keys with its replica); a single-Region key is refused."""
        found = yield from request_one(self._call("describe_key", {"KeyId": self.key_id}))
        meta = found.get("KeyMetadata") or {}
        if not meta.get("MultiRegion"):
            raise ConfigurationError(
                f"{self.describe()} is a single-Region KMS key: with a replica, the key must be a multi-Region key "
                "(its replica in the replica's region unwraps the same data keys). Create one (MultiRegion=True), "
                "replicate it to the replica's region, and give its alias or id to KmsKey"
            )

    def wrap(self, items: list[tuple[dict[str, str], bytes]]) -> Op[list[tuple[bytes, str]]]:
        if not items:
            return []
        calls = [
            self._call("encrypt", {"KeyId": self.key_id, "Plaintext": secret, "EncryptionContext": ctx})
            for ctx, secret in items
        ]
        answers = yield from request(*calls)
        return [(bytes(a["CiphertextBlob"]), KMS_PREFIX + a["KeyId"]) for a in answers]

    def target(self) -> Op[str]:
        found = yield from request_one(self._call("describe_key", {"KeyId": self.key_id}))
        arn = (found.get("KeyMetadata") or {}).get("Arn")
        if not isinstance(arn, str) or not arn:
            raise CorruptObjectError(f"KMS DescribeKey of {self.key_id!r} answered no key ARN")
        return KMS_PREFIX + arn

    def names(self, kek: str | None) -> str:
        """A record's ``kek`` as this region names its key (compared with ``target``)."""
        if not (kek or "").startswith(KMS_PREFIX):
            return kek or ""
        return KMS_PREFIX + self._here((kek or "")[len(KMS_PREFIX) :])

    def rewrap(self, sealed: list[Sealed], destination_key_id: str) -> Op[list[tuple[bytes, str]]]:
        """Each record's data key wrapped under ``destination_key_id`` instead, bound to
        the same context, without it ever leaving KMS (``ReEncrypt``): (wrapped, kek)."""
        if not sealed:
            return []
        for item in sealed:
            self._check_kek(item, KMS_PREFIX)
        calls = [
            self._call(
                "re_encrypt",
                {
                    "CiphertextBlob": item.record.wrapped,
                    "SourceEncryptionContext": item.context,
                    "SourceKeyId": self._here((item.record.kek or "")[len(KMS_PREFIX) :]),
                    "DestinationKeyId": destination_key_id,
                    "DestinationEncryptionContext": item.context,
                },
            )
            for item in sealed
        ]
        answers = yield tuple(calls)
        out = []
        for item, call, answer in zip(sealed, calls, answers):
            if isinstance(answer, BaseException):
                if error_code(answer) in _NOT_OURS:
                    raise ForeignCiphertextError(
                        f"{item.where()}: KMS does not re-wrap its data key for this {item.noun} ({error_code(answer)})",
                        bucket=item.bucket, key=item.key, thread_id=item.thread_id,
                    ) from answer
                raise_failure(call, answer)
            out.append((bytes(answer["CiphertextBlob"]), KMS_PREFIX + answer["KeyId"]))
        return out


class LocalKeyring(Keyring):
    """Random data keys wrapped with AES-256-GCM under a local master key: no request."""

    def __init__(self, config: LocalKey) -> None:
        self._master = aesgcm()(config._secret)
        self.kek = LOCAL_PREFIX + config.fingerprint

    def describe(self) -> str:
        return f"the local master key {self.kek[len(LOCAL_PREFIX):]!r}"

    def owns(self, kek: str | None) -> bool:
        return kek == self.kek

    def generate(self, contexts: list[dict[str, str]]) -> Op[list[Wrapped]]:
        # Random, never derived from the master key: a derivable key could not be destroyed.
        secrets = [os.urandom(DATA_KEY_BYTES) for _ in contexts]
        wrapped = yield from self.wrap(list(zip(contexts, secrets)))
        return [Wrapped(secret, w, kek) for secret, (w, kek) in zip(secrets, wrapped)]

    def wrap(self, items: list[tuple[dict[str, str], bytes]]) -> Op[list[tuple[bytes, str]]]:
        out = []
        for ctx, secret in items:
            nonce = os.urandom(_NONCE)
            out.append((_LOCAL_VERSION + nonce + self._master.encrypt(nonce, secret, canonical(ctx)), self.kek))
        return out
        yield  # pragma: no cover - an operation that sends nothing

    def target(self) -> Op[str]:
        return self.kek
        yield  # pragma: no cover - an operation that sends nothing

    def unwrap(self, sealed: list[Sealed]) -> Op[list[bytes]]:
        from cryptography.exceptions import InvalidTag

        keys = []
        for item in sealed:
            if item.record.kek != self.kek:
                raise self._wrong_kek(item)
            wrapped = item.record.wrapped or b""
            if wrapped[:1] != _LOCAL_VERSION or len(wrapped) < 1 + _NONCE + DATA_KEY_BYTES:
                raise CorruptObjectError(f"{item.where()}: its wrapped key is not the local keyring's")
            try:
                secret = self._master.decrypt(wrapped[1 : 1 + _NONCE], wrapped[1 + _NONCE :], canonical(item.context))
            except InvalidTag:
                raise ForeignCiphertextError(
                    f"{item.where()}: its data key does not unwrap for this {item.noun} under the local master key: "
                    f"the record was moved from another {item.noun} or prefix, or changed",
                    bucket=item.bucket, key=item.key, thread_id=item.thread_id,
                ) from None
            keys.append(secret)
        return keys
        yield  # pragma: no cover - an operation that sends nothing


def unwrap_with(rings: list[Keyring], sealed: list[Sealed]) -> Op[list[bytes]]:
    """Each record unwrapped by the first of ``rings`` that holds its key-encryption key
    (the configured key first, then those a rotation left: ``previous=``), in one wave.
    A record none holds goes to the configured one, which names both keys."""
    groups: dict[int, list[int]] = {}
    for i, item in enumerate(sealed):
        owner = next((n for n, ring in enumerate(rings) if ring.owns(item.record.kek)), 0)
        groups.setdefault(owner, []).append(i)
    answers = yield from gather(*(rings[n].unwrap([sealed[i] for i in idx]) for n, idx in groups.items()))
    keys: list[bytes] = [b""] * len(sealed)
    for idx, found in zip(groups.values(), answers):
        for i, key in zip(idx, found):
            keys[i] = key
    return keys


def keyring_for(config: KmsKey | LocalKey, where: Where, region: str | None = None) -> Keyring:
    return KmsKeyring(config, where, region) if isinstance(config, KmsKey) else LocalKeyring(config)
