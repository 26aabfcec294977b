"""The public encryption settings: ``KmsKey`` and ``LocalKey`` (``S3Saver(encryption=...)``)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from typing import Any

from s3_saver._crypto.envelope import DATA_KEY_BYTES
from s3_saver._transport.clients import BUCKET_RULE, bucket_name_ok
from s3_saver.errors import ConfigurationError

LOCAL_KEY_ENV = "S3_SAVER_LOCAL_KEY"
# arn:<partition>:kms:<region>:<account>:key/<id> or :alias/<name>
_KMS_ARN = re.compile(r"^arn:aws[\w-]*:kms:([a-z0-9-]+):\d{12}:(key|alias)/.+$")


def _check_key_bucket(key_bucket: Any) -> None:
    if key_bucket is None:
        return
    if not isinstance(key_bucket, str) or not bucket_name_ok(key_bucket):
        raise ConfigurationError(f"key_bucket={key_bucket!r} is not an S3 bucket name ({BUCKET_RULE})")


def _check_previous(owner: str, previous: Any) -> tuple[Any, ...]:
    """The keys a rotation left behind, read only: KmsKey or LocalKey, none with keys of
    its own behind it (a chain would keep a key nobody means to keep)."""
    if previous is None:
        return ()
    if isinstance(previous, (KmsKey, LocalKey)) or isinstance(previous, (str, bytes)):
        previous = [previous]
    found = tuple(previous)
    for key in found:
        if not isinstance(key, (KmsKey, LocalKey)):
            raise ConfigurationError(
                f"{owner}(previous=...) takes s3_saver.KmsKey and s3_saver.LocalKey, got {type(key).__name__}: {key!r}"
            )
        if key.previous:
            raise ConfigurationError(f"{owner}(previous=...): {key!r} has previous keys of its own; list them all in one")
    return found


class KmsKey:
    """Encryption with a data key per thread, wrapped by an AWS KMS key.

    Each thread gets its own 256-bit data key from KMS ``GenerateDataKey``, kept wrapped
    in the key store (a bucket of its own: nothing else lives there, unversioned, so a
    destroyed key leaves no copy) and unwrapped with ``Decrypt`` once per process. The
    wrapped key is bound to its thread (KMS encryption context ``s3_saver:thread``, and
    ``s3_saver:prefix``): moved to another thread's record, it does not unwrap.

    Example:
        ```python
        from s3_saver import KmsKey, S3Saver

        saver = S3Saver(
            "my-bucket", table="checkpoints", encryption=KmsKey("alias/checkpoints")
        )
        saver.setup()  # creates the key store bucket "my-bucket-keys" too
        ```

    Args:
        key_id: The KMS key: a key id, a key ARN, an alias (``alias/name``) or an alias ARN.
            A symmetric encryption key. The saver needs ``kms:GenerateDataKey`` and
            ``kms:Decrypt`` on it.
        key_bucket: The key store's bucket; None: ``<bucket>-keys``. It must not be
            versioned (so it can have no Object Lock and no replication rule):
            [setup()][s3_saver.S3Saver.setup] creates it and refuses a versioned one.
            Keep it out of backup plans: a backup would keep the keys it is there to destroy.
        region_name: The region of the KMS key; None: the region of its ARN, else the saver's.
        endpoint_url: A KMS endpoint (LocalStack, moto); None: the saver's ``endpoint_url``.
        previous: Keys a rotation is moving away from ([LocalKey][s3_saver.LocalKey]s,
            or a KmsKey for a move between kinds): records they wrapped are still
            unwrapped, new keys are made under this one. Another KMS key needs none:
            a record names the KMS key that wrapped it (``kms:Decrypt`` on it is enough).
            See [rewrap()][s3_saver.S3Saver.rewrap].
    """

    def __init__(
        self,
        key_id: str,
        *,
        key_bucket: str | None = None,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        previous: Any = (),
    ) -> None:
        if not isinstance(key_id, str) or not key_id.strip():
            raise ConfigurationError(f"KmsKey needs a KMS key id, ARN or alias, got {key_id!r}")
        _check_key_bucket(key_bucket)
        for name, value in (("region_name", region_name), ("endpoint_url", endpoint_url)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(f"KmsKey {name} must be a non-empty string or None, got {value!r}")
        if endpoint_url is not None and not endpoint_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"KmsKey endpoint_url must be an http:// or https:// URL, got {endpoint_url!r}")
        self.key_id = key_id
        self.key_bucket = key_bucket
        arn = _KMS_ARN.match(key_id)
        self.region_name = region_name or (arn.group(1) if arn else None)
        self.endpoint_url = endpoint_url
        self.previous = _check_previous("KmsKey", previous)

    def __repr__(self) -> str:
        return f"KmsKey({self.key_id!r}, key_bucket={self.key_bucket!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KmsKey) and (self.key_id, self.key_bucket, self.region_name, self.endpoint_url) == (
            other.key_id, other.key_bucket, other.region_name, other.endpoint_url
        )

    def __hash__(self) -> int:
        return hash((KmsKey, self.key_id, self.key_bucket))


class LocalKey:
    """Encryption with a data key per thread, wrapped by a master key you keep: for
    S3-compatible stores without KMS (MinIO, R2, SeaweedFS...).

    Each thread's data key is 32 random bytes (never derived from the master key: a
    derivable key could not be destroyed), wrapped with AES-256-GCM under the master key,
    bound to its thread, and kept in the key store bucket. Anyone with the master key and
    a key record reads that thread; destroying the record (erase) makes every copy of
    the thread unreadable, master key or not.

    Example:
        ```python
        import os
        from s3_saver import LocalKey, S3Saver

        # 32 random bytes as base64 text, kept as a secret of your deployment:
        # base64.b64encode(os.urandom(32)).decode()
        os.environ["S3_SAVER_LOCAL_KEY"] = "..."
        saver = S3Saver(
            "my-bucket", endpoint_url="http://minio:9000", encryption=LocalKey()
        )
        ```

    Args:
        key: The master key: 32 bytes, or their base64 text; None reads the base64 text
            from the ``S3_SAVER_LOCAL_KEY`` environment variable (when the saver is made).
        key_bucket: The key store's bucket; None: ``<bucket>-keys`` (see
            [KmsKey][s3_saver.KmsKey]).
        previous: The master keys (``LocalKey``s, or a ``KmsKey``) a rotation is moving
            away from: records they wrapped are still unwrapped, new keys are made
            under this one. Keep them until [rewrap()][s3_saver.S3Saver.rewrap] has
            wrapped every record under this key, then drop them.

    Raises:
        ConfigurationError: No key, or not 32 bytes.
    """

    def __init__(self, key: bytes | str | None = None, *, key_bucket: str | None = None, previous: Any = ()) -> None:
        _check_key_bucket(key_bucket)
        self.previous = _check_previous("LocalKey", previous)
        source = "key="
        if key is None:
            key = os.environ.get(LOCAL_KEY_ENV)
            source = f"the {LOCAL_KEY_ENV} environment variable"
            if not key:
                raise ConfigurationError(
                    f"LocalKey() needs a master key: pass key= (32 bytes, or their base64 text) or set {LOCAL_KEY_ENV}"
                )
        if isinstance(key, str):
            try:
                key = base64.b64decode(key.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise ConfigurationError(f"LocalKey: {source} is not base64 text") from None
        if not isinstance(key, (bytes, bytearray)) or len(key) != DATA_KEY_BYTES:
            size = len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__
            raise ConfigurationError(f"LocalKey: the master key from {source} must be {DATA_KEY_BYTES} bytes, got {size}")
        self._secret = bytes(key)
        self.key_bucket = key_bucket

    @property
    def fingerprint(self) -> str:
        """A name of the master key that does not reveal it (an HMAC of a constant),
        kept in each key record it wraps: a record wrapped by another master key is
        named as such."""
        return hmac.new(self._secret, b"s3_saver.local-key", hashlib.sha256).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"LocalKey(fingerprint={self.fingerprint!r}, key_bucket={self.key_bucket!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalKey) and hmac.compare_digest(self._secret, other._secret) and (
            self.key_bucket == other.key_bucket
        )

    def __hash__(self) -> int:
        return hash((LocalKey, self.fingerprint, self.key_bucket))


Encryption = KmsKey | LocalKey


def check_encryption(value: Any) -> None:
    if value is not None and not isinstance(value, (KmsKey, LocalKey)):
        raise ConfigurationError(
            f"encryption must be an s3_saver.KmsKey, an s3_saver.LocalKey or None, got {type(value).__name__}: {value!r}"
        )


def key_bucket_of(encryption: Encryption, bucket: str, own: bool = True) -> str:
    """The key store's bucket: as configured, else ``<bucket>-keys``. ``own=False``: a
    replica region's (its ``Replica.key_bucket``, else ``<replica bucket>-keys``: the
    configured one is the primary region's)."""
    name = (encryption.key_bucket if own else None) or f"{bucket}-keys"
    if not bucket_name_ok(name):
        where = f"to {type(encryption).__name__}(...)" if own else "to Replica(...)"
        raise ConfigurationError(
            f"the key store bucket {name!r} (from bucket {bucket!r}) is not a valid bucket name: pass key_bucket= "
            f"{where} ({BUCKET_RULE})"
        )
    return name
