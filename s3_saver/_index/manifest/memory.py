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
before the head that names it and deleted after the swap that drops it. A swap refused
(another writer, or its own resend after a lost answer) is judged on the head read
again (``_swap``); applied again, its value objects are first copied to fresh tokens
(+1 CopyObject per large value, only after a refusal).

Removals (erase, the TTL sweep of an emptied namespace) unregister a namespace by a
head swap and a registry swap, fenced by the registry's ``seq`` (see "removals" below).

Not built yet (the design's phase 1b): sealing rows into immutable segments (a head
holds all of its namespace's rows: it grows with the namespace), conditional GETs (304)
of unchanged heads, group commit of one process's concurrent swaps of one head.
"""

from __future__ import annotations

import random
from dataclasses import replace
from collections.abc import Mapping, Sequence
from typing import Any

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.documents import (
    Head,
    Registry,
    dumps_head,
    dumps_registry,
    head_key,
    loads_head,
    loads_registry,
    node_folder,
    registry_object_key,
    sweep_object_key,
    value_key,
)
from s3_saver._format.memory.names import node_id, registry_key, show
from s3_saver._format.memory.rows import ObjectRef, Row, ValueCell, VectorsCell, put_row
from s3_saver._format.memory.ttl import Clock, expires_at
from s3_saver._index.memory import Change, Erasure, Path, Purge, Snapshot, Swept
from s3_saver._transport.budget import Cache, CacheBudget
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import (
    Backoff,
    Call,
    Op,
    about,
    gather,
    raise_failure,
    request_one,
)
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import CorruptObjectError, StoreUnavailableError

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
        # which namespaces are new (an empty head, or none) and must be registered first.
        unknown = [p for p in groups if self._heads.get(node_id(p)) is None]
        if unknown:
            yield from self._read_heads(unknown)
        new = [p for p, changes in groups.items() if _adds(changes) and self._heads.get(node_id(p))[1].empty]
        registered: dict[Path, str | None] = {}
        if new:
            # Listed before readable: the registry's swap lands before any head it lists,
            # and each ancestor's ``desc`` before any item below it (a search of an
            # ancestor whose head says it has none below reads no registry).
            heads = {p: self._heads.get(node_id(p)) for p in new}
            registered = {p: etag for p, (etag, _) in heads.items()}
            yield from self._register(new, frozenset(p for p, (_, head) in heads.items() if head.emptied))
            yield from gather(*(self._mark(a) for a in _ancestors(new)))
        swaps = (self._swap(path, changes, path in unknown, registered.get(path, _NEVER)) for path, changes in groups.items())
        released = yield from gather(*swaps)
        return [key for keys in released for key in keys]

    def _register(self, paths: list[Path], renew: frozenset[Path] = frozenset()) -> Op[None]:
        key = registry_object_key(self.prefix)
        for attempt in range(1, _MAX_SWAPS + 1):
            known = self._registry.get(_REGISTRY)
            if known is None:
                call = about(self.s3.get(key), _REGISTRY_SUBJECT)
                (answer,) = yield (call,)
                known = self._registry_answer(call, answer)
            etag, registry = known
            changed = Registry(registry.seq, dict(registry.created))
            if not changed.register(paths, renew):
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
            changed = Head(head.path, head.seq, head.rows, desc=True, emptied=head.emptied)
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

    def _swap(self, path: Path, changes: list[Change], confirmed: bool, registered: object) -> Op[list[str]]:
        """``confirmed``: the cached head was read by this commit (not an older guess);
        ``registered``: the ETag of the empty head this commit registered the namespace
        after reading (``_NEVER``: none).
        Returns the value objects that no head names any more: those of the rows its swap
        replaced.

        A refused swap may be one that landed: its answer lost, the driver sent it again,
        and the copy met its own write (412). So each refused swap is remembered (the rows
        it wrote, the tokens it released) and judged on the head read after it:

        - its rows stand in the head: it landed (and no one replaced them), the commit is
          done, and what it released is released;
        - else it never landed, or it landed and a writer replaced it since, and deleted
          its value objects (the rows it replaced named them): the changes are applied
          again, but never naming an object an earlier swap named; each is copied to a
          fresh token first (a copy that finds its source gone proves the earlier swap
          landed: the commit is done, ordered before the writer that replaced it).

        The tokens the refused swaps released and the head finally written (or read) does
        not name are released too: named by no head, and by no later one (a commit never
        names again a token after a refused swap: it copies)."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = _namespace(path, [c.key for c in changes])
        refused: list[tuple[dict[str, Any], list[str]]] = []  # (rows written, tokens released) per refused swap
        for attempt in range(1, _MAX_SWAPS + 1):
            known = self._heads.get(node)
            if known is None:
                call = about(self.s3.get(key), subject)
                (answer,) = yield (call,)
                known, confirmed = self._head_answer(path, call, answer), True
            etag, head = known
            if refused and confirmed:
                for written, released in refused:
                    if any(head.rows.get(k) == row for k, row in written.items()):
                        return self._released(path, released, refused, head)
                fresh = yield from self._fresh_objects(path, changes)
                if fresh is None:  # an earlier swap landed, then was replaced
                    return self._released(path, [], refused, head)
                changes, old = fresh
                refused.append(({}, old))  # the objects copied away: named by no head this commit writes
            if head.empty and _adds(changes) and registered != etag:
                # Invariant: an item lands in an empty head only after a registration made
                # after reading that very head (its ETag, unique per write, is the swap's
                # condition). An erase or a sweep that unregistered the namespace emptied the
                # head first, so such a registration is numbered after the removal read the
                # registry, and the removal keeps it (``Registry.register``). A process whose
                # cached head predates the removal meets the empty head here, on its swap's 412.
                yield from self._register([path], frozenset([path]) if head.emptied else frozenset())
                yield from gather(*(self._mark(a) for a in _ancestors([path])))
                registered = etag
            changed, released = apply(head, changes, self.clock)
            if changed is None:
                if confirmed:
                    # Nothing to change, on the head as stored (a delete of an absent key).
                    return self._released(path, [], refused, head)
                # Nothing to change on a cached head: a guess, so read it and judge again.
                self._heads.pop(node)
                continue
            call = about(self.s3.put_swap(key, dumps_head(changed), etag), subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                written: Known = (answer["ETag"], changed)
                self._heads.put(node, written, _size(written))
                # Named by the head this swap replaced: no other row names them (tokens are fresh).
                return self._released(path, released, refused, changed)
            confirmed = False
            yield from self._lost(call, answer, attempt, lambda: self._heads.pop(node))
            puts = {c.key for c in changes if c.value is not None and c.refresh is None}
            refused.append(({k: changed.rows[k] for k in puts if k in changed.rows}, released))
        raise StoreUnavailableError(
            f"namespace {show(path)} (s3://{self.s3.bucket}/{key}) kept changing under {_MAX_SWAPS} swaps: too many "
            "writers of one namespace at once; try again"
        )

    def _released(self, path: Path, released: list[str], refused: list[tuple[dict[str, Any], list[str]]], head: Head) -> list[str]:
        named = {cell.token for row in head.rows.values() for cell in (row.value, row.vectors) if isinstance(cell, ObjectRef)}
        tokens = dict.fromkeys([*released, *(t for _, gone in refused for t in gone if t not in named)])
        return [self.value_key(path, token) for token in tokens]

    def _fresh_objects(self, path: Path, changes: list[Change]) -> Op[tuple[list[Change], list[str]] | None]:
        """``changes`` with each value object copied to a fresh token (one wave), and the
        old tokens; None when a source is gone (the swap that named it landed, and the
        writer that replaced it deleted it)."""
        moves: dict[str, str] = {}
        for change in changes:
            for cell in (change.value, change.vectors):
                if isinstance(cell, ObjectRef):
                    moves.setdefault(cell.token, new_token())
        if not moves:
            return changes, []
        calls = tuple(about(self.s3.copy(self.value_key(path, old), self.value_key(path, new)), _namespace(path)) for old, new in moves.items())
        answers = yield calls
        for call, answer in zip(calls, answers):
            if isinstance(answer, BaseException):
                if classify(answer, call.operation) == OBJECT_MISSING:
                    return None
                if error_code(answer) not in PRECONDITION_FAILED_CODES:  # 412: this copy, sent again, met itself
                    raise_failure(call, answer)
        return [_moved(c, moves) for c in changes], list(moves)

    # -- removals (erase, sweep) ------------------------------------------------------
    #
    # A removal unregisters a namespace in two steps: it reads the registry (its ``seq``
    # S is the fence), swaps the namespace's head for an empty one marked ``emptied`` (a
    # new write, even over an empty head: its ETag is new), then removes the registry
    # entries numbered below S. A writer that puts into the namespace after the head swap
    # meets the emptied head and registers it anew (``_swap``), numbered S or more: kept. A writer whose
    # swap landed before it had its item erased (erase), or made the head non-empty, so
    # the sweep did not empty it. So a namespace holding an item is always listed.

    def node_folder(self, path: Path) -> str:
        return node_folder(self.prefix, node_id(path))

    def erase_rows(self, prefix: Path, purge: Purge) -> Op[Erasure]:
        fence, registry = yield from self._read_registry()
        paths = sorted(p for p in registry.created if p[: len(prefix)] == prefix)
        # The namespaces' heads, and those of the nodes between them and the prefix
        # (a head with no item names no namespace, but an erase leaves no doubt).
        nodes = sorted({p[:i] for p in paths for i in range(max(len(prefix), 1), len(p) + 1)} | ({prefix} if prefix else set()))
        registered = set(paths)
        results = yield from gather(*(self._empty(n, n in registered, purge) for n in nodes))
        items = sum(count for count, _ in results)
        records = tuple(f"s3://{self.s3.bucket}/{key}" for _, key in results if key)
        return Erasure(tuple(paths), tuple(nodes), items, fence, records, (registry_object_key(self.prefix),))

    def erase_registrations(self, erasure: Erasure) -> Op[list[Path]]:
        return (yield from self._unregister(list(erasure.namespaces), erasure.fence))

    def sweep(self, limit: int, now: int, purge: Purge) -> Op[Swept]:
        cursor_key, reg_key = sweep_object_key(self.prefix), registry_object_key(self.prefix)
        calls = (about(self.s3.get(cursor_key), "the TTL sweep's cursor"), about(self.s3.get(reg_key), _REGISTRY_SUBJECT))
        answers = yield calls
        cursor = self._cursor_answer(calls[0], answers[0])
        _, registry = self._registry_answer(calls[1], answers[1])
        fence = registry.seq  # read before any head is emptied (see above)
        after = [p for p in registry.paths() if registry_key(p) > cursor]
        page = after[:limit]
        results = yield from gather(*(self._sweep_node(p, now, purge) for p in page))
        emptied = [p for p, (_, empty) in zip(page, results) if empty]
        kept = (yield from self._unregister(emptied, fence)) if emptied else []
        # Past the last namespace, the next run starts over.
        following = registry_key(page[-1]) if len(after) > limit else ""
        if following != cursor:
            call = about(self.s3.put_replace(cursor_key, following.encode()), "the TTL sweep's cursor")
            yield from request_one(call)
        return Swept(sum(n for n, _ in results), len(page), tuple(p for p in emptied if p not in kept))

    def _cursor_answer(self, call: Call, answer: Any) -> str:
        if isinstance(answer, BaseException):
            if classify(answer, call.operation) != OBJECT_MISSING:
                raise_failure(call, answer)
            return ""
        try:
            return answer["Body"].decode()
        except UnicodeDecodeError as exc:
            raise CorruptObjectError(f"s3://{self.s3.bucket}/{call.params['Key']}: not a sweep cursor ({exc})") from exc

    def _read_registry(self) -> Op[tuple[int, Registry]]:
        """The registry as stored now (not as cached), and its ``seq``: a removal's fence."""
        call = about(self.s3.get(registry_object_key(self.prefix)), _REGISTRY_SUBJECT)
        (answer,) = yield (call,)
        _, registry = self._registry_answer(call, answer)
        return registry.seq, registry

    def _empty(self, path: Path, registered: bool, purge: Purge) -> Op[tuple[int, str | None]]:
        """Swap the head of ``path`` for an empty one (keeping ``desc``: namespaces below
        may be registered again meanwhile), deleting first the value objects its rows name
        (so a call cut short and made again still finds them named). Returns the items
        removed and the head's key (None: there was no head, and none is needed)."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = f"{_namespace(path)} (erase)"
        for attempt in range(1, _MAX_SWAPS + 1):
            call = about(self.s3.get(key), subject)
            (answer,) = yield (call,)
            etag, head = self._head_answer(path, call, answer)
            if etag is None and not registered:
                return 0, None
            # Even an empty head is written again (a new ETag), and a missing one of a
            # registered namespace created: a writer that read the old one registers again.
            named = [self.value_key(path, r.value.token) for r in head.rows.values() if isinstance(r.value, ObjectRef)]
            if named:
                yield from purge(named)
            emptied = Head(path, 0, {}, head.desc, emptied=True)
            call = about(self.s3.put_swap(key, dumps_head(emptied), etag), subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                written: Known = (answer["ETag"], emptied)
                self._heads.put(node, written, _size(written))
                return len(head.rows), key
            yield from self._lost(call, answer, attempt, lambda: self._heads.pop(node))
        raise StoreUnavailableError(
            f"namespace {show(path)} (s3://{self.s3.bucket}/{key}) kept changing under {_MAX_SWAPS} swaps while being "
            "erased: too many writers at once; run the erase again"
        )

    def _sweep_node(self, path: Path, now: int, purge: Purge) -> Op[tuple[int, bool]]:
        """Drop the rows of ``path`` expired at ``now`` (their value objects first: no
        read returns an expired row); a head left with no row is emptied (see above).
        Returns the rows dropped and whether the head was emptied."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = f"{_namespace(path)} (TTL sweep)"
        for attempt in range(1, _MAX_SWAPS + 1):
            call = about(self.s3.get(key), subject)
            (answer,) = yield (call,)
            etag, head = self._head_answer(path, call, answer)
            live = {k: r for k, r in head.rows.items() if r.live(now)}
            expired = [r for r in head.rows.values() if not r.live(now)]
            if live and not expired:
                return 0, False
            named = [self.value_key(path, r.value.token) for r in expired if isinstance(r.value, ObjectRef)]
            if named:
                yield from purge(named)
            changed = Head(path, head.seq, live, head.desc) if live else Head(path, 0, {}, head.desc, emptied=True)
            call = about(self.s3.put_swap(key, dumps_head(changed), etag), subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                written: Known = (answer["ETag"], changed)
                self._heads.put(node, written, _size(written))
                return len(expired), not live
            yield from self._lost(call, answer, attempt, lambda: self._heads.pop(node))
        raise StoreUnavailableError(
            f"namespace {show(path)} (s3://{self.s3.bucket}/{key}) kept changing under {_MAX_SWAPS} swaps during the "
            "TTL sweep: too many writers at once; the next sweep visits it again"
        )

    def _unregister(self, paths: list[Path], before: int) -> Op[list[Path]]:
        """Remove the registry entries of ``paths`` numbered below ``before`` (a removal's
        fence); returns the paths kept (registered again since)."""
        key = registry_object_key(self.prefix)
        for attempt in range(1, _MAX_SWAPS + 1):
            known = self._registry.get(_REGISTRY)
            if known is None:
                call = about(self.s3.get(key), _REGISTRY_SUBJECT)
                (answer,) = yield (call,)
                known = self._registry_answer(call, answer)
            etag, registry = known
            changed = Registry(registry.seq, dict(registry.created))
            kept = changed.remove(paths, before)
            if changed.created == registry.created:
                # Nothing to remove. The cached registry is no older than the removal's own
                # read of it (the fence): it holds every entry numbered below the fence.
                return kept
            call = about(self.s3.put_swap(key, dumps_registry(changed), etag), _REGISTRY_SUBJECT)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                written: Known = (answer["ETag"], changed)
                self._registry.put(_REGISTRY, written, _size(written))
                return kept
            yield from self._lost(call, answer, attempt, lambda: self._registry.pop(_REGISTRY))
        raise StoreUnavailableError(
            f"the namespace registry s3://{self.s3.bucket}/{key} kept changing under {_MAX_SWAPS} swaps unregistering "
            f"{', '.join(show(p) for p in paths[:3])}: too many processes registering namespaces at once; try again"
        )

    def _lost(self, call: Call, answer: BaseException, attempt: int, forget: Any) -> Op[None]:
        """A swap refused: another writer got there first (412, or 409 for a race S3 saw):
        forget the guess, pause briefly, read again. Any other failure is raised."""
        if error_code(answer) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
            raise_failure(call, answer)
        forget()
        go_on = yield Backoff(_JITTER.uniform(0, min(_BACKOFF_MAX, 0.01 * 2**attempt)), attempt)
        if go_on is False:
            # The retry budget (or deadline()) leaves no time for another swap. The 412 is
            # no error of the caller's: raised as is, it reached users as botocore's bare
            # PreconditionFailed (one process's burst of writers of one namespace met it).
            raise StoreUnavailableError(
                f"{call.describe()} in s3://{self.s3.bucket}: the document kept changing under {attempt} swaps "
                "within the retry budget: too many writers of one namespace at once; try again"
            )


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


def _moved(change: Change, moves: dict[str, str]) -> Change:
    def cell(c: Any) -> Any:
        return ObjectRef(moves[c.token], c.size) if isinstance(c, ObjectRef) else c

    return replace(change, value=cell(change.value), vectors=cell(change.vectors))  # stamps and all kept


_NEVER = object()


def _ancestors(paths: Sequence[Path]) -> list[Path]:
    return sorted({p[:i] for p in paths for i in range(1, len(p))})


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
