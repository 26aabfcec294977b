"""The store's schedules end to end: its world, its scenarios, the checks after a schedule.

The scheduler is the saver simulation's (``sim.scheduler``: processes, faults,
choosers, replay); only the world's processes are ``S3Store`` objects (each its own,
as separate Lambdas: no cache shared), and the rules are the store's
(``sim.store_model``).

A scenario is ``random`` (2-3 processes of 1-3 steps of ``store_model.BASE_KINDS``,
by weight), ``random-shared`` (the same, the second process running on the first one's
store: one process's concurrent calls, which its group commit puts in shared swaps),
``removal`` (as ``random``, drawn from every kind: erase, sweep and puts with a ttl among
them) or processes spelled out: ``+`` between processes, ``&`` between processes that
run on one store (the first one's), ``,`` between a process's steps, ``@one`` at the end
to put every step on one key (e.g. ``put_large,get+put_large@one``,
``put_large&put_large@one``). Before the schedule a setup store may put a few items
(existing namespaces, values to replace; with a ttl too when the scenario has a
removal kind). A step cut short and retried runs on a fresh store (a new process),
whether it shared one or not.

An erase that was cut and abandoned is finished after the schedule by calling it
again (as the guide says an operator does), before the final reads; the checks of
``sim.store_removal`` then look at the bucket and the index for bytes an erase or a
sweep had to remove.
"""

from __future__ import annotations

import random
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import GetOp, ListNamespacesOp, SearchOp

from sim import store_crypto as crypto
from sim import store_model as SM
from sim import store_removal as removal
from sim import store_rules as SR
from sim.runner import Outcome, Spec, fault_plan
from sim.scheduler import (
    ExhaustiveChooser,
    FaultPlan,
    OneFaultChooser,
    Process,
    RandomChooser,
    Scheduler,
    Step,
)
from sim.world import OLD, World

# A known gap, not fixed: an erase finds a namespace's folder only through the registry,
# and a sweep unregisters a namespace it found empty without listing its folder. What the
# folder still held then (on a versioned bucket the noncurrent versions its deletes,
# overwrites and expiries left: earlier heads, deleted value objects; the value object of a
# put cut before its commit) stays after any later erase of the namespace. (The erase itself unregisters a namespace only once
# its folder is clear.) A process that knew the namespace registered and writes a value
# object after it was unregistered, then is cut before registering again, leaves the same.
KNOWN_UNREGISTERED = "sim/store_runner.py KNOWN_UNREGISTERED"


class StoreWorld(World):
    """The moto server, with ``S3Store`` processes; the stores' clock is the scheduler's
    tick (``store_model.TickClock``), and each step's last call sent is recorded."""

    def __init__(self, endpoint: str, mode: str, head_budget: int | None = None, **kwargs: Any) -> None:
        self.clock = SM.TickClock()
        # Manifest mode: a head's row bytes before it seals (tiny: every schedule seals
        # and compacts); None: the store's own.
        self.head_budget = head_budget
        self.last: dict[int, int] = {}  # id(LogicalOp) -> tick of its last call sent
        self.called: dict[int, int] = {}  # id(Made) -> tick its method was first called
        self.scheduler: Scheduler | None = None
        self.processes: list[Process] = []
        self.sealed = 0  # segments written or seen by the leftover checks (a test asks that seals happened)
        super().__init__(endpoint, mode, **kwargs)

    def saver(self, prefix: str, **options: Any) -> Any:  # the scheduler's name for "a new process's object"
        from s3_saver import S3Store
        from s3_saver._format.memory.ttl import Clock

        if self.encryption is not None:
            options.setdefault("encryption", self.encryption)  # None: an old process (sim/store_crypto.py)
        store = S3Store(
            self.bucket,
            table=self.table,
            prefix=prefix,
            region_name="us-east-1",
            s3_client=self.s3,
            dynamodb_client=self.dynamodb,
            clock=Clock(self.clock),
            **options,
        )
        if self.head_budget is not None and self.table is None:
            store._memory.index.head_budget = self.head_budget
        self.savers.append(store)
        return store

    def send(self, call: Any, writer: Any = None) -> Any:
        self._lister = writer
        if writer is not None and self.scheduler is not None:
            self.last[id(writer)] = self.scheduler.tick
            # A commit queued behind another of its store (group commit) takes effect in
            # that one's swap: every step waiting on the store that sends a call may.
            store = next((p.saver for p in self.processes if p.current is writer), None)
            for p in self.processes:
                if p.saver is store and p.current is not writer and p.runner is not None and p.runner.blocked is not None:
                    self.last[id(p.current)] = self.scheduler.tick
        if getattr(call, "operation", None) == "put_object" and "/@s/" in str(getattr(call, "params", {}).get("Key", "")):
            # A seal or a merge wrote a segment (a later delete or merge may leave none to see).
            self.sealed += 1
        return super().send(call, writer)

    def _age(self, page: dict[str, Any]) -> None:
        """The grace period, idealised for an erase (which deletes every current value
        object older than its grace, named or not: its rows are gone): an object is as
        young as it really is, seconds, when its writer was in flight or answered after the
        listing's operation began (a put that committed after the erase read its rows);
        else a day old (``World._age``: an abandoned put's object is garbage by then)."""
        lister = getattr(self, "_lister", None)
        began = lister.start if lister is not None and lister.start is not None else None
        listed = [*(page.get("Contents", ()) or ()), *(page.get("Versions", ()) or ()), *(page.get("DeleteMarkers", ()) or ())]
        for obj in listed:
            writer = self.writers.get(obj.get("Key"))
            recent = writer is not None and (
                writer.in_flight or (began is not None and writer.end is not None and writer.outcome is not None
                                     and writer.outcome[0] != "abandoned" and writer.end > began)
            )
            if not recent and "LastModified" in obj:
                obj["LastModified"] = obj["LastModified"] - OLD


