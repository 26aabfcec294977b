"""What a versioned bucket keeps of the heads the manifest index replaces.

Each manifest write replaces its thread's head. A versioned bucket (required by
replication and Object Lock) keeps every replaced head as a noncurrent version,
billed as storage until a lifecycle rule expires it. ``setup()`` reads the
bucket's versioning state (the manifest then writes heads without bodies, see
``doc.encode_head``; a process that skips ``setup()`` learns it from
its first head's version id) and its lifecycle rules; it and ``verify`` warn
when no rule expires noncurrent versions under the manifest's prefix.

Both calls are admin reads (``s3:GetBucketVersioning``,
``s3:GetLifecycleConfiguration``): a store that refuses or lacks them (S3
compatibles without versioning) is taken as unversioned, with no warning.
"""

from __future__ import annotations

import logging
from typing import Any

from s3_saver._ops.context import Context
from s3_saver._transport.failures import error_code
from s3_saver._transport.protocol import Op

log = logging.getLogger("s3_saver")

# Measured (benchmarks, longconv; docs/reference/costs.md): what a chat of 1 KB
# messages keeps as noncurrent head versions, per byte of its own, with no rule.
NONCURRENT_PER_BYTE = "about 0.9x"
_NO_RULES = "NoSuchLifecycleConfiguration"


def noncurrent_warning(ctx: Context) -> Op[str | None]:
    """Read the bucket's versioning (set ``ctx.index.versioned_bucket``) and
    lifecycle rules; a warning when replaced heads are kept with no expiry."""
    prefix = ctx.index.replaced_prefix
    if prefix is None:
        return None  # the index replaces no object: nothing becomes noncurrent by writing
    versioning, lifecycle = yield (ctx.s3.bucket_versioning(), ctx.s3.bucket_lifecycle())
    if isinstance(versioning, BaseException):
        log.debug("bucket %s: versioning state not readable (%s)", ctx.s3.bucket, error_code(versioning))
        return None
    ctx.index.versioned_bucket = versioning.get("Status") == "Enabled"
    if not ctx.index.versioned_bucket:
        return None
    if isinstance(lifecycle, BaseException):
        if error_code(lifecycle) != _NO_RULES:
            return _message(ctx, prefix, f"its lifecycle rules could not be read ({error_code(lifecycle)})")
        rules: list[dict[str, Any]] = []
    else:
        rules = lifecycle.get("Rules", [])
    if any(_expires_noncurrent(rule, prefix) for rule in rules):
        return None
    return _message(ctx, prefix, "no lifecycle rule expires noncurrent versions under that prefix")


def warn_setup(ctx: Context) -> Op[None]:
    message = yield from noncurrent_warning(ctx)
    if message is not None:
        log.warning("%s", message)


def _message(ctx: Context, prefix: str, why: str) -> str:
    return (
        f"bucket {ctx.s3.bucket!r} has versioning enabled and {why} (prefix {prefix!r}): every write "
        "to a thread keeps the manifest head it replaces as a noncurrent version, billed as storage "
        f"($0.023/GB-month in S3 Standard, and again in a replica) until deleted: {NONCURRENT_PER_BYTE} "
        "a chat's own bytes, growing with every write. Add a rule with NoncurrentVersionExpiration "
        f"filtered on {prefix!r} (infra/template.yaml has one: 1 day); see docs/reference/costs.md"
    )


def _expires_noncurrent(rule: dict[str, Any], prefix: str) -> bool:
    """True when ``rule`` expires the noncurrent versions of every key under
    ``prefix``: enabled, with NoncurrentVersionExpiration, and a filter on a
    prefix of it alone (a tag or size filter leaves some heads out)."""
    if rule.get("Status") != "Enabled" or "NoncurrentDays" not in rule.get("NoncurrentVersionExpiration", {}):
        return False
    filt = rule.get("Filter")
    if filt is None:
        return prefix.startswith(rule.get("Prefix", ""))  # the legacy form: a prefix or nothing
    if set(filt) - {"Prefix"}:
        return False
    return prefix.startswith(filt.get("Prefix", ""))
