"""The store's schedules end to end: its world, its scenarios, the checks after a schedule.

The scheduler is the saver simulation's (``sim.scheduler``: processes, faults,
choosers, replay); only the world's processes are ``S3Store`` objects (each its own,
as separate Lambdas: no cache shared), and the rules are the store's
(``sim.store_model``).

A scenario is ``random`` (2-3 processes of 1-3 steps of ``store_model.KINDS``, by
weight) or processes spelled out: ``+`` between processes, ``,`` between a process's
steps, ``@one`` at the end to put every step on one key (e.g.
``put_large,get+put_large@one``). Before the schedule a setup store may put a few items
(existing namespaces, values to replace).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from langgraph.store.base import GetOp, ListNamespacesOp, SearchOp

from sim import store_model as SM
from sim.runner import Outcome, Spec, fault_plan
from sim.scheduler import (
    ExhaustiveChooser,
    OneFaultChooser,
    Process,
    RandomChooser,
    Scheduler,
    Step,
)
from sim.world import World


class StoreWorld(World):
    """The moto server, with ``S3Store`` processes; the stores' clock is the scheduler's
    tick (``store_model.TickClock``), and each step's last call sent is recorded."""

    def __init__(self, endpoint: str, mode: str, head_budget: int | None = None, **kwargs: Any) -> None:
        self.clock = SM.TickClock()
        # Manifest mode: a head's row bytes before it seals (tiny: every schedule seals
        # and compacts); None: the store's own.
        self.head_budget = head_budget
        self.last: dict[int, int] = {}  # id(LogicalOp) -> tick of its last call sent
        self.scheduler: Scheduler | None = None
        self.sealed = 0  # segments seen by the leftover checks (a test asks that seals happened)
        super().__init__(endpoint, mode, **kwargs)

    def saver(self, prefix: str, **options: Any) -> Any:  # the scheduler's name for "a new process's object"
        from s3_saver import S3Store
        from s3_saver._format.memory.ttl import Clock

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
        if writer is not None and self.scheduler is not None:
            self.last[id(writer)] = self.scheduler.tick
        return super().send(call, writer)


class StoreSpec(Spec):
    def replay(self) -> str:
        env = f"SIM_SEED={self.seed} SIM_MODE={self.mode} SIM_SCENARIO={self.scenario} SIM_FAULTS={self.faults}"
        if self.path is not None:
            env += f" SIM_PATH={','.join(map(str, self.path)) or '-'}"
        return f"{env} .venv/bin/python -m pytest -p no:cacheprovider -n 0 tests/test_store_simulation.py -k replay"


@dataclass
class Scenario:
    name: str
    setup: list[SM.Made]
    processes: list[list[SM.Made]]


def build(rng: random.Random, scenario: str) -> Scenario:
    spelled, _, focus = scenario.partition("@")
    space = SM.SPACES[focus]
    if spelled == "random":
        weights = {name: kind.weight for name, kind in SM.KINDS.items()}
        plan = [rng.choices(list(weights), list(weights.values()), k=rng.randint(1, 3)) for _ in range(rng.randint(2, 3))]
    else:
        plan = [process.split(",") for process in spelled.split("+")]
    for kinds in plan:
        for kind in kinds:
            if kind not in SM.KINDS:
                raise ValueError(f"unknown store step kind {kind!r} (known: {', '.join(SM.KINDS)})")
    # Existing items (a namespace registered, a value to replace): none to three.
    setup = [SM.KINDS[rng.choice(["put", "put_large", "put_medium"])].make(rng, f"S.{i}", space) for i in range(rng.randint(0, 3))]
    processes = [[SM.KINDS[kind].make(rng, f"P{pid}.{i}", space) for i, kind in enumerate(kinds)] for pid, kinds in enumerate(plan)]
    name = "+".join(",".join(kinds) for kinds in plan) + (f"@{focus}" if focus else "")
    return Scenario(name, setup, processes)