class StoreSpec(Spec):
    def replay(self) -> str:
        env = f"SIM_SEED={self.seed} SIM_MODE={self.mode} SIM_SCENARIO={self.scenario} SIM_FAULTS={self.faults}"
        if self.versioned:
            env += " SIM_VERSIONED=1"
        if self.encryption:
            env += f" SIM_ENCRYPTION={self.encryption}"
        if self.path is not None:
            env += f" SIM_PATH={','.join(map(str, self.path)) or '-'}"
        return f"{env} .venv/bin/python -m pytest -p no:cacheprovider -n 0 tests/test_store_simulation.py -k replay"


@dataclass
class Scenario:
    name: str
    setup: list[SM.Made]
    processes: list[list[SM.Made]]
    shares: dict[int, int] = field(default_factory=dict)  # process -> the process whose store it runs on
    # A migration's world (sim/store_crypto.py): the setup written without encryption, and
    # the processes that run without it (old ones).
    plain_setup: bool = False
    plain: tuple[int, ...] = ()


def build(rng: random.Random, scenario: str) -> Scenario:
    spelled, _, focus = scenario.partition("@")
    space = SM.SPACES[focus]
    shares: dict[int, int] = {}
    if spelled == "migration":
        plan = crypto.draw_migration(rng)
    elif spelled in ("random", "random-shared", "removal"):
        drawn = SM.KINDS if spelled == "removal" else SM.BASE_KINDS
        weights = {name: kind.weight for name, kind in drawn.items()}
        plan = [rng.choices(list(weights), list(weights.values()), k=rng.randint(1, 3)) for _ in range(rng.randint(2, 3))]
        if spelled == "random-shared":
            shares[1] = 0
    else:
        plan = []
        for together in spelled.split("+"):
            first = len(plan)
            for j, process in enumerate(together.split("&")):
                if j:
                    shares[first + j] = first
                plan.append(process.split(","))
    for kinds in plan:
        for kind in kinds:
            if kind not in SM.KINDS and kind not in crypto.KINDS:
                raise ValueError(f"unknown store step kind {kind!r} (known: {', '.join([*SM.KINDS, *crypto.KINDS])})")
    # Existing items (a namespace registered, a value to replace): none to three; some
    # with a ttl when the scenario removes (a sweep finds them expired).
    choices = ["put", "put_large", "put_medium"]
    if spelled == "removal" or any(kind in SM.REMOVAL_KINDS for kinds in plan for kind in kinds):
        choices.append("put_ttl")
    # A migration has plaintext to migrate: two items at least.
    migrating = crypto.migration(plan)
    setup = [SM.KINDS[rng.choice(choices)].make(rng, f"S.{i}", space) for i in range(rng.randint(2 if migrating else 0, 3))]
    kinds_ = {**SM.KINDS, **crypto.KINDS}
    processes = [[kinds_[kind].make(rng, f"P{pid}.{i}", space) for i, kind in enumerate(kinds)] for pid, kinds in enumerate(plan)]
    name = "".join(("&" if i in shares else "+" if i else "") + ",".join(kinds) for i, kinds in enumerate(plan))
    plain = tuple(i for i, kinds in enumerate(plan) if crypto.old_process(kinds))
    return Scenario(name + (f"@{focus}" if focus else ""), setup, processes, shares, migrating, plain)


