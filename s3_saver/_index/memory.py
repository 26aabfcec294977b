"""The memory store's index interface (``S3Store``), and its terms.

Each method is a generator of calls returning parsed terms, as the thread index's are
(``_index/base``); the store's operations (``_ops/memory``) are written once against
it, and each index mode implements it: the manifest mode (``_index/manifest/memory``:
a head per namespace and a registry, in the bucket) and the DynamoDB mode
(``_index/dynamodb/memory``: an item per memory item, and a registry partition, in the
saver's table).

Invariants every backend keeps:

- a namespace is registered (listed, and found by a search of its prefixes) before any
  of its items is readable: the registry write comes first, the items last;
- a change of one namespace is applied to what is stored now, never to a stale copy
  (compare-and-swap, or a conditional write), so concurrent writers of one key leave
  the last committed value whole, and ``created_at`` the first's;
- a refresh moves an item's expiry only if the expiry is still the one read (it never
  revives a deleted item, nor shortens an expiry a newer write gave);
- what a read returns is checked to be the namespace asked for;
- a value object, once the row naming it is replaced or removed, is never named again
  (tokens are fresh, and a write applied again after a lost answer names copies:
  ``fresh_objects``), so whoever learns that a row was replaced may delete its objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from s3_saver._format.key_codec import new_token
from s3_saver._format.memory.names import show
from s3_saver._format.memory.rows import ObjectRef, Row, ValueCell, VectorsCell
from s3_saver._format.memory.ttl import Clock, Refresh
from s3_saver._transport.failures import (
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Op, about, raise_failure
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import S3SaverError

Path = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Change:
    """One change of one key of a namespace: a put (``value`` set), a delete (neither
    ``value`` nor ``refresh``), or a refresh of its expiry (``refresh``). A put with
    ``stamps`` writes an item as it was exported (``import_memory``): its
    ``(created_us, updated_us, expires_us)`` as given, not the commit's time."""

    key: str
    value: ValueCell | ObjectRef | None = None
    vectors: VectorsCell | None = None
    ttl_minutes: float | None = None
    refresh: Refresh | None = None
    stamps: tuple[int, int, int | None] | None = None
    written: int | None = None
    """When its value object (an ``ObjectRef``) was sent, by the store's clock (µs): a
    commit never names one older than ``memory_lease.VALUE_LEASE``."""
    sealed_with: str | None = None
    """With encryption, a put's: the id (hex) of the namespace key its value and vectors
    are sealed under. The commit refuses it (``KeyFenced``) when an erase destroyed that
    key, inside the conditional write that lands it (see ``MemoryIndex.commit``)."""
    reseal: Row | None = None
    """Set by the encryption migration (``_ops/memory/encrypt``): ``value`` and ``vectors``
    are the row's own, encrypted, and replace the row's only if the key's row is still
    exactly this one (fenced: a put or delete that landed since wins; the item's times,
    expiry and place stay). Never creates an item. The value objects the change names are
    released when it does not apply."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a read found: each namespace's rows by key, as stored (expired rows
    included: the caller judges them at its own ``now``), and the registered namespaces
    asked for (each with its registration number)."""

    nodes: dict[Path, dict[str, Row]]
    registry: dict[Path, int]
    leaves: frozenset[Path] = frozenset()
    """Namespaces read whole that are known to have no namespace below them (so a search
    of one needs no registry read); an index that cannot tell names none."""


class KeyFenced(S3SaverError):
    """A commit refused: a put of it is sealed under a namespace key that an erase
    destroyed (another process erased the namespace after this one cached the key).
    Nothing of the refused namespace's puts landed under that key; the operation drops
    the cached key, reads the key record again (a new key once the erase is over), seals
    the puts anew and runs again (``sealing.rekeying``)."""

    def __init__(self, paths: Sequence[Path], where: str) -> None:
        names = ", ".join(show(p) for p in paths[:3])
        super().__init__(
            f"{where}: namespace {names}: the write was sealed under a key that an erase of the namespace destroyed "
            "(another process erased it after this one cached the key); nothing was written under it"
        )
        self.paths = tuple(paths)


