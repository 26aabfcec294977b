"""The two-region schedules' reference: what each region committed, and checks (f), (g), (b).

See tests/sim/failover.py for the schedule. A write (a put, a put_writes call)
of region P or R is

* ``OK``: it answered;
* ``MAYBE``: it did not answer (raised at the outage, cut and abandoned) and
  one of its index writes was applied (``RegionWorld.indexed``), so it may have
  committed; so is every write to a thread deleted in P (the promoted region may
  never have seen the delete: what it kept comes back);
* ``NEVER``: it did not answer and no index write of it was applied.

Pending writes are compared per task as LangGraph keeps them (``WRITES_IDX_MAP``'s
channels last-write-wins, the others first-write-wins per index): one region's
run of the task, P's committed calls (what P's own index holds), or R's (the P
calls R's index held, then R's own).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP

from s3_saver.errors import PrimaryUnavailableError, ReplicationLagError

from sim import check as C
from sim import model as M

OK, MAYBE, NEVER = "ok", "maybe", "never"


@dataclass
class Write:
    region: str
    status: str
    order: tuple[int, int]
    model: Any  # M.Put or M.PutWrites


def _model(step_model: Any) -> Any:
    inner = getattr(step_model, "model", None)  # failover.Continued: built at its first call
    return inner if inner is not None else step_model


class Committed:
    """Every put and put_writes call of a schedule (its setup's too), by region and status."""

    def __init__(self, plan: Any, history: list[Any], roles: dict[int, str], indexed: set[int]) -> None:
        self.ref = M.ModelState()  # every checkpoint written, as a read returns it
        self.puts: dict[tuple[str, str, str], Write] = {}
        self.calls: dict[tuple[str, str, str, str], list[Write]] = defaultdict(list)
        for i, action in enumerate(plan.setup):
            self._add(Write("P", MAYBE if action.model.t in plan.deleted else OK, (-1, i), action.model))
        for op in history:
            model = _model(op.step.model)
            if op.outcome is None or not isinstance(model, (M.Put, M.PutWrites)):
                continue
            if op.outcome[0] == "ok":
                status = OK
            else:
                status = MAYBE if id(op) in indexed else NEVER
            if status == OK and roles[op.pid] == "P" and model.t in plan.deleted:
                status = MAYBE
            end = op.end if op.end is not None else op.start
            self._add(Write(roles[op.pid], status, (end if end is not None else 0, op.pid), model))

    def _add(self, w: Write) -> None:
        m = w.model
        if isinstance(m, M.Put):
            self.ref.put(m.config, m.checkpoint, m.metadata, m.new_versions)
            self.puts[(m.t, m.ns, m.checkpoint["id"])] = w
        else:
            self.calls[(m.t, m.ns, m.cid, m.task_id)].append(w)

    def payload(self, t: str, key: M.Key) -> dict[str, Any]:
        return self.ref.view(t)[key]


def resolve(line: list[Write]) -> tuple:
    """A task's pending writes after ``line``'s calls, in order (as LangGraph keeps them)."""
    slots: dict[tuple[str, int], tuple[str, str, Any]] = {}
    for w in sorted(line, key=lambda w: (w.region != "P", w.order)):
        m = w.model
        for idx, (channel, value) in enumerate(m.writes):
            slot = (m.task_id, WRITES_IDX_MAP.get(channel, idx))
            if slot in slots and slot[1] >= 0:
                continue
            slots[slot] = (m.task_id, channel, value)
    return M.norm_writes(list(slots.values()))


def _subsets(calls: list[Write], required: bool, never_too: bool) -> list[list[Write]]:
    """Every set of ``calls`` a region's index may hold: with each OK one
    (``required``), and any of the others that may have committed."""
    must = [w for w in calls if required and w.status == OK]
    may = [w for w in calls if w not in must and (w.status != NEVER or never_too)]
    return [must + list(c) for r in range(len(may) + 1) for c in combinations(may, r)]


def explain(observed: tuple, p_calls: list[Write], r_calls: list[Write], rebuilt: bool) -> list[Write] | None:
    """The line (one region's run) that gives ``observed`` keeping the most
    answered calls; None when none does."""
    lines = _subsets(p_calls, True, False)
    # R's index holds the P calls that replicated (any, a rebuild even uncommitted
    # ones it found whole), and R's own.
    lines += [p + r for p in _subsets(p_calls, False, rebuilt) for r in _subsets(r_calls, True, False)]
    lines.append([])
    found = [line for line in lines if resolve(line) == observed]
    if not found:
        return None
    return max(found, key=lambda line: sum(w.status == OK for w in line))


def _calls_text(calls: list[Write]) -> str:
    return ", ".join(f"{w.region}:{w.status}:{[c for c, _ in w.model.writes]}" for w in calls) or "none"


def check_final(world: Any, prefix: str, plan: Any, ref: Committed, problems: list[str]) -> None:
    """(f) and (b): a fresh process configured as at first, after the failback."""
    rebuilt = world.mode == "dynamodb" and not world.global_table
    reader = world.saver(prefix, "P")
    observed = C.read_all(reader, plan.threads, problems)
    if observed is None:
        return
    try:
        report = reader.verify(plan.threads)
    except Exception as exc:
        problems.append(f"(f) verify() after the failback raised {C._err(exc)}")
        return
    aside = {(g.thread_id, g.ns, g.checkpoint_id, g.kind, g.task_id): g.reason for g in report.set_aside if g.reason}
    for t in plan.threads:
        for key, payload in observed[t].items():
            put = ref.puts.get((t, *key))
            if put is None:
                problems.append(f"(f) {t} {key}: readable, no put wrote it")
                continue
            if put.status == NEVER and not (rebuilt and put.region == "P"):
                problems.append(f"(f) {t} {key}: readable, its put in {put.region} never committed")
            want = ref.payload(t, key)
            diffs = [d for d in M.differences(payload, want) if not d.startswith("pending_writes")]
            if diffs:
                problems.append(f"(f) {t} {key}: not as {put.region} wrote it: " + "; ".join(diffs))
            _check_writes(t, key, payload["pending_writes"], ref, aside, rebuilt, problems)
        for (tt, ns, cid), put in ref.puts.items():
            if tt == t and put.status == OK and (ns, cid) not in observed[t] and (t, ns, cid, "checkpoint", None) not in aside:
                problems.append(
                    f"(f) {t} {(ns, cid)}: committed by {put.region}, neither readable nor set aside by verify()"
                )
    C.audit(reader, problems, "of P after the failback")


def _check_writes(t: str, key: M.Key, pending: tuple, ref: Committed, aside: dict, rebuilt: bool, problems: list[str]) -> None:
    by_task: dict[str, list] = defaultdict(list)
    for w in pending:
        by_task[w[0]].append(w)
    tasks = set(by_task) | {task for (tt, ns, cid, task) in ref.calls if (tt, ns, cid) == (t, *key)}
    for task in sorted(tasks):
        calls = ref.calls.get((t, *key, task), [])
        p_calls = [w for w in calls if w.region == "P"]
        r_calls = [w for w in calls if w.region == "R"]
        seen = M.norm_writes(by_task.get(task, ()))
        line = explain(seen, p_calls, r_calls, rebuilt)
        if line is None:
            problems.append(
                f"(f) {t} {key} task {task}: pending writes {[(c, M._short(v, 40)) for _, c, v in seen]} are no run "
                f"of the task either region committed (P: {_calls_text(p_calls)}; R: {_calls_text(r_calls)})"
            )
            continue
        dropped = [w for w in calls if w.status == OK and w not in line]
        reason = aside.get((t, *key, "writes", task))
        if dropped and reason is None:
            problems.append(
                f"(f) {t} {key} task {task}: committed by {'/'.join(sorted({w.region for w in dropped}))} "
                f"({_calls_text(dropped)}), neither readable nor set aside by verify()"
            )
        elif dropped and "another run" in reason and not any(w.region == "R" for w in line):
            # R's run wins only where R ran the task itself (a call of its own):
            # parts of P's that R only received are P's run, kept whole (issue 34, 1).
            problems.append(
                f"(f) {t} {key} task {task}: P's committed calls ({_calls_text(dropped)}) set aside for "
                f"another run of the task ({reason!r}), but R never ran it (what R read: {_calls_text(line)})"
            )


def check_lagging(op: Any, rebuilt: bool, ref: Committed, problems: list[str]) -> None:
    """(g) A read of a process configured as the application was, during the outage."""
    kind, value = op.outcome
    if kind == "abandoned":
        return
    if kind == "raised":
        if not (isinstance(value, ReplicationLagError) or (rebuilt and isinstance(value, PrimaryUnavailableError))):
            problems.append(f"(g) {op.label} during the outage raised {C._err(value)}")
        return
    rows = [M.norm(x) for x in (value if op.step.emits else [value]) if x is not None]
    if not rows:
        problems.append(f"(g) {op.label} during the outage read nothing (the setup had replicated whole)")
    ids = {key for key, _ in rows}
    for key, payload in rows:
        t = payload["thread_id"]
        put = ref.puts.get((t, *key))
        if put is None or put.region != "P" or put.status == NEVER:
            problems.append(f"(g) {op.label} read {key}, which P never committed ({put and put.status})")
            continue
        diffs = [d for d in M.differences(payload, ref.payload(t, key)) if not d.startswith("pending_writes")]
        if diffs:
            problems.append(f"(g) {op.label} read {key} not as P wrote it: " + "; ".join(diffs))
        written = {(task, c, repr(v)) for (tt, ns, cid, task), calls in ref.calls.items() if (tt, ns, cid) == (t, *key)
                   for w in calls if w.status != NEVER for c, v in w.model.writes}
        extra = [w for w in payload["pending_writes"] if (w[0], w[1], repr(w[2])) not in written]
        if extra:
            problems.append(f"(g) {op.label} read {key} with pending writes P never committed: {extra}")
        if op.step.emits and payload["parent"] is not None and (key[0], payload["parent"]) not in ids:
            problems.append(f"(g) {op.label} read {key} without its parent {payload['parent']}: a hole in the history")
