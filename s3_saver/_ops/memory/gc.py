"""collect_garbage: the value objects no item names, deleted (an admin path: it lists the
bucket, in both index modes).

A value too large for its row (over 64 KiB in the bucket alone, 16 KiB with a table) is
an object of its own, ``memory/n/<node id>/@v/<token>``, written before the commit that
names it. What leaves one named by nothing: a put cut short between the two (or whose
commit failed), a process that died before deleting the value its commit replaced, the
object a refused swap copied away from (bucket alone); with a table also an item that
DynamoDB's TTL deleted, and an expired item replaced by a creation (a transaction returns
no old value). No read ever returns such an object; this deletes it.

A run is bounded and resumes where the last one stopped:

1. the cursor (``memory/@gc/cursor``: the last key a run listed; last writer wins);
2. the namespaces' folders listed from there in key order, up to ``limit`` keys;
3. for each folder holding a value object older than the grace period, the rows of its
   namespace as stored now (``MemoryIndex.named_values``, by the folder's node id: the
   namespace need not be registered), in waves of ``_FOLDERS_AT_ONCE``; an object they
   name stays, one they do not is garbage. An object younger than the grace period
   stays whatever the rows say (``in_flight``): a put may be about to name it;
4. the garbage deleted, then the cursor moved (past the end: the next run starts over).

Why deleting what step 3 judged is safe ("delete only what you read"): each key is
written once (a fresh token, ``IfNoneMatch``), so the object deleted is the object
listed; and no commit names an object older than the lease (``_index/memory_lease``,
ten minutes), so one found unnamed past a grace period of at least fifteen minutes is
never named afterwards: no put racing the run can name what it deletes. (A grace period
under fifteen minutes, ``force`` on the command line, holds only with every writer
stopped.) A run cut short anywhere leaves the cursor where it was: run again, it lists
the same keys and deletes what is left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from s3_saver._format.key_codec import MEMORY_PREFIX
from s3_saver._format.memory.documents import gc_object_key
from s3_saver._ops.memory.context import Memory
from s3_saver._ops.memory.erase import delete_objects
from s3_saver._transport.failures import OBJECT_MISSING, classify
from s3_saver._transport.protocol import (
    Call,
    Op,
    about,
    gather,
    raise_failure,
    request_one,
)
from s3_saver.errors import ConfigurationError, CorruptObjectError

_PAGE = 1000  # keys per listing request (S3's most)
_FOLDERS_AT_ONCE = 64  # folders whose rows are read in one wave
_VALUE = re.compile(r"([0-9a-f]{64})/@v/([0-9a-f]{32})")
_CURSOR = "garbage collection's cursor"


@dataclass(frozen=True)
class MemoryGarbageReport:
    """What [S3Store.collect_garbage()][s3_saver.S3Store.collect_garbage] found, and deleted.

    Attributes:
        examined: Keys listed in this run (at most its ``limit``).
        namespaces: Namespace folders whose items were read (those holding a value object
            older than the grace period).
        garbage: Value objects no item names, older than the grace period: deleted
            (in a dry run, would be).
        deleted: Value objects deleted (none in a dry run).
        bytes: The size of ``garbage``.
        in_flight: Value objects no item names yet, younger than the grace period: kept
            (a put may be about to name them).
        broken: Folders whose items could not be read, each with the reason: left alone.
        finished: This run listed the store's last key: the next one starts from the first.
    """

    examined: int
    namespaces: int
    garbage: tuple[str, ...]
    deleted: tuple[str, ...]
    bytes: int
    in_flight: tuple[str, ...]
    broken: tuple[tuple[str, str], ...] = field(default=())
    finished: bool = False


@dataclass(frozen=True)
class _Listed:
    key: str
    node: str
    token: str
    size: int
    modified_us: int


def collect_garbage(mem: Memory, limit: int, older_than_us: int, dry_run: bool) -> Op[MemoryGarbageReport]:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"collect_garbage(limit=...) takes a number of keys to list, 1 or more; got {limit!r}")
    if older_than_us < 0:
        raise ConfigurationError(f"older_than must not be negative, got {older_than_us / 1e6} s")
    cursor = yield from _load_cursor(mem)
    listed, examined, following = yield from _list(mem, cursor, limit)
    cutoff = mem.clock.now() - older_than_us  # after the listing: an object listed is at least this old
    old = [o for o in listed if o.modified_us <= cutoff]
    young = tuple(o.key for o in listed if o.modified_us > cutoff)
    nodes = sorted({o.node for o in old})
    named: dict[str, frozenset[str]] = {}
    broken: list[tuple[str, str]] = []
    for start in range(0, len(nodes), _FOLDERS_AT_ONCE):
        wave = nodes[start : start + _FOLDERS_AT_ONCE]
        for node, found in zip(wave, (yield from gather(*(_named(mem, n) for n in wave))), strict=True):
            if isinstance(found, CorruptObjectError):
                broken.append((f"s3://{mem.s3.bucket}/{_folder(mem, node)}", str(found)))
            else:
                named[node] = found
    # Judged on rows read after the listing: a row committed before the read names its
    # object here, and none committed after it names one this old (the lease).
    garbage = [o for o in old if o.node in named and o.token not in named[o.node]]
    deleted: tuple[str, ...] = ()
    if not dry_run:
        if garbage:
            yield from delete_objects(mem, [o.key for o in garbage], "garbage collection")
            deleted = tuple(o.key for o in garbage)
        if following != cursor:  # only once every deletion is done: a cut run lists the same keys again
            yield from request_one(about(mem.s3.put_replace(gc_object_key(mem.index.prefix), following.encode()), _CURSOR))
    return MemoryGarbageReport(
        examined,
        len(named) + len(broken),
        tuple(o.key for o in garbage),
        deleted,
        sum(o.size for o in garbage),
        young,
        tuple(broken),
        not following,
    )


def _root(mem: Memory) -> str:
    return f"{mem.index.prefix}{MEMORY_PREFIX}n/"


def _folder(mem: Memory, node: str) -> str:
    return f"{_root(mem)}{node}/"


def _named(mem: Memory, node: str) -> Op[Any]:
    try:
        return (yield from mem.index.named_values(node))
    except CorruptObjectError as exc:  # this folder's answer: the others go on
        return exc


def _load_cursor(mem: Memory) -> Op[str]:
    call = about(mem.s3.get(gc_object_key(mem.index.prefix)), _CURSOR)
    (answer,) = yield (call,)
    if isinstance(answer, BaseException):
        if classify(answer, call.operation) != OBJECT_MISSING:
            raise_failure(call, answer)
        return ""
    try:
        cursor = answer["Body"].decode()
    except UnicodeDecodeError as exc:
        raise CorruptObjectError(f"s3://{mem.s3.bucket}/{call.params['Key']}: not a cursor ({exc})") from exc
    # A cursor outside the folders (written by hand, or another prefix's): start over.
    return cursor if cursor.startswith(_root(mem)) else ""


def _list(mem: Memory, cursor: str, limit: int) -> Op[tuple[list[_Listed], int, str]]:
    """Up to ``limit`` keys after ``cursor``: the value objects among them, the count of
    keys, and where the next run starts ("": from the first, this run listed the last)."""
    root = _root(mem)
    found: list[_Listed] = []
    examined, token, last = 0, None, cursor
    while examined < limit:
        call: Call = mem.s3.list_keys(root, token=token, start_after=cursor or None, max_keys=min(_PAGE, limit - examined))
        page = yield from request_one(call)
        for item in page.get("Contents", []):
            examined += 1
            key = last = item["Key"]
            match = _VALUE.fullmatch(key[len(root) :]) if key.startswith(root) else None
            if match is None:
                continue  # a head, or no key of this store's: never deleted here
            modified = item["LastModified"]
            found.append(_Listed(key, match.group(1), match.group(2), int(item.get("Size", 0)), int(modified.timestamp() * 1_000_000)))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or token is None:
            return found, examined, ""
    return found, examined, last
