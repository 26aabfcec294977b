"""One schedule end to end, and the loops that run many within a budget.

A schedule is a function of (mode, scenario, seed[, exhaustive path]): the
workload, the choices and the faults all come from seeded generators, so a
failure replays with the command its message prints.
"""

from __future__ import annotations

import json
import os
import random
import warnings
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sim import check as C
from sim import crypto
from sim import model as M
from sim import workload as W
from sim.scheduler import ExhaustiveChooser, FaultPlan, OneFaultChooser, Process, RandomChooser, Scheduler
from sim.world import HarnessError, World


@dataclass
class Spec:
    """What identifies a schedule."""

    mode: str
    scenario: str  # "random", or a pair "run+prune"
    seed: int
    faults: str = "random"  # "random" | "none" | "one"
    # faults "none": the interleaving's explored choices (depth first);
    # faults "one": [call index (-1: none), fault (index in scheduler.FAULTS), retry (0) or abandon (1)].
    path: list[int] | None = None
    versioned: bool = False  # the world's buckets keep versions (World(versioned=True))
    encryption: str | None = None  # the world's savers encrypt: "local" or "kms" (sim.crypto)

    def replay(self) -> str:
        env = f"SIM_SEED={self.seed} SIM_MODE={self.mode} SIM_SCENARIO={self.scenario} SIM_FAULTS={self.faults}"
        if self.versioned:
            env += " SIM_VERSIONED=1"
        if self.encryption:
            env += f" SIM_ENCRYPTION={self.encryption}"
        if self.path is not None:
            env += f" SIM_PATH={','.join(map(str, self.path)) or '-'}"
        return f"{env} .venv/bin/python -m pytest -p no:cacheprovider -n 0 tests/test_simulation.py -k replay"


@dataclass
class Outcome:
    spec: Spec
    problems: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    calls: int = 0
    seconds: float = 0.0
    next_path: list[int] | None = None
    events: int = 0  # calls the schedule sent
    name: str = ""
    setup: list[str] = field(default_factory=list)
    cut_points: int = 0  # two regions: the calls of the writers' phase an outage may come before

    @property
    def ok(self) -> bool:
        return not self.problems

    def report(self) -> str:
        lines = [
            f"simulation FAILED: mode={self.spec.mode} scenario={self.name or self.spec.scenario} seed={self.spec.seed} faults={self.spec.faults}"
            + (f" path={self.spec.path}" if self.spec.path is not None else ""),
            f"replay: {self.spec.replay()}",
            "setup (one saver, before the schedule): " + ", ".join(self.setup),
            "problems:",
            *(f"  - {p}" for p in self.problems),
            "operations (start..end tick: answer):",
            *(f"  {h}" for h in self.history),
            "trace (tick, process.step#attempt, call, [fault], result):",
            *(f"  {line}" for line in self.trace),
        ]
        return "\n".join(lines)


def fault_plan(rng: random.Random, kind: str) -> FaultPlan:
    if kind == "none":
        return FaultPlan()
    if kind == "one":  # OneFaultChooser decides; every fault allowed, once
        return FaultPlan(lost=0.25, notsent=0.25, cut=0.5, max_faults=1, max_cuts_per_process=1)
    profile = rng.random()
    if profile < 0.2:
        return FaultPlan()
    if profile < 0.45:
        return FaultPlan(lost=0.06, notsent=0.06)
    return FaultPlan(lost=0.04, notsent=0.03, cut=rng.choice([0.03, 0.06, 0.1]), retry_after_cut=0.6)