def run_store_schedule(world: StoreWorld, spec: Spec, *, strict: bool = False) -> Outcome:
    """One schedule and its checks (``strict``: the known gap fails it too)."""
    began = time.perf_counter()
    world.requests()
    rng = random.Random(f"store/{spec.mode}/{spec.scenario}/{spec.seed}")
    random.seed(spec.seed)
    prefix = world.new_prefix("m")
    world.scheduler = None
    world.clock.ticks = lambda: 0
    world.last.clear()
    world.called.clear()
    scenario = build(rng, spec.scenario)
    out = Outcome(spec, name=scenario.name, setup=[m.name for m in scenario.setup])
    history = SR.History()

    if scenario.plain_setup and world.encryption is None:
        raise ValueError(f"{spec.scenario}: a migration's scenario runs in an encrypted world (SIM_ENCRYPTION=local|kms)")
    setup = world.saver(prefix, encryption=None) if scenario.plain_setup else world.saver(prefix)
    for made in scenario.setup:
        try:
            made.invoke(setup)
        except Exception as exc:
            out.problems.append(f"setup {made.name} raised {type(exc).__name__}: {exc}")
            return _done(out, world, began)
        history.add("setup", made.effect, -1, 0, 0, True, 0)

    if spec.faults == "one":
        at, fault, retry = spec.path or [-1, 0, 0]
        chooser: Any = OneFaultChooser(at, fault, retry, rng)
    elif spec.path is not None:
        chooser = ExhaustiveChooser(spec.path, {"op"}, rng)
    else:
        chooser = RandomChooser(rng)
    scheduler = Scheduler(world, chooser, fault_plan(rng, spec.faults))
    world.scheduler = scheduler
    world.clock.ticks = lambda: scheduler.tick
    processes = [
        Process(pid=i, steps=[Step(m.name, _invoke(world, m), m) for m in steps], prefix=prefix)
        for i, steps in enumerate(scenario.processes)
    ]
    for i, j in scenario.shares.items():
        processes[i].share = processes[j]
    for i in scenario.plain:
        processes[i].options = {"encryption": None}  # an old process of the rollout
    world.processes = processes
    try:
        ops = scheduler.run(processes)
    finally:
        out.trace = scheduler.trace
        out.events = scheduler.tick
    if isinstance(chooser, ExhaustiveChooser):
        spec.path = chooser.path()
        out.next_path = chooser.next_prefix()

    erases: list[Erased] = []
    raised: list[tuple[Any, SM.Made, BaseException]] = []
    for op in ops:
        made: SM.Made = op.step.model
        kind, value = op.outcome or ("abandoned", None)
        last = world.last.get(id(op))
        start = op.start if op.start is not None else scheduler.tick
        called = world.called.get(id(made), start)
        out.history.append(f"{op.label}: {start}..{op.end if kind != 'abandoned' else '-'} (called {called}, last call {last}): "
                           + (kind if kind != "raised" else f"raised {type(value).__name__}: {value}")
                           + (f" (attempts {op.attempts})" if op.attempts > 1 else ""))
        history.cut |= op.cuts > 0
        if kind == "raised":
            raised.append((op, made, value))
        end = op.end if kind != "abandoned" else None
        history.add(op.label, made.effect, start, last, end, kind == "ok", called)
        if made.effect.unlists:
            erases.append(Erased(made, history.unlisters[-1][1], value if kind == "ok" else None))
        if kind == "ok" and made.observe is not None:
            assert op.end is not None
            history.reads.append(SR.Read(op.label, start, op.end, made.observe(value), called))
    for op, made, error in raised:
        # Every fault of the plan is one the store rides out (a transient one at most
        # twice per call, below its attempts): an error is an answer no order allows,
        # but one: a read that meets a large value an erase deleted before the row that
        # names it (the erase running, or cut short and not yet called again) raises
        # StoreUnavailableError, as the guide says.
        during = _erase_during(op, made, error, erases)
        if during is not None:
            out.history.append(f"{op.label}: its StoreUnavailableError allowed: {during.write.label} was erasing what it read")
            continue
        # Encrypted worlds (sim/store_crypto.py): refused the key of a namespace an erase
        # was erasing; in a migration's, a read refused content of the other kind.
        during = crypto.erase_refused(op, made, error, erases)
        if during is not None:
            out.history.append(f"{op.label}: its NamespaceErasedError allowed: {during.write.label} was erasing its namespace")
            continue
        if scenario.plain_setup and crypto.migration_refused(error, made):
            out.history.append(f"{op.label}: its {type(error).__name__} allowed: a refusal during the migration")
            continue
        out.problems.append(f"{op.label} raised {type(error).__name__}: {str(error)[:300]}")
    for e in erases:
        _held(history, e)
    if all(op.outcome is not None for op in ops):
        _verify(world, prefix, history, erases, scheduler.tick, out, strict, scenario.plain_setup)
    return _done(out, world, began)


