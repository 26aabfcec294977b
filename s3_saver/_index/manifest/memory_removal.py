"""The memory index in the bucket (manifest mode): removals, ``erase_namespace``'s
rows and registrations and the TTL sweep.

A removal unregisters a namespace in two steps: it reads the registry (its ``seq``
S is the fence), swaps the namespace's head for an empty one marked ``emptied`` (a
new write, even over an empty head: its ETag is new), then removes the registry
entries numbered below S. A writer that puts into the namespace after the head swap
meets the emptied head and registers it anew (``ManifestMemory._swap``), numbered S or
more: kept. A writer whose swap landed before it had its item erased (erase), or made
the head non-empty, so the sweep did not empty it. So a namespace holding an item is
always listed.

Sealed segments: an erase deletes the value objects every row names (the head's and
every segment's), then the segments, then swaps the head for an empty one; a call cut
short and made again finds the segments it deleted gone, and what they named gone
before them. The sweep reads every segment of a namespace it visits, deletes the value
objects of the expired items, and swaps in a head without them: the head's expired rows
dropped, the segments compacted when what no read returns outweighs the rest
(``memory_segments``), or every segment retired when nothing is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from s3_saver._format.memory.documents import (
    Head,
    Registry,
    dumps_head,
    dumps_registry,
    gone_ids,
    head_key,
    node_folder,
    registry_object_key,
    sweep_object_key,
)
from s3_saver._format.memory.names import node_id, registry_key, show
from s3_saver._format.memory.rows import ObjectRef, Row
from s3_saver._format.memory.segments import row_bytes
from s3_saver._index.manifest.memory_documents import (
    _MAX_SWAPS,
    _REGISTRY,
    _REGISTRY_SUBJECT,
    Known,
    _namespace,
    _size,
)
from s3_saver._index.manifest.memory_segments import (
    Segments,
    drop_expired,
    merged,
    sealed_row,
)
from s3_saver._index.memory import Destroy, Erasure, Path, Purge, Swept
from s3_saver._transport.failures import (
    OBJECT_MISSING,
    classify,
)
from s3_saver._transport.protocol import (
    Call,
    Op,
    about,
    gather,
    raise_failure,
    request_one,
)
from s3_saver.errors import CorruptObjectError, StoreUnavailableError


class Removals(Segments):
    """Erase and the TTL sweep of the manifest memory index."""

    def node_folder(self, path: Path) -> str:
        return node_folder(self.prefix, node_id(path))

    def erase_rows(self, prefix: Path, purge: Purge, destroy: Destroy | None = None) -> Op[Erasure]:
        fence, registry = yield from self._read_registry()
        paths = sorted(p for p in registry.created if p[: len(prefix)] == prefix)
        # With encryption, every namespace's key destroyed before its head is emptied; the
        # emptied head records the ids, so a process that cached one commits nothing under
        # it (``ManifestMemory._swap``).
        gone = (yield from destroy(paths)) if destroy is not None else {}
        # The namespaces' heads, and those of the nodes between them and the prefix
        # (a head with no item names no namespace, but an erase leaves no doubt).
        nodes = sorted({p[:i] for p in paths for i in range(max(len(prefix), 1), len(p) + 1)} | ({prefix} if prefix else set()))
        registered = set(paths)
        results = yield from gather(*(self._empty(n, n in registered, purge, gone.get(n, frozenset())) for n in nodes))
        items = sum(count for count, _ in results)
        records = tuple(f"s3://{self.s3.bucket}/{key}" for _, key in results if key)
        return Erasure(tuple(paths), tuple(nodes), items, fence, records, (registry_object_key(self.prefix),))

    def erase_registrations(self, erasure: Erasure, hold: Sequence[Path] = ()) -> Op[list[Path]]:
        going = [p for p in erasure.namespaces if p not in hold]
        kept = (yield from self._unregister(going, erasure.fence)) if going else []
        return [p for p in erasure.namespaces if p in kept or p in hold]

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

    def _empty(self, path: Path, registered: bool, purge: Purge, gone: frozenset[str] = frozenset()) -> Op[tuple[int, str | None]]:
        """Swap the head of ``path`` for an empty one (keeping ``desc``: namespaces below
        may be registered again meanwhile; and the destroyed key ids, with ``gone`` added),
        deleting first the value objects its rows name (so a call cut short and made
        again still finds them named). Returns the items removed and the head's key
        (None: there was no head, and none is needed)."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = f"{_namespace(path)} (erase)"
        refused: int | None = None  # the rows of the head a refused swap emptied
        for attempt in range(1, _MAX_SWAPS + 1):
            call = about(self.s3.get(key), subject)
            (answer,) = yield (call,)
            etag, head = self._head_answer(path, call, answer)
            if refused is not None and head.emptied and not head.rows and set(gone) <= set(head.gone):
                # A refused swap may be one that landed (its answer lost, sent again, the copy
                # met its own write): the head is emptied now, so it is counted as this erase's.
                return refused, key
            if etag is None and not registered:
                return 0, None
            # Every row, the segments' too (one gone: an erase cut short deleted it, after
            # what it named).
            refs = [*head.segments, *head.retired]
            loaded = (yield from self._load({path: refs}))[0][path] if refs else {}
            every: list[Row] = [*head.rows.values(), *(r for rows in loaded.values() for r in rows.values())]
            # The items: each key's newest row, if not a tombstone.
            seen, items = set(head.rows), sum(not r.tombstone for r in head.rows.values())
            for ref in reversed(head.segments):
                for name, row in loaded.get(ref.token, {}).items():
                    if name not in seen:
                        seen.add(name)
                        items += not row.tombstone
            # Even an empty head is written again (a new ETag), and a missing one of a
            # registered namespace created: a writer that read the old one registers again.
            named = list(dict.fromkeys(self.value_key(path, c.token) for r in every for c in (r.value, r.vectors) if isinstance(c, ObjectRef)))
            if named:
                yield from purge(named)
            if refs:
                yield from purge([self.segment_key(path, r) for r in refs])
            emptied = Head(path, 0, {}, head.desc, emptied=True, gone=gone_ids(head.gone, gone))
            call = about(self.s3.put_swap(key, dumps_head(emptied), etag), subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                written: Known = (answer["ETag"], emptied)
                self._heads.put(node, written, _size(written))
                return items, key
            yield from self._lost(call, answer, attempt, lambda: self._heads.pop(node))
            refused = items
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
        refused: tuple[int, Head, Head] | None = None  # a refused swap's: items dropped, head written, head read
        for attempt in range(1, _MAX_SWAPS + 1):
            call = about(self.s3.get(key), subject)
            (answer,) = yield (call,)
            etag, head = self._head_answer(path, call, answer)
            if refused is not None and (head.rows, head.emptied, head.segments) == (refused[1].rows, refused[1].emptied, refused[1].segments):
                # Its rows and segments stand: the refused swap landed (its answer lost, the
                # copy sent again met its own write); the rows it dropped are this sweep's,
                # and the segments it retired go as after its answer.
                removed, changed, before = refused
                retired = self._retired_keys(path, before, changed)
                if retired:
                    yield from self._drop(retired, "retired segments")
                return removed, changed.emptied
            found, gone = yield from self._load({path: head.segments})
            if gone:  # compacted away since the head was read: read it again
                continue
            loaded = found[path]
            items = merged(head, loaded)
            expired = [r for r in items.values() if not r.live(now)]
            live = len(items) - len(expired)
            named = [self.value_key(path, c.token) for r in expired for c in (r.value, r.vectors) if isinstance(c, ObjectRef)]
            if live:
                sealed = [r for r in expired if r.key not in head.rows]
                trimmed = drop_expired(head, now)
                shaped = yield from self._reshape(path, trimmed, sum(row_bytes(r) for r in sealed))
                if shaped is None:
                    continue
                if named:
                    # Expired: no read returns them, so their objects go first, whether or
                    # not this swap lands (a row left naming one is never read).
                    yield from purge(named)
                merging = {r.token for r in shaped.head.retired}
                removed = len(expired) - sum(1 for r in sealed if (s := sealed_row(head, loaded, r.key)) and s[0].token not in merging)
                if trimmed.rows == head.rows and not shaped.written and not shaped.head.retired:
                    return removed, False  # nothing to swap (a sealed expired row stays until a compaction)
                changed = shaped.head
            else:
                if named:
                    yield from purge(named)
                removed = len(expired)
                # Nothing left: every segment retired (deleted after the swap).
                changed = Head(path, 0, {}, head.desc, emptied=True, retired=[*head.segments, *head.retired], gone=head.gone)
            call = about(self.s3.put_swap(key, dumps_head(changed), etag), subject)
            (answer,) = yield (call,)
            if not isinstance(answer, BaseException):
                self.learn(answer)
                written: Known = (answer["ETag"], changed)
                self._heads.put(node, written, _size(written))
                retired = self._retired_keys(path, head, changed)
                if retired:
                    yield from self._drop(retired, "retired segments")
                return removed, not live
            yield from self._lost(call, answer, attempt, lambda: self._heads.pop(node))
            refused = (removed, changed, head)
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
