"""The reference model, and the search for an order of a schedule's operations that explains what was read.

Thread contents live in LangGraph's ``InMemorySaver`` (fed the committed calls:
``put``, ``put_writes``), plus what it lacks: prune, delete_for_runs, copy,
export/import, the tombstones that make a continued run of a deleted thread
fail, the runs marked deleted.

A checkpoint may be *maybe* present: an operation that changes many entries in
several requests (prune, delete_for_runs, copy, import) and was cut short and
abandoned may have removed or written part of them, each entry whole (never a
half-readable checkpoint). A maybe entry, when read, must equal the model's.

Each model operation maps (state, what the real operation answered) to the
states it may lead to; none means the answer is impossible in that order.
:func:`linearize` tries every order that respects real time (A before B when A
answered before B's first call), with an abandoned operation either never
taking effect or taking effect at any point after it started.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

from s3_saver.errors import (
    ConfigurationError,
    EncryptedObjectError,
    MissingObjectError,
    PlaintextObjectError,
    RunDeletedError,
    ThreadArchivedError,
    ThreadDeletedError,
    ThreadErasedError,
)

Key = tuple[str, str]  # (checkpoint_ns, checkpoint_id)


# -- normal form of what a read returns -------------------------------------------------
def norm_writes(writes: Any) -> tuple:
    return tuple(sorted(((w[0], w[1], w[2]) for w in writes or ()), key=lambda w: (w[0], w[1], repr(w[2]))))


def norm(t: Any) -> tuple[Key, dict[str, Any]]:
    """A CheckpointTuple as (key, comparable payload)."""
    conf = t.config["configurable"]
    parent = (t.parent_config or {}).get("configurable", {}).get("checkpoint_id") if t.parent_config else None
    return (conf.get("checkpoint_ns", ""), conf["checkpoint_id"]), {
        "thread_id": conf["thread_id"],
        "checkpoint": t.checkpoint,
        "metadata": t.metadata,
        "parent": parent,
        "pending_writes": norm_writes(t.pending_writes),
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two payloads (for messages)."""
    out = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            if k == "checkpoint":
                ca, cb = a.get(k) or {}, b.get(k) or {}
                for ck in sorted(set(ca) | set(cb)):
                    if ca.get(ck) != cb.get(ck):
                        out.append(f"checkpoint[{ck!r}]: saver {_short(ca.get(ck))} != model {_short(cb.get(ck))}")
            else:
                out.append(f"{k}: saver {_short(a.get(k))} != model {_short(b.get(k))}")
    return out


def _short(v: Any, n: int = 300) -> str:
    text = repr(v)
    return text if len(text) <= n else text[:n] + "..."


