"""The key rotation of S3Saver (``encryption=``): ``rewrap``.

A mixin of [S3Saver][s3_saver.S3Saver], like ``_saver/threads``: each method is one
line, an operation (``_ops.rewrap``) and a driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from s3_saver._crypto.config import KmsKey, LocalKey
from s3_saver._crypto.rotate import RewrapReport
from s3_saver._ops import rewrap

if TYPE_CHECKING:
    from s3_saver._ops.context import Context
    from s3_saver._regions.sites import Route
    from s3_saver._transport.aio import AsyncDriver
    from s3_saver._transport.protocol import Op
    from s3_saver._transport.sync import SyncDriver


class KeyRotation:
    """Key rotation (S3Saver's ``_sync``, ``_async`` and ``_ctx`` run it)."""

    _sync: SyncDriver
    _async: AsyncDriver
    _ctx: Context
    _other_ctx: Context
    _route: Route | None

    def rewrap(self, encryption: KmsKey | LocalKey) -> RewrapReport:
        """Wrap every thread's data key under another key-encryption key (rotation).

        Each live record of the key store (every region's, with a
        [Replica][s3_saver.Replica]) gets its data key wrapped by the new key,
        bound to its thread as before: KMS to KMS with ``ReEncrypt`` (the data key
        never leaves KMS), otherwise unwrapped by this saver's key and wrapped by the
        new one. The data keys stay, so no checkpoint, value, archive or export is
        rewritten, and processes that hold a key in their cache go on with it.

        An admin call: it lists the key store (``s3:ListBucket``) and reads each
        record. Records already under the new key are skipped and erased threads'
        records are left alone, so a run cut short anywhere is finished by running
        it again. A record another process changes meanwhile (an erase) is read
        again, never overwritten.

        Configure every process with the new key first (or, with a local key,
        with ``LocalKey(new, previous=[old])``): a process still configured with
        the old key makes new threads' keys under it. Run ``rewrap`` again once
        they are; it reports ``rewrapped == 0`` when nothing is left.

        Args:
            encryption: The new key: [KmsKey][s3_saver.KmsKey] (its
                ``key_bucket`` left out: the records stay where they are; its
                calls go to this saver's KMS endpoint) or [LocalKey][s3_saver.LocalKey].

        Returns:
            [RewrapReport][s3_saver.RewrapReport]: records wrapped again, found
            under the new key already, and erased.

        Raises:
            ConfigurationError: This saver has no ``encryption=``, or with a
                replica the new KMS key is not multi-Region.
            EncryptionKeyError: A record wrapped by a key this saver does not
                have, or a KMS key that cannot be used.
        """
        return self._sync.run(self._rewrapping(encryption))

    async def arewrap(self, encryption: KmsKey | LocalKey) -> RewrapReport:
        """Async version of [rewrap()][s3_saver.S3Saver.rewrap]."""
        return await self._async.run(self._rewrapping(encryption))

    def _rewrapping(self, encryption: KmsKey | LocalKey) -> Op[RewrapReport]:
        others = [self._route.as_writer(self._other_ctx)] if self._route is not None else []
        return rewrap.rewrap(self._ctx, encryption, others)