Destroy = Callable[[list[Path]], Op[dict[Path, frozenset[str]]]]
"""An erase's: destroys the keys of the namespaces given (those not destroyed yet) and
returns, per namespace that had one, the ids (hex) of every key of it destroyed: what the
index records for the namespace's commits to refuse (``erase_rows``)."""

Stage = Callable[[], Op[None]]
"""Writes the value objects a commit's rows will name (``commit`` runs it once the
namespaces that receive items are registered, before any row is written)."""

Purge = Callable[[list[str]], Op[None]]
"""Deletes value objects (by key) before the rows that name them go: an erase or a
sweep passes one to the index (the objects are the bucket's in both modes)."""


@dataclass(frozen=True, slots=True)
class Erasure:
    """The index's part of an erase under way (``erase_rows``), and what
    ``erase_registrations`` needs to finish it."""

    namespaces: tuple[Path, ...]
    """The registered namespaces the erase found under its prefix."""
    nodes: tuple[Path, ...]
    """Every namespace whose folder (``node_folder``) may hold objects to erase."""
    items: int
    """Items removed."""
    fence: Any
    """What tells the erase's registrations from those made after it began."""
    records: tuple[str, ...]
    """What stays, with no item and no namespace name in it."""
    history: tuple[str, ...] = ()
    """Keys whose noncurrent versions may name erased namespaces (the manifest registry)."""


@dataclass(frozen=True, slots=True)
class Swept:
    """What one sweep run did: expired items removed, namespaces visited, and those it
    found empty and unregistered."""

    removed: int
    visited: int
    unregistered: tuple[Path, ...]


class MemoryIndex(Protocol):
    prefix: str
    """The store's key prefix (in the bucket; encoded, in the table)."""
    clock: Clock
    """The store's clock: its items' times, and a value object's lease (``memory_lease``)."""
    knows_leaves: bool
    """Whether ``read`` names the leaves among the namespaces it reads whole (then a
    search of a leaf reads no registry)."""
    inline_limit: int
    """A value of more bytes (as packed) goes to an object of its own, written first."""
    vector_limit: int | None
    """The most bytes an item's vectors (as packed) may take, None: no limit. Checked
    before any request of the batch (or import) that would write more."""

    def value_key(self, path: Path, token: str) -> str:
        """The S3 key of a value moved out of its row (both modes keep such values in the bucket)."""
        ...

    def describe(self, path: Path) -> str:
        """Where a namespace's items live (bucket and key, or table and partition): for messages."""
        ...

    def read(self, whole: Sequence[Path], keys: Mapping[Path, Sequence[str]], registry: Sequence[Path] = ()) -> Op[Snapshot]:
        """Every row of the namespaces ``whole``, the rows of ``keys`` (a namespace's rows
        may hold more than the keys asked for), and the registered namespaces under each
        prefix of ``registry`` (none: no registry read; ``()`` among them: all; the answer
        may hold more): one round trip (and the further pages of what does not fit one)."""
        ...

    def commit(self, groups: dict[Path, list[Change]], stage: Stage | None = None) -> Op[list[str]]:
        """Apply each namespace's changes, in order (the last change of a key wins),
        registering first the namespaces that receive an item and are not registered
        (in the order of ``groups``), then running ``stage`` (the value objects the rows
        name: objects first, index last). Namespaces are committed side by side. Returns
        the keys of the value objects the commit released: named by the rows it replaced
        or removed, as stored (delete only what you read).

        Invariant: a value object is written into a namespace's folder only once the
        namespace is registered, as far as this process knows (an erase finds folders
        through the registry: a commit cut short after its objects leaves them where an
        erase of any prefix of the namespace lists them).

        Invariant (encryption): a put whose ``sealed_with`` names a key an erase of its
        namespace destroyed never lands. The erase records the destroyed ids where the
        commit's own conditional write reads them (the namespace's head, in manifest mode;
        its registry item and its items, in DynamoDB mode, and a record of the ids that
        outlives the registry item, checked by a registration), so the check costs no request;
        refused, the commit raises ``KeyFenced`` (other namespaces of the commit may have
        landed: the operation runs again whole)."""
        ...

    def named_values(self, node: str) -> Op[frozenset[str]]:
        """The tokens of the value objects that the rows of the namespace whose node id is
        ``node`` name, as stored now, expired rows included (``collect_garbage`` keeps
        them). Read by the node id alone (a folder of the bucket: its namespace may be
        registered or not); each row read is checked to be that node's. Raises
        CorruptObjectError when the rows cannot be read."""
        ...

    def named_objects(self, path: Path) -> Op[frozenset[str]]:
        """The keys of the objects in the namespace's folder (``node_folder``) that its
        index names now: the value objects of its rows (expired ones included), and in
        the manifest mode its head and the segments the head reads from (not those it
        retired). Another object there is named by no read: a write's that has not
        committed yet (younger than the lease, ``memory_lease``), or garbage."""
        ...

    def node_folder(self, path: Path) -> str:
        """The key prefix of every object of a namespace in the bucket (its value objects,
        and in manifest mode its head)."""
        ...

    def erase_rows(self, prefix: Path, purge: Purge, destroy: Destroy | None = None) -> Op[Erasure]:
        """Remove every item of every registered namespace under ``prefix`` (itself
        included): value objects first (``purge``), then the rows. Registrations stay
        until ``erase_registrations``, so a call cut short and made again finds them.
        ``destroy`` (encryption): called with the namespaces found, before anything of
        them changes; the key ids it returns are recorded where each namespace's commits
        check them (``commit``'s invariant)."""
        ...

    def erase_registrations(self, erasure: Erasure, hold: Sequence[Path] = ()) -> Op[list[Path]]:
        """Unregister the namespaces ``erase_rows`` emptied, except those registered again
        since it began (a put meanwhile: they stay listed) and those of ``hold`` (the
        erase left a version in their folder: registered, the erase called again finds
        it); returns the namespaces that stay registered."""
        ...

    def sweep(self, limit: int, now: int, purge: Purge) -> Op[Swept]:
        """Visit up to ``limit`` registered namespaces, in path order from where the last
        run stopped (a cursor kept beside the registry; past the last, the next run starts
        over): remove their items expired at ``now`` (value objects first) and unregister
        those left with no item."""
        ...