def run_schedule(world: World, spec: Spec) -> Outcome:
    began = time.perf_counter()
    world.requests()
    calls_before = 0
    rng = random.Random(f"{spec.mode}/{spec.scenario}/{spec.seed}")
    random.seed(spec.seed)  # get_next_version, resilient's (zero) backoff
    prefix = world.new_prefix()
    versions = world.saver(prefix).get_next_version
    if spec.scenario == "random":
        kinds = W.random_kinds(rng)
    elif spec.scenario in W.RANDOM_CRYPTO:
        kinds = W.random_crypto_kinds(rng, spec.scenario)
    else:
        kinds = tuple(spec.scenario.split("+"))
    scenario = W.build(rng, prefix, versions, kinds)
    out = Outcome(spec, name=scenario.name, setup=[a.name for a in scenario.setup])

    # Setup: a normal saver writes the history; the model is fed the same calls.
    state = M.ModelState()
    # A migration's world: the setup written by a saver without encryption (sim.crypto).
    setup = world.saver(prefix, encryption=None) if scenario.plain_setup else world.saver(prefix)
    for action in scenario.setup:
        try:
            value = action.invoke(setup)
        except Exception as exc:
            out.problems.append(f"setup {action.name} raised {C._err(exc)}")
            return _done(out, world, calls_before, began)
        nexts = action.model.apply(state, ("ok", value), None, M.Ctx())
        if not nexts:
            raise HarnessError(f"the model refuses the setup step {action.name}")
        state = nexts[0]

    # The schedule.
    if spec.faults == "one":
        at, fault, retry = spec.path or [-1, 0, 0]
        chooser: Any = OneFaultChooser(at, fault, retry, rng)
    elif spec.path is not None:
        chooser = ExhaustiveChooser(spec.path, {"op"}, rng)
    else:
        chooser = RandomChooser(rng)
    plan = fault_plan(rng, spec.faults)
    scheduler = Scheduler(world, chooser, plan)
    processes = [Process(pid=i, steps=steps, prefix=prefix) for i, steps in enumerate(scenario.processes)]
    for i, j in scenario.shares.items():
        processes[i].share = processes[j]
    for i in scenario.plain:
        processes[i].options = {"encryption": None}  # an old process of the rollout
    if scenario.rotate:
        writer_key, target = world.rotation()
        for p in processes:
            # Every process on the new key, the old one still read; the rewrap's target.
            p.options = {"encryption": writer_key}
            p.env["new_key"] = target
    try:
        history = scheduler.run(processes)
    finally:
        out.trace = scheduler.trace
        out.events = scheduler.tick
    if isinstance(chooser, ExhaustiveChooser):
        spec.path = chooser.path()
        out.next_path = chooser.next_prefix()
    out.history = [
        f"{op.label}: {op.start}..{op.end if op.end is not None else '-'}: "
        + (op.outcome[0] if op.outcome[0] != "raised" else f"raised {C._err(op.outcome[1])}")
        + (f" (attempts {op.attempts})" if op.attempts > 1 else "")
        for op in history
    ]
    finished: set[str] = set()
    if world.encryption is not None:
        out.problems.extend(world.cut_problems)
        finished = crypto.finish_abandoned_erases(world, prefix, history, out.problems)
        out.history += [f"(harness) erase_thread({t}) called again after its abandoned cut: ok" for t in sorted(finished)]
        if scenario.plain_setup:
            deleted = crypto.finish_abandoned_deletes(world, prefix, history, out.problems)
            out.history += [f"(harness) delete_thread({t}) called again after its abandoned cut: ok" for t in deleted]
            crypto.finish_migrations(world, prefix, scenario, history, out.problems)
            out.history.append("(harness) encrypt_existing() twice, a fresh process each, the grace period over")
    old_key = world.encryption
    try:
        if scenario.rotate:
            kek = crypto.finish_rewraps(world, prefix, history, out.problems)
            if kek is None:
                return _done(out, world, calls_before, began)
            out.problems.extend(crypto.records_under(world, prefix, kek))
            # Every read after is of a process with the new key alone: each record not
            # erased unwraps under it (k).
            world.encryption = world.rotation()[1]
        _verify(world, prefix, scenario, history, state, rng, out, finished)
        if old_key is not None:
            out.problems.extend(crypto.erased_keys_stay_erased(world, history))
    finally:
        world.encryption = old_key
    return _done(out, world, calls_before, began)


def _done(out: Outcome, world: World, calls_before: int, began: float) -> Outcome:
    out.calls = world.requests()
    out.seconds = time.perf_counter() - began
    return out


# Which checks run (SIM_CHECKS=a,b,c,d,e,f; default all): leaving one out lets a
# long run look past a known defect (e.g. SIM_CHECKS=a,b,d while leftovers are fixed).
CHECKS = set((os.environ.get("SIM_CHECKS") or "a,b,c,d,e,f").split(","))


