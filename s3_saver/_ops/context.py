"""What every operation needs: layout, call builders, serializer, settings, caches."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from s3_saver._crypto.keys import Crypt
from s3_saver._crypto.sealer import PLAIN, Sealer
from s3_saver._format.entries import CheckpointEntry, Loc
from s3_saver._format.keys import KeyLayout
from s3_saver._format.pieces import Held
from s3_saver._index.base import Index
from s3_saver._ops.source import ReplicaReads
from s3_saver._transport.budget import KEY_BYTES, LOC_ITEM_BYTES, CacheBudget, key_bytes
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import ConfigurationError

# What put needs to know of a parent: its loc map, its delete generation and the
# tag of its object (the commit checks the parent is still there as known).
Known = tuple[Loc, int, str]


# Entries of the tables a decision rests on (``fixed`` in ``_transport/budget``): kept by
# count, never evicted for bytes. 4,096 ids of ~36 characters take about 1.2 MB
# per table (``budget.key_bytes``), charged to the budget as they fill.
_FIXED_ENTRIES = 4096


class LocCache:
    """Remembers ``loc`` maps (and generations) of recently seen checkpoints.

    A checkpoint item never changes, so an entry never goes stale while its
    thread exists; ``put`` uses it to point unchanged channels at the object
    that already holds them without reading the parent item first. A delete
    in another process is caught by the commit's fence on the generation
    kept here (or by the thread's record, read when it is not known).

    The loc maps are charged to the cache budget: one evicted is read again
    from the index (``put`` reads its parent; ``_joins`` asks the index). The
    generation per thread is a fence: a count bound only (``fixed``).
    """

    def __init__(self, budget: CacheBudget | None = None) -> None:
        budget = budget if budget is not None else CacheBudget()
        self._data = budget.cache("locs")
        # Per thread, the generation of the checkpoint last put here (its newest).
        self._gens = budget.cache("gens", entries=_FIXED_ENTRIES, fixed=True)

    def get(self, key: tuple[str, str, str]) -> Known | None:
        return self._data.get(key)  # type: ignore[no-any-return]

    def put(self, key: tuple[str, str, str], known: Known) -> None:
        with self._data.lock:
            self._data.put(key, known, key_bytes(key) + LOC_ITEM_BYTES * len(known[0]))
            self._gens.put(key[0], known[1], key_bytes(key[0]))

    def thread_gen(self, thread_id: str) -> int | None:
        """The generation of the thread's checkpoint this process put or read last."""
        return self._gens.get(thread_id)  # type: ignore[no-any-return]

    def forget_thread(self, thread_id: str) -> None:
        """Drop the thread's loc maps. The generation last seen stays: the writes
        of a run still in flight here fence on it after a delete, prune, archive
        or restore (none of which lowers it), and a newer one refuses them unless
        their checkpoint is there (``commit._joins``); forgotten, they would read the
        newest and be taken into it."""
        with self._data.lock:
            for key in [k for k in self._data.keys() if k[0] == thread_id]:  # type: ignore[index]
                self._data.pop(key)


class Starting:
    """Runs this process starts afresh on a thread: its first checkpoint (root
    namespace, no parent) being put, or put already, in a generation. LangGraph
    sends the writes of a run's steps before their checkpoints' puts land (each
    put waits for the previous one); they belong where the run's first
    checkpoint went (see ``commit._joins``). A decision rests on it: a count
    bound only (``fixed``)."""

    def __init__(self, budget: CacheBudget | None = None) -> None:
        budget = budget if budget is not None else CacheBudget()
        self._putting: dict[str, int] = {}  # puts under way: as many as the calls in flight
        self._began = budget.cache("began", entries=_FIXED_ENTRIES, fixed=True)  # thread -> generation
        self._lock = self._began.lock

    def add(self, thread_id: str) -> None:
        with self._lock:
            self._putting[thread_id] = self._putting.get(thread_id, 0) + 1

    def done(self, thread_id: str, gen: int | None) -> None:
        """The put ended: committed into ``gen``, or refused (None)."""
        with self._lock:
            left = self._putting.get(thread_id, 0) - 1
            if left > 0:
                self._putting[thread_id] = left
            else:
                self._putting.pop(thread_id, None)
            if gen is not None:
                self._began.put(thread_id, gen, key_bytes(thread_id))

    def began(self, thread_id: str, gen: int) -> bool:
        """Whether this process is starting the thread, or started it in ``gen``."""
        with self._lock:
            return thread_id in self._putting or self._began.get(thread_id) == gen


class WriteSlots:
    """The pending-write slots ((task_id, part)) of recently seen checkpoints:
    those this process wrote or read. A checkpoint put after them names its
    parent's in its entry (``CheckpointEntry.parent_writes``), at no request:
    LangGraph makes a child from writes its process wrote or loaded. Charged
    to the cache budget: a checkpoint whose parent's slots were evicted names
    none (unknown, as from a process that never saw them)."""

    def __init__(self, budget: CacheBudget | None = None) -> None:
        self._data = (budget if budget is not None else CacheBudget()).cache("slots")

    def get(self, key: tuple[str, str, str]) -> frozenset[tuple[str, str]] | None:
        return self._data.get(key)  # type: ignore[no-any-return]

    def add(self, key: tuple[str, str, str], slots: Any) -> frozenset[tuple[str, str]]:
        """Adds ``slots`` (the key is known from now on); returns those that are new."""
        with self._data.lock:
            had = self._data.get(key) or frozenset()
            new = frozenset(slots) - had
            self._put(key, had | new)
            return new

    def discard(self, key: tuple[str, str, str], slots: frozenset[tuple[str, str]]) -> None:
        with self._data.lock:
            had = self._data.get(key)
            if had is not None:
                self._put(key, had - slots)

    def _put(self, key: tuple[str, str, str], slots: frozenset[tuple[str, str]]) -> None:
        size = key_bytes(key) + sum(key_bytes(s) for s in slots)
        self._data.put(key, slots, size)


class Noted:
    """Hints this process has written or seen written, each written once: the
    (run, thread) pairs, and the (thread, generation) pairs listed. One
    forgotten is written again (an immutable object, or an idempotent item):
    a count bound only (``fixed``)."""

    def __init__(self, budget: CacheBudget | None = None, kind: str = "noted") -> None:
        self._data = (budget if budget is not None else CacheBudget()).cache(kind, entries=_FIXED_ENTRIES, fixed=True)

    def __contains__(self, pair: tuple[str, Any]) -> bool:
        return pair in self._data

    def add(self, pair: tuple[str, Any]) -> None:
        self._data.put(pair, None, key_bytes(pair))


class Archives:
    """Archived threads this process has read, decoded (an archive object never
    changes: a key names one content): the next read of the thread costs one
    index request and no GET. Charged to the cache budget by what each holds
    (``ArchiveIndex.size``); one evicted is read again (one GET)."""

    def __init__(self, budget: CacheBudget | None = None) -> None:
        self._data = (budget if budget is not None else CacheBudget()).cache("archives")

    def get(self, key: str) -> Index | None:
        return self._data.get(key)  # type: ignore[no-any-return]

    def put(self, key: str, index: Index) -> None:
        self._data.put(key, index, getattr(index, "size", 0) + key_bytes(key))


@dataclass
class Context:
    layout: KeyLayout
    s3: S3Calls
    index: Index
    serde: SerializerProtocol
    inline_threshold: int
    ttl_seconds: int | None
    # Lists that extend their parent's value are stored as deltas (see ``_format/pieces``).
    list_deltas: bool = True
    # The saver's one cache budget (``_transport/budget``): every cache below is charged to
    # it, and the manifest index's too (``sites.make_site`` gives it the same).
    budget: CacheBudget = field(default_factory=CacheBudget)
    # Made from ``budget`` when not given (``dataclasses.replace`` passes them on).
    locs: LocCache = None  # type: ignore[assignment]
    noted: Noted = None  # type: ignore[assignment]
    listed: Noted = None  # type: ignore[assignment]
    # (thread, day) activity entries this process wrote or saw recorded (``_ops/idle``).
    active: Noted = None  # type: ignore[assignment]
    archives: Archives = None  # type: ignore[assignment]
    starting: Starting = None  # type: ignore[assignment]
    # List values last written or read, the bases of deltas (see ``_format/pieces``).
    lists: HeldLists = None  # type: ignore[assignment]
    slots: WriteSlots = None  # type: ignore[assignment]
    # Set for a replica region's reads: lag-safe (``_ops/lagged.py``).
    replica: ReplicaReads | None = None
    # The site's index-mode check (``mode.ModeMark``): admin calls settle it
    # first (``mode.settle_mode``); None in contexts made without a site.
    mode: Any = None
    # The saver's encryption (``encryption=``; None: none), and what an operation seals
    # and opens its threads' content with: the keys it loaded (``_ops/keyed``), carried
    # in its own copy of the context. Every stored byte string of user content goes
    # through ``sealer`` (objects, index bodies and metadata).
    crypt: Crypt | None = None
    sealer: Sealer = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.sealer is None or (self.sealer is PLAIN and self.crypt is not None):
            self.sealer = self.crypt.sealer() if self.crypt is not None else PLAIN
        b = self.budget
        if self.locs is None:
            self.locs = LocCache(b)
        if self.noted is None:
            self.noted = Noted(b, "noted")
        if self.listed is None:
            self.listed = Noted(b, "listed")
        if self.active is None:
            self.active = Noted(b, "active")
        if self.archives is None:
            self.archives = Archives(b)
        if self.starting is None:
            self.starting = Starting(b)
        if self.lists is None:
            self.lists = HeldLists(b)
        if self.slots is None:
            self.slots = WriteSlots(b)

    def now(self) -> int:
        return int(time.time())

    def expired(self, entry: CheckpointEntry) -> bool:
        # DynamoDB deletes expired items lazily (up to days later): never serve them.
        return entry.expires_at is not None and entry.expires_at <= self.now()


def meta_key(ctx: Context, thread_id: str, ns: str, checkpoint_id: str) -> str:
    """The place an index entry's metadata is sealed for: the checkpoint's object key
    without a tag (every form of a checkpoint has the same metadata)."""
    return ctx.layout.checkpoint_key(thread_id, ns, checkpoint_id)


def target(config: Any, *, need_checkpoint_id: bool = False) -> tuple[str, str, str | None]:
    """(thread_id, checkpoint_ns, checkpoint_id) of a RunnableConfig, validated."""
    configurable = (config or {}).get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        raise ConfigurationError(
            "config['configurable']['thread_id'] is required: pass "
            "{'configurable': {'thread_id': ...}} to invoke/get_state"
        )
    if isinstance(thread_id, int) and not isinstance(thread_id, bool):
        thread_id = str(thread_id)  # as the SQL savers do: 7 and "7" are one thread
    if thread_id == "":
        # An empty id would be stored as a real thread that every caller with a
        # missing id shares.
        raise ConfigurationError("config['configurable']['thread_id'] must not be empty")
    ns = configurable.get("checkpoint_ns") or ""
    checkpoint_id = configurable.get("checkpoint_id")
    if need_checkpoint_id and not checkpoint_id:
        raise ConfigurationError("config['configurable']['checkpoint_id'] is required here")
    for name, value in (("thread_id", thread_id), ("checkpoint_ns", ns), ("checkpoint_id", checkpoint_id)):
        if value is not None and not isinstance(value, str):
            raise ConfigurationError(f"{name} must be a string, got {type(value).__name__}: {value!r}")
    return thread_id, ns, checkpoint_id


class HeldLists:
    """The serialized list values this process last wrote or read, by the stored
    object that holds them, charged to the saver's cache budget. One evicted
    makes the next version of its list a keyframe (stored whole): a cost, never
    another value (a base is used only when its bytes prove the extension)."""

    def __init__(self, budget: CacheBudget | None = None) -> None:
        self._budget = budget if budget is not None else CacheBudget()
        self._data = self._budget.cache("lists")

    def get(self, key: tuple[Any, ...]) -> Held | None:
        return self._data.get(key)  # type: ignore[no-any-return]

    def put(self, key: tuple[Any, ...], held: Held) -> None:
        # A list over a quarter of the budget would push out most of what the
        # process holds: it is stored whole next time.
        if len(held.data) > self._budget.limit // 4:
            return
        self._data.put(key, held, len(held.data) + KEY_BYTES + 8 * len(held.sizes))
