"""What the simulated processes do: threads of realistic checkpoints, and the scenarios.

A thread has a root namespace and a subgraph namespace. Its channels: ``messages``
(a list that grows, larger than the savers' ``inline_threshold``: a value object of
its own), ``counter`` (small, inline), ``doc`` (large, written once by the first
checkpoint and carried unchanged by every later one), ``scratch`` (changes now and
then, sometimes large). Checkpoints carry ``run_id`` metadata, pending writes are
regular and special (``WRITES_IDX_MAP``: resume, interrupt, error) channels.

Ids come from ``uuid6`` in the order the workload creates checkpoints; versions from
``saver.get_next_version`` (the global ``random`` is seeded per schedule).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from langgraph.checkpoint.base.id import uuid6

from sim import model as M
from sim.scheduler import Step

SUB_NS = "inner:" + "7" * 8  # a subgraph namespace: sorts after "" (listed first)
RESUME, INTERRUPT, ERROR = "__resume__", "__interrupt__", "__error__"
GC_GRACE = timedelta(hours=1)  # the concurrent gc's grace (world.World._age idealises it)
_WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def cfg(t: str, ns: str | None = "", cid: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"thread_id": t}
    if ns is not None:
        c["checkpoint_ns"] = ns
    if cid is not None:
        c["checkpoint_id"] = cid
    return {"configurable": c}


@dataclass
class Made:
    """A checkpoint the workload built (what a put needs, and what a child carries)."""

    t: str
    ns: str
    cid: str
    parent: str | None
    run_id: str
    values: dict[str, Any]
    versions: dict[str, str]
    step: int

    @property
    def config(self) -> dict[str, Any]:
        return cfg(self.t, self.ns, self.cid)


class Builder:
    """Builds checkpoints, puts and pending writes, deterministically from ``rng``."""

    def __init__(self, rng: random.Random, next_version: Callable[[Any], str]) -> None:
        self.rng = rng
        self.next_version = next_version
        self.made: dict[tuple[str, str], list[Made]] = {}
        self.tasks = 0
        # Every checkpoint's ``ts``: days back (its activity entry is yesterday's, see
        # ``activity_day``), or today's (``idle``: the day a restore writes its entry on).
        self.ts = datetime(2026, 11, 24, tzinfo=timezone.utc).isoformat()

    def text(self, words: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(words))

    def latest(self, t: str, ns: str = "") -> Made | None:
        made = self.made.get((t, ns)) or []
        return made[-1] if made else None

    def checkpoint(self, t: str, ns: str, run_id: str, parent: Made | None = None, *, fork: bool = False) -> tuple[Made, M.Put, Any]:
        """The next checkpoint of (t, ns) from ``parent`` (default: the latest made).
        Returns (made, its model put, the arguments of saver.put)."""
        if parent is None and not fork:
            parent = self.latest(t, ns)
        step = parent.step + 1 if parent else 0
        values = dict(parent.values) if parent else {}
        versions = dict(parent.versions) if parent else {}
        changed: list[str] = []
        if parent is None:
            values["doc"] = "doc " + self.text(40)  # large, never changes
            changed.append("doc")
        msgs = list(values.get("messages", []))
        msgs.append(f"{step}: " + self.text(self.rng.randint(8, 20)))
        values["messages"] = msgs
        values["counter"] = step
        changed += ["messages", "counter"]
        if parent is None or self.rng.random() < 0.4:
            values["scratch"] = self.text(self.rng.choice([1, 2, 30]))
            changed.append("scratch")
        if ns:
            values["sub"] = f"sub {step} " + self.text(20)
            changed.append("sub")
        new_versions = {}
        for ch in changed:
            versions[ch] = self.next_version(versions.get(ch))
            new_versions[ch] = versions[ch]
        cid = str(uuid6(clock_seq=self.rng.randrange(1 << 14)))
        checkpoint = {
            "v": 4,
            "id": cid,
            "ts": self.ts,
            "channel_values": dict(values),
            "channel_versions": dict(versions),
            "versions_seen": {"agent": {ch: versions[ch] for ch in sorted(changed)}},
            "updated_channels": sorted(changed),
        }
        metadata = {"source": "loop", "step": step, "run_id": run_id, "parents": {}, "tag": self.rng.choice(["x", "y"])}
        made = Made(t, ns, cid, parent.cid if parent else None, run_id, values, versions, step)
        self.made.setdefault((t, ns), []).append(made)
        config = cfg(t, ns, parent.cid if parent else None)
        return made, M.Put(config, checkpoint, metadata, new_versions), (config, checkpoint, metadata, new_versions)

    def writes(self, target: Made, *, special: str | None = None, task_id: str | None = None) -> tuple[M.PutWrites, Any]:
        """A task's pending writes for ``target`` (regular, or one special channel);
        ``task_id``: a task that wrote before (its resume after its interrupt)."""
        self.tasks += 1
        task_id = task_id or f"task-{self.tasks}-{self.rng.randrange(10**6)}"
        if special == RESUME:
            writes = [(RESUME, "yes " + self.text(2))]
        elif special == INTERRUPT:
            writes = [(INTERRUPT, {"value": "approve? " + self.text(3), "id": task_id})]
        elif special == ERROR:
            writes = [(ERROR, "boom " + self.text(25))]
        else:
            writes = [("messages", ["reply " + self.text(20)]), ("counter", target.step + 1)]
        args = (target.config, writes, task_id, "~__pregel_pull, agent")
        return M.PutWrites(*args), args


# -- steps ------------------------------------------------------------------------------------
def put_step(b: Builder, t: str, ns: str, run_id: str, parent: Made | None = None, *, fork: bool = False) -> tuple[Made, Step]:
    made, model, args = b.checkpoint(t, ns, run_id, parent, fork=fork)
    return made, Step(f"put({t[-6:]},{'sub' if ns else 'root'},{made.cid[-6:]})", lambda s, env, a=args: s.put(*a), model)


def writes_step(b: Builder, target: Made, special: str | None = None) -> Step:
    model, args = b.writes(target, special=special)
    return Step(f"put_writes({target.cid[-6:]},{special or 'regular'})", lambda s, env, a=args: s.put_writes(*a), model)


def prune_step(ts: list[str], keep: int | None) -> Step:
    return Step(f"prune(keep_last={keep})", lambda s, env: s.prune(ts, keep_last=keep), M.Prune(ts, keep))


def delete_runs_step(runs: list[str], threads: tuple[str, ...]) -> Step:
    return Step(f"delete_for_runs({runs})", lambda s, env: s.delete_for_runs(runs), M.DeleteForRuns(runs, threads))


def archive_step(t: str) -> Step:
    return Step("archive_thread", lambda s, env: s.archive_thread(t), M.ArchiveThread(t))


def restore_step(t: str) -> Step:
    return Step("restore_thread", lambda s, env: s.restore_thread(t), M.RestoreThread(t))


def copy_step(src: str, dst: str) -> Step:
    return Step("copy_thread", lambda s, env: s.copy_thread(src, dst), M.CopyThread(src, dst))


def export_import_steps(src: str, dst: str, slot: Any) -> list[Step]:
    return [
        Step("export_thread", lambda s, env: s.export_thread(src), M.ExportThread(src, slot), keep="export"),
        Step("import_thread", lambda s, env: s.import_thread(env["export"], thread_id=dst), M.ImportThread(dst, slot, src)),
    ]


def gc_step(ts: list[str] | None) -> Step:
    return Step(
        "collect_garbage", lambda s, env: s.collect_garbage(ts, older_than=GC_GRACE), M.CollectGarbage()
    )


def delete_step(t: str) -> Step:
    return Step("delete_thread", lambda s, env: s.delete_thread(t), M.DeleteThread(t))


def erase_step(t: str) -> Step:
    return Step("erase_thread", lambda s, env: s.erase_thread(t), M.EraseThread(t))


def idle_step(threads: list[str]) -> Step:
    """archive_idle with no grace (every thread written before it is idle): it may
    archive any thread of the prefix (``threads``: the scenario's, once built)."""
    return Step("archive_idle", lambda s, env: s.archive_idle(timedelta(0)), M.ArchiveIdle(threads))


def migrate_step(t: str) -> Step:
    return Step("encrypt_thread", lambda s, env: s.encrypt_thread(t), M.EncryptThread(t))


def rewrap_step() -> Step:
    """rewrap to the world's new key (``env["new_key"]``, set by the runner)."""
    return Step("rewrap", lambda s, env: s.rewrap(env["new_key"]), M.Rewrap())


def get_step(t: str, ns: str = "", cid: str | None = None) -> Step:
    return Step("get_tuple", lambda s, env: s.get_tuple(cfg(t, ns, cid)), M.GetTuple(t, ns, cid))


def list_step(t: str, ns: str | None = None, filter: dict | None = None, before: str | None = None, limit: int | None = None) -> Step:
    bef = cfg(t, None, before) if before else None
    return Step(
        f"list(ns={ns!r},filter={filter},before={before and before[-6:]},limit={limit})",
        lambda s, env: s.list(cfg(t, ns), filter=filter, before=bef, limit=limit),
        M.ListCheckpoints(t, ns, filter, before, limit),
        emits=True,
    )


# -- scenarios -------------------------------------------------------------------------------
@dataclass
class SetupAction:
    name: str
    invoke: Callable[[Any], Any]
    model: M.ModelOp


@dataclass
class Scenario:
    name: str
    setup: list[SetupAction] = field(default_factory=list)
    processes: list[list[Step]] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)  # every thread to read back
    archiving: set[str] = field(default_factory=set)
    deleting: set[str] = field(default_factory=set)
    archives: dict[str, int] = field(default_factory=dict)  # archive_thread steps per thread
    # Process index -> the index of the process whose saver it runs on (a fan-out's calls).
    shares: dict[int, int] = field(default_factory=dict)
    # Encrypted worlds (sim.crypto). A migration ("migrate"): the setup is written by a saver
    # without encryption, and the processes of ``plain`` (kinds "plain_run", "plain_writes":
    # old processes of the rollout) run without it. A rotation ("rewrap"): every process
    # runs with the world's new key, the old one as ``previous`` (the rollout before rewrap).
    plain_setup: bool = False
    plain: set[int] = field(default_factory=set)
    migrating: set[str] = field(default_factory=set)
    rotate: bool = False