def _verify(
    world: World, prefix: str, scenario: W.Scenario, history: list[Any], state: M.ModelState, rng: random.Random,
    out: Outcome, finished: set[str] = frozenset(),
) -> None:
    problems = out.problems
    threads = scenario.threads
    reader = world.saver(prefix)
    observed = C.read_all(reader, threads, problems)
    if observed is None:
        return
    if "a" in CHECKS:
        # The thread every process works on always; the copies and imports now and then.
        for t in threads:
            if t == threads[0] or rng.random() < 0.35:
                C.consistent_reads(reader, t, observed[t], rng, problems)

    def observe(s: M.ModelState) -> list[str]:
        return [d for t in threads for d in M.compare_thread(s, t, observed[t])]

    found = M.linearize(history, state, observe, _ctx(scenario, history))
    if not found.ok and "a" in CHECKS:
        problems.append(
            "(a) no order of the operations explains what the saver reads"
            + (f" (answers impossible in some orders: {found.rejected})" if found.rejected else "")
        )
        for label, reason in found.reasons.items():
            problems.append(f"    {label} returned what no order allows: {reason[:600]}")
        if found.closest:
            problems.append("    closest order: " + " -> ".join(found.closest_order))
            problems.extend(f"    {d}" for d in found.closest[:12])
    if "b" in CHECKS:
        C.audit(reader, problems, "after the schedule")
    if found.ok and "c" in CHECKS:
        for t in threads:
            if C.deleted_cleanly(history, found.state, t):
                problems.extend(C.leftovers(world, prefix, t))
            if C.erased_cleanly(history, found.state, t):
                problems.extend(C.erased_leftovers(world, prefix, t))
    # (e) before any collection (put_writes refused them), and after it.
    settled = [t for t in threads if "e" in CHECKS and C.settled_after_delete(history, t)]
    for t in settled:
        problems.extend(C.orphan_writes(world.saver(prefix), t, "before collect_garbage"))
    if "d" in CHECKS:
        _gc_changes_nothing(world, prefix, threads, observed, problems)
    for t in settled:
        if "d" not in CHECKS:
            world.saver(prefix).collect_garbage([t], older_than=timedelta(0))
        problems.extend(C.orphan_writes(world.saver(prefix), t, "after collect_garbage"))
    if not found.ok and scenario.archiving:
        _after_restore(world, prefix, scenario, history, state, problems)
    # (f) last: it archives the threads it checks.
    if found.ok and "f" in CHECKS and any(isinstance(op.step.model, M.ArchiveIdle) for op in history):
        problems.extend(C.idle_not_found(world, prefix, history, found.state, threads))
    if world.encryption is not None:
        # (g), (h), then (i) last: it puts erased threads back as a backup would (sim.crypto).
        problems.extend(crypto.plaintext_left(world, prefix, scenario))
        problems.extend(crypto.copies_under_own_keys(world, prefix, reader._base_ctx.layout.prefix, history))
        if found.ok:
            erased = finished | {
                op.step.model.t for op in history
                if isinstance(op.step.model, M.EraseThread) and op.outcome is not None and op.outcome[0] == "ok"
            }
            problems.extend(crypto.unreadable_after_restore(world, prefix, erased, found.state, scenario))


def _gc_changes_nothing(world: World, prefix: str, threads: list[str], observed: dict[str, Any], problems: list[str]) -> None:
    """(d) collect_garbage(older_than=0), nothing in flight: every read stays the same."""
    try:
        collected = world.saver(prefix).collect_garbage(older_than=timedelta(0))
    except Exception as exc:
        problems.append(f"(d) collect_garbage raised {C._err(exc)}")
        return
    if collected.deleted:  # else nothing changed
        _after_gc(world, prefix, threads, observed, problems)


def _ctx(scenario: W.Scenario, history: list[Any]) -> M.Ctx:
    archive_ops: dict[str, list[Any]] = {t: [] for t in scenario.archiving}
    erase_ops: dict[str, list[Any]] = {}
    migrate_ops: dict[str, list[Any]] = {}
    plain_writes: dict[str, list[Any]] = {}
    for op in history:
        if isinstance(op.step.model, (M.ArchiveThread, M.ArchiveIdle, M.EncryptThread)):
            for t in op.step.model.threads:
                archive_ops.setdefault(t, []).append(op)
        if isinstance(op.step.model, M.EraseThread):
            erase_ops.setdefault(op.step.model.t, []).append(op)
        if isinstance(op.step.model, M.EncryptThread):
            migrate_ops.setdefault(op.step.model.t, []).append(op)
        if op.pid in scenario.plain and isinstance(op.step.model, (M.Put, M.PutWrites)):
            plain_writes.setdefault(op.step.model.t, []).append(op)
    return M.Ctx(
        erase_ops=erase_ops,
        migrate_ops=migrate_ops,
        plain_writes=plain_writes,
        plain_setup=scenario.plain_setup,
        archiving=set(scenario.archiving),
        deleting=set(scenario.deleting),
        rearchiving={t for t, n in scenario.archives.items() if n > 1},
        archive_ops=archive_ops,
    )