# -- the state ------------------------------------------------------------------------------
class ModelState:
    def __init__(self) -> None:
        self.mem = InMemorySaver()
        self.maybe: set[tuple[str, str, str]] = set()
        self.tombs: dict[str, set[str]] = defaultdict(set)  # ids written before the thread's last delete
        self.ever: dict[str, set[str]] = defaultdict(set)  # ids ever committed
        # Runs deleted by delete_for_runs: (run, thread) for each thread the run had
        # committed a checkpoint to (its next put there must raise RunDeletedError);
        # a put of a deleted run in a thread it never wrote to may go either way.
        self.deleted_runs: set[tuple[str, str]] = set()
        self.deleted_run_ids: set[str] = set()
        self.run_threads: set[tuple[str, str]] = set()
        self.exports: dict[Any, Any] = {}
        # Archived threads: reads as before, but prune, delete_for_runs and copy_thread
        # refuse them (ThreadArchivedError: restore first); a write restores first.
        self.archived: set[str] = set()

    def clone(self) -> ModelState:
        new = ModelState.__new__(ModelState)
        mem = InMemorySaver(serde=self.mem.serde)
        for t, spaces in self.mem.storage.items():
            if spaces:
                mem.storage[t] = defaultdict(dict, {ns: dict(cps) for ns, cps in spaces.items()})
        for k, v in self.mem.writes.items():
            mem.writes[k] = dict(v)
        mem.blobs.update(self.mem.blobs)
        new.mem = mem
        new.maybe = set(self.maybe)
        new.tombs = defaultdict(set, {k: set(v) for k, v in self.tombs.items()})
        new.ever = defaultdict(set, {k: set(v) for k, v in self.ever.items()})
        new.deleted_runs = set(self.deleted_runs)
        new.deleted_run_ids = set(self.deleted_run_ids)
        new.run_threads = set(self.run_threads)
        new.exports = dict(self.exports)
        new.archived = set(self.archived)
        return new

    # -- reading ----------------------------------------------------------------
    def keys(self, t: str) -> list[Key]:
        spaces = self.mem.storage.get(t, {})
        return [(ns, cid) for ns, cps in spaces.items() for cid in cps]

    def present(self, t: str, ns: str, cid: str) -> bool:
        return cid in self.mem.storage.get(t, {}).get(ns, {})

    def is_maybe(self, t: str, ns: str, cid: str) -> bool:
        return (t, ns, cid) in self.maybe

    def certain(self, t: str) -> list[Key]:
        return [k for k in self.keys(t) if (t, *k) not in self.maybe]

    def empty(self, t: str) -> bool:
        """No checkpoint for sure (maybe ones aside)."""
        return not self.certain(t)

    def nothing(self, t: str) -> bool:
        return not self.keys(t)

    def metadata(self, t: str, ns: str, cid: str) -> dict[str, Any]:
        return self.mem.serde.loads_typed(self.mem.storage[t][ns][cid][1])

    def view(self, t: str) -> dict[Key, dict[str, Any]]:
        """Every checkpoint of the thread, as reads must return it."""
        if t not in self.mem.storage:
            return {}
        return dict(norm(x) for x in self.mem.list({"configurable": {"thread_id": t}}))

    def ordered(self, t: str, ns: str | None = None) -> list[tuple[Key, dict[str, Any], bool]]:
        """(key, payload, maybe) in the saver's list order: namespaces descending,
        newest first within each."""
        view = self.view(t)
        keys = sorted(view, key=lambda k: (k[0], k[1]), reverse=True)
        return [(k, view[k], (t, *k) in self.maybe) for k in keys if ns is None or k[0] == ns]

    # -- changing -----------------------------------------------------------------
    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> None:
        t = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        self.mem.put(config, checkpoint, metadata, new_versions)
        self.ever[t].add(checkpoint["id"])
        self.run_threads.add((metadata.get("run_id"), t))
        self.archived.discard(t)  # a write to an archived thread restores it first
        self.maybe.discard((t, ns, checkpoint["id"]))

    def remove(self, t: str, ns: str, cid: str) -> None:
        spaces = self.mem.storage.get(t)
        if spaces is not None and ns in spaces:
            spaces[ns].pop(cid, None)
            if not spaces[ns]:
                del spaces[ns]
        if t in self.mem.storage and not self.mem.storage[t]:
            del self.mem.storage[t]
        self.mem.writes.pop((t, ns, cid), None)
        self.maybe.discard((t, ns, cid))

    def snapshot(self, t: str) -> dict[str, Any]:
        """What an export holds: the thread's entries, writes and values."""
        return {
            "storage": {ns: dict(cps) for ns, cps in self.mem.storage.get(t, {}).items()},
            "writes": {k[1:]: dict(v) for k, v in self.mem.writes.items() if k[0] == t},
            "blobs": {k[1:]: v for k, v in self.mem.blobs.items() if k[0] == t},
            "maybe": {(ns, cid) for (tt, ns, cid) in self.maybe if tt == t},
        }

    def install(self, dst: str, snap: dict[str, Any], *, partial: bool) -> None:
        """``dst`` becomes ``snap`` (copy, import); partial: each entry maybe written."""
        for ns, cps in snap["storage"].items():
            for cid, value in cps.items():
                self.mem.storage[dst][ns][cid] = value
                self.ever[dst].add(cid)
                self.run_threads.add((self.mem.serde.loads_typed(value[1]).get("run_id"), dst))
                if partial or (ns, cid) in snap["maybe"]:
                    self.maybe.add((dst, ns, cid))
        for (ns, cid), w in snap["writes"].items():
            self.mem.writes[(dst, ns, cid)] = dict(w)
        for k, v in snap["blobs"].items():
            self.mem.blobs[(dst, *k)] = v

    def delete_thread(self, t: str) -> None:
        self.tombs[t] |= self.ever[t] | {cid for _, cid in self.keys(t)}
        self.mem.delete_thread(t)
        self.maybe = {m for m in self.maybe if m[0] != t}
        self.run_threads = {rt for rt in self.run_threads if rt[1] != t}
        self.archived.discard(t)

    def fingerprint(self) -> Any:
        return (
            tuple(sorted((t, ns, cid, v) for t, sp in self.mem.storage.items() for ns, cps in sp.items() for cid, v in cps.items())),
            tuple(sorted((k, tuple(sorted(v.items()))) for k, v in self.mem.writes.items() if v)),
            tuple(sorted(self.maybe)),
            tuple(sorted((t, tuple(sorted(v))) for t, v in self.tombs.items() if v)),
            tuple(sorted(self.deleted_runs)),
            tuple(sorted(self.deleted_run_ids)),
            tuple(sorted(self.run_threads)),
            tuple(sorted(self.archived)),
            tuple(sorted((t, tuple(sorted(v))) for t, v in self.ever.items() if v)),
            tuple(sorted(map(repr, self.mem.blobs))),
            tuple(sorted((repr(k), _canon(v)) for k, v in self.exports.items())),
        )


