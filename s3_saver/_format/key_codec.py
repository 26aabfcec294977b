"""Key encoding: the key prefixes, the percent-encoding of ids in object keys,
the order-preserving encoding of ids in DynamoDB sort keys, tokens and tags,
and the size checks every key goes through. ``_format/keys`` (the layout) builds
keys with these and re-exports them.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from urllib.parse import quote, unquote

from s3_saver.errors import ConfigurationError, KeyTooLongError

LIVE_PREFIX = "live/"
"""Sub-prefix of the bucket prefix that holds every object the saver writes."""
MANIFEST_PREFIX = "manifests/"
"""Sub-prefix of the manifest index (no DynamoDB table): a head and sealed segments
per thread. Not under ``live/``: a lifecycle rule on ``live/`` must not expire it."""
LISTING_PREFIX = "listing/"
"""Sub-prefix of the records that find threads without listing ``live/`` (manifest
mode): one empty object per thread, named by when it was created, and one per
(run, thread)."""
SET_ASIDE_PREFIX = "set-aside/"
"""Sub-prefix of the records a failback leaves of the committed writes its merge
did not keep (one immutable object per thread and merge, read by ``verify``).
Not under ``live/``: nothing in it is a thread's data, and garbage collection
and rebuilds never take it for one."""
ERASE_MARK = "erase."
"""Name start of an erase's record in a thread's manifest folder (``KeyLayout.erase_key``)."""
ACTIVITY_PREFIX = LISTING_PREFIX + "active/"
"""Sub-prefix of the activity entries (manifest mode): one empty object per thread and
day it was written on (``archive_idle`` walks them by day, see ``_ops/idle``)."""
ACTIVITY_SHARDS = 8
"""DynamoDB partitions the activity entries are spread over (by a hash of the thread)."""
ARCHIVE_PREFIX = "archive/"
"""Sub-prefix of archived threads: one object per thread (``archive_thread``), in a
cold storage class; lifecycle rules may move it colder still."""

MEMORY_PREFIX = "memory/"
"""Sub-prefix of the memory store (``S3Store``): in manifest mode every object it
writes (per-namespace heads under ``n/<node id>/``, the namespace registry under
``@reg/``). Not a thread's: a saver's gc, audit, erase and rebuild never list it."""
NODE_CACHE_PREFIX = "node-cache/"
"""Sub-prefix of the node cache (``S3Cache``): its entries and its generations
document. A folder of its own, so a lifecycle rule that expires cache entries
(and a saver's gc, which lists only its own folders) never meets a thread's objects."""

FOLDERS = tuple(
    p.rstrip("/")
    for p in (LIVE_PREFIX, MANIFEST_PREFIX, LISTING_PREFIX, SET_ASIDE_PREFIX, ARCHIVE_PREFIX, MEMORY_PREFIX, NODE_CACHE_PREFIX)
)
"""The folders every key of a saver, store or cache starts with, after its prefix. No
prefix may have one as a segment (``check_prefix``): that is what keeps two trees apart."""

S3_KEY_MAX_BYTES = 1024
DYNAMODB_PARTITION_KEY_MAX_BYTES = 2048
DYNAMODB_SORT_KEY_MAX_BYTES = 1024

# Characters kept as they are. "|" and "/" are separators and "=" marks the
# empty string, so none of them may be safe; everything else is %XX-escaped
# (UTF-8), which makes the encoding injective and prefix-free per segment.
_SAFE = "-_.~"
_EMPTY = "="
CHECKPOINT_SUFFIX = "~"
WRITES_MARK = "w"
# A space sorts below "!" and below every encoded character, and no item key
# starts with one: the thread tombstone sorts before every item of the thread.
THREAD_TOMBSTONE_SK = " tombstone"
LINK_MARK = " link!"
# U+10FFFF is refused in ids (see _check_text), so "<ns>!" + U+10FFFF sorts
# after every item of the namespace: newest first, its tombstone comes first.
_NS_TOMBSTONE_MARK = "\U0010FFFF"
# Separates an object's tag from its checkpoint id: encode() escapes "@", so a
# tagged key never equals another id's key.
_TAG_SEP = "@"
_TAG = re.compile(r"[0-9a-f]{1,32}")


def new_token(nbytes: int = 16) -> str:
    """A random hex token from the OS's generator: the saver never draws from
    ``uuid.uuid4`` or the ``random`` module, which a user's tests may patch or seed."""
    return secrets.token_hex(nbytes)


def new_tag() -> str:
    """The tag of one operation's rewritten objects (see the module's docstring)."""
    return new_token(6)

# Sort-key components keep their characters, except those at or below '"',
# which become '"' plus two hex digits; "!" separates components. DynamoDB
# compares sort keys as UTF-8 bytes, i.e. by code point, so with a separator
# that sorts below every character a component can hold, comparing two keys
# compares (ns, checkpoint_id, ...) exactly as Python compares those strings:
# "1" < "10" < "9" and "a" < "ab", as in every other LangGraph saver.
_SORT_SEP = "!"
_SORT_ESC = '"'
_SORT_ESCAPED = re.compile(r'[\x00-"]')
_SORT_UNESCAPE = re.compile(r'"([0-9A-F]{2})')


def encode(segment: str) -> str:
    """Encode one id so it can never be confused with a separator or another id.

    ``unquote(encode(x)) == x`` for every non-empty ``x``; the empty string maps
    to ``=`` (never produced otherwise), and all-dot ids are escaped so no key
    holds a ``.`` or ``..`` path segment that a proxy or SDK could normalise.
    """
    if segment == "":
        return _EMPTY
    _check_text(segment)
    if segment.strip(".") == "":
        return "%2E" * len(segment)
    return quote(segment, safe=_SAFE)


def _check_text(segment: str) -> None:
    if not isinstance(segment, str):
        raise ConfigurationError(f"ids must be strings, got {type(segment).__name__}: {segment!r}")
    try:
        segment.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"id {segment!r} is not valid Unicode text: {exc}") from exc
    if _NS_TOMBSTONE_MARK in segment:
        # Reserved: it marks namespace tombstones in the index (a noncharacter,
        # never part of real text).
        raise ConfigurationError(f"id {segment!r} contains U+10FFFF, which ids may not contain")


