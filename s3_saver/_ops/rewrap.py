"""rewrap: every thread's data key wrapped under another key-encryption key (rotation).

The walk and the rewrite of each key store are ``_crypto/rotate``'s; this operation
checks what it is given and walks each region's key store in turn: the region written
to's first, then with a replica the replica region's (its own store, with its own
keyring: KMS calls in that region). Sequential, so the report names the new key as the
region written to names it.
"""

from __future__ import annotations

from s3_saver._crypto.config import Encryption, KmsKey, LocalKey
from s3_saver._crypto.keys import Crypt
from s3_saver._crypto.rotate import RewrapReport, rotate
from s3_saver._ops.context import Context
from s3_saver._transport.protocol import Op
from s3_saver.errors import ConfigurationError


def rewrap(ctx: Context, target: Encryption, others: list[Context]) -> Op[RewrapReport]:
    """Every live key record of the saver's key stores wrapped under ``target``.

    Raises:
        ConfigurationError: No ``encryption=`` on the saver, ``target`` not a
            ``KmsKey``/``LocalKey``, or one naming another key store.
    """
    crypt = ctx.crypt
    if crypt is None:
        raise ConfigurationError(
            f"rewrap wraps the data keys of an encrypted saver again; the saver of bucket {ctx.s3.bucket!r} has no "
            "encryption=: give it the key the records are wrapped by now (KmsKey or LocalKey)"
        )
    if not isinstance(target, (KmsKey, LocalKey)):
        raise ConfigurationError(
            f"rewrap needs the new key as an s3_saver.KmsKey or s3_saver.LocalKey, got {type(target).__name__}: {target!r}"
        )
    if target.key_bucket is not None and target.key_bucket != crypt.key_bucket:
        raise ConfigurationError(
            f"rewrap wraps the records where they are, in the key store {crypt.key_bucket!r}; the new key names "
            f"key_bucket={target.key_bucket!r}: leave key_bucket out of it"
        )
    # KMS keys are regional: the new key is used through the saver's KMS client (its
    # region, and with a replica the replica region's, where a multi-Region key has its replica).
    if isinstance(target, KmsKey) and target.region_name and crypt.kms_region and target.region_name != crypt.kms_region:
        raise ConfigurationError(
            f"rewrap: the new KMS key {target.key_id!r} is in region {target.region_name}, the saver's KMS calls go to "
            f"{crypt.kms_region}: give a key of that region (a multi-Region key's replica there, by its ARN or alias)"
        )
    crypts: list[Crypt] = [crypt, *(o.crypt for o in others if o.crypt is not None)]
    report = RewrapReport()
    for each in crypts:
        prepared = yield from rotate(each, target, len(crypts) > 1, report)
        # The memory store's keys (a namespace's, the store-wide one) in the same key store:
        # one more listing (``m/``) and the store-wide record's GET.
        yield from rotate(each.for_memory(), target, len(crypts) > 1, report, prepared)
    return report
