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
"""

from __future__ import annotations

from typing import Any

from s3_saver._format.memory.documents import (
    Head,
    Registry,
    dumps_head,
    dumps_registry,
    head_key,
    node_folder,
    registry_object_key,
    sweep_object_key,
)
from s3_saver._format.memory.names import node_id, registry_key, show
from s3_saver._format.memory.rows import ObjectRef
from s3_saver._index.manifest.memory_documents import (
    _MAX_SWAPS,
    _REGISTRY,
    _REGISTRY_SUBJECT,
    Documents,
    Known,
    _namespace,
    _size,
)
from s3_saver._index.memory import Erasure, Path, Purge, Swept
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


class Removals(Documents):
    """Erase and the TTL sweep of the manifest memory index."""

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

    def _empty(self, path: Path, registered: bool, purge: Purge) -> Op[tuple[int, str | None]]:
        """Swap the head of ``path`` for an empty one (keeping ``desc``: namespaces below
        may be registered again meanwhile), deleting first the value objects its rows name
        (so a call cut short and made again still finds them named). Returns the items
        removed and the head's key (None: there was no head, and none is needed)."""
        node = node_id(path)
        key = head_key(self.prefix, node)
        subject = f"{_namespace(path)} (erase)"
        refused: int | None = None  # the rows of the head a refused swap emptied
        for attempt in range(1, _MAX_SWAPS + 1):
            call = about(self.s3.get(key), subject)
            (answer,) = yield (call,)
            etag, head = self._head_answer(path, call, answer)
            if refused is not None and head.emptied and not head.rows:
                # A refused swap may be one that landed (its answer lost, sent again, the copy
                # met its own write): the head is emptied now, so it is counted as this erase's.
                return refused, key
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
            refused = len(head.rows)
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
        refused: tuple[int, Head] | None = None  # the rows a refused swap dropped, and the head it wrote
        for attempt in range(1, _MAX_SWAPS + 1):
            call = about(self.s3.get(key), subject)
            (answer,) = yield (call,)
            etag, head = self._head_answer(path, call, answer)
            if refused is not None and head.rows == refused[1].rows and head.emptied == refused[1].emptied:
                # Its rows stand: the refused swap landed (its answer lost, the copy sent
                # again met its own write); the rows it dropped are this sweep's.
                return refused[0], not head.rows
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
            refused = (len(expired), changed)
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