class LegacyPrefix(str):
    """A prefix ``check_prefix`` refuses, given to open what an earlier version,
    which accepted it, stored under it: to move its threads elsewhere
    (``open_saver(url, create=False)``, migrate's source)."""


def check_prefix(prefix: str, bucket: str | None = None, table: str | None = None) -> str:
    """The prefix as keys start with it ("" or ending in "/"), or ConfigurationError
    naming it (and ``bucket``, ``table`` when given).

    Every key a saver writes, lists or deletes is ``<prefix><folder>/...`` with
    ``<folder>`` one of ``FOLDERS``. For a key to lie in two savers' trees, one
    prefix must extend the other, and the part the longer adds must begin with a
    folder name as a whole segment (``"live/a/"`` over ``""``): whatever the ids
    after it, the outer saver would then read the inner saver's keys as its own
    threads' (``live/a/live/blobs/=/checkpoints/<id>`` as a value of thread
    ``a``) and its gc or erase would delete them. So a prefix with a folder name
    as a segment is refused (in any letter case: a store on a case-insensitive
    disk takes ``Live`` for ``live``), and two accepted savers' trees never
    meet, at no request. A proxy or a store that normalises paths ("a/./b",
    "a/../b", "a//b") only drops segments, so it never makes a folder name
    appear; but ``.`` and ``..`` segments are refused too, as ids never make
    them (see ``encode``): resolved, they would give two prefixes one tree.
    """
    if not isinstance(prefix, str):
        raise ConfigurationError(f"prefix must be a string, got {type(prefix).__name__}: {prefix!r}")
    given = prefix
    prefix = str(prefix)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if isinstance(given, LegacyPrefix):
        return prefix
    where = f"prefix {given!r}" + (f" of bucket {bucket!r}" if bucket else "")
    segments = prefix.split("/")[:-1]
    for i, segment in enumerate(segments):
        outer = "".join(s + "/" for s in segments[:i])
        if segment.lower() in FOLDERS:
            source = f"s3://{bucket or 'BUCKET'}/{quote(prefix, safe='/')}" + (f"?table={table}" if table else "")
            target = f"s3://{bucket or 'BUCKET'}/NEW-PREFIX" + (f"?table={table}" if table else "")
            raise ConfigurationError(
                f"{where}: its segment {segment!r} is the name of a folder every saver (or memory store, or node cache) keeps under its own "
                f"prefix ({', '.join(FOLDERS)}), so a saver with prefix {outer!r} on the bucket would take this "
                f"one's objects for its own; choose a prefix with none of those names as a segment. Threads "
                f"stored under it move with: langgraph-s3-saver migrate --from '{source}' --to '{target}'"
            )
        if segment in (".", ".."):
            raise ConfigurationError(
                f"{where}: its segment {segment!r} is one a proxy or a store may resolve, moving every key "
                "(possibly onto another prefix's); give a prefix without '.' or '..' segments"
            )
    return prefix