def _held(history: SR.History, e: Erased) -> None:
    if e.report is not None:
        for ns in e.report.written_during:
            history.held.setdefault(tuple(ns), []).append(e.write)


@dataclass
class Erased:
    """An erase step: its model, its write in the history, its report (None: it did not answer)."""

    made: SM.Made
    write: SR.Write
    report: Any

    @property
    def prefix(self) -> SM.Path:
        return self.made.effect.unlists[0]


def _erase_during(op: Any, made: SM.Made, error: BaseException, erases: list[Erased]) -> Erased | None:
    """The erase during which (or after whose cut) read ``op`` could meet a row whose
    value object it had deleted, or None."""
    from s3_saver.errors import StoreUnavailableError

    if not isinstance(error, StoreUnavailableError) or made.observe is None or op.start is None or op.end is None:
        return None
    for e in erases:
        w = e.write
        overlaps = w.may and w.start < op.end and (w.end is None or op.start < w.end)
        if overlaps and any(SM.under(e.prefix, ns) for ns in made.touches):
            return e
    return None


def _invoke(world: StoreWorld, made: SM.Made) -> Any:
    """The step's method, noting the tick it is first called at (its operation is built,
    and may read the store's clock, then: before its first call)."""

    def invoke(store: Any, env: Any) -> Any:
        tick = world.scheduler.tick if world.scheduler is not None else 0
        world.called.setdefault(id(made), tick)
        return made.invoke(store)

    return invoke


def _done(out: Outcome, world: World, began: float) -> Outcome:
    out.calls = world.requests()
    out.seconds = time.perf_counter() - began
    return out


def _verify(
    world: StoreWorld, prefix: str, history: SR.History, erases: list[Erased], now: int, out: Outcome, strict: bool = False,
    migrating: bool = False,
) -> None:
    problems = out.problems
    judge = SR.Judge(history)
    problems += judge.during()
    # An erase cut short and abandoned: called again, as the guide says, once what it
    # left may go, before the final reads: a step of its own after the schedule's (its
    # ticks, the stores' clock, the world's ages), with no fault.
    for e in [e for e in erases if e.write.end is None and e.write.may]:
        scheduler = Scheduler(world, RandomChooser(random.Random(now)), FaultPlan())
        scheduler.tick = now
        world.scheduler = scheduler
        world.clock.ticks = lambda s=scheduler: s.tick  # type: ignore[misc]
        label = f"{e.write.label} again"
        (op,) = scheduler.run([Process(pid=-1, steps=[Step(label, _invoke(world, e.made), e.made)], prefix=prefix)])
        out.trace += scheduler.trace
        now = scheduler.tick
        kind, report = op.outcome or ("abandoned", None)
        if kind != "ok":
            problems.append(f"{e.write.label} called again after its cut: {kind} {report}")
            return
        assert op.start is not None and op.end is not None
        history.add(label, e.made.effect, op.start, world.last.get(id(op), op.end), op.end, True, op.start)
        erases.append(Erased(e.made, history.unlisters[-1][1], report))
        _held(history, erases[-1])
        out.history.append(f"{label}: {op.start}..{op.end}, after the schedule: {_report(report)}")
    world.scheduler = None
    now += 1
    world.clock.ticks = lambda at=now: at  # type: ignore[misc]
    if migrating:
        out.history += crypto.finish_migration(world, prefix, problems)
        if problems:
            return
    reader = world.saver(prefix)
    space = [(ns, k) for ns in SM.NAMESPACES for k in (*SM.KEYS, "z")]
    prefixes = sorted({ns[:i] for ns in SM.NAMESPACES for i in range(len(ns) + 1)})
    # One batch (its reads are of one moment): every key, the listing, a search of every prefix.
    ops = [GetOp(*key) for key in space] + [ListNamespacesOp(limit=1000)] + [SearchOp(p, limit=1000) for p in prefixes]
    try:
        answers = reader.batch(ops)
    except Exception as exc:
        problems.append(f"the final reads raised {type(exc).__name__}: {exc}")
        return
    finals = dict(zip(space, answers))
    listed = frozenset(tuple(p) for p in answers[len(space)])
    for key, item in finals.items():
        problem = judge.final(key, None if item is None else item.value, now)
        if problem:
            problems.append(problem)
    problems += judge.listing("the final list_namespaces", now, now, listed)
    holding = {ns for (ns, _), item in finals.items() if item is not None}
    for ns in sorted(holding - listed):
        problems.append(f"namespace {'/'.join(ns)} holds a readable item but the final list_namespaces does not list it")
    # Each namespace found by a search of each of its prefixes, with the value get returns
    # (and nothing get does not return).
    for prefix_, hits in zip(prefixes, answers[len(space) + 1 :]):
        got = {(tuple(h.namespace), h.key): h.value for h in hits}
        want = {key: item.value for key, item in finals.items() if item is not None and SM.under(prefix_, key[0])}
        if got != want:
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            changed = sorted(k for k in set(got) & set(want) if got[k] != want[k])
            problems.append(f"the final search of {'/'.join(prefix_) or '()'} differs from get: missing {missing}, "
                            f"extra {extra}, other values {changed}")
    problems += judge.created(finals)
    problems += _leftovers(world, reader, prefix, history, now)
    erased, gaps = removal.erased_bytes(world, reader, history, [(e.prefix, e.write, e.report) for e in erases if e.write.ok])
    problems += erased
    if strict:
        problems += gaps
        gaps = []
    for gap in gaps:
        out.history.append(f"known gap: {gap}")
        warnings.warn(f"the known gap of a folder an earlier removal unregistered ({KNOWN_UNREGISTERED}): "
                      f"{out.spec.replay()}: {gap}", stacklevel=2)
    problems += removal.swept_bytes(world, reader, prefix, history)
    if world.encryption is not None:
        problems += crypto.plaintext_left(world, prefix, history)


