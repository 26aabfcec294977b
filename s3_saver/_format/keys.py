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

This module holds ``KeyLayout``; the encoding of ids, tokens, the key and
prefix checks are in ``_format/key_codec``, the DynamoDB sort keys and listing shards
in ``_format/sort_keys``, both re-exported here, and which keys of a tree are another
saver's in ``_format/key_owner``.
"""

from __future__ import annotations

from s3_saver._format.key_codec import (
    ACTIVITY_PREFIX,
    ACTIVITY_SHARDS,
    ARCHIVE_PREFIX,
    CHECKPOINT_SUFFIX,
    DYNAMODB_PARTITION_KEY_MAX_BYTES,
    DYNAMODB_SORT_KEY_MAX_BYTES,
    ERASE_MARK,
    FOLDERS,
    LINK_MARK,
    LISTING_PREFIX,
    LIVE_PREFIX,
    MANIFEST_PREFIX,
    S3_KEY_MAX_BYTES,
    SET_ASIDE_PREFIX,
    THREAD_TOMBSTONE_SK,
    WRITES_MARK,
    LegacyPrefix,
    ObjectKey,
    _checked,
    _tagged,
    _untagged,
    check_prefix,
    decode,
    encode,
    new_tag,
    new_token,
    parse_version,
    sort_decode,
    sort_encode,
    version_segment,
)
from s3_saver._format.key_owner import (
    CURSORS,
    ERASE_NAME,
    MODE_MARKER,
    PROBES,
    SEGMENT_NAME,
    builds,
    exact_id,
    nested_prefix,
)
from s3_saver._format.sort_keys import (
    _LISTING_CLOCK,
    LISTING_SHARDS,
    PartitionKeys,
    SortKey,
    activity_shard,
    activity_sort_key,
    checkpoint_sort_key,
    checkpoint_sort_prefix,
    link_ns_prefix,
    link_sort_key,
    listing_sort_key,
    ns_sort_prefix,
    ns_tombstone_sort_key,
    parse_activity_sort_key,
    parse_listing_sort_key,
    parse_sort_key,
    run_sort_key,
    run_sort_prefix,
    shard_of,
    writes_sort_key,
    writes_sort_prefix,
)
from s3_saver.errors import ConfigurationError, KeyTooLongError

# The encoding and the sort keys, re-exported: code imports them from here.
__all__ = [
    "ACTIVITY_PREFIX", "ACTIVITY_SHARDS", "ARCHIVE_PREFIX", "CHECKPOINT_SUFFIX",
    "DYNAMODB_PARTITION_KEY_MAX_BYTES", "DYNAMODB_SORT_KEY_MAX_BYTES", "ERASE_MARK", "FOLDERS", "LINK_MARK",
    "LISTING_PREFIX", "LISTING_SHARDS", "LIVE_PREFIX", "LegacyPrefix", "MANIFEST_PREFIX", "S3_KEY_MAX_BYTES",
    "SET_ASIDE_PREFIX", "THREAD_TOMBSTONE_SK", "WRITES_MARK", "KeyLayout", "ObjectKey", "SortKey",
    "activity_shard", "activity_sort_key", "check_prefix", "checkpoint_sort_key", "checkpoint_sort_prefix", "decode",
    "encode", "link_ns_prefix", "link_sort_key", "listing_sort_key", "new_tag", "new_token",
    "ns_sort_prefix", "ns_tombstone_sort_key", "parse_activity_sort_key", "parse_listing_sort_key",
    "parse_sort_key", "parse_version", "run_sort_key", "run_sort_prefix", "shard_of", "sort_decode",
    "sort_encode", "version_segment", "writes_sort_key", "writes_sort_prefix",
]


_HEX = "0123456789abcdef"  # the characters of a ``new_token``


class KeyLayout(PartitionKeys):
    """Builds object keys and index keys for one bucket prefix, and parses them back.

    Parsing is exact: a key counts as this layout's only if its builder makes
    exactly that key again, and no saver whose prefix lies inside this one's
    tree builds it (``nested_prefix``). ``check_prefix`` refuses the prefixes
    that could nest; such a tree may still hold what an earlier version wrote.
    """

    def __init__(self, prefix: str = "", *, nested: bool = False) -> None:
        # ``nested`` (or a LegacyPrefix): a prefix check_prefix refuses, that an
        # earlier version accepted: to read its threads (migrate's source) and
        # to tell its keys apart inside another saver's tree.
        prefix = check_prefix(LegacyPrefix(prefix) if nested else prefix)
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
        anything else: the exact inverse of the key builders above. A key another
        saver's prefix inside this tree builds is not this layout's, even when
        it reads as one (``live/a/live/blobs/=/checkpoints/1`` is a value of
        thread ``a`` here, and a checkpoint of thread ``blobs`` under
        ``live/a/``): a gc or an erase never takes it (see ``nested_prefix``)."""
        o = self._live_object(key)
        return o if o is not None and self.nested_prefix(key) is None else None

    def _live_object(self, key: str) -> ObjectKey | None:
        """``parse_object_key`` without asking whether a nested saver builds the key."""
        o = self.parts_of(key)
        try:
            return o if o is not None and self.object_key(o) == key else None
        except (ConfigurationError, KeyTooLongError):
            return None

    def parts_of(self, key: str) -> ObjectKey | None:
        """The parts of a ``live/`` key this layout built itself (an index entry's
        reference: cheap). A key found by listing the bucket goes through
        ``parse_object_key``, which asks whose it is."""
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
        versioned bucket by a prune or a delete before it deletes the keys it
        takes out (their noncurrent versions are then still found by an erase,
        after the thread started afresh too)."""
        return _checked(f"{self.manifest_dir(thread_id)}{ERASE_MARK}{token}")

    @property
    def mode_marker_key(self) -> str:
        """The marker of the prefix's index mode (``_transport/mode``): in the live folder,
        where no thread's folder is ("#": ``encode`` never produces it)."""
        return f"{self.root}{MODE_MARKER}"

    def probe_key(self, token: str) -> str:
        """Where ``setup()`` checks that the store honours conditional writes."""
        return f"{self.manifest_root}{PROBES}/{token}"

    def segment_key(self, thread_id: str, number: int, token: str) -> str:
        return _checked(f"{self.manifest_dir(thread_id)}segments/{number:08d}.{token}")

    def thread_of_head(self, key: str) -> str | None:
        """The thread id of a manifest head's key (listing the bucket), else None."""
        rest = key[len(self.manifest_root) :] if key.startswith(self.manifest_root) else ""
        encoded, _, name = rest.partition("/")
        return self._own(key, exact_id(encoded)) if name == "head" else None

    def thread_of_manifest(self, key: str) -> str | None:
        """The thread of a key in a thread's manifest folder (its head, a sealed
        segment, an erase's record), else None."""
        rest = key[len(self.manifest_root) :] if key.startswith(self.manifest_root) else ""
        encoded, _, name = rest.partition("/")
        if name == "head" or ERASE_NAME.fullmatch(name) or SEGMENT_NAME.fullmatch(name):
            return self._own(key, exact_id(encoded))
        return None

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
        return self._thread_of_file(key, self.archive_root)

    def thread_of_set_aside(self, key: str) -> str | None:
        """The thread id of a failback's record of what it set aside, else None."""
        return self._thread_of_file(key, self.prefix + SET_ASIDE_PREFIX)

    def _thread_of_file(self, key: str, root: str) -> str | None:
        """The thread of ``<root><encoded thread>/<name>``, else None."""
        rest = key[len(root) :] if key.startswith(root) else ""
        encoded, _, name = rest.partition("/")
        return self._own(key, exact_id(encoded)) if name and "/" not in name else None

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
        thread_id = self._own(key, exact_id(encoded))
        return None if thread_id is None else (_LISTING_CLOCK - int(inverted), thread_id)

    # -- the activity entries (archive_idle's index of threads by the day they were written) --
    @property
    def activity_root(self) -> str:
        return self.prefix + ACTIVITY_PREFIX

    def activity_key(self, day: int, thread_id: str, token: str = "") -> str:
        """An activity entry of ``thread_id`` on ``day``. Day first: S3 lists keys
        ascending, so a walk reads the oldest day first. ``token``: new for every
        entry written, so no write ever lands on a key a walk has read (the walk
        deletes what it read by key: "delete only what you read"); without one,
        the day's folder of the thread's entries (and the key earlier versions
        wrote, one per thread and day)."""
        return _checked(f"{self.activity_root}{day:08d}/{encode(thread_id)}" + (f"/{token}" if token else ""))

    def parse_activity_key(self, key: str) -> tuple[int, str, str] | None:
        """(day, thread, token) of a key ``activity_key`` builds ("" token: an
        entry of an earlier version), else None (a key of a saver nested under
        this one's folders included)."""
        if not key.startswith(self.activity_root):
            return None
        day, slash, rest = key[len(self.activity_root) :].partition("/")
        encoded, _, token = rest.partition("/")  # ``encode`` never produces "/"
        if not slash or len(day) != 8 or not day.isdigit() or token.strip(_HEX):
            return None
        thread_id = self._own(key, exact_id(encoded))
        if thread_id is None or self.activity_key(int(day), thread_id, token) != key:
            return None
        return int(day), thread_id, token

    def activity_cursor_key(self, name: str) -> str:
        """The object holding ``archive_idle``'s cursor ``name``: in the manifest
        folder (read and written like heads); ``encode`` never produces "#", so
        no thread's folder is this one."""
        return f"{self.manifest_root}{CURSORS}/{name}"

    def runs_dir(self, run_id: str) -> str:
        return f"{self.prefix}{LISTING_PREFIX}runs/{encode(run_id)}/"

    def run_key(self, run_id: str, thread_id: str) -> str:
        return _checked(self.runs_dir(run_id) + encode(thread_id))

    def thread_of_run(self, run_id: str, key: str) -> str | None:
        """The thread of a run hint's key, else None."""
        prefix = self.runs_dir(run_id)
        return self._own(key, exact_id(key[len(prefix) :])) if key.startswith(prefix) else None

    # -- whose key is it ---------------------------------------------------------
    def _own(self, key: str, thread_id: str | None) -> str | None:
        """``thread_id`` (a key's parsed thread), unless a nested saver builds the key."""
        return thread_id if thread_id is not None and self.nested_prefix(key) is None else None

    def nested_prefix(self, key: str) -> str | None:
        """The prefix of a saver inside this one's folders under which ``key`` is a
        key that saver builds, else None (see ``_format/key_owner``)."""
        return nested_prefix(self, key)

    def builds(self, key: str) -> bool:
        """Whether ``key`` has the shape of a key this layout builds, in any of its
        folders (ids exact, tokens not checked)."""
        return builds(self, key)

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
