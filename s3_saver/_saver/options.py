"""The saver's constructor arguments, checked by name before anything uses them."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from botocore.config import Config

from s3_saver._crypto.config import check_encryption
from s3_saver._format.key_codec import check_prefix
from s3_saver._transport.budget import MIN_BYTES
from s3_saver._transport.clients import (
    BUCKET_RULE,
    TABLE_NAME,
    TABLE_RULE,
    bucket_name_ok,
)
from s3_saver._transport.retry import RetryPolicy
from s3_saver.errors import ConfigurationError


def check_options(options: dict[str, Any]) -> None:
    """Refuse wrongly typed options by name, before they fail somewhere deeper."""

    def refuse(name: str, wanted: str) -> None:
        value = options[name]
        raise ConfigurationError(f"{name} must be {wanted}, got {type(value).__name__}: {value!r}")

    if not isinstance(options["bucket"], str) or not options["bucket"]:
        refuse("bucket", "a non-empty string")
    if not bucket_name_ok(options["bucket"]):
        raise ConfigurationError(f"bucket={options['bucket']!r} is not an S3 bucket name ({BUCKET_RULE})")
    if options["table"] is not None and (not isinstance(options["table"], str) or not options["table"]):
        refuse("table", "a non-empty DynamoDB table name, or None for the manifest index in the bucket")
    if options["table"] is not None and not TABLE_NAME.match(options["table"]):
        raise ConfigurationError(
            f"table={options['table']!r} is not a DynamoDB table name ({TABLE_RULE}); "
            "pass table=None for the manifest index in the bucket"
        )
    if not isinstance(options["prefix"], str):
        refuse("prefix", "a string")
    # No prefix lies inside another's tree: see check_prefix.
    check_prefix(options["prefix"], options["bucket"], options["table"])
    for name in ("region_name", "endpoint_url", "s3_endpoint_url", "dynamodb_endpoint_url"):
        value = options[name]
        if value is not None and (not isinstance(value, str) or not value):
            refuse(name, "a non-empty string or None")
    for name in ("endpoint_url", "s3_endpoint_url", "dynamodb_endpoint_url"):
        value = options[name]
        if value is not None and not value.startswith(("http://", "https://")):
            refuse(name, "an http:// or https:// URL")
    if options["client_config"] is not None and not isinstance(options["client_config"], Config):
        refuse("client_config", "a botocore.config.Config or None")
    ttl = options["ttl"]
    if ttl is not None and (not isinstance(ttl, timedelta) or ttl.total_seconds() < 1):
        refuse("ttl", "a datetime.timedelta of at least one second, or None")
    if options["retry"] is not None and not isinstance(options["retry"], RetryPolicy):
        refuse("retry", "an s3_saver.RetryPolicy or None")
    if not isinstance(options["list_deltas"], bool):
        refuse("list_deltas", "True or False")
    for name, least in (("inline_threshold", 0), ("max_concurrency", 1)):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            refuse(name, f"an int >= {least}")
    check_encryption(options["encryption"])
    value = options["cache_bytes"]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < MIN_BYTES):
        refuse("cache_bytes", f"an int of at least {MIN_BYTES} (1 MiB), or None for the default")


# Durations as operators write them: the command line's options and LangGraph Server's
# CHECKPOINT_TTL.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``1h``, ``7d``, ``2w``, ``1h30m`` or plain seconds (``3600``, ``0``).

    Raises:
        ValueError: Anything else (negative numbers included).
    """
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return timedelta(seconds=float(value))
    if not _WHOLE.fullmatch(value):
        raise ValueError(text)
    return timedelta(seconds=sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(value)))


def format_duration(delta: timedelta) -> str:
    """The shortest of ``parse_duration``'s spellings for ``delta`` (``1h``, ``90s``, ``7d``)."""
    seconds = delta.total_seconds()
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"


# Sizes as operators write them: LangGraph Server's CHECKPOINT_CACHE_BYTES.
_SIZE = re.compile(r"(\d+)\s*(|b|kb|kib|mb|mib|gb|gib)")
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "kib": 2**10, "mb": 10**6, "mib": 2**20, "gb": 10**9, "gib": 2**30}


def parse_bytes(text: str) -> int:
    """``67108864``, ``64MiB``, ``64MB``, ``512KiB``, ``1GiB`` (case aside) as bytes.

    Raises:
        ValueError: Anything else.
    """
    found = _SIZE.fullmatch(text.strip().lower())
    if found is None:
        raise ValueError(text)
    return int(found.group(1)) * _SIZE_UNITS[found.group(2)]
