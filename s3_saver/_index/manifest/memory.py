"""The memory store's index in the bucket (manifest mode, no database).

Per namespace one head, ``memory/n/<node id>/@head``, holding the newest rows of the
namespace and the refs of the immutable segments its older rows were sealed into
(``memory_segments``); one registry, ``memory/@reg/head``, holding every registered
namespace.
Both are replaced only by compare-and-swap (``IfMatch`` the ETag read, ``IfNoneMatch:
*`` to create), so a change is always applied to what is stored: two writers of one
namespace never lose an update (the loser of a swap reads again and re-applies its
changes), and a row is never torn (it lives in one document).

Costs (one process, a head it knows): a get, or a search of a namespace with no
sub-namespaces, is 1 GET of its head (its ``desc`` says none is below it: no registry
read), and one more wave for the segments it needs that this process has not read
(cached: they never change); a search of a prefix with namespaces below it adds the registry, then their
heads (3 round trips); a put or delete 1 PUT (the cached ETag stands in for a read), 2
requests from a process that has not read the head; the first put into a new namespace
adds the registry's swap and each ancestor's ``desc`` swap before the head's.

Caches (the store's budget): heads and the registry as last read or written, with
their ETags. Each is a guess that the swap's condition checks: a stale one costs a
412 and a read, never another answer. Reads never answer from them.

A value over ``INLINE_LIMIT`` bytes (packed) lives in an object of its own, written
before the head that names it (within its lease: ``memory_lease``) and deleted after the
swap that drops it. A swap refused
(another writer, or its own resend after a lost answer) is judged on the head read
again (``_swap``); applied again, its value objects are first copied to fresh tokens
(+1 CopyObject per large value, only after a refusal).

Removals (erase, the TTL sweep of an emptied namespace) unregister a namespace by a
head swap and a registry swap, fenced by the registry's ``seq`` (``memory_removal``).

With encryption, an erase records on the head it empties the ids of the namespace's keys
it destroyed (``Head.gone``, carried by every later swap); a swap of a put sealed under
one is refused (``KeyFenced``), checked on the head it replaces: no request more.

One process's concurrent swaps of one head go out as one (group commit:
``memory_group``): a process never conflicts with itself.

Not built yet: conditional GETs (304) of unchanged heads.

The module holds reads and writes; the documents and what they share are
``memory_documents``'s, segments (sealing, compaction, what a change and a read need of
them) ``memory_segments``'s, removals ``memory_removal``'s, group commit
``memory_group``'s, garbage collection ``memory_collect``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from s3_saver._format.memory.documents import (
    Head,
    Registry,
    dumps_head,
    dumps_registry,
    head_key,
    registry_object_key,
)
from s3_saver._format.memory.names import node_id, show
from s3_saver._format.memory.segments import SegmentRef
from s3_saver._index.manifest.memory_collect import Collection
from s3_saver._index.manifest.memory_documents import (
    _MAX_SWAPS,
    _NEVER,
    _REGISTRY,
    _REGISTRY_SUBJECT,
    Known,
    _adds,
    _ancestors,
    _namespace,
    _size,
)
from s3_saver._index.manifest.memory_group import GroupCommits
from s3_saver._index.manifest.memory_removal import Removals
from s3_saver._index.manifest.memory_reseal import Named
from s3_saver._index.manifest.memory_segments import apply
from s3_saver._index.memory import (
    Change,
    KeyFenced,
    Path,
    Snapshot,
    Stage,
    fresh_objects,
)
from s3_saver._index.memory_lease import renewed
from s3_saver._transport.protocol import (
    Op,
    about,
    gather,
)
from s3_saver.errors import StoreUnavailableError

INLINE_LIMIT = 64 * 1024

_Refused = tuple[dict[str, Any], list[str], list[SegmentRef]]


class ManifestMemory(GroupCommits, Collection, Removals, Named):
    """``MemoryIndex`` on the bucket (see the module docstring)."""

    inline_limit = INLINE_LIMIT
    vector_limit = None  # a head holds an item's vectors whatever their size
    knows_leaves = True  # a head's ``desc``

    # -- reads -------------------------------------------------------------------------

    def read(self, whole: Sequence[Path], keys: Mapping[Path, Sequence[str]], registry: Sequence[Path] = ()) -> Op[Snapshot]:
        # The registry is one document: any range reads it whole.
        paths = list(dict.fromkeys([*whole, *keys]))
        held = [self._heads.get(node_id(p)) for p in paths]  # what the cache holds as the reads go out
        calls = tuple(about(self.s3.get(head_key(self.prefix, node_id(p))), _namespace(p)) for p in paths)
        if registry:
            calls += (about(self.s3.get(registry_object_key(self.prefix)), _REGISTRY_SUBJECT),)
        answers = yield calls
        heads = {p: self._head_answer(p, calls[i], answers[i], held[i])[1] for i, p in enumerate(paths)}
        found = self._registry_answer(calls[-1], answers[-1])[1].created if registry else {}
        # The sealed rows: every segment of a namespace read whole, those that may hold a
        # key asked for otherwise (one more wave, for the ones this process has not read).
        nodes = yield from self._complete(heads, whole, keys)
        leaves = frozenset(p for p in whole if not heads[p].desc)
        return Snapshot(nodes, found, leaves)

    def _read_heads(self, paths: Sequence[Path]) -> Op[None]:
        # The heads alone (cached by the read): a commit reads the segments it needs itself.
        yield from self.read([], {p: () for p in paths})

    # -- writes ------------------------------------------------------------------------

    def commit(self, groups: dict[Path, list[Change]], stage: Stage | None = None) -> Op[list[str]]:
        if not groups:
            return []
        # The heads this process does not know: read them first (one wave), to learn
        # which namespaces are new (an empty head, or none) and must be registered first.
        unknown = [p for p in groups if self._heads.get(node_id(p)) is None]
        if unknown:
            yield from self._read_heads(unknown)
        # (A head the cache lost meanwhile is judged by the swap: it registers what it finds new.)
        heads = {p: k for p, changes in groups.items() if _adds(changes) and (k := self._heads.get(node_id(p))) is not None and k[1].empty}
        new = list(heads)
        registered: dict[Path, str | None] = {}
        if new:
            # Listed before readable: the registry's swap lands before any head it lists,
            # and each ancestor's ``desc`` before any item below it (a search of an
            # ancestor whose head says it has none below reads no registry).
            registered = {p: etag for p, (etag, _) in heads.items()}
            yield from self._register(new, frozenset(p for p, (_, head) in heads.items() if head.emptied))
            yield from gather(*(self._mark(a) for a in _ancestors(new)))
        if stage is not None:
            # And before its value objects (``MemoryIndex.commit``'s invariant): an erase
            # finds them even if this commit is cut short before its head's swap.
            yield from stage()
        swaps = (self._joined(path, changes, path in unknown, registered.get(path, _NEVER)) for path, changes in groups.items())
        released = yield from gather(*swaps)
        return [key for keys in released for key in keys]

    def _register_now(self, paths: list[Path], renew: frozenset[Path] = frozenset()) -> Op[None]:
        key = registry_object_key(self.prefix)
        for attempt in range(1, _MAX_SWAPS + 1):
            known = self._registry.get(_REGISTRY) if attempt == 1 else None  # refused: read, never a guess again
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

    def _mark_now(self, path: Path) -> Op[None]:
        """Set ``desc`` on the head of ``path`` (creating an empty head if none)."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = f"{_namespace(path)} (a namespace below it)"
        for attempt in range(1, _MAX_SWAPS + 1):
            known = self._heads.get(node) if attempt == 1 else None  # refused: read, never a guess again
            if known is None:
                call = about(self.s3.get(key), subject)
                (answer,) = yield (call,)
                known = self._head_answer(path, call, answer)
            etag, head = known
            if head.desc:
                return  # set already (never cleared yet: a cached True is final)
            changed = replace(head, desc=True)  # its rows, segments and retired ones kept
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
        names again a token after a refused swap: it copies).

        Segments: the change is applied on the head's rows and on those of the segments
        that may hold its keys (read first when not cached: ``memory_segments.apply``);
        then the head is sealed or compacted as due, its new segments written before the
        swap. A refused swap whose segments the head read after it names landed (only
        that swap names them). Segments written for swaps that did not land are deleted
        once the commit is done (a swap refused on a head that changed can never land
        later: its condition is that head's ETag); the segments the head read had
        retired, and those this swap retires, after the swap."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = _namespace(path, [c.key for c in changes])
        refused: list[_Refused] = []  # (rows written, tokens released, segments written) per refused swap
        for attempt in range(1, _MAX_SWAPS + 1):
            known = None if refused else self._heads.get(node)  # refused: read, never a guess again
            if known is None:
                call = about(self.s3.get(key), subject)
                (answer,) = yield (call,)
                known, confirmed = self._head_answer(path, call, answer), True
            etag, head = known
            fenced = {c.sealed_with for c in changes if c.sealed_with is not None} & set(head.gone)
            if fenced:
                # Invariant (``MemoryIndex.commit``): a put sealed under a key an erase
                # destroyed never lands. Checked on the head this swap would replace (its
                # ETag the swap's condition): a cached head that predates the erase meets
                # the emptied one on its 412, and is judged here again. The ids only grow,
                # so a cached head naming the key is decisive too.
                self._heads.pop(node)
                raise KeyFenced([path], f"s3://{self.s3.bucket}/{key}")
            if refused and confirmed:
                named = {r.token for r in [*head.segments, *head.retired]}
                for written, released, sealed in refused:
                    if any(head.rows.get(k) == row for k, row in written.items()) or any(r.token in named for r in sealed):
                        return self._released(path, released, refused, head, head)
                fresh = yield from fresh_objects(self.s3, self, path, changes, _namespace(path))
                if fresh is None:  # an earlier swap landed, then was replaced
                    return self._released(path, [], refused, head, head)
                changes, old = fresh
                refused.append(({}, old, []))  # the objects copied away: named by no head this commit writes
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
            # The lease: never name a value object older than VALUE_LEASE (``memory_lease``).
            changes = yield from renewed(self.s3, self.value_key, self.clock, path, changes)
            # The sealed rows of the keys changed that the head does not hold (decided on
            # exact rows: an overwrite keeps the item's creation, see ``memory_segments``).
            loaded, gone = yield from self._rows_of({path: head}, keys={path: [c.key for c in changes]})
            if gone:  # compacted away since this head was read: the head is stale
                self._heads.pop(node)
                confirmed = False
                continue
            changed, released = apply(head, changes, self.clock, loaded[path])
            if changed is None:
                if confirmed:
                    # Nothing to change, on the head as stored (a delete of an absent key).
                    return self._released(path, [], refused, head, head)
                # Nothing to change on a cached head: a guess, so read it and judge again.
                self._heads.pop(node)
                continue
            shaped = yield from self._reshape(path, changed)
            if shaped is None:  # a segment to merge is gone: the head is stale
                self._heads.pop(node)
                confirmed = False
                continue
            changed, released = shaped.head, [*released, *shaped.released]
            call = about(self.s3.put_swap(key, dumps_head(changed), etag), subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                self.learn(answer)
                written: Known = (answer["ETag"], changed)
                self._heads.put(node, written, _size(written))
                # Named by the head this swap replaced: no other row names them (tokens are fresh).
                return self._released(path, released, refused, changed, head)
            confirmed = False
            yield from self._lost(call, answer, attempt, lambda: self._heads.pop(node))
            puts = {c.key for c in changes if c.value is not None and c.refresh is None}
            refused.append(({k: changed.rows[k] for k in puts if k in changed.rows}, released, [r for r, _ in shaped.written]))
        raise StoreUnavailableError(
            f"namespace {show(path)} (s3://{self.s3.bucket}/{key}) kept changing under {_MAX_SWAPS} swaps: too many "
            "writers of one namespace at once; try again"
        )

    def _released(self, path: Path, released: list[str], refused: list[_Refused], head: Head, read: Head) -> list[str]:
        """The objects a commit that ends with ``head`` (written, or read) leaves to delete:
        value objects (see ``_swap``), segments of refused swaps that ``head`` does not
        name, and the segments retired by ``head`` and by the head ``read`` before it."""
        named = head.tokens()
        tokens = dict.fromkeys([*released, *(t for _, gone, _ in refused for t in gone if t not in named)])
        kept = {r.token for r in [*head.segments, *head.retired]}
        orphans = [self.segment_key(path, r) for _, _, sealed in refused for r in sealed if r.token not in kept]
        return [*(self.value_key(path, token) for token in tokens), *orphans, *self._retired_keys(path, read, head)]

