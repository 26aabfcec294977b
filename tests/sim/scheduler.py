"""Processes of public-method calls, run side by side on one Python thread, one call at a time.

A *process* is what one Lambda or worker does: a list of steps (public method
calls, e.g. a run's ``put`` then ``put_writes``), on a saver of its own. Each
step's operation comes from the public method (``world.capture``), wrapped in
``resilient`` (so transiently failed calls are sent again, as the drivers do;
``Sleep`` steps are skipped). Every call of a wave is an event of its own: at
each event a *chooser* picks which process advances, which of its pending calls
goes, and what fault hits it:

* ``lost``: the call is applied, the operation gets a read timeout instead of
  the answer (``resilient`` sends it again: a retry meets its own write);
* ``notsent``: a connection error, nothing applied;
* ``cut+`` / ``cut-``: the process dies after the call was applied / before it
  was sent. Then it is either abandoned, or the same public method is called
  again by a fresh saver (another process), which may be cut again.

A step is a *logical operation* of the history: it spans from its first call to
its answer across retries; one abandoned for good has no answer (it may take
effect at any later time, or never).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from s3_saver._transport.protocol import Emit, Sleep, Wait
from s3_saver._transport.retry import RetryPolicy, resilient

from sim import model as M
from sim.world import HarnessError, World, capture

POLICY = RetryPolicy(attempts=4, base=0, cap=0, budget=None)
MAX_TRANSIENT_PER_CALL = 2  # < POLICY.attempts - 1: a retried call always gets through

NONE, LOST, NOTSENT, CUT_APPLIED, CUT_NOTSENT = "ok", "lost", "notsent", "cut+", "cut-"
FAULTS = (NONE, LOST, NOTSENT, CUT_APPLIED, CUT_NOTSENT)
RETRY, ABANDON = 0, 1


# -- choosers ------------------------------------------------------------------------------
class RandomChooser:
    """Seeded choices (random mode)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def choose(self, kind: str, weights: list[float]) -> int:
        options = [i for i, w in enumerate(weights) if w > 0]
        if len(options) == 1:
            return options[0]
        return self.rng.choices(options, [weights[i] for i in options])[0]


class ExhaustiveChooser:
    """Depth-first enumeration of the choices of the kinds in ``explore`` (the
    others come from a seeded generator, the same for every schedule): run one
    schedule with a ``prefix`` of choices, then :meth:`next_prefix` for the next."""

    def __init__(self, prefix: list[int], explore: set[str], rng: random.Random) -> None:
        self.prefix = list(prefix)
        self.explore = explore
        self.rng = rng
        self.records: list[tuple[int, int]] = []

    def choose(self, kind: str, weights: list[float]) -> int:
        options = [i for i, w in enumerate(weights) if w > 0]
        if kind not in self.explore:
            if len(options) == 1:
                return options[0]
            return self.rng.choices(options, [weights[i] for i in options])[0]
        if len(options) == 1:
            return options[0]
        pos = len(self.records)
        pick = self.prefix[pos] if pos < len(self.prefix) else 0
        if pick >= len(options):
            raise HarnessError(f"exhaustive replay diverged at choice {pos} ({kind}: {pick} of {len(options)})")
        self.records.append((pick, len(options)))
        return options[pick]

    def path(self) -> list[int]:
        return [c for c, _ in self.records]

    def next_prefix(self) -> list[int] | None:
        for j in range(len(self.records) - 1, -1, -1):
            choice, n = self.records[j]
            if choice + 1 < n:
                return [c for c, _ in self.records[:j]] + [choice + 1]
        return None


class OneFaultChooser:
    """One fault, at the ``at``-th call of the schedule (``at`` < 0: none); every
    other choice from the seeded generator, so the schedule up to the fault is
    the one without it. ``fault`` indexes FAULTS; ``retry`` is RETRY or ABANDON."""

    def __init__(self, at: int, fault: int, retry: int, rng: random.Random) -> None:
        self.at, self.fault, self.retry = at, fault, retry
        self.rng = rng
        self.events = 0

    def choose(self, kind: str, weights: list[float]) -> int:
        if kind == "fault":
            at = self.events
            self.events += 1
            return self.fault if at == self.at and weights[self.fault] > 0 else 0
        if kind == "retry":
            return self.retry
        options = [i for i, w in enumerate(weights) if w > 0]
        if len(options) == 1:
            return options[0]
        return self.rng.choices(options, [weights[i] for i in options])[0]