def sort_encode(segment: str) -> str:
    """Encode one id for a DynamoDB sort key, preserving Python's string order."""
    _check_text(segment)
    return _SORT_ESCAPED.sub(lambda m: f"{_SORT_ESC}{ord(m.group()):02X}", segment)


def sort_decode(segment: str) -> str:
    return _SORT_UNESCAPE.sub(lambda m: chr(int(m.group(1), 16)), segment)


def decode(segment: str) -> str:
    return "" if segment == _EMPTY else unquote(segment, errors="strict")


def version_segment(version: str | int | float) -> str:
    # Versions are strings from get_next_version; numbers from other code paths
    # keep a type mark so 1, 1.0 and "1" stay distinct keys.
    if isinstance(version, str):
        return encode(version)
    return f"{type(version).__name__}:{version!r}"


def parse_version(segment: str) -> str | int | float:
    """The inverse of ``version_segment``."""
    if ":" in segment:  # encode() escapes ":", so only a type mark has one
        kind, _, text = segment.partition(":")
        return {"int": int, "float": float}[kind](text)
    return decode(segment)


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """What an object's key says: its kind ("checkpoint", "blob" or "writes"), thread,
    namespace and checkpoint, and for a blob its channel and version, for writes its
    task, part and token."""

    kind: str
    thread_id: str
    ns: str
    checkpoint_id: str
    channel: str = ""
    version: str | int | float = ""
    task_id: str = ""
    part: str = ""
    token: str = ""
    tag: str = ""


def _tagged(checkpoint_id: str, tag: str) -> str:
    return f"{encode(checkpoint_id)}{_TAG_SEP}{tag}" if tag else encode(checkpoint_id)


def _untagged(segment: str) -> tuple[str, str]:
    """(checkpoint id, tag) of a key's last segment; a malformed tag raises ValueError."""
    encoded, sep, tag = segment.partition(_TAG_SEP)
    if sep and not _TAG.fullmatch(tag):
        raise ValueError(f"not a tag: {tag!r}")
    return decode(encoded), tag



def _checked(key: str) -> str:
    size = len(key.encode())
    if size > S3_KEY_MAX_BYTES:
        raise KeyTooLongError(
            f"object key would be {size} bytes, over S3's limit of {S3_KEY_MAX_BYTES} bytes "
            f"(ids are percent-encoded; shorten the thread id, namespace, channel or "
            f"task id): {key[:120]}..."
        )
    return key


def _checked_sort(sk: str) -> str:
    return _checked_index(sk, DYNAMODB_SORT_KEY_MAX_BYTES, "sort key")


def _checked_index(key: str, limit: int, what: str) -> str:
    size = len(key.encode())
    if size > limit:
        raise KeyTooLongError(
            f"DynamoDB {what} would be {size} bytes, over the limit of {limit} bytes "
            f"(shorten the thread id, namespace, checkpoint id or task id): {key[:120]}..."
        )
    return key