def _canon(value: Any) -> Any:
    """A hashable, order-independent form of nested dicts/sets (for fingerprints)."""
    if isinstance(value, dict):
        return tuple(sorted(((repr(k), _canon(v)) for k, v in value.items()), key=lambda kv: kv[0]))
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(v) for v in value))
    return value


# -- matching reads against the model ------------------------------------------------------
def match_list(observed: list[tuple[Key, dict]], expected: list[tuple[Key, dict, bool]], limit: int | None) -> str | None:
    """None when ``observed`` is ``expected`` with some maybe entries left out
    (then cut to ``limit``); else what differs."""
    j = 0
    taken = 0
    for key, payload, maybe in expected:
        if limit is not None and taken >= limit:
            break
        if j < len(observed) and observed[j][0] == key:
            if observed[j][1] != payload:
                return f"{key}: " + "; ".join(differences(observed[j][1], payload))
            j += 1
            taken += 1
        elif not maybe:
            got = observed[j][0] if j < len(observed) else "(end)"
            return f"expected {key} at position {j}, the saver returned {got}"
    if j < len(observed):
        return f"unexpected {observed[j][0]} at position {j}"
    return None


def list_expected(state: ModelState, t: str, ns: str | None, filter: dict | None, before: str | None) -> list[tuple[Key, dict, bool]]:
    rows = state.ordered(t, ns)
    out = []
    for key, payload, maybe in rows:
        if before is not None and not key[1] < before:
            continue
        if filter and not all(payload["metadata"].get(k, _ABSENT) == v for k, v in filter.items()):
            continue
        out.append((key, payload, maybe))
    return out


_ABSENT = object()


def compare_thread(state: ModelState, t: str, observed: dict[Key, dict]) -> list[str]:
    """Differences between a thread as read and the model (maybe-aware)."""
    view = state.view(t)
    out = []
    for key, payload in view.items():
        maybe = (t, *key) in state.maybe
        if key not in observed:
            if not maybe:
                out.append(f"{t} {key}: in the model, not in the saver")
        elif observed[key] != payload:
            out.append(f"{t} {key}: " + "; ".join(differences(observed[key], payload)))
    for key in observed:
        if key not in view:
            out.append(f"{t} {key}: in the saver, not in the model")
    return out


# -- model operations -----------------------------------------------------------------------
@dataclass
class Ctx:
    """What a model operation may need to know of the whole schedule."""

    archiving: set[str] = field(default_factory=set)  # threads an archive_thread of the schedule touches
    # Threads that a delete_thread, delete_for_runs or prune of the schedule takes
    # checkpoints from: an operation reading one of them may meet an object
    # deleted under it and raise MissingObjectError ("seen while a thread is being
    # deleted"), with no effect.
    deleting: set[str] = field(default_factory=set)
    # Threads that two archive_thread of the schedule archive: one may find the
    # live objects the other already moved (MissingObjectError, no effect).
    rearchiving: set[str] = field(default_factory=set)
    # The archive_thread operations of the schedule (scheduler.LogicalOp), by thread:
    # what tells an archive in progress during another operation from one over.
    archive_ops: dict[str, list[Any]] = field(default_factory=dict)
    # The erase_thread operations of the schedule, by thread (encrypted worlds: see _erase_raced).
    erase_ops: dict[str, list[Any]] = field(default_factory=dict)
    # The encrypt_thread operations of the schedule, by thread (see plain_refused), and the
    # writes of its processes without encryption, by thread (see plain_met).
    migrate_ops: dict[str, list[Any]] = field(default_factory=dict)
    plain_writes: dict[str, list[Any]] = field(default_factory=dict)
    plain_setup: bool = False

    def archiving_during(self, t: str, op: Any) -> bool:
        """Whether an archive of ``t`` may be in progress (its mark set) while
        ``op`` runs: one that had not answered when ``op`` began (or never did:
        a cut leaves its mark), and began before ``op`` answered. Without
        ``op`` (the setup), or for a schedule's archives not listed: any."""
        if op is None or t not in self.archive_ops:
            return t in self.archiving
        return any(
            a.start is not None
            and (a.end is None or op.start is None or a.end >= op.start)
            and (op.end is None or a.start <= op.end)
            for a in self.archive_ops[t]
        )