@dataclass
class FaultPlan:
    """Weights of each fault per call, and bounds per schedule / process."""

    lost: float = 0.0
    notsent: float = 0.0
    cut: float = 0.0  # split evenly between cut+ and cut-
    retry_after_cut: float = 0.6  # probability that a cut step is retried by a fresh process
    max_cuts_per_process: int = 2
    max_faults: int | None = None  # per schedule (exhaustive: 1)

    def weights(self, transient_ok: bool, cut_ok: bool) -> list[float]:
        ok = max(0.0, 1.0 - self.lost - self.notsent - self.cut)
        return [
            ok,
            self.lost if transient_ok else 0.0,
            self.notsent if transient_ok else 0.0,
            self.cut / 2 if cut_ok else 0.0,
            self.cut / 2 if cut_ok else 0.0,
        ]


# -- steps, processes, the history ----------------------------------------------------------
@dataclass
class Step:
    """One public-method call of a process.

    ``invoke(saver, env)`` calls the method (its operation is captured, not run);
    ``keep`` names the env entry the result goes to (for a later step);
    ``model`` is the reference model's version of the step (``model.ModelOp``)."""

    name: str
    invoke: Callable[[Any, dict[str, Any]], Any]
    model: Any
    keep: str | None = None
    emits: bool = False  # list(): the result is what it emitted
    # Made by another process, with caches of its own (``Process.other``), between
    # this process's steps: what it cached before is stale after (workload's stale kinds).
    other: bool = False
    # Always called again by a fresh process after a cut (an operator's call the
    # runbook says to repeat until it answers: promote).
    retry: bool = False


@dataclass
class LogicalOp:
    """A step as the history sees it (across the retries of a cut one)."""

    pid: int
    index: int
    step: Step
    start: int | None = None  # tick of its first call
    end: int | None = None  # tick of its answer (None: abandoned, or never ran)
    outcome: tuple[str, Any] | None = None  # ("ok", value) | ("raised", exc) | ("abandoned", None)
    attempts: int = 0
    cuts: int = 0

    @property
    def in_flight(self) -> bool:
        return self.attempts > 0 and self.outcome is None

    @property
    def retried(self) -> bool:
        return self.attempts > 1

    @property
    def label(self) -> str:
        return f"P{self.pid}.{self.index} {self.step.name}"


class OpRunner:
    """Drives one operation (``resilient``-wrapped) wave by wave; each call of a
    wave is completed separately, in any order."""

    def __init__(self, op: Any) -> None:
        self.gen = resilient(op, POLICY)
        self.wave: tuple[Any, ...] = ()
        self.results: list[Any] = []
        self.pending: list[int] = []
        self.emitted: list[Any] = []
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        # A Wait not over yet: another operation of the same saver (a group
        # commit's lead) sets it; or the scheduler lets the wait run out.
        self.blocked: Wait | None = None
        self.waits = 0
        self._advance(None)

    def _advance(self, reply: Any) -> None:
        while True:
            try:
                step = self.gen.send(reply)
            except StopIteration as stop:
                self.done, self.value = True, stop.value
                return
            except Exception as exc:  # the operation's answer
                self.done, self.error = True, exc
                return
            reply = None
            if isinstance(step, Emit):
                self.emitted.append(step.value)
            elif isinstance(step, Sleep):
                continue
            elif isinstance(step, Wait):
                self.waits += 1
                if step.signal.is_set():
                    continue
                self.blocked = step
                return
            elif isinstance(step, tuple):
                if not step:
                    reply = []
                    continue
                self.wave, self.results, self.pending = step, [None] * len(step), list(range(len(step)))
                return
            else:
                raise HarnessError(f"unknown instruction {step!r}")

    def unblock(self) -> None:
        """The Wait is over (its signal set, or it ran out): the operation goes on."""
        self.blocked = None
        self._advance(None)

    def complete(self, i: int, result: Any) -> None:
        self.results[i] = result
        self.pending.remove(i)
        if not self.pending:
            results, self.wave, self.results = self.results, (), []
            self._advance(results)

    def close(self) -> None:
        try:
            self.gen.close()
        except Exception:
            pass


