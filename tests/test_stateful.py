"""Stateful property test: sequences of every public operation, with cuts, against the model.

Hypothesis draws a sequence of operations on 2-3 threads (put, put_writes,
get_tuple, list with before/limit/filter, prune, delete_for_runs, copy_thread,
archive_thread, restore_thread, export_thread + import_thread, delete_thread,
collect_garbage), in both index modes. Each runs through the simulation's
scheduler (tests/sim), sometimes cut short at a drawn call (then retried by a
fresh saver, or abandoned). After every step a fresh saver reads every thread,
and some state of the model (tests/sim/model.py) must read the same; the audit
must find nothing missing.

Budget: ``SIM_STATEFUL_SECONDS`` (default 8 per mode, 12 in ``make test-all``; ``make soak`` gives it a
share of ``SOAK_MINUTES``), in rounds of ``SIM_HYPOTHESIS_EXAMPLES`` examples
(default 4) of at most ``SIM_HYPOTHESIS_STEPS`` steps (default 8). A failure is not
shrunk unless ``SIM_HYPOTHESIS_SHRINK=1`` (on by default in a soak): shrinking takes minutes.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from conftest import INDEX_MODES
from sim import check as C
from sim import model as M
from sim import workload as W
from sim.runner import budget_seconds, summarize
from sim.scheduler import CUT_APPLIED, CUT_NOTSENT, FAULTS, NONE, Process, Scheduler, Step, FaultPlan
from sim.world import World

MAX_STATES = 24  # model states kept (answers that allow several outcomes)
CUTS = st.one_of(
    st.none(),
    st.none(),
    st.tuples(st.integers(0, 14), st.booleans(), st.booleans()),  # (call index, applied, retried)
)


class _Scripted:
    """A chooser for one process: no faults but one cut at a given call."""

    def __init__(self, cut: tuple[int, bool, bool] | None) -> None:
        self.cut = cut
        self.events = 0

    def choose(self, kind: str, weights: list[float]) -> int:
        if kind == "fault":
            at = self.events
            self.events += 1
            if self.cut is not None and at == self.cut[0] and weights[FAULTS.index(CUT_APPLIED)] > 0:
                return FAULTS.index(CUT_APPLIED if self.cut[1] else CUT_NOTSENT)
            return FAULTS.index(NONE)
        if kind == "retry":
            return 0 if self.cut is not None and self.cut[2] else 1
        return 0


_COUNTS = {"examples": 0, "steps": 0}


class SaverMachine(RuleBasedStateMachine):
    world: World  # set by the test: one World (bucket, table) per test

    def __init__(self) -> None:
        super().__init__()
        self.mode = self.world.mode
        self.prefix = self.world.new_prefix("h")
        # The same rules build the same values whatever the prefix: a failure replays.
        random.seed(0)
        self.builder = W.Builder(random.Random(0), self.world.saver(self.prefix).get_next_version)
        self.threads = [f"{self.prefix}-T{i}-x" for i in range(2)]
        self.runs = [f"{self.prefix}-run{i}" for i in range(3)]
        self.states = [M.ModelState()]
        self.observed: dict[str, dict[M.Key, dict]] = {t: {} for t in self.threads}
        self.extra = itertools.count()
        self.trace: list[str] = []
        _COUNTS["examples"] += 1

    # -- running one step (or two: export then import) ----------------------------
    def _run(self, steps: list[Step], cut: Any) -> None:
        _COUNTS["steps"] += 1
        scheduler = Scheduler(self.world, _Scripted(cut), FaultPlan(max_cuts_per_process=1))
        history = scheduler.run([Process(0, steps, self.prefix)])
        self.trace.append(f"{[s.name for s in steps]} cut={cut}: " + "; ".join(
            f"{op.step.name}={op.outcome[0] if op.outcome[0] != 'raised' else C._err(op.outcome[1])[:160]}" for op in history
        ))
        ctx = M.Ctx()  # one operation at a time: nothing races
        states = self.states
        for op in history:
            nexts: dict[Any, M.ModelState] = {}
            for s in states:
                options = op.step.model.apply(s, op.outcome, op, ctx)
                if op.outcome[0] == "abandoned":
                    options = [s] + options
                for n in options:
                    nexts.setdefault(n.fingerprint(), n)
            if not nexts:
                raise AssertionError(
                    f"{op.label}: answered {op.outcome[0]} "
                    + (C._err(op.outcome[1]) if op.outcome[0] == "raised" else "")
                    + " -- impossible in the model"
                    + (f": {op.step.model.last_reason}" if op.step.model.last_reason else "")
                    + "\n"
                    + "\n".join(self.trace)
                    + "\n" + "\n".join(scheduler.trace[-40:])
                )
            states = list(nexts.values())[:MAX_STATES]
        self.states = states

    def _visible(self, t: str, ns: str = "") -> list[W.Made]:
        made = {m.cid: m for m in self.builder.made.get((t, ns), [])}
        return [made[cid] for (n, cid) in sorted(self.observed.get(t, {})) if n == ns and cid in made]

    # -- rules --------------------------------------------------------------------
    @rule(ti=st.integers(0, 2), sub=st.booleans(), run=st.integers(0, 2), fork=st.integers(0, 3), writes=st.booleans(), cut=CUTS)
    def put(self, ti, sub, run, fork, writes, cut):
        t = self.threads[ti % len(self.threads)]
        ns = W.SUB_NS if sub else ""
        visible = self._visible(t, ns)
        parent = visible[-1 - fork % len(visible)] if visible else None  # fork 0: the latest
        made, step = W.put_step(self.builder, t, ns, self.runs[run], parent, fork=parent is None)
        steps = [step]
        if writes:
            steps.append(W.writes_step(self.builder, made, None))
        self._run(steps, cut)

    @rule(ti=st.integers(0, 2), special=st.sampled_from([None, None, W.RESUME, W.INTERRUPT, W.ERROR]), old=st.booleans(), cut=CUTS)
    def put_writes(self, ti, special, old, cut):
        t = self.threads[ti % len(self.threads)]
        visible = self._visible(t)
        if not visible:
            return
        target = visible[0] if old else visible[-1]
        self._run([W.writes_step(self.builder, target, special)], cut)

    @rule(ti=st.integers(0, 2), ns=st.sampled_from([None, "", W.SUB_NS]), limit=st.sampled_from([None, 1, 2]),
          before=st.booleans(), flt=st.sampled_from([None, "run", "tag"]))
    def read(self, ti, ns, limit, before, flt):
        t = self.threads[ti % len(self.threads)]
        visible = sorted(self.observed.get(t, {}))
        bid = visible[len(visible) // 2][1] if before and visible else None
        filter = None
        if flt == "run":
            filter = {"run_id": self.runs[0]}
        elif flt == "tag":
            filter = {"tag": "y"}
        self._run([W.list_step(t, ns, filter, bid, limit)], None)
        self._run([W.get_step(t, ns or "")], None)

    @rule(which=st.sampled_from(["one", "all"]), keep=st.sampled_from([None, 1, 2]), cut=CUTS)
    def prune(self, which, keep, cut):
        ts = self.threads[:1] if which == "one" else list(self.threads)
        self._run([W.prune_step(ts, keep)], cut)

    @rule(run=st.integers(0, 2), cut=CUTS)
    def delete_for_runs(self, run, cut):
        self._run([W.delete_runs_step([self.runs[run]], tuple(self.threads))], cut)

    @rule(ti=st.integers(0, 2), cut=CUTS)
    def copy_thread(self, ti, cut):
        if len(self.threads) >= 4:
            return
        src = self.threads[ti % len(self.threads)]
        dst = f"{self.prefix}-C{next(self.extra)}-x"
        self.threads.append(dst)
        self._run([W.copy_step(src, dst)], cut)

    @rule(ti=st.integers(0, 2), cut=CUTS)
    def export_import(self, ti, cut):
        if len(self.threads) >= 4:
            return
        src = self.threads[ti % len(self.threads)]
        dst = f"{self.prefix}-I{next(self.extra)}-x"
        self.threads.append(dst)
        self._run(W.export_import_steps(src, dst, ("export", dst)), cut)

    @rule(ti=st.integers(0, 2), cut=CUTS)
    def archive_thread(self, ti, cut):
        t = self.threads[ti % len(self.threads)]
        self._run([W.archive_step(t)], cut)

    @rule(ti=st.integers(0, 2), cut=CUTS)
    def restore_thread(self, ti, cut):
        self._run([W.restore_step(self.threads[ti % len(self.threads)])], cut)

    @rule(ti=st.integers(0, 2), cut=CUTS)
    def delete_thread(self, ti, cut):
        self._run([W.delete_step(self.threads[ti % len(self.threads)])], cut)

    @rule(cut=CUTS)
    def collect_garbage(self, cut):
        step = Step("collect_garbage", lambda s, env: s.collect_garbage(older_than=timedelta(0)), M.CollectGarbage())
        self._run([step], cut)

    # -- after every step ---------------------------------------------------------
    @invariant()
    def reads_match_the_model(self):
        problems: list[str] = []
        reader = self.world.saver(self.prefix)
        observed = C.read_all(reader, self.threads, problems)
        if observed is not None:
            self.observed = observed
            t = random.Random(len(self.trace)).choice(self.threads)
            C.consistent_reads(reader, t, observed[t], random.Random(len(self.trace)), problems)
            matching = [s for s in self.states if not [d for t in self.threads for d in M.compare_thread(s, t, observed[t])]]
            if not matching:
                diffs = [d for t in self.threads for d in M.compare_thread(self.states[0], t, observed[t])]
                problems.append("(a) no state of the model reads as the saver does:\n    " + "\n    ".join(diffs[:12]))
            else:
                self.states = matching
        if self.trace:  # the audit lists the prefix: after the first step only
            C.audit(reader, problems, "after this step")
        assert not problems, (
            f"mode={self.mode} prefix={self.prefix}\n" + "\n".join(problems) + "\nsteps:\n  " + "\n  ".join(self.trace)
        )


@pytest.mark.parametrize("mode", INDEX_MODES)
def test_stateful(moto_endpoint: str, mode: str) -> None:
    machine = type(f"SaverMachine_{mode}", (SaverMachine,), {"world": World(moto_endpoint, mode)})
    budget = float(os.environ.get("SIM_STATEFUL_SECONDS", 0)) or budget_seconds(4, long=12)
    examples = int(os.environ.get("SIM_HYPOTHESIS_EXAMPLES", "4"))
    steps = int(os.environ.get("SIM_HYPOTHESIS_STEPS", "8"))
    # Shrinking a failure can take minutes: on in a soak (or SIM_HYPOTHESIS_SHRINK=1).
    shrink = os.environ.get("SIM_HYPOTHESIS_SHRINK", "1" if os.environ.get("SOAK_MINUTES") else "0") == "1"
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])
    config = settings(
        phases=phases,
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    deadline = time.monotonic() + budget
    rounds = 0
    before = dict(_COUNTS)
    started = time.monotonic()
    try:
        while rounds == 0 or time.monotonic() < deadline:
            run_state_machine_as_test(machine, settings=config)
            rounds += 1
    finally:
        summarize(
            f"[sim] {mode} stateful: {_COUNTS['examples'] - before['examples']} examples, "
            f"{_COUNTS['steps'] - before['steps']} operations in {rounds} rounds, {time.monotonic() - started:.1f} s"
        )
