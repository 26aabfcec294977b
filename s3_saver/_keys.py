"""Where every object and index item lives: the key layout and its encoding.

Layout (all under the user's ``prefix``)::

    live/<thread>/<ns>/checkpoints/<checkpoint_id>[@<tag>]
    live/<thread>/<ns>/blobs/<channel>/<version>/<checkpoint_id>[@<tag>]
    live/<thread>/<ns>/writes/<checkpoint_id>/<task_id>/<part>.<token>

A ``put`` writes its objects untagged. An operation that writes a thread's
objects again from elsewhere (``restore_thread``, ``import_thread``,
``copy_thread``) gives every object it writes a fresh random tag, and the index
entries name it (``CheckpointEntry.tag``, a ``loc`` reference's fifth element):
a key is never written again once it may have been deleted, so a cleanup or a
garbage collection still finishing can never delete what a restore wrote.

DynamoDB index items of one thread share a partition (``pk`` = encoded prefix
and thread, see ``KeyLayout.partition_key``) and sort as::

    " tombstone"                              the thread's record (generation, archive, marks)
    <ns>!<checkpoint_id>!~                    checkpoint item
    <ns>!<checkpoint_id>!w!<task_id>!<part>   pending writes of one task
    <ns>!\U0010FFFF                            a namespace's tombstone (earlier versions)

so that, read newest first, a namespace's tombstone comes before all of its
items, each checkpoint item is followed by its own writes, and ids order
exactly as Python orders the strings (see ``sort_encode``).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import zlib
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


class KeyLayout:
    """Builds object keys and index keys for one bucket prefix."""

    def __init__(self, prefix: str = "") -> None:
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.prefix = prefix
        self.root = prefix + LIVE_PREFIX

    # -- S3 object keys ---------------------------------------------------
    def thread_dir(self, thread_id: str) -> str:
        return f"{self.root}{encode(thread_id)}/"

    def ns_dir(self, thread_id: str, ns: str) -> str:
        return f"{self.thread_dir(thread_id)}{encode(ns)}/"

    def checkpoint_key(self, thread_id: str, ns: str, checkpoint_id: str, tag: str = "") -> str:
        return _checked(f"{self.ns_dir(thread_id, ns)}checkpoints/{_tagged(checkpoint_id, tag)}")

    def blob_key(
        self, thread_id: str, ns: str, channel: str, version: str | int | float, checkpoint_id: str, tag: str = ""
    ) -> str:
        # The writing checkpoint is part of the key: a value stored again (ttl
        # refresh, unknown parent) gets a new object with a new age instead of
        # colliding with the old copy.
        return _checked(
            f"{self.ns_dir(thread_id, ns)}blobs/{encode(channel)}/{version_segment(version)}/"
            f"{_tagged(checkpoint_id, tag)}"
        )

    def writes_key(self, thread_id: str, ns: str, checkpoint_id: str, task_id: str, part: str, token: str) -> str:
        return _checked(
            f"{self.ns_dir(thread_id, ns)}writes/{encode(checkpoint_id)}/{encode(task_id)}/{part}.{token}"
        )

    def object_key(self, o: ObjectKey, thread_id: str | None = None) -> str:
        """The key of the object ``o`` names (under ``thread_id`` when given): the
        inverse of ``parse_object_key``."""
        t = o.thread_id if thread_id is None else thread_id
        if o.kind == "checkpoint":
            return self.checkpoint_key(t, o.ns, o.checkpoint_id, o.tag)
        if o.kind == "blob":
            return self.blob_key(t, o.ns, o.channel, o.version, o.checkpoint_id, o.tag)
        return self.writes_key(t, o.ns, o.checkpoint_id, o.task_id, o.part, o.token)

    def parse_object_key(self, key: str) -> ObjectKey | None:
        """The parts of a ``live/`` object key (listing the bucket), or None for
        anything else: the inverse of the key builders above."""
        if not key.startswith(self.root):
            return None
        parts = key[len(self.root) :].split("/")
        try:
            thread_id, ns, kind = decode(parts[0]), decode(parts[1]), parts[2]
            if kind == "checkpoints" and len(parts) == 4:
                checkpoint_id, tag = _untagged(parts[3])
                return ObjectKey("checkpoint", thread_id, ns, checkpoint_id, tag=tag)
            if kind == "blobs" and len(parts) == 6:
                checkpoint_id, tag = _untagged(parts[5])
                return ObjectKey(
                    "blob", thread_id, ns, checkpoint_id, channel=decode(parts[3]), version=parse_version(parts[4]), tag=tag
                )
            if kind == "writes" and len(parts) == 6:
                part, _, token = parts[5].partition(".")
                return ObjectKey(
                    "writes", thread_id, ns, decode(parts[3]), task_id=decode(parts[4]), part=part, token=token
                )
        except (IndexError, KeyError, ValueError, UnicodeDecodeError):
            return None
        return None

    # -- the manifest index ----------------------------------------------------
    @property
    def manifest_root(self) -> str:
        return self.prefix + MANIFEST_PREFIX

    def manifest_dir(self, thread_id: str) -> str:
        return f"{self.manifest_root}{encode(thread_id)}/"

    def manifest_head_key(self, thread_id: str) -> str:
        return _checked(f"{self.manifest_dir(thread_id)}head")

    def erase_key(self, thread_id: str, token: str) -> str:
        """A record of keys outside the thread's own prefixes that name it (its
        listing and run hints): written by an erase before its delete takes them
        out of the head (an erase cut short finds them here again), and on a
        versioned bucket by a prune before it deletes the hints of runs it took
        out (their noncurrent versions are then still found by an erase)."""
        return _checked(f"{self.manifest_dir(thread_id)}{ERASE_MARK}{token}")

    def segment_key(self, thread_id: str, number: int, token: str) -> str:
        return _checked(f"{self.manifest_dir(thread_id)}segments/{number:08d}.{token}")

    def thread_of_head(self, key: str) -> str | None:
        """The thread id of a manifest head's key (listing the bucket), else None."""
        rest = key[len(self.manifest_root) :] if key.startswith(self.manifest_root) else ""
        encoded, _, name = rest.partition("/")
        return decode(encoded) if name == "head" and encoded else None

    # -- what a failback's merge set aside ---------------------------------------
    def set_aside_dir(self, thread_id: str) -> str:
        return f"{self.prefix}{SET_ASIDE_PREFIX}{encode(thread_id)}/"

    def set_aside_key(self, thread_id: str, digest: str) -> str:
        return _checked(f"{self.set_aside_dir(thread_id)}{digest}")

    # -- archived threads ------------------------------------------------------
    def archive_dir(self, thread_id: str) -> str:
        return f"{self.archive_root}{encode(thread_id)}/"

    @property
    def archive_root(self) -> str:
        return self.prefix + ARCHIVE_PREFIX

    def thread_of_archive(self, key: str) -> str | None:
        """The thread id of an archive object's key (listing the bucket), else None."""
        rest = key[len(self.archive_root) :] if key.startswith(self.archive_root) else ""
        encoded, _, name = rest.partition("/")
        return decode(encoded) if name and "/" not in name and encoded else None

    def archive_key(self, thread_id: str, token: str) -> str:
        # A new key per archive call, recorded in the index before the object is
        # written (``Index.mark_archive``): an archive cut short leaves an object
        # the next call finds and deletes.
        return _checked(f"{self.archive_dir(thread_id)}{token}")

    # -- the thread listing and run hints (manifest mode) -------------------
    @property
    def threads_root(self) -> str:
        return self.prefix + LISTING_PREFIX + "threads/"

    def listing_key(self, created: int, thread_id: str) -> str:
        # Newest first in key order: S3 lists keys ascending.
        return _checked(f"{self.threads_root}{_LISTING_CLOCK - created:012d}.{encode(thread_id)}")

    def parse_listing_key(self, key: str) -> tuple[int, str] | None:
        inverted, dot, encoded = key[len(self.threads_root) :].partition(".")
        if not key.startswith(self.threads_root) or not dot or not inverted.isdigit():
            return None
        return _LISTING_CLOCK - int(inverted), decode(encoded)

    # -- the activity entries (archive_idle's index of threads by the day they were written) --
    @property
    def activity_root(self) -> str:
        return self.prefix + ACTIVITY_PREFIX

    def activity_key(self, day: int, thread_id: str) -> str:
        # Day first: S3 lists keys ascending, so a walk reads the oldest day first.
        return _checked(f"{self.activity_root}{day:08d}/{encode(thread_id)}")

    def parse_activity_key(self, key: str) -> tuple[int, str] | None:
        day, slash, encoded = key[len(self.activity_root) :].partition("/")
        if not key.startswith(self.activity_root) or not slash or not day.isdigit() or not encoded:
            return None
        return int(day), decode(encoded)

    def activity_cursor_key(self, name: str) -> str:
        """The object holding ``archive_idle``'s cursor ``name``: in the manifest
        folder (read and written like heads); ``encode`` never produces "#", so
        no thread's folder is this one."""
        return f"{self.manifest_root}#active/{name}"

    def activity_partition(self, shard: int | None) -> str:
        """The DynamoDB partition of one shard of the activity entries (None: the
        one of the cursors). ``encode`` never produces "#": no thread's partition."""
        base = f"{encode(self.prefix) if self.prefix else ''}#active"
        return base if shard is None else f"{base}#{shard}"

    def runs_dir(self, run_id: str) -> str:
        return f"{self.prefix}{LISTING_PREFIX}runs/{encode(run_id)}/"

    def run_key(self, run_id: str, thread_id: str) -> str:
        return _checked(self.runs_dir(run_id) + encode(thread_id))

    # -- DynamoDB partition keys --------------------------------------------
    def listing_partition(self, what: str, shard: int | None = None) -> str:
        """A partition of the thread listing ("threads") or of the run hints
        ("runs"): ``<prefix>#<what>#<shard>``, or with no shard the single
        partition earlier versions wrote (still read, until ``setup()`` moves
        its items; see ``shard_of``). ``encode`` never produces "#", so no
        thread's partition is one, and the prefix ends at the first "#"."""
        base = f"{encode(self.prefix) if self.prefix else ''}#{what}"
        return base if shard is None else f"{base}#{shard}"

    def partition_key(self, thread_id: str) -> str:
        """The index partition of a thread under this prefix.

        Whatever the prefix separates in the bucket is separate in the index:
        with a prefix the key is ``<encoded prefix>/<encoded thread>``. ``encode``
        never produces "/", so the key is injective, and the bare encoded thread
        of the empty prefix can never equal a prefixed one.
        """
        pk = f"{encode(self.prefix)}/{encode(thread_id)}" if self.prefix else encode(thread_id)
        return _checked_index(pk, DYNAMODB_PARTITION_KEY_MAX_BYTES, "partition key")

    def thread_of(self, pk: str) -> str | None:
        """The thread id of a partition key, or None when it belongs to another prefix."""
        if "#" in pk:
            return None  # the thread listing or the run hints
        head, _, tail = pk.rpartition("/")
        if head != (encode(self.prefix) if self.prefix else ""):
            return None
        return decode(tail)

    def check_room(self, thread_id: str, ns: str, checkpoint_id: str) -> None:
        """Refuse ids that leave no room for the keys a thread goes on to need.

        ``put`` calls this before anything of a new checkpoint is written: a
        thread whose checkpoints fit but whose pending writes (a task id, and
        a subgraph namespace one level down) would not must fail at its first
        checkpoint, not half-way through a run.
        """
        for nested in (ns, ns + _ROOM_NS if ns else _ROOM_NS[1:]):
            self.writes_key(thread_id, nested, checkpoint_id, _ROOM_TASK, "s9", _ROOM_TOKEN)
            writes_sort_key(nested, checkpoint_id, _ROOM_TASK, "s9")
        self.partition_key(thread_id)


