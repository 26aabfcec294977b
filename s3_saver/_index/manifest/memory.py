"""The memory store's index in the bucket (manifest mode, no database).

Per namespace one head, ``memory/n/<node id>/@head``, holding every row of the
namespace; one registry, ``memory/@reg/head``, holding every registered namespace.
Both are replaced only by compare-and-swap (``IfMatch`` the ETag read, ``IfNoneMatch:
*`` to create), so a change is always applied to what is stored: two writers of one
namespace never lose an update (the loser of a swap reads again and re-applies its
changes), and a row is never torn (it lives in one document).

Costs (one process, a head it knows): a get, or a search of a namespace with no
sub-namespaces, is 1 GET of its head (its ``desc`` says none is below it: no registry
read); a search of a prefix with namespaces below it adds the registry, then their
heads (3 round trips); a put or delete 1 PUT (the cached ETag stands in for a read), 2
requests from a process that has not read the head; the first put into a new namespace
adds the registry's swap and each ancestor's ``desc`` swap before the head's.

Caches (the store's budget): heads and the registry as last read or written, with
their ETags. Each is a guess that the swap's condition checks: a stale one costs a
412 and a read, never another answer. Reads never answer from them.

A value over ``INLINE_LIMIT`` bytes (packed) lives in an object of its own, written
before the head that names it and deleted after the swap that drops it.

Not built yet (the design's phase 1b): sealing rows into immutable segments (a head
holds all of its namespace's rows: it grows with the namespace), conditional GETs (304) of unchanged heads, group commit of one process's
concurrent swaps of one head, and the removal of registrations (sweep, erase).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from s3_saver._format.memory.documents import (
    Head,
    Registry,
    dumps_head,
    dumps_registry,
    head_key,
    loads_head,
    loads_registry,
    registry_object_key,
    value_key,
)
from s3_saver._format.memory.names import node_id, show
from s3_saver._format.memory.rows import ObjectRef, Row, ValueCell, VectorsCell, put_row
from s3_saver._format.memory.ttl import Clock, expires_at
from s3_saver._index.memory import Change, Path, Snapshot
from s3_saver._transport.budget import Cache, CacheBudget
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Backoff, Call, Op, about, gather, raise_failure
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import StoreUnavailableError

_MAX_SWAPS = 20
_BACKOFF_MAX = 0.5  # seconds
_JITTER = random.SystemRandom()
_REGISTRY = "registry"
_ROW_BYTES = 256  # a decoded row's objects beside its bytes (an estimate, as the saver's ENTRY_BYTES)

# (ETag, document) as last read or written; ETag None: the object did not exist.
Known = tuple[str | None, Any]


INLINE_LIMIT = 64 * 1024


class ManifestMemory:
    """``MemoryIndex`` on the bucket (see the module docstring)."""

    inline_limit = INLINE_LIMIT
    vector_limit = None  # a head holds an item's vectors whatever their size
    knows_leaves = True  # a head's ``desc``

    def __init__(self, s3: S3Calls, prefix: str, budget: CacheBudget, clock: Clock) -> None:
        self.s3 = s3
        self.prefix = prefix
        self.clock = clock
        self._heads: Cache = budget.cache("mem-heads")
        self._registry: Cache = budget.cache("mem-registry", entries=1)

    def describe(self, path: Path) -> str:
        return f"s3://{self.s3.bucket}/{head_key(self.prefix, node_id(path))}"

    def value_key(self, path: Path, token: str) -> str:
        return value_key(self.prefix, node_id(path), token)

    # -- reads -------------------------------------------------------------------------

    def read(self, whole: Sequence[Path], keys: Mapping[Path, Sequence[str]], registry: Sequence[Path] = ()) -> Op[Snapshot]:
        # The registry is one document: any range reads it whole.
        # A head holds every row of its namespace: a get reads it whole.
        paths = list(dict.fromkeys([*whole, *keys]))
        calls = tuple(about(self.s3.get(head_key(self.prefix, node_id(p))), _namespace(p)) for p in paths)
        if registry:
            calls += (about(self.s3.get(registry_object_key(self.prefix)), _REGISTRY_SUBJECT),)
        answers = yield calls
        heads = {p: self._head_answer(p, calls[i], answers[i])[1] for i, p in enumerate(paths)}
        found = self._registry_answer(calls[-1], answers[-1])[1].created if registry else {}
        leaves = frozenset(p for p in whole if not heads[p].desc)
        return Snapshot({p: h.rows for p, h in heads.items()}, found, leaves)

    def _read_heads(self, paths: Sequence[Path]) -> Op[None]:
        yield from self.read(paths, {})

    def _head_answer(self, path: Path, call: Call, answer: Any) -> Known:
        if isinstance(answer, BaseException):
            if classify(answer, call.operation) != OBJECT_MISSING:
                raise_failure(call, answer)
            known: Known = (None, Head(path))
        else:
            known = (answer["ETag"], loads_head(answer["Body"], path, f"s3://{self.s3.bucket}/{call.params['Key']}"))
        self._heads.put(node_id(path), known, _size(known))
        return known

    def _registry_answer(self, call: Call, answer: Any) -> Known:
        if isinstance(answer, BaseException):
            if classify(answer, call.operation) != OBJECT_MISSING:
                raise_failure(call, answer)
            known: Known = (None, Registry())
        else:
            known = (answer["ETag"], loads_registry(answer["Body"], f"s3://{self.s3.bucket}/{call.params['Key']}"))
        self._registry.put(_REGISTRY, known, _size(known))
        return known

    # -- writes ------------------------------------------------------------------------

    def commit(self, groups: dict[Path, list[Change]]) -> Op[list[str]]:
        if not groups:
            return []
        # The heads this process does not know: read them first (one wave), to learn
        # which namespaces are new (no head) and must be registered before their head.
        unknown = [p for p in groups if self._heads.get(node_id(p)) is None]
        if unknown:
            yield from self._read_heads(unknown)
        # A head that never held an item (none, or an ancestor's made by ``_mark``) is not
        # registered yet (or its registration was cut short: registering again is a no-op).
        new = [p for p, changes in groups.items() if _adds(changes) and self._heads.get(node_id(p))[1].seq == 0]
        if new:
            # Listed before readable: the registry's swap lands before any head it lists,
            # and each ancestor's ``desc`` before any item below it (a search of an
            # ancestor whose head says it has none below reads no registry).
            yield from self._register(new)
            ancestors = sorted({p[:i] for p in new for i in range(1, len(p))})
            yield from gather(*(self._mark(a) for a in ancestors))
        released = yield from gather(*(self._swap(path, changes, path in unknown) for path, changes in groups.items()))
        return [key for keys in released for key in keys]

    def _register(self, paths: list[Path]) -> Op[None]:
        key = registry_object_key(self.prefix)
        for attempt in range(1, _MAX_SWAPS + 1):
            known = self._registry.get(_REGISTRY)
            if known is None:
                call = about(self.s3.get(key), _REGISTRY_SUBJECT)
                (answer,) = yield (call,)
                known = self._registry_answer(call, answer)
            etag, registry = known
            changed = Registry(registry.seq, dict(registry.created))
            if not changed.register(paths):
                return  # registered already (by another process, or a commit cut after its registration)
            call = about(self.s3.put_swap(key, dumps_registry(changed), etag), _REGISTRY_SUBJECT)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                written: Known = (answer["ETag"], changed)
                self._registry.put(_REGISTRY, written, _size(written))
                return
            yield from self._lost(call, answer, attempt, lambda: self._registry.pop(_REGISTRY))
        raise StoreUnavailableError(
            f"the namespace registry s3://{self.s3.bucket}/{key} kept changing under {_MAX_SWAPS} swaps registering "
            f"{', '.join(show(p) for p in paths[:3])}: too many processes registering namespaces at once; try again"
        )

    def _mark(self, path: Path) -> Op[None]:
        """Set ``desc`` on the head of ``path`` (creating an empty head if none)."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = f"{_namespace(path)} (a namespace below it)"
        for attempt in range(1, _MAX_SWAPS + 1):
            known = self._heads.get(node)
            if known is None:
                call = about(self.s3.get(key), subject)
                (answer,) = yield (call,)
                known = self._head_answer(path, call, answer)
            etag, head = known
            if head.desc:
                return  # set already (never cleared yet: a cached True is final)
            changed = Head(head.path, head.seq, head.rows, desc=True)
            call = about(self.s3.put_swap(key, dumps_head(changed), etag), subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                written: Known = (answer["ETag"], changed)
                self._heads.put(node, written, _size(written))
                return
            yield from self._lost(call, answer, attempt, lambda: self._heads.pop(node))
        raise StoreUnavailableError(
            f"namespace {show(path)} (s3://{self.s3.bucket}/{key}) kept changing under {_MAX_SWAPS} swaps: too many "
            "writers at once; try again"
        )

    def _swap(self, path: Path, changes: list[Change], confirmed: bool) -> Op[list[str]]:
        """``confirmed``: the cached head was read by this commit (not an older guess).
        Returns the value objects the rows it replaced named."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = _namespace(path, [c.key for c in changes])
        for attempt in range(1, _MAX_SWAPS + 1):
            known = self._heads.get(node)
            if known is None:
                call = about(self.s3.get(key), subject)
                (answer,) = yield (call,)
                known, confirmed = self._head_answer(path, call, answer), True
            etag, head = known
            changed, released = apply(head, changes, self.clock)
            if changed is None:
                if confirmed:
                    return []  # nothing to change, on the head as stored (a delete of an absent key)
                # Nothing to change on a cached head: a guess, so read it and judge again.
                self._heads.pop(node)
                continue
            call = about(self.s3.put_swap(key, dumps_head(changed), etag), subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                written: Known = (answer["ETag"], changed)
                self._heads.put(node, written, _size(written))
                # Named by the head this swap replaced: no other row names them (tokens are fresh).
                return [self.value_key(path, token) for token in released]
            confirmed = False
            yield from self._lost(call, answer, attempt, lambda: self._heads.pop(node))
        raise StoreUnavailableError(
            f"namespace {show(path)} (s3://{self.s3.bucket}/{key}) kept changing under {_MAX_SWAPS} swaps: too many "
            "writers of one namespace at once; try again"
        )

    def _lost(self, call: Call, answer: BaseException, attempt: int, forget: Any) -> Op[None]:
        """A swap refused: another writer got there first (412, or 409 for a race S3 saw):
        forget the guess, pause briefly, read again. Any other failure is raised."""
        if error_code(answer) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
            raise_failure(call, answer)
        forget()
        go_on = yield Backoff(_JITTER.uniform(0, min(_BACKOFF_MAX, 0.01 * 2**attempt)), attempt)
        if go_on is False:
            raise_failure(call, answer)


def apply(head: Head, changes: list[Change], clock: Clock) -> tuple[Head | None, list[str]]:
    """The head after ``changes`` (a new Head: the given one may be a cached copy), or
    None when they change nothing, and the tokens of the value objects of the rows it
    replaces or drops. An overwrite keeps the live row's ``created_us`` and ``seq``; a
    put over nothing (or an expired row) is a new item, numbered ``head.seq``. Rows
    expired at the time of the write are dropped from it (readers never return them)."""
    rows = dict(head.rows)
    seq = head.seq
    changed = False
    now = clock.now()
    for change in changes:
        old = rows.get(change.key)
        if change.refresh is not None:
            # Fenced on the expiry read: never revives a deleted item, never overrides a newer write's.
            if old is not None and old.expires_us == change.refresh.seen_us:
                rows[change.key] = old.with_expiry(change.refresh.expires_us)
                changed = True
            continue
        if change.value is None:
            changed |= rows.pop(change.key, None) is not None
            continue
        now = clock.now()
        kept = old if old is not None and old.live(now) else None
        if change.stamps is not None:
            # An imported item: its times as exported; its place among the namespace's
            # items is where the import puts it first (a later import keeps it).
            created, updated, expires = change.stamps
            rows[change.key] = Row(
                change.key, kept.seq if kept else seq, created, updated, expires, change.ttl_minutes, 0, change.value, change.vectors
            )
            seq += kept is None
            changed = True
            continue
        rows[change.key] = put_row(
            change.key,
            kept=kept,
            now=now,
            seq=seq,
            value=change.value,
            vectors=change.vectors,
            ttl_minutes=change.ttl_minutes,
            expires_us=expires_at(now, change.ttl_minutes),
        )
        seq += kept is None
        changed = True
    if not changed:
        return None, []
    kept = {k: r for k, r in rows.items() if r.live(now)}
    named = {r.value.token for r in kept.values() if isinstance(r.value, ObjectRef)}
    released = [r.value.token for r in head.rows.values() if isinstance(r.value, ObjectRef) and r.value.token not in named]
    return Head(head.path, seq, kept, head.desc), released


_REGISTRY_SUBJECT = "the namespace registry"


def _namespace(path: Path, keys: Sequence[str] = ()) -> str:
    """A call's subject: the namespace (and the keys) its hashed key stands for."""
    text = f"namespace {show(path)}"
    if len(keys) == 1:
        return f"{text}, key {show(keys[0])}"
    return f"{text}, keys {', '.join(show(k) for k in keys[:3])}{', ...' if len(keys) > 3 else ''}" if keys else text


def _adds(changes: list[Change]) -> bool:
    return any(c.value is not None for c in changes)


def _size(known: Known) -> int:
    """Bytes charged to the budget: the stored bytes of the rows (values, vectors, keys)
    and a fixed overhead per row and per registry entry."""
    doc = known[1]
    if isinstance(doc, Head):
        return 256 + sum(_ROW_BYTES + len(r.key) + _cell(r.value) + _cell(r.vectors) for r in doc.rows.values())
    return 256 + sum(_ROW_BYTES + sum(len(label) for label in p) for p in doc.created)


def _cell(cell: Any) -> int:
    if isinstance(cell, ValueCell):
        return cell.size
    return len(cell.raw) if isinstance(cell, VectorsCell) else 0