def _report(report: Any) -> str:
    return (f"{len(report.namespaces)} namespaces, {report.items} items, {report.deleted} deleted, "
            f"remaining {len(report.remaining)}, written during {list(report.written_during)}")


def _leftovers(world: StoreWorld, reader: Any, prefix: str, history: SR.History, now: int) -> list[str]:
    """Value objects named by no row (once no step was cut), and live rows naming a
    missing one. Two leftovers the store allows: an expired row whose object a sweep cut
    short deleted already (no read returns it; the next sweep drops it), and in DynamoDB
    mode the object of an expired item a put replaced (a creation is a transaction, which
    returns no old value to delete: the guide says so). In manifest mode, sealed segments
    named by no head (once no step was cut), and heads naming a missing one."""
    from s3_saver._format.memory.rows import ObjectRef

    snapshot = reader._sync.run(reader._memory.index.read(list(SM.NAMESPACES), {}))
    named = {
        reader._memory.index.value_key(ns, cell.token): (ns, key, row)
        for ns, rows_ in snapshot.nodes.items()
        for key, row in rows_.items()
        for cell in (row.value, row.vectors)
        if isinstance(cell, ObjectRef)
    }
    present = {key for key, _ in world.objects_naming(prefix, "/@v/")}
    clock = SM.TickClock()
    clock.ticks = lambda: now
    problems = [
        f"row {'/'.join(named[k][0])}:{named[k][1]} names the value object {k}, which is gone"
        for k in sorted(set(named) - present)
        if named[k][2].live(clock())
    ]
    if not history.cut:
        unnamed = sorted(present - set(named))
        if world.mode == "dynamodb":
            unnamed = [k for k in unnamed if not removal.replaced_expired(world, reader, history, k)]
        problems += [f"the value object {k} is named by no row (no step was cut)" for k in unnamed]
    if world.table is None:
        problems += _segment_leftovers(world, reader, prefix, history)
    return problems


def _segment_leftovers(world: StoreWorld, reader: Any, prefix: str, history: SR.History) -> list[str]:
    index = reader._memory.index
    heads = {ns: reader._sync.run(_head(index, ns)) for ns in SM.NAMESPACES}
    named = {index.segment_key(ns, ref): ns for ns, head in heads.items() for ref in head.segments}
    retired = {index.segment_key(ns, ref) for ns, head in heads.items() for ref in head.retired}
    present = {key for key, _ in world.objects_naming(prefix, "/@s/")}
    world.sealed += len(present)
    problems = [f"the head of {'/'.join(named[k])} names the segment {k}, which is gone" for k in sorted(set(named) - present)]
    if not history.cut:
        problems += [f"the segment {k} is named by no head (no step was cut)" for k in sorted(present - set(named) - retired)]
    return problems


def _head(index: Any, ns: Any) -> Any:
    from s3_saver._format.memory.documents import head_key
    from s3_saver._format.memory.names import node_id

    call = index.s3.get(head_key(index.prefix, node_id(ns)))
    (answer,) = yield (call,)
    return index._head_answer(ns, call, answer)[1]