@dataclass
class Process:
    pid: int
    steps: list[Step]
    prefix: str
    env: dict[str, Any] = field(default_factory=dict)
    position: int = 0
    saver: Any = None
    runner: OpRunner | None = None
    current: LogicalOp | None = None
    dead: bool = False
    cuts: int = 0
    history: list[LogicalOp] = field(default_factory=list)
    # Runs on the saver of this process (one process, concurrent calls: a fan-out's
    # put and put_writes), until a cut makes it retry on a fresh one.
    share: Process | None = None
    # The saver of the steps marked ``other``: another process's, its caches its own.
    other: Any = None
    # How the world builds this process's savers (``World.saver``'s options: a region's role).
    options: dict[str, Any] = field(default_factory=dict)


def _summary(result: Any) -> str:
    if isinstance(result, BaseException):
        code = getattr(result, "response", {}).get("Error", {}).get("Code") if hasattr(result, "response") else None
        return f"{type(result).__name__}({code})" if code else type(result).__name__
    return "ok"


class Scheduler:
    """Runs processes to the end; :attr:`trace` says what happened, event by event."""

    def __init__(self, world: World, chooser: Any, faults: FaultPlan) -> None:
        self.world = world
        self.chooser = chooser
        self.faults = faults
        self.tick = 0
        self.trace: list[str] = []
        self.faults_used = 0
        self._transient: dict[int, tuple[Any, int]] = {}

    # -- steps ----------------------------------------------------------------------
    def _begin(self, p: Process) -> None:
        """Start the process's next step (or the retry of its cut one)."""
        while not p.dead and p.runner is None and p.position < len(p.steps):
            step = p.steps[p.position]
            if p.current is None:
                p.current = LogicalOp(p.pid, p.position, step)
                p.history.append(p.current)
            if p.saver is None and p.share is not None:
                if p.share.saver is None:
                    p.share.saver = self.world.saver(p.share.prefix, **p.share.options)
                p.saver = p.share.saver
            if p.saver is None:
                p.saver = self.world.saver(p.prefix, **p.options)
            if step.other and p.other is None:
                p.other = self.world.saver(p.prefix, **p.options)
            saver = p.other if step.other else p.saver
            p.current.attempts += 1
            try:
                op = capture(saver, lambda s: step.invoke(s, p.env))
            except HarnessError:
                raise
            except Exception as exc:  # refused before any call
                self._answer(p, ("raised", exc))
                continue
            runner = OpRunner(op)
            if runner.done:
                self._finish(p, runner)
                continue
            p.runner = runner

    def _answer(self, p: Process, outcome: tuple[str, Any]) -> None:
        op = p.current
        assert op is not None
        if op.start is None:
            op.start = self.tick
        op.end = self.tick
        op.outcome = outcome
        self.trace.append(f"{self.tick:4d} {op.label}: answered {_outcome(outcome)}")
        if outcome[0] == "ok" and op.step.keep:
            p.env[op.step.keep] = outcome[1]
        p.current, p.runner = None, None
        p.position += 1
        if outcome[0] != "ok":
            # A step that raised ends its process: what came next depended on it.
            p.dead = True

    def _finish(self, p: Process, runner: OpRunner) -> None:
        if runner.waits:
            self.trace.append(f"{self.tick:4d} {p.current.label}: waited {runner.waits}x for a commit of its process")
        if runner.error is not None:
            self._answer(p, ("raised", runner.error))
        else:
            self._answer(p, ("ok", runner.emitted if p.current.step.emits else runner.value))

    def _cut(self, p: Process) -> None:
        op = p.current
        assert op is not None and p.runner is not None
        p.runner.close()
        p.runner = None
        self.world.at_cut(self, op)  # what the world looks at where a process stopped (sim.crypto)
        p.cuts += 1
        op.cuts += 1
        retry = self.chooser.choose("retry", [self.faults.retry_after_cut, 1 - self.faults.retry_after_cut])
        if retry == RETRY or op.step.retry:
            # Another process calls the same method again: a fresh saver, no caches.
            if op.step.other:
                p.other = self.world.saver(p.prefix, **p.options)
            else:
                p.saver = self.world.saver(p.prefix, **p.options)
            self.trace.append(f"{self.tick:4d} {op.label}: cut; retried by a fresh process")
        else:
            op.outcome = ("abandoned", None)
            p.dead = True
            self.trace.append(f"{self.tick:4d} {op.label}: cut; abandoned")

    # -- the loop -------------------------------------------------------------------
    def run(self, processes: list[Process]) -> list[LogicalOp]:
        self.processes = processes
        # The checkpoints whose put has not answered yet, started or not (World._age).
        self.world.puts_to_come = lambda: {
            step.model.checkpoint["id"]
            for p in processes
            for i, step in enumerate(p.steps)
            if isinstance(step.model, M.Put) and not p.dead
            and (i > p.position or (i == p.position and (p.current is None or p.current.outcome is None)))
        }
        for p in processes:
            self._begin(p)
        while True:
            if self._wake(processes):
                continue
            runnable = [p for p in processes if p.runner is not None and p.runner.blocked is None]
            if not runnable:
                waiting = [p for p in processes if p.runner is not None]
                if not waiting:
                    break
                # Every operation waits for another: a wait runs out (the drivers'
                # timeout), and that one goes on alone.
                p = waiting[self.chooser.choose("op", [1.0] * len(waiting))]
                self.trace.append(f"{self.tick:4d} {p.current.label}: its wait ran out")
                self._unblock(p)
                continue
            self.world.between_calls(self)  # e.g. replication landing (sim.failover)
            p = runnable[self.chooser.choose("op", [1.0] * len(runnable))]
            runner = p.runner
            assert runner is not None and p.current is not None
            i = runner.pending[self.chooser.choose("call", [1.0] * len(runner.pending))]
            call = runner.wave[i]
            fault = self._fault(p, call)
            op = p.current
            if op.start is None:
                op.start = self.tick
            self.tick += 1
            if fault in (NONE, LOST, CUT_APPLIED):
                result = self.world.send(call, writer=op)
            else:
                result = None
            shown = _summary(result) if fault in (NONE, LOST, CUT_APPLIED) else "-"
            self.trace.append(f"{self.tick:4d} {op.label}#{op.attempts} {call.describe()} [{fault}] {shown}")
            if fault in (CUT_APPLIED, CUT_NOTSENT):
                self._cut(p)
                self._begin(p)
                continue
            if fault == LOST:
                result = ReadTimeoutError(endpoint_url=self.world.endpoint)
            elif fault == NOTSENT:
                result = EndpointConnectionError(endpoint_url=self.world.endpoint)
            runner.complete(i, result)
            if runner.done:
                self._finish(p, runner)
                self._begin(p)
        return [op for p in processes for op in p.history]

    def _wake(self, processes: list[Process]) -> bool:
        """Go on with the first operation whose Wait's signal was set."""
        for p in processes:
            if p.runner is not None and p.runner.blocked is not None and p.runner.blocked.signal.is_set():
                self._unblock(p)
                return True
        return False

    def _unblock(self, p: Process) -> None:
        runner = p.runner
        assert runner is not None
        runner.unblock()
        if runner.done:
            self._finish(p, runner)
            self._begin(p)

    def _fault(self, p: Process, call: Any) -> str:
        plan = self.faults
        budget_left = plan.max_faults is None or self.faults_used < plan.max_faults
        seen = self._transient.get(id(call))
        count = seen[1] if seen is not None and seen[0] is call else 0
        transient_ok = budget_left and count < MAX_TRANSIENT_PER_CALL
        cut_ok = budget_left and p.cuts < plan.max_cuts_per_process
        weights = plan.weights(transient_ok, cut_ok)
        fault = FAULTS[self.chooser.choose("fault", weights)]
        if fault != NONE:
            self.faults_used += 1
        if fault in (LOST, NOTSENT):
            self._transient[id(call)] = (call, count + 1)
        return fault


def _outcome(outcome: tuple[str, Any]) -> str:
    kind, value = outcome
    if kind == "raised":
        return f"raised {type(value).__name__}: {str(value)[:200]}"
    return kind