class Workshop:
    """Builds one schedule's scenario under ``prefix``."""

    def __init__(self, rng: random.Random, prefix: str, next_version: Callable[[Any], str]) -> None:
        self.rng = rng
        self.prefix = prefix
        self.b = Builder(rng, next_version)
        self.sc = Scenario("")
        self.runs = {k: f"{prefix}-run{k}" for k in (1, 2, 3, 4)}
        self.setup_made: dict[tuple[str, str], int] = {}
        self.deletes_runs = False  # a process calls delete_for_runs
        self.idles = 0  # processes calling archive_idle

    def base(self, t: str, ns: str = "") -> list[Made]:
        """The checkpoints made by the setup (committed before any process runs):
        a process never builds on another's checkpoint, which may never commit."""
        return self.b.made.get((t, ns), [])[: self.setup_made.get((t, ns), 0)]

    def end_setup(self) -> None:
        self.setup_made = {k: len(v) for k, v in self.b.made.items()}

    def thread(self, name: str) -> str:
        t = f"{self.prefix}-{name}-x"
        if t not in self.sc.threads:
            self.sc.threads.append(t)
        return t

    # -- setup ------------------------------------------------------------------
    def grow(self, t: str, length: int, *, sub: bool = True, writes: bool = True) -> None:
        """A thread's history, written before the schedule (runs 1 then 2)."""
        for i in range(length):
            run = self.runs[1] if i < max(1, length // 2) else self.runs[2]
            made, model, args = self.b.checkpoint(t, "", run)
            self.sc.setup.append(SetupAction(f"put({made.cid[-6:]})", lambda s, a=args: s.put(*a), model))
            if sub and i == length - 1 or (sub and i == 0 and length > 2):
                smade, smodel, sargs = self.b.checkpoint(t, SUB_NS, run)
                self.sc.setup.append(SetupAction(f"put(sub,{smade.cid[-6:]})", lambda s, a=sargs: s.put(*a), smodel))
            if writes and (i == length - 1 or self.rng.random() < 0.3):
                special = self.rng.choice([None, None, RESUME, INTERRUPT])
                wmodel, wargs = self.b.writes(made, special=special)
                self.sc.setup.append(SetupAction(f"put_writes({made.cid[-6:]},{special or 'regular'})", lambda s, a=wargs: s.put_writes(*a), wmodel))

    def setup_archive(self, t: str) -> None:
        self.sc.setup.append(SetupAction("archive_thread", lambda s: s.archive_thread(t), M.ArchiveThread(t)))

    def setup_prune(self, t: str) -> None:
        self.sc.setup.append(SetupAction("prune(keep_last=1)", lambda s: s.prune([t], keep_last=1), M.Prune([t], 1)))

    # -- processes --------------------------------------------------------------
    def fanout(self, t: str) -> list[list[Step]]:
        """One process's concurrent calls, as LangGraph makes them in a step of
        parallel branches: the checkpoint's put, and the put_writes of two or
        three of its tasks (sent together: writes may come before their put).
        The manifest index commits them in shared head swaps (group commit)."""
        b, rng = self.b, self.rng
        base = self.base(t)
        made, put = put_step(b, t, "", self.runs[3], base[-1] if base else None, fork=not base)
        tasks = [[writes_step(b, made, rng.choice([None, None, RESUME, INTERRUPT]))] for _ in range(rng.choice([2, 3]))]
        return [[put], *tasks]

    def stale(self, kind: str, t: str) -> list[Step]:
        """A process whose cache of the thread goes stale before its call (issue
        32): it archives the thread and another process restores it by writing
        (``stale_restore``), or it reads the thread and another process archives
        it (``stale_archive``); then it makes its call, on what it cached."""
        b, rng = self.b, self.rng
        self.sc.archiving.add(t)
        self.sc.archives[t] = self.sc.archives.get(t, 0) + 1
        base = self.base(t)
        if kind == "stale_restore":
            made, put = put_step(b, t, "", self.runs[3], base[-1] if base else None, fork=not base)
            steps = [archive_step(t), replace(put, other=True)]
        else:
            made = base[-1] if base else None
            steps = [get_step(t), replace(archive_step(t), other=True)]
        call = rng.choice(["delete_runs", "writes", "put", "archive"] if made is not None else ["delete_runs", "archive"])
        if call == "delete_runs":
            self.deletes_runs = True
            steps.append(delete_runs_step([rng.choice([self.runs[1], self.runs[2]])], tuple(self.sc.threads)))
        elif call == "writes":
            steps.append(writes_step(b, made, rng.choice([None, RESUME])))
        elif call == "put":
            steps.append(put_step(b, t, "", self.runs[3], made)[1])
        else:
            self.sc.archives[t] += 1
            steps.append(archive_step(t))
        return steps

    def proc(self, kind: str, t: str, slot: int) -> list[Step]:
        b, rng = self.b, self.rng
        if kind == "run":  # a run continues the thread: put, its writes, maybe another put
            run = rng.choice([self.runs[2], self.runs[3]])
            base = self.base(t)
            made, step = put_step(b, t, "", run, base[-1] if base else None, fork=not base)
            steps = [step]
            if rng.random() < 0.6:
                steps.append(writes_step(b, made, rng.choice([None, None, RESUME])))
            if rng.random() < 0.5:
                steps.append(put_step(b, t, "", run, made)[1])
            return steps
        if kind == "fork":  # time travel: a put from an older checkpoint
            history = self.base(t)
            parent = rng.choice(history[:-1]) if len(history) > 1 else None
            made, step = put_step(b, t, "", self.runs[4], parent, fork=parent is None)
            return [step, writes_step(b, made)] if rng.random() < 0.5 else [step]
        if kind == "subput":
            base = self.base(t, SUB_NS)
            return [put_step(b, t, SUB_NS, self.runs[2], base[-1] if base else None, fork=not base)[1]]
        if kind == "writes":
            history = self.base(t)
            if not history:
                return [get_step(t)]
            target = history[-1] if rng.random() < 0.7 or len(history) < 2 else rng.choice(history[:-1])
            steps = [writes_step(b, target, rng.choice([None, None, RESUME, INTERRUPT, ERROR]))]
            if rng.random() < 0.4:
                steps.append(writes_step(b, target, rng.choice([None, RESUME])))
            return steps
        if kind in ("copy_delete", "import_delete"):
            # A copy (or an import) of the thread, then a delete of the copy: what the
            # copy gave it (its activity entry, listing, run hints) goes with it.
            if kind == "copy_delete":
                dest = self.thread(f"copy{slot}")
                steps = [copy_step(t, dest)]
            else:
                dest = self.thread(f"imp{slot}")
                steps = export_import_steps(t, dest, ("export", slot))
            self.sc.deleting.add(dest)
            return [*steps, delete_step(dest)]
        if kind in ("prune", "delete_runs", "delete", "erase", "relive") or kind.startswith("prune_"):
            self.sc.deleting.add(t)
        if kind == "prune":
            return [prune_step([t], rng.choice([None, 1, 2]))]
        if kind == "delete_runs":
            return [delete_runs_step([rng.choice([self.runs[1], self.runs[2]])], tuple(self.sc.threads))]
        if kind in ("archive", "archive_restore", "prune_archive"):
            self.sc.archiving.add(t)
            self.sc.archives[t] = self.sc.archives.get(t, 0) + 1
        if kind == "archive":
            return [archive_step(t)]
        if kind == "restore":
            return [restore_step(t)]
        if kind == "archive_restore":
            return [archive_step(t), restore_step(t)]
        if kind == "export_import":
            return export_import_steps(t, self.thread(f"imp{slot}"), ("export", slot))
        if kind == "copy":
            return [copy_step(t, self.thread(f"copy{slot}"))]
        if kind == "gc":
            return [gc_step(rng.choice([None, [t]]))]
        if kind == "delete":
            return [delete_step(t)]
        if kind == "erase":
            return [erase_step(t)]
        if kind == "migrate":
            self.sc.migrating.add(t)
            self.sc.archiving.add(t)
            self.sc.archives[t] = self.sc.archives.get(t, 0) + 1
            return [migrate_step(t)]
        if kind == "rewrap":
            self.sc.rotate = True
            return [rewrap_step()]
        if kind == "relive":
            # The thread deleted, started afresh by a new run, then erased: the
            # erase must find what its earlier life left (run hints, its listing
            # object: keys outside its folders that its new head does not name).
            # Other processes' writes build on the setup's checkpoints, which the
            # delete takes: only a put from no parent starts a new life.
            made, fresh = put_step(b, t, "", self.runs[4], None, fork=True)
            steps = [delete_step(t), fresh]
            if rng.random() < 0.5:
                steps.append(writes_step(b, made))
            return [*steps, erase_step(t)]
        if kind == "read":
            return [rng.choice([get_step(t, ""), list_step(t, None, limit=rng.choice([None, 3])), get_step(t, SUB_NS)])]
        if kind in ("stale_restore", "stale_archive"):
            return self.stale(kind, t)
        if kind == "idle":
            # The operator's schedule beside the writers: a writer restoring a thread
            # the run archives writes the day's activity entry again, which the run's
            # drops must leave (check (f) of tests/sim/check.py).
            self.idles += 1
            return [idle_step(self.sc.threads)]
        if kind == "prune_archive":  # issue 21's shape, within one process
            return [prune_step([t], None), archive_step(t), restore_step(t)]
        if kind == "prune_copy":
            return [prune_step([t], None), copy_step(t, self.thread(f"copy{slot}"))]
        if kind == "prune_export":
            return [prune_step([t], None)] + export_import_steps(t, self.thread(f"imp{slot}"), ("export", slot))
        raise ValueError(kind)


PROCESS_KINDS = (
    "run", "fork", "subput", "writes", "prune", "delete_runs", "archive", "restore", "archive_restore",
    "export_import", "copy", "gc", "delete", "read", "prune_archive", "prune_copy", "prune_export", "fanout",
    "stale_restore", "stale_archive", "erase", "relive", "idle", "copy_delete", "import_delete",
)
# Encrypted worlds only (test_simulation's encrypted tests): a migration of a thread written
# without encryption, beside old processes writing without it, and a key rotation.
CRYPTO_KINDS = ("migrate", "plain_run", "plain_writes", "rewrap")
WRITERS = ("run", "writes", "fanout")
ADMIN = ("prune", "delete_runs", "archive", "restore", "export_import", "copy", "gc", "delete", "erase")
# The pairs every mode must cover (a "long" pair grows the thread past the manifest's seal).
PAIRS: tuple[tuple[str, str], ...] = (
    *((w, a) for a in ADMIN for w in WRITERS),
    ("archive", "restore"),
    *(("gc", a) for a in ADMIN if a != "gc"),
    ("gc", "fork"),
    ("gc", "prune_archive"),
    ("gc", "prune_copy"),
    ("gc", "prune_export"),
    ("run", "run"),
    ("run", "fork"),
    ("run", "subput"),
    ("writes", "writes"),
    ("delete_runs", "fork"),
    ("long", "run"),
    ("stale_restore", "writes"),
    ("stale_archive", "run"),
    # erase_thread beside the other whole-thread operations (its writers are above).
    ("erase", "delete"),
    ("erase", "archive_restore"),
    ("erase", "copy"),
    # A copy or an import, then a delete of it, beside a writer of the source.
    ("copy_delete", "run"),
    ("import_delete", "writes"),
    # archive_idle beside writers that restore what it archives, and beside another run.
    ("idle", "run"),
    ("idle", "fanout"),
    ("idle", "idle"),
)


def build(rng: random.Random, prefix: str, next_version: Callable[[Any], str], kinds: tuple[str, ...]) -> Scenario:
    """A scenario of one process per kind on thread A (grown in setup first)."""
    w = Workshop(rng, prefix, next_version)
    w.sc.name = "+".join(kinds)
    if "idle" in kinds:
        # Written today: the writes' entries and a restore's are of one day, the
        # race ``idle`` is there for (a run's drop meeting a restore's entry).
        w.b.ts = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0).isoformat()
    t = w.thread("A")
    long = "long" in kinds
    kinds = tuple("run" if k == "long" else k for k in kinds)
    w.grow(t, 50 if long else rng.randint(2, 4))
    if "restore" in kinds and rng.random() < 0.8:
        w.setup_archive(t)  # the restore has something to do
    elif rng.random() < 0.15:
        w.setup_prune(t)
    if rng.random() < 0.2 and not long:
        w.grow(w.thread("B"), 2, sub=False)
    w.end_setup()
    for i, k in enumerate(kinds):
        if k in ("fanout", "plain_fanout"):
            first = len(w.sc.processes)
            for j, steps in enumerate(w.fanout(t)):
                if j:
                    w.sc.shares[first + j] = first
                if k == "plain_fanout":
                    w.sc.plain.add(len(w.sc.processes))
                w.sc.processes.append(steps)
        elif k.startswith("plain_"):
            w.sc.plain.add(len(w.sc.processes))
            w.sc.processes.append(w.proc(k[len("plain_"):], t, i))
        else:
            w.sc.processes.append(w.proc(k, t, i))
    w.sc.plain_setup = "migrate" in kinds
    if "delete_runs" in kinds or w.deletes_runs:
        w.sc.deleting |= set(w.sc.threads)  # a run may hold checkpoints in every thread
    if w.idles:
        w.sc.archiving |= set(w.sc.threads)  # a run may archive every thread
        for x in w.sc.threads:
            w.sc.archives[x] = w.sc.archives.get(x, 0) + w.idles
    return w.sc


def random_kinds(rng: random.Random) -> tuple[str, ...]:
    n = rng.choice([2, 2, 3])
    kinds = [rng.choice(WRITERS + ("fork", "subput"))]
    kinds += [rng.choice(PROCESS_KINDS) for _ in range(n - 1)]
    if rng.random() < 0.03:
        kinds[0] = "long"
    rng.shuffle(kinds)
    return tuple(kinds)


# Random schedules of encrypted worlds around a migration or a rotation (scenario names).
RANDOM_CRYPTO = {
    "random_migrate": ("migrate", ("plain_run", "plain_writes", "plain_fanout", "migrate", "erase", "prune", "delete", "delete_runs")),
    "random_rewrap": ("rewrap", ("run", "writes", "fanout", "erase", "relive", "delete", "prune", "copy", "rewrap")),
}


def random_crypto_kinds(rng: random.Random, scenario: str) -> tuple[str, ...]:
    first, others = RANDOM_CRYPTO[scenario]
    kinds = [first] + [rng.choice(others) for _ in range(rng.choice([1, 2, 2]))]
    rng.shuffle(kinds)
    return tuple(kinds)