def _after_gc(world: World, prefix: str, threads: list[str], observed: dict[str, Any], problems: list[str]) -> None:
    """(d) What collect_garbage deleted was needed by no read."""
    again: list[str] = []
    after = C.read_all(world.saver(prefix), threads, again)
    if after is None:
        problems.extend(again)
        return
    for t in threads:
        if after[t] != observed[t]:
            lost = sorted(set(observed[t]) - set(after[t]))
            changed = [k for k in observed[t] if k in after[t] and after[t][k] != observed[t][k]]
            problems.append(f"(d) collect_garbage changed {t}: gone {lost}, changed {changed}")
    C.audit(world.saver(prefix), problems, "after collect_garbage")


def _after_restore(world: World, prefix: str, scenario: W.Scenario, history: list[Any], state: M.ModelState, problems: list[str]) -> None:
    """A diagnostic: does restoring the archived threads bring the missing writes
    back (parked under the archive) or not (lost)?"""
    saver = world.saver(prefix)
    try:
        for t in sorted(scenario.archiving):
            saver.restore_thread(t)
    except Exception as exc:
        problems.append(f"    (diagnostic) restore_thread raised {C._err(exc)}")
        return
    scratch: list[str] = []
    observed = C.read_all(world.saver(prefix), scenario.threads, scratch)
    if observed is None:
        problems.append(f"    (diagnostic) after restore_thread: {scratch[0] if scratch else 'reads fail'}")
        return
    found = M.linearize(history, state, lambda s: [d for t in scenario.threads for d in M.compare_thread(s, t, observed[t])], _ctx(scenario, history))
    problems.append(
        "    (diagnostic) after restore_thread the reads "
        + ("match an order: the committed writes were parked under the archive, invisible meanwhile" if found.ok else "still match no order (a committed write lost, or an answer no order allows)")
    )


# -- budgets and loops -------------------------------------------------------------------------
class SimulationSummary(UserWarning):
    """How much a simulation test ran: a warning, so pytest shows it (xdist workers too)."""


def summarize(line: str) -> None:
    print(line)
    warnings.warn(SimulationSummary(line), stacklevel=2)



def budget_seconds(default: float, long: float | None = None) -> float:
    """Seconds for one simulation test: ``default`` in make test, ``long`` (if given)
    in make test-all, a share of ``SOAK_MINUTES`` in make soak; ``SIM_BUDGET_SECONDS``
    overrides the first two."""
    minutes = os.environ.get("SOAK_MINUTES")
    if minutes:
        # `make soak`: the minutes are split across the simulation and stateful tests (SOAK_SHARES per worker).
        return float(minutes) * 60 / float(os.environ.get("SOAK_SHARES", "5"))
    if long is not None and os.environ.get("TEST_ALL") == "1":
        default = long
    return float(os.environ.get("SIM_BUDGET_SECONDS", default))


@dataclass
class Tally:
    schedules: int = 0
    calls: int = 0
    seconds: float = 0.0
    failures: list[Outcome] = field(default_factory=list)
    by_scenario: dict[str, int] = field(default_factory=dict)

    def add(self, out: Outcome) -> None:
        self.schedules += 1
        self.calls += out.calls
        self.seconds += out.seconds
        self.by_scenario[out.name or out.spec.scenario] = self.by_scenario.get(out.name or out.spec.scenario, 0) + 1
        if not out.ok:
            self.failures.append(out)
            path = os.environ.get("SIM_FAILURES_FILE")
            if path:  # one JSON line per failed schedule, for triage after a soak
                with open(path, "a") as f:
                    f.write(json.dumps({"replay": out.spec.replay(), "scenario": out.name, "problems": out.problems,
                                        "history": out.history, "setup": out.setup}) + "\n")

    def summary(self, what: str) -> str:
        per_min = self.schedules / self.seconds * 60 if self.seconds else 0.0
        ms = self.seconds / self.calls * 1000 if self.calls else 0.0
        return (
            f"[sim] {what}: {self.schedules} schedules, {self.calls} calls, {self.seconds:.1f} s "
            f"({per_min:.0f} schedules/min, {ms:.2f} ms/call incl. checks), {len(self.failures)} failed"
        )
