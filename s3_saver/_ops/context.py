"""What every operation needs: layout, call builders, serializer, settings, caches."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from s3_saver._index.base import CheckpointEntry, Index, Loc
from s3_saver._keys import KeyLayout
from s3_saver._pieces import HeldLists
from s3_saver._replica import ReplicaReads
from s3_saver._s3 import S3Calls
from s3_saver.errors import ConfigurationError

# What put needs to know of a parent: its loc map, its delete generation and the
# tag of its object (the commit checks the parent is still there as known).
Known = tuple[Loc, int, str]


class LocCache:
    """Remembers ``loc`` maps (and generations) of recently seen checkpoints.

    A checkpoint item never changes, so an entry never goes stale while its
    thread exists; ``put`` uses it to point unchanged channels at the object
    that already holds them without reading the parent item first. A delete
    in another process is caught by the commit's fence on the generation
    kept here (or by the thread's record, read when it is not known).
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._data: OrderedDict[tuple[str, str, str], Known] = OrderedDict()
        # Per thread, the generation of the checkpoint last put here (its newest).
        self._gens: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> Known | None:
        with self._lock:
            loc = self._data.get(key)
            if loc is not None:
                self._data.move_to_end(key)
            return loc

    def put(self, key: tuple[str, str, str], known: Known) -> None:
        with self._lock:
            self._data[key] = known
            self._data.move_to_end(key)
            self._gens[key[0]] = known[1]
            self._gens.move_to_end(key[0])
            for data in (self._data, self._gens):
                while len(data) > self._size:
                    data.popitem(last=False)

    def thread_gen(self, thread_id: str) -> int | None:
        """The generation of the thread's checkpoint this process put or read last."""
        with self._lock:
            return self._gens.get(thread_id)

    def forget_thread(self, thread_id: str) -> None:
        """Drop the thread's loc maps. The generation last seen stays: the writes
        of a run still in flight here fence on it after a delete, prune, archive
        or restore (none of which lowers it), and a newer one refuses them unless
        their checkpoint is there (``put._joins``); forgotten, they would read the
        newest and be taken into it."""
        with self._lock:
            for key in [k for k in self._data if k[0] == thread_id]:
                del self._data[key]


class Starting:
    """Runs this process starts afresh on a thread: its first checkpoint (root
    namespace, no parent) being put, or put already, in a generation. LangGraph
    sends the writes of a run's steps before their checkpoints' puts land (each
    put waits for the previous one); they belong where the run's first
    checkpoint went (see ``put._joins``)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._putting: dict[str, int] = {}
        self._began: OrderedDict[str, int] = OrderedDict()  # thread -> generation
        self._lock = threading.Lock()

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
                self._began[thread_id] = gen
                self._began.move_to_end(thread_id)
                while len(self._began) > self._size:
                    self._began.popitem(last=False)

    def began(self, thread_id: str, gen: int) -> bool:
        """Whether this process is starting the thread, or started it in ``gen``."""
        with self._lock:
            return thread_id in self._putting or self._began.get(thread_id) == gen


class WriteSlots:
    """The pending-write slots ((task_id, part)) of recently seen checkpoints:
    those this process wrote or read. A checkpoint put after them names its
    parent's in its entry (``CheckpointEntry.parent_writes``), at no request:
    LangGraph makes a child from writes its process wrote or loaded."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._data: OrderedDict[tuple[str, str, str], frozenset[tuple[str, str]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> frozenset[tuple[str, str]] | None:
        with self._lock:
            return self._data.get(key)

    def add(self, key: tuple[str, str, str], slots: Any) -> frozenset[tuple[str, str]]:
        """Adds ``slots`` (the key is known from now on); returns those that are new."""
        with self._lock:
            had = self._data.get(key, frozenset())
            new = frozenset(slots) - had
            self._data[key] = had | new
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)
            return new

    def discard(self, key: tuple[str, str, str], slots: frozenset[tuple[str, str]]) -> None:
        with self._lock:
            if key in self._data:
                self._data[key] = self._data[key] - slots


class Noted:
    """Hints this process has written or seen written, each written once: the
    (run, thread) pairs, and the (thread, generation) pairs listed."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._data: OrderedDict[tuple[str, Any], None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, pair: tuple[str, Any]) -> bool:
        with self._lock:
            return pair in self._data

    def add(self, pair: tuple[str, Any]) -> None:
        with self._lock:
            self._data[pair] = None
            while len(self._data) > self._size:
                self._data.popitem(last=False)


class Archives:
    """Archived threads this process has read, decoded (an archive object never
    changes: a key names one content): the next read of the thread costs one
    index request and no GET."""

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._data: OrderedDict[str, Index] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Index | None:
        with self._lock:
            found = self._data.get(key)
            if found is not None:
                self._data.move_to_end(key)
            return found

    def put(self, key: str, index: Index) -> None:
        with self._lock:
            self._data[key] = index
            while len(self._data) > self._size:
                self._data.popitem(last=False)


@dataclass
class Context:
    layout: KeyLayout
    s3: S3Calls
    index: Index
    serde: SerializerProtocol
    inline_threshold: int
    ttl_seconds: int | None
    # Lists that extend their parent's value are stored as deltas (see ``_pieces``).
    list_deltas: bool = True
    locs: LocCache = field(default_factory=LocCache)
    noted: Noted = field(default_factory=Noted)
    listed: Noted = field(default_factory=Noted)
    # (thread, day) activity entries this process wrote or saw recorded (``_ops/idle``).
    active: Noted = field(default_factory=Noted)
    archives: Archives = field(default_factory=Archives)
    starting: Starting = field(default_factory=Starting)
    # List values last written or read, the bases of deltas (see ``_pieces``).
    lists: HeldLists = field(default_factory=HeldLists)
    slots: WriteSlots = field(default_factory=WriteSlots)
    # Set for a replica region's reads: lag-safe (``_ops/lagged.py``).
    replica: ReplicaReads | None = None

    def now(self) -> int:
        return int(time.time())

    def expired(self, entry: CheckpointEntry) -> bool:
        # DynamoDB deletes expired items lazily (up to days later): never serve them.
        return entry.expires_at is not None and entry.expires_at <= self.now()


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