def fresh_objects(
    s3: S3Calls, index: MemoryIndex, path: Path, changes: list[Change], subject: str
) -> Op[tuple[list[Change], list[str]] | None]:
    """``changes`` with each value object copied to a fresh token (one wave of
    CopyObject), and the old tokens; None when a source is gone.

    For a write applied again after one whose answer was lost (both modes): that one may
    have landed and been replaced since, and the writer that replaced it deleted its
    objects (the row it replaced named them). Named again, the key would name a deleted
    object. A copy that finds its source gone proves exactly that: the earlier write
    landed (ordered before the one that replaced it), and the commit is done. The old
    tokens are named by no row from now on (the caller releases them)."""
    moves: dict[str, str] = {}
    for change in changes:
        for cell in (change.value, change.vectors):
            if isinstance(cell, ObjectRef):
                moves.setdefault(cell.token, new_token())
    if not moves:
        return changes, []
    calls = tuple(about(s3.copy(index.value_key(path, old), index.value_key(path, new)), subject) for old, new in moves.items())
    sent = index.clock.now()
    answers = yield calls
    for call, answer in zip(calls, answers):
        if isinstance(answer, BaseException):
            if classify(answer, call.operation) == OBJECT_MISSING:
                return None
            if error_code(answer) not in PRECONDITION_FAILED_CODES:  # 412: this copy, sent again, met itself
                raise_failure(call, answer)
    return [_moved(c, moves, sent) for c in changes], list(moves)


def _moved(change: Change, moves: dict[str, str], sent: int) -> Change:
    def cell(c: Any) -> Any:
        return ObjectRef(moves[c.token], c.size) if isinstance(c, ObjectRef) else c

    moved = any(isinstance(c, ObjectRef) for c in (change.value, change.vectors))
    # replace(): every other field kept (an import's stamps among them); a copy's lease
    # runs from its own write (``memory_lease``).
    return replace(change, value=cell(change.value), vectors=cell(change.vectors), written=sent if moved else change.written)