# Room kept for keys made after the first checkpoint: a task id (a uuid), a
# pending-writes part and token, and one level of subgraph namespace
# ("|<node>:<task uuid>", node names up to 24 characters).
_ROOM_TASK = "0" * 36
_ROOM_TOKEN = "0" * 32
_ROOM_NS = "|" + "n" * 24 + ":" + "0" * 36


# Seconds are stored as (this - created), 12 digits, so newer sorts first.
_LISTING_CLOCK = 10**12 - 1

LISTING_SHARDS = 16
"""Partitions the DynamoDB thread listing and run hints are spread over: one
partition takes about 1,000 writes a second, so a single listing partition
would cap how fast a whole app starts threads. Changing it moves every item
(``setup()`` moves only the unsharded partition's): keep it fixed per table."""


def shard_of(name: str) -> int:
    """The listing shard of a thread id (or the hint shard of a run id): a
    stable hash (the same in every process and version, unlike ``hash``)."""
    digest = hashlib.blake2b(encode(name).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % LISTING_SHARDS

# -- DynamoDB sort keys ------------------------------------------------------


def listing_sort_key(created: int, thread_id: str) -> str:
    """Sort key of a thread in the listing partition: newest first, then by thread
    id, read in ascending order, as the manifest's listing keys are."""
    return _checked_sort(f"{_LISTING_CLOCK - created:012d}{_SORT_SEP}{encode(thread_id)}")


def parse_listing_sort_key(sk: str) -> tuple[int, str]:
    inverted, _, encoded = sk.partition(_SORT_SEP)
    return _LISTING_CLOCK - int(inverted), decode(encoded)


def activity_shard(thread_id: str) -> int:
    """The shard of a thread's activity entries: a stable hash (never Python's ``hash``,
    which differs per process)."""
    return zlib.crc32(thread_id.encode("utf-8", "surrogatepass")) % ACTIVITY_SHARDS


def activity_sort_key(day: int, thread_id: str) -> str:
    """Sort key of an activity entry in its shard: by day (oldest first), then thread."""
    return _checked_sort(f"{day:08d}{_SORT_SEP}{encode(thread_id)}")


def parse_activity_sort_key(sk: str) -> tuple[int, str]:
    day, _, encoded = sk.partition(_SORT_SEP)
    return int(day), decode(encoded)


def run_sort_prefix(run_id: str) -> str:
    return encode(run_id) + _SORT_SEP


def run_sort_key(run_id: str, thread_id: str) -> str:
    return _checked_sort(run_sort_prefix(run_id) + encode(thread_id))


def ns_sort_prefix(ns: str) -> str:
    return sort_encode(ns) + _SORT_SEP


def checkpoint_sort_prefix(ns: str, checkpoint_id: str) -> str:
    return ns_sort_prefix(ns) + sort_encode(checkpoint_id) + _SORT_SEP


def checkpoint_sort_key(ns: str, checkpoint_id: str) -> str:
    # "~" sorts after "w", so newest-first reads meet a checkpoint item before
    # its own writes, and its writes before the next older checkpoint.
    return _checked_sort(checkpoint_sort_prefix(ns, checkpoint_id) + CHECKPOINT_SUFFIX)


def writes_sort_prefix(ns: str, checkpoint_id: str) -> str:
    return checkpoint_sort_prefix(ns, checkpoint_id) + WRITES_MARK + _SORT_SEP


def writes_sort_key(ns: str, checkpoint_id: str, task_id: str, part: str) -> str:
    return _checked_sort(f"{writes_sort_prefix(ns, checkpoint_id)}{sort_encode(task_id)}{_SORT_SEP}{part}")


def ns_tombstone_sort_key(ns: str) -> str:
    return _checked_sort(ns_sort_prefix(ns) + _NS_TOMBSTONE_MARK)


@dataclass(frozen=True, slots=True)
class SortKey:
    """The parts of an index sort key.

    ``kind`` is "checkpoint", "writes" (with ``task_id`` and ``part``),
    "ns_tombstone" (only ``ns``) or "thread_tombstone" (nothing else).
    """

    kind: str
    ns: str = ""
    checkpoint_id: str = ""
    task_id: str = ""
    part: str = ""


def link_sort_key(ns: str, checkpoint_id: str) -> str:
    """A checkpoint's link item: its parent and loc without its body, in a range of
    their own (a space sorts below every namespace) that the ancestor walk reads."""
    return _checked_sort(LINK_MARK + checkpoint_sort_prefix(ns, checkpoint_id))


def link_ns_prefix(ns: str) -> str:
    return LINK_MARK + ns_sort_prefix(ns)


def parse_sort_key(sk: str) -> SortKey:
    if sk == THREAD_TOMBSTONE_SK:
        return SortKey("thread_tombstone")
    if sk.startswith(LINK_MARK):
        ns, checkpoint_id, _ = sk[len(LINK_MARK) :].split(_SORT_SEP)
        return SortKey("link", sort_decode(ns), sort_decode(checkpoint_id))
    parts = sk.split(_SORT_SEP)
    ns = sort_decode(parts[0])
    if parts[1] == _NS_TOMBSTONE_MARK:
        return SortKey("ns_tombstone", ns)
    checkpoint_id = sort_decode(parts[1])
    if parts[2] == CHECKPOINT_SUFFIX:
        return SortKey("checkpoint", ns, checkpoint_id)
    return SortKey("writes", ns, checkpoint_id, sort_decode(parts[3]), parts[4])


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