def _raced(value: Any, t: str, ctx: Ctx) -> bool:
    return isinstance(value, MissingObjectError) and t in ctx.deleting


def _erase_raced(value: Any, t: str, op: Any, ctx: Ctx) -> bool:
    """With encryption: ThreadErasedError from an operation on ``t`` while an erase of
    ``t`` was under way (it destroys the key first, then deletes; a write is refused
    until it has) or had been cut short (abandoned: until it is called again). Never
    after an erase answered: then the thread reads as deleted, and a write starts its
    new life. Without ``op`` (the setup): never."""
    if not isinstance(value, ThreadErasedError) or op is None:
        return False
    return any(
        e.start is not None
        and (op.end is None or e.start <= op.end)
        and (e.end is None or op.start is None or e.end >= op.start)
        for e in ctx.erase_ops.get(t, ())
    )


class ModelOp:
    name = "?"
    threads: tuple[str, ...] = ()
    last_reason: str | None = None  # why the last answer was impossible (reads)

    def apply(self, state: ModelState, outcome: tuple[str, Any], op: Any, ctx: Ctx) -> list[ModelState]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.name}{self.threads}"


def _same(state: ModelState) -> list[ModelState]:
    return [state]


def _restored(state: ModelState, t: str) -> list[ModelState]:
    """A write to an archived thread restores it first: that part may have happened alone."""
    if t not in state.archived:
        return []
    s = state.clone()
    s.archived.discard(t)
    return [s]