def run_store_schedule(world: StoreWorld, spec: Spec) -> Outcome:
    began = time.perf_counter()
    world.requests()
    rng = random.Random(f"store/{spec.mode}/{spec.scenario}/{spec.seed}")
    random.seed(spec.seed)
    prefix = world.new_prefix("m")
    world.scheduler = None
    world.clock.ticks = lambda: 0
    world.last.clear()
    scenario = build(rng, spec.scenario)
    out = Outcome(spec, name=scenario.name, setup=[m.name for m in scenario.setup])
    history = SM.History()

    setup = world.saver(prefix)
    for made in scenario.setup:
        try:
            made.invoke(setup)
        except Exception as exc:
            out.problems.append(f"setup {made.name} raised {type(exc).__name__}: {exc}")
            return _done(out, world, began)
        history.add("setup", made.effect, -1, 0, 0, True)

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
        Process(pid=i, steps=[Step(m.name, _invoke(m), m) for m in steps], prefix=prefix)
        for i, steps in enumerate(scenario.processes)
    ]
    try:
        ops = scheduler.run(processes)
    finally:
        out.trace = scheduler.trace
        out.events = scheduler.tick
    if isinstance(chooser, ExhaustiveChooser):
        spec.path = chooser.path()
        out.next_path = chooser.next_prefix()

    for op in ops:
        made: SM.Made = op.step.model
        kind, value = op.outcome or ("abandoned", None)
        last = world.last.get(id(op))
        start = op.start if op.start is not None else scheduler.tick
        out.history.append(f"{op.label}: {start}..{op.end if kind != 'abandoned' else '-'} (last call {last}): "
                           + (kind if kind != "raised" else f"raised {type(value).__name__}: {value}")
                           + (f" (attempts {op.attempts})" if op.attempts > 1 else ""))
        history.cut |= op.cuts > 0
        if kind == "raised":
            # Every fault of the plan is one the store rides out (a transient one at most
            # twice per call, below its attempts): an error is an answer no order allows.
            out.problems.append(f"{op.label} raised {type(value).__name__}: {str(value)[:300]}")
        end = op.end if kind != "abandoned" else None
        history.add(op.label, made.effect, start, last, end, kind == "ok")
        if kind == "ok" and made.observe is not None:
            assert op.end is not None
            history.reads.append(SM.Read(op.label, start, op.end, made.observe(value)))
    if all(op.outcome is not None for op in ops):
        _verify(world, prefix, history, scheduler.tick, out)
    return _done(out, world, began)


def _invoke(made: SM.Made) -> Any:
    return lambda store, env: made.invoke(store)


def _done(out: Outcome, world: World, began: float) -> Outcome:
    out.calls = world.requests()
    out.seconds = time.perf_counter() - began
    return out


def _verify(world: StoreWorld, prefix: str, history: SM.History, now: int, out: Outcome) -> None:
    problems = out.problems
    judge = SM.Judge(history)
    problems += judge.during()
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
        problem = judge.final(key, None if item is None else item.value)
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
    problems += _leftovers(world, reader, prefix, history)


def _leftovers(world: StoreWorld, reader: Any, prefix: str, history: SM.History) -> list[str]:
    """Value objects named by no row (once no step was cut), and rows naming a missing
    one; sealed segments (manifest mode) named by no head (once no step was cut), and
    heads naming a missing one."""
    from s3_saver._format.memory.rows import ObjectRef

    snapshot = reader._sync.run(reader._memory.index.read(list(SM.NAMESPACES), {}))
    named = {
        reader._memory.index.value_key(ns, cell.token): (ns, key)
        for ns, rows_ in snapshot.nodes.items()
        for key, row in rows_.items()
        for cell in (row.value, row.vectors)
        if isinstance(cell, ObjectRef)
    }
    present = {key for key, _ in world.objects_naming(prefix, "/@v/")}
    problems = [f"row {'/'.join(named[k][0])}:{named[k][1]} names the value object {k}, which is gone" for k in sorted(set(named) - present)]
    if not history.cut:
        problems += [f"the value object {k} is named by no row (no step was cut)" for k in sorted(present - set(named))]
    if world.table is None:
        problems += _segment_leftovers(world, reader, prefix, history)
    return problems


def _segment_leftovers(world: StoreWorld, reader: Any, prefix: str, history: SM.History) -> list[str]:
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
