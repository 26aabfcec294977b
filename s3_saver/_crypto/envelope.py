"""The sealed byte format: AES-256-GCM under a thread's data key, bound to its place.

Every encrypted byte string is::

    b"\\x00s3e" | version (1 byte) | key id (16) | nonce (12) | ciphertext and tag (16)

The leading 0x00 never starts a msgpack map (0x80-0x8f, 0xde, 0xdf) nor a zlib stream
(0x78), so a reader tells plaintext, ciphertext and compressed bytes apart by the first
byte. The plaintext is the stored bytes as they would be without encryption (msgpack,
zlib-squeezed when that pays): compressed, then encrypted.

The associated data binds each ciphertext to its place: the saver's prefix, the object's
key within that prefix and the thread id (and, for an index attribute that is not the
object's own bytes, the attribute's name). An object copied to another key or thread,
or bytes changed, fail the tag check. The key id names the data key: a thread written
anew after its key was destroyed has another one, so an old copy restored from history
is recognised as erased, never read as corrupt.

Nonces are random (96 bits): a data key seals far fewer than 2**32 messages in a thread's
life. The cipher is ``cryptography``'s (imported on first use: a saver without
encryption never loads it).
"""

from __future__ import annotations

import os
from typing import Any

import ormsgpack

MAGIC = b"\x00s3e"
VERSION = 1
KEY_ID_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16
DATA_KEY_BYTES = 32  # AES-256
HEADER_BYTES = len(MAGIC) + 1 + KEY_ID_BYTES + NONCE_BYTES
# What sealing adds to a plaintext (its header and the tag).
OVERHEAD = HEADER_BYTES + TAG_BYTES

# Why a ciphertext did not open (``EnvelopeError.reason``).
MALFORMED = "malformed"  # not an envelope of a version this saver reads
OTHER_KEY = "other-key"  # sealed under another data key than the one given
TAG = "tag"  # the tag check failed: another place, or changed bytes


class EnvelopeError(Exception):
    """Internal: why ``open_sealed`` refused (the sealer names the place in its error)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail


def aesgcm() -> Any:
    """``cryptography``'s AESGCM, imported on first use."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - the extra is missing
        raise ImportError(
            "encryption= needs the cryptography package: pip install '.[encryption]' in a checkout of "
            "s3_saver (or its path instead of '.'), or pip install cryptography"
        ) from exc
    return AESGCM


class DataKey:
    """A data key in the clear: its id and its cipher. Never printed, never stored
    unwrapped (the key store keeps it wrapped by the key-encryption key)."""

    __slots__ = ("_cipher", "key_id")

    def __init__(self, key_id: bytes, secret: bytes) -> None:
        if len(key_id) != KEY_ID_BYTES or len(secret) != DATA_KEY_BYTES:
            raise ValueError("a data key is 32 bytes, its id 16")
        self.key_id = bytes(key_id)
        self._cipher = aesgcm()(bytes(secret))

    def __repr__(self) -> str:
        return f"DataKey(key_id={self.key_id.hex()})"


def new_key_id() -> bytes:
    return os.urandom(KEY_ID_BYTES)


def new_secret() -> bytes:
    return os.urandom(DATA_KEY_BYTES)


def is_sealed(data: bytes | bytearray | memoryview | None) -> bool:
    """Whether ``data`` is an envelope (of any version): the first byte tells."""
    return data is not None and bytes(data[: len(MAGIC)]) == MAGIC


def key_id_of(data: bytes) -> bytes | None:
    """The data key an envelope names (None: too short to name one)."""
    if len(data) < HEADER_BYTES:
        return None
    return bytes(data[len(MAGIC) + 1 : len(MAGIC) + 1 + KEY_ID_BYTES])


def seal(key: DataKey, aad: bytes, plaintext: bytes) -> bytes:
    """``plaintext`` sealed under ``key`` for the place ``aad`` describes."""
    nonce = os.urandom(NONCE_BYTES)
    version = bytes([VERSION])
    return MAGIC + version + key.key_id + nonce + key._cipher.encrypt(nonce, bytes(plaintext), version + aad)


def open_sealed(key: DataKey, aad: bytes, data: bytes) -> bytes:
    """The plaintext of an envelope sealed under ``key`` for the place ``aad`` describes.

    Raises:
        EnvelopeError: ``MALFORMED`` (not an envelope this version reads), ``OTHER_KEY``
            (sealed under another data key: its id differs), ``TAG`` (another place,
            or changed bytes).
    """
    data = bytes(data)
    if not is_sealed(data) or len(data) < OVERHEAD:
        raise EnvelopeError(MALFORMED, f"{len(data)} bytes, not an envelope")
    version = data[len(MAGIC)]
    if version != VERSION:
        raise EnvelopeError(MALFORMED, f"envelope version {version}; this saver reads version {VERSION}")
    found = key_id_of(data)
    if found != key.key_id:
        raise EnvelopeError(OTHER_KEY, f"sealed under key id {found.hex() if found else '?'}")
    nonce = data[HEADER_BYTES - NONCE_BYTES : HEADER_BYTES]
    from cryptography.exceptions import InvalidTag

    try:
        return key._cipher.decrypt(nonce, data[HEADER_BYTES:], bytes([version]) + aad)  # type: ignore[no-any-return]
    except InvalidTag:
        raise EnvelopeError(TAG, "its authentication tag does not match this place") from None


# -- associated data: the place ----------------------------------------------------------
def place(prefix: str, key: str, thread_id: str, field: str | None = None) -> bytes:
    """The associated data of what is stored at object ``key`` (a full key: the saver's
    ``prefix`` is taken off) for thread ``thread_id``; ``field``: an index attribute
    standing for the object that is not its bytes (``"meta"``, the metadata).

    Canonical msgpack of ``[version, prefix, key within the prefix, thread id(, field)]``:
    a list of strings has one encoding, and no two places share one (the prefix and the
    key are apart, so a saver with another prefix never opens this one's objects).
    """
    if not key.startswith(prefix):
        raise ValueError(f"{key!r} is not under the prefix {prefix!r}")
    parts: list[Any] = [VERSION, prefix, key[len(prefix) :], thread_id]
    if field is not None:
        parts.append(field)
    return ormsgpack.packb(parts)