class Put(ModelOp):
    name = "put"

    def __init__(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> None:
        self.config, self.checkpoint, self.metadata, self.new_versions = config, checkpoint, metadata, new_versions
        c = config["configurable"]
        self.t, self.ns, self.parent = c["thread_id"], c.get("checkpoint_ns", ""), c.get("checkpoint_id")
        self.threads = (self.t,)

    def _applied(self, state: ModelState) -> ModelState:
        s = state.clone()
        s.put(self.config, self.checkpoint, self.metadata, self.new_versions)
        return s

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        run = self.metadata.get("run_id")
        run_deleted = (run, self.t) in state.deleted_runs
        run_maybe = run in state.deleted_run_ids and not run_deleted
        tomb = self.parent is not None and self.parent in state.tombs.get(self.t, ())
        parent_gone = self.parent is not None and (
            not state.present(self.t, self.ns, self.parent) or state.is_maybe(self.t, self.ns, self.parent)
        )
        if kind == "ok":
            c = (value or {}).get("configurable", {})
            if (c.get("thread_id"), c.get("checkpoint_ns", ""), c.get("checkpoint_id")) != (self.t, self.ns, self.checkpoint["id"]):
                return []
            return [] if run_deleted or tomb else [self._applied(state)]
        if kind == "abandoned":
            return _restored(state, self.t) + ([] if run_deleted or tomb else [self._applied(state)])
        allowed = False
        if isinstance(value, RunDeletedError):
            allowed = run_deleted or run_maybe or parent_gone
        elif isinstance(value, ThreadDeletedError):
            allowed = tomb or parent_gone or run_deleted
        elif isinstance(value, ThreadArchivedError):
            allowed = self.t in ctx.archiving
        elif _raced(value, self.t, ctx):
            allowed = True  # an object of the thread deleted under it (a wrong type, but no harm)
        elif _erase_raced(value, self.t, op, ctx) or plain_refused(value, self.t, op, ctx):
            allowed = True
        if not allowed:
            return []
        out = [state] + _restored(state, self.t)
        if op is not None and op.retried and not run_deleted and not tomb:
            out.append(self._applied(state))  # an earlier attempt committed it
        return out


class PutWrites(ModelOp):
    name = "put_writes"

    def __init__(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self.config, self.writes, self.task_id, self.task_path = config, writes, task_id, task_path
        c = config["configurable"]
        self.t, self.ns, self.cid = c["thread_id"], c.get("checkpoint_ns", ""), c["checkpoint_id"]
        self.threads = (self.t,)

    def _applied(self, state: ModelState) -> ModelState:
        s = state.clone()
        s.mem.put_writes(self.config, self.writes, self.task_id, self.task_path)
        s.archived.discard(self.t)
        return s

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        tomb = self.cid in state.tombs.get(self.t, ())
        gone = not state.present(self.t, self.ns, self.cid) or state.is_maybe(self.t, self.ns, self.cid)
        if kind in ("ok", "abandoned"):
            if tomb:
                # A pending write for a checkpoint of the deleted history answers
                # "ok" only when it committed before the delete (which removed it):
                # after the delete it is refused (ThreadDeletedError), never taken
                # into the new generation (issue 33; check (e) looks for it in the
                # index, since no read shows it).
                return [state] + (_restored(state, self.t) if kind == "abandoned" else [])
            done = self._applied(state)
            if self.t not in state.archived:
                return [done]
            # Whether a pending write restores an archived thread first is not said.
            kept = done.clone()
            kept.archived.add(self.t)
            return [done, kept] + (_restored(state, self.t) if kind == "abandoned" else [])
        if isinstance(value, ThreadDeletedError):
            allowed = tomb or gone
        elif isinstance(value, ThreadArchivedError):
            allowed = self.t in ctx.archiving
        else:
            allowed = _raced(value, self.t, ctx) or _erase_raced(value, self.t, op, ctx) or plain_refused(value, self.t, op, ctx)
        if not allowed:
            return []
        out = [state] + _restored(state, self.t)
        if op is not None and op.retried and not tomb:
            out.append(self._applied(state))
        return out


class Prune(ModelOp):
    name = "prune"

    def __init__(self, thread_ids: list[str], keep_last: int | None) -> None:
        self.thread_ids, self.keep = list(thread_ids), keep_last or 1
        self.threads = tuple(thread_ids)

    def _effect(self, state: ModelState, partial: bool, skip: set[str] = frozenset()) -> ModelState:
        s = state.clone()
        for t in self.thread_ids:
            if t in skip:
                continue
            by_ns: dict[str, list[str]] = defaultdict(list)
            for ns, cid in s.keys(t):
                by_ns[ns].append(cid)
            for ns, cids in by_ns.items():
                certain = maybe = 0
                for cid in sorted(cids, reverse=True):
                    was_maybe = s.is_maybe(t, ns, cid)
                    if certain + maybe < self.keep:
                        pass  # kept whichever the maybe ones turned out
                    elif certain >= self.keep:
                        if partial:
                            s.maybe.add((t, ns, cid))
                        else:
                            s.remove(t, ns, cid)
                    else:
                        s.maybe.add((t, ns, cid))  # kept or not, as the maybe ones above it
                    if was_maybe:
                        maybe += 1
                    else:
                        certain += 1
        return s

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        archived = [t for t in self.thread_ids if t in state.archived]
        if kind == "raised" and isinstance(value, ThreadArchivedError) and not archived:
            racing = [t for t in self.thread_ids if t in ctx.archiving]
            if racing:  # an archive of it in progress (marked): refused
                return [state, self._effect(state, True, skip=set(racing))]
        if archived:
            # "prune refuses an archived thread": nothing of it changes (others may).
            if kind == "raised" and isinstance(value, ThreadArchivedError):
                return [state, self._effect(state, True, skip=set(archived))]
            return [state] if kind == "abandoned" else []
        if kind == "ok":
            return [self._effect(state, False)]
        if kind == "abandoned":
            return [self._effect(state, False), self._effect(state, True)]
        if any(_erase_raced(value, t, op, ctx) for t in self.thread_ids):
            return [state, self._effect(state, True)]  # it met a thread being erased: any part done
        if any(plain_met(value, t, op, ctx) for t in self.thread_ids):
            return [state]  # refused at its read, before any delete
        return []


class DeleteForRuns(ModelOp):
    name = "delete_for_runs"

    def __init__(self, run_ids: list[str], threads: tuple[str, ...]) -> None:
        self.run_ids = list(run_ids)
        self.threads = threads

    def _holders(self, state: ModelState) -> set[str]:
        return {t for t in state.mem.storage for ns, cid in state.keys(t) if state.metadata(t, ns, cid).get("run_id") in self.run_ids}

    def _effect(self, state: ModelState, partial: bool, skip: set[str] = frozenset()) -> ModelState:
        s = state.clone()
        s.deleted_run_ids |= set(self.run_ids)
        s.deleted_runs |= {(r, t) for (r, t) in s.run_threads if r in self.run_ids and t not in skip}
        for t in list(s.mem.storage):
            if t in skip:
                continue
            for ns, cid in s.keys(t):
                if s.metadata(t, ns, cid).get("run_id") in self.run_ids:
                    if partial:
                        s.maybe.add((t, ns, cid))
                    else:
                        s.remove(t, ns, cid)
        return s

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        archived = self._holders(state) & state.archived
        if kind == "raised" and isinstance(value, ThreadArchivedError) and not archived:
            # Only while an archive of it is in progress: a thread archived and
            # restored since (by another process) is live (issue 32).
            racing = {t for t in self._holders(state) & ctx.archiving if ctx.archiving_during(t, op)}
            if racing:  # an archive in progress (marked): refused
                return [state, self._effect(state, True, skip=racing)]
        if archived:
            # "delete_for_runs refuses an archived thread" (the others may be done, and the runs marked).
            if kind == "raised" and isinstance(value, ThreadArchivedError):
                return [state, self._effect(state, True, skip=archived)]
            if kind == "abandoned":
                return [self._effect(state, True, skip=archived)]
            return []
        if kind == "ok":
            return [self._effect(state, False)]
        if kind == "abandoned":
            return [self._effect(state, False), self._effect(state, True)]
        if any(_erase_raced(value, t, op, ctx) for t in self.threads):
            return [state, self._effect(state, True)]  # it met a thread being erased: any part done
        if any(plain_met(value, t, op, ctx) for t in self.threads):
            return [state, self._effect(state, True)]  # any thread before it done
        return []


class CopyThread(ModelOp):
    name = "copy_thread"

    def __init__(self, src: str, dst: str) -> None:
        self.src, self.dst = src, dst
        self.threads = (src, dst)

    def _effect(self, state: ModelState, partial: bool) -> ModelState:
        s = state.clone()
        s.install(self.dst, s.snapshot(self.src), partial=partial)
        return s

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        if self.src in state.archived and kind == "raised" and isinstance(value, ThreadArchivedError):
            # README: "copy_thread copies it from its archive (the source stays archived)";
            # an archive in a class that cannot be read at once refuses.
            return [state]
        if not state.nothing(self.dst):
            return [state] if kind == "raised" and isinstance(value, ConfigurationError) else []
        if kind == "ok":
            return [self._effect(state, False)]
        if kind == "abandoned":
            return [self._effect(state, False), self._effect(state, True)]
        if _raced(value, self.src, ctx) or _erase_raced(value, self.src, op, ctx) or (
            isinstance(value, (MissingObjectError, ThreadArchivedError)) and self.src in ctx.archiving
        ):
            # Its source changed under it (deleted, or moved to an archive: "refused").
            return [state, self._effect(state, True)]  # objects first: none or some entries
        if isinstance(value, ConfigurationError):
            out = []
            if state.empty(self.src):
                out.append(state)
            if op is not None and op.retried:
                out.append(self._effect(state, False))
            return out
        return []


class ArchiveThread(ModelOp):
    name = "archive_thread"

    def __init__(self, t: str) -> None:
        self.t = t
        self.threads = (t,)

    def _archived(self, state: ModelState) -> ModelState:
        s = state.clone()
        s.archived.add(self.t)
        return s

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        if kind == "ok":
            return [] if state.nothing(self.t) else [self._archived(state)]
        if kind == "abandoned":
            return [self._archived(state)]
        if isinstance(value, ThreadArchivedError) or _raced(value, self.t, ctx) or (
            isinstance(value, MissingObjectError) and self.t in ctx.rearchiving
        ):
            return [state]  # "the thread changed while it was read: call again"
        if _erase_raced(value, self.t, op, ctx):
            return [state]
        if isinstance(value, ConfigurationError) and state.empty(self.t):
            return [state]
        return []


class ArchiveIdle(ModelOp):
    """archive_idle: archives the threads its report names (any of the prefix's:
    ``threads`` is the scenario's list, complete once it is built). To readers
    nothing changes; prune, delete_for_runs and copy_thread then refuse them."""

    name = "archive_idle"

    def __init__(self, threads: list[str]) -> None:
        self._threads = threads

    @property
    def threads(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self._threads)

    def _archived(self, state: ModelState, ts: Any) -> ModelState:
        s = state.clone()
        s.archived.update(ts)
        return s

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        if kind == "ok":
            named = {status.thread_id for status in value}
            return [] if any(state.nothing(t) for t in named) else [self._archived(state, named)]
        may = [t for t in self.threads if not state.nothing(t) and t not in state.archived]
        # Cut short, or a thread's live objects moved or went under an archive's
        # read (another archive, a delete): any of them may have been archived first.
        if kind == "abandoned" or (
            isinstance(value, MissingObjectError) and any(t in ctx.deleting or t in ctx.rearchiving for t in self.threads)
        ):
            subsets = [[t for i, t in enumerate(may) if mask >> i & 1] for mask in range(1 << len(may))]
            return [self._archived(state, sub) for sub in subsets]
        return []


class RestoreThread(ModelOp):
    name = "restore_thread"

    def __init__(self, t: str) -> None:
        self.t = t
        self.threads = (t,)

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        s = state.clone()
        s.archived.discard(self.t)
        if kind == "ok":
            return [s] if getattr(value, "state", "live") == "live" else []
        if kind == "abandoned":
            return [s]
        if isinstance(value, ConfigurationError) and state.empty(self.t):
            return [state]
        if _erase_raced(value, self.t, op, ctx):
            return [state, s]
        return []


class ExportThread(ModelOp):
    name = "export_thread"

    def __init__(self, t: str, slot: Any) -> None:
        self.t, self.slot = t, slot
        self.threads = (t,)

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        if kind == "ok":
            if state.nothing(self.t):
                return []
            s = state.clone()
            s.exports[self.slot] = s.snapshot(self.t)
            return [s]
        if kind == "abandoned" or _raced(value, self.t, ctx) or _erase_raced(value, self.t, op, ctx):
            return [state]
        if isinstance(value, MissingObjectError) and self.t in ctx.archiving:
            return [state]  # the live objects moved to the archive while it read them
        if isinstance(value, ConfigurationError) and state.empty(self.t):
            return [state]
        return []


class ImportThread(ModelOp):
    name = "import_thread"

    def __init__(self, dst: str, slot: Any, src: str | None = None) -> None:
        self.dst, self.slot, self.src = dst, slot, src
        self.threads = (dst,)

    def _effect(self, state: ModelState, partial: bool) -> ModelState:
        s = state.clone()
        s.install(self.dst, s.exports[self.slot], partial=partial)
        return s

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        if self.slot not in state.exports:
            return []
        if not state.nothing(self.dst):
            return [state] if kind == "raised" and isinstance(value, ConfigurationError) else []
        if kind == "ok":
            return [self._effect(state, False)] if value == self.dst else []
        if kind == "abandoned":
            return [self._effect(state, False), self._effect(state, True)]
        if isinstance(value, ConfigurationError) and op is not None and op.retried:
            return [self._effect(state, False)]
        if isinstance(value, ThreadErasedError) and op is not None and self.src is not None and any(
            e.start is not None and (op.end is None or e.start <= op.end) for e in ctx.erase_ops.get(self.src, ())
        ):
            # An encrypted export is bound to its thread's key: once an erase of the
            # exported thread has begun, the export opens nowhere (nothing written).
            return [state]
        return []


class CollectGarbage(ModelOp):
    name = "collect_garbage"

    def apply(self, state, outcome, op, ctx):
        return [state] if outcome[0] in ("ok", "abandoned") else []


class DeleteThread(ModelOp):
    name = "delete_thread"

    def __init__(self, t: str) -> None:
        self.t = t
        self.threads = (t,)

    def apply(self, state, outcome, op, ctx):
        if outcome[0] not in ("ok", "abandoned"):
            return []
        s = state.clone()
        s.delete_thread(self.t)
        return [s]


class EraseThread(DeleteThread):
    """erase_thread: to readers, a delete (what it removes beyond is the leftover check's)."""

    name = "erase_thread"


class EncryptThread(ModelOp):
    """encrypt_thread (a migration to encryption): to readers, nothing changes. Its archive
    and restore run inside it; cut short, the thread may be left in the migration's
    archive (restored by a call again, or by a writer's restore-first)."""

    name = "encrypt_thread"

    def __init__(self, t: str) -> None:
        self.t = t
        self.threads = (t,)

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        if kind == "abandoned":
            s = state.clone()
            s.archived.add(self.t)
            return [state] if state.nothing(self.t) else [state, s]
        if kind == "ok":
            if value.state == "empty":
                return [state] if state.empty(self.t) else []
            if value.state in ("encrypted", "busy"):  # busy: written to through every attempt
                return [] if state.nothing(self.t) else [state]
            return []
        if _raced(value, self.t, ctx) or _erase_raced(value, self.t, op, ctx):
            return [state]
        return []


class Rewrap(ModelOp):
    """rewrap (key rotation): rewrites key records only; to readers, nothing changes.
    Its own checks (every live record under the new key, an erasure never undone) are
    sim.crypto's."""

    name = "rewrap"
    threads = ()

    def apply(self, state, outcome, op, ctx):
        return [state] if outcome[0] in ("ok", "abandoned") else []


def plain_refused(value: Any, t: str, op: Any, ctx: Ctx) -> bool:
    """A write of a process without encryption (an old process of a rollout) to a thread a
    migration of the schedule has begun to encrypt: refused by name, no effect."""
    if not isinstance(value, EncryptedObjectError) or op is None:
        return False
    return any(m.start is not None and (op.end is None or m.start <= op.end) for m in ctx.migrate_ops.get(t, ()))


def plain_met(value: Any, t: str, op: Any, ctx: Ctx) -> bool:
    """An encrypting process meeting content written without encryption: refused by name,
    no effect. The setup of a migration's world wrote its threads so; a thread stops
    holding any once a migration of it answered complete, unless a process without
    encryption wrote to it since (or may have: cut short)."""
    if not isinstance(value, PlaintextObjectError) or not ctx.plain_setup:
        return False
    if op is None or op.start is None:
        return True
    done = [m.end for m in ctx.migrate_ops.get(t, ()) if m.outcome and m.outcome[0] == "ok" and m.outcome[1].complete
            and m.end is not None and m.end < op.start]
    if not done:
        return True
    return any(w.start is not None and (op.end is None or w.start <= op.end) and (w.end is None or w.end >= min(done))
               for w in ctx.plain_writes.get(t, ()))


class GetTuple(ModelOp):
    name = "get_tuple"

    def __init__(self, t: str, ns: str, cid: str | None = None) -> None:
        self.t, self.ns, self.cid = t, ns, cid
        self.threads = (t,)

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        if kind == "abandoned" or (kind == "raised" and (_raced(value, self.t, ctx) or _erase_raced(value, self.t, op, ctx))):
            return [state]
        if kind != "ok":
            return []
        rows = state.ordered(self.t, self.ns)
        if self.cid is not None:
            rows = [r for r in rows if r[0][1] == self.cid]
        got = [] if value is None else [norm(value)]
        self.last_reason = match_list(got, rows, 1)
        return [state] if self.last_reason is None else []


class ListCheckpoints(ModelOp):
    name = "list"

    def __init__(self, t: str, ns: str | None, filter: dict | None, before: str | None, limit: int | None) -> None:
        self.t, self.ns, self.filter, self.before, self.limit = t, ns, filter, before, limit
        self.threads = (t,)

    def apply(self, state, outcome, op, ctx):
        kind, value = outcome
        if kind == "abandoned" or (kind == "raised" and (_raced(value, self.t, ctx) or _erase_raced(value, self.t, op, ctx))):
            return [state]
        if kind != "ok":
            return []
        expected = list_expected(state, self.t, self.ns, self.filter, self.before)
        got = [norm(x) for x in value]
        self.last_reason = match_list(got, expected, self.limit)
        return [state] if self.last_reason is None else []


# -- the search ----------------------------------------------------------------------------
@dataclass
class Linearization:
    ok: bool
    state: ModelState | None = None  # a final state that matches
    order: list[str] = field(default_factory=list)
    closest: list[str] = field(default_factory=list)  # differences of the closest final state
    closest_order: list[str] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)  # op label -> times its answer was impossible
    reasons: dict[str, str] = field(default_factory=dict)  # op label -> the last reason (reads)
    leaves: int = 0


def linearize(
    history: list[Any],
    initial: ModelState,
    observe: Any,
    ctx: Ctx,
    max_leaves: int = 200_000,
) -> Linearization:
    """Find an order of ``history`` (scheduler.LogicalOp) that explains the answers
    and leads to a final state for which ``observe(state)`` returns no difference."""
    ops = [op for op in history if op.outcome is not None]
    result = Linearization(ok=False)
    best: list[Any] = [None, None]
    seen: set[Any] = set()

    def before(a: Any, b: Any) -> bool:
        # a answered before b sent its first call: a comes first. So does an
        # earlier step of the same process (its answer and the next step's first
        # call can share a tick).
        if a.pid == b.pid and a.index < b.index:
            return True
        return a.end is not None and b.start is not None and a.end < b.start

    def search(state: ModelState, remaining: list[Any], order: list[str]) -> ModelState | None:
        if result.leaves >= max_leaves:
            return None
        if not remaining:
            result.leaves += 1
            diffs = observe(state)
            if not diffs:
                result.order = list(order)
                return state
            if best[0] is None or len(diffs) < len(best[0]):
                best[0], best[1] = diffs, list(order)
            return None
        memo = (tuple(id(o) for o in remaining), state.fingerprint())
        if memo in seen:
            return None
        seen.add(memo)
        for op in remaining:
            if any(before(other, op) for other in remaining if other is not op):
                continue
            rest = [o for o in remaining if o is not op]
            if op.outcome[0] == "abandoned":
                # Never took effect (its position does not matter then).
                found = search(state, rest, order + [f"{op.label} (no effect)"])
                if found is not None:
                    return found
            nexts = op.step.model.apply(state, op.outcome, op, ctx)
            if not nexts:
                result.rejected[op.label] = result.rejected.get(op.label, 0) + 1
                if op.step.model.last_reason:
                    result.reasons[op.label] = op.step.model.last_reason
            for i, nxt in enumerate(nexts):
                tag = op.label + ("" if len(nexts) == 1 else f" (variant {i})")
                found = search(nxt, rest, order + [tag])
                if found is not None:
                    return found
        return None

    found = search(initial, ops, [])
    result.ok = found is not None
    result.state = found
    if not result.ok and best[0] is not None:
        result.closest, result.closest_order = best[0], best[1]
    return result
