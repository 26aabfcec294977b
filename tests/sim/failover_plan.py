"""The two-region schedules' steps (tests/sim/failover.py runs them): what each phase's processes do.

Phase 1, writers on P: a run (checkpoint X, task T's interrupt on X, X's child Y,
T's resume on X: issue 34's sequence 1), another task's writes, a thread
written then deleted. Phase 2: ``promote()`` beside a reader of P's thread.
Phase 3, writers on R: the thread continued from what R reads (a write built
at its first call), and T run again there. Phase 4: ``promote()`` back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from sim import model as M
from sim import workload as W
from sim.scheduler import Step


class Promote:
    """promote(): ``"failover"`` (P down) or ``"failback"``."""

    threads: tuple[str, ...] = ()

    def __init__(self, which: str) -> None:
        self.name = which


class Continued:
    """A write built at its first call from what its process read before
    (``env["latest"]``: R's latest), then the same on every retry."""

    threads: tuple[str, ...] = ()

    def __init__(self, b: W.Builder, t: str, run_id: str, after: Continued | None = None, special: str | None = None) -> None:
        self.b, self.t, self.run_id, self.after, self.special = b, t, run_id, after, special
        self.model: M.Put | M.PutWrites | None = None
        self.made: W.Made | None = None

    def invoke(self, saver: Any, env: dict[str, Any]) -> Any:
        if self.model is None and self.after is None:
            latest = env.get("latest")
            parent = None
            if latest is not None:
                c, meta = latest.config["configurable"], latest.metadata or {}
                cp = latest.checkpoint
                parent = W.Made(self.t, c.get("checkpoint_ns", ""), c["checkpoint_id"], None, self.run_id,
                                dict(cp["channel_values"]), dict(cp["channel_versions"]), meta.get("step", 0))
            self.made, self.model, _ = self.b.checkpoint(self.t, "", self.run_id, parent, fork=parent is None)
        elif self.model is None:
            assert self.after is not None and self.after.made is not None
            self.model, _ = self.b.writes(self.after.made, special=self.special)
        m = self.model
        if isinstance(m, M.Put):
            return saver.put(m.config, m.checkpoint, m.metadata, m.new_versions)
        return saver.put_writes(m.config, m.writes, m.task_id, m.task_path)


def _continued(obj: Continued, name: str) -> Step:
    return Step(name, lambda s, env: obj.invoke(s, env), obj)


def resume_step(b: W.Builder, target: W.Made, task_id: str, answer: str) -> Step:
    """Task ``task_id`` resumed on ``target`` (after its interrupt): the answer and the node's write."""
    writes = [(W.RESUME, f"{answer} " + b.text(2)), ("counter", target.step + 1)]
    model = M.PutWrites(target.config, writes, task_id, "~__pregel_pull, agent")
    return Step(f"put_writes({target.cid[-6:]},resume {task_id[-2:]})",
                lambda s, env: s.put_writes(*(target.config, writes, task_id, model.task_path)), model)


def promote_step(which: str) -> Step:
    return Step(f"promote({which})", lambda s, env: s.promote(), Promote(which), retry=True)


@dataclass
class Plan:
    name: str
    setup: list[W.SetupAction]
    phases: list[list[tuple[str, list[Step]]]]  # per phase: (role, steps) per process
    threads: list[str]
    deleted: set[str] = field(default_factory=set)


def build(rng: random.Random, prefix: str, next_version: Any) -> Plan:
    w = W.Workshop(rng, prefix, next_version)
    b = w.b
    a = w.thread("A")
    w.grow(a, rng.randint(2, 3))
    bt = w.thread("B")
    w.grow(bt, 2, sub=False)
    w.end_setup()
    base = w.base(a)[-1]
    kinds = ["run"] + rng.sample(["run", "writes", "delete"], rng.choice([1, 2]))
    writers: list[tuple[str, list[Step]]] = []
    tasks: list[tuple[W.Made, str]] = []
    deleted: set[str] = set()
    for i, kind in enumerate(kinds):
        if kind == "run":  # issue 34's sequence 1: X, T's interrupt, X's child Y, T's resume
            x, put_x = W.put_step(b, a, "", w.runs[2], base)
            task = f"{prefix}-T{i}"
            interrupt, _ = b.writes(x, special=W.INTERRUPT, task_id=task)
            y, put_y = W.put_step(b, a, "", w.runs[2], x)
            steps = [put_x, Step(f"put_writes({x.cid[-6:]},interrupt {task[-2:]})",
                                 lambda s, env, m=interrupt: s.put_writes(m.config, m.writes, m.task_id, m.task_path), interrupt),
                     put_y, resume_step(b, x, task, "yes")]
            tasks.append((x, task))
        elif kind == "writes":
            steps = [W.writes_step(b, base, rng.choice([None, W.INTERRUPT, W.ERROR]))]
        else:
            deleted.add(bt)
            steps = [W.writes_step(b, w.base(bt)[-1]), W.delete_step(bt)]
        writers.append(("P", steps))
    outage = [("P", [promote_step("failover")])]
    if rng.random() < 0.7:
        outage.append(("P", [W.get_step(a), W.list_step(a)]))
    cont = Continued(b, a, w.runs[3])
    on_r = [("R", [replace(W.get_step(a), keep="latest"), _continued(cont, "put(A, continued)"),
                   _continued(Continued(b, a, w.runs[3], cont, W.INTERRUPT), "put_writes(continued, interrupt)")])]
    if tasks and rng.random() < 0.6:
        x, task = rng.choice(tasks)
        on_r.append(("R", [resume_step(b, x, task, "no")]))  # R runs T itself
    back = [("R", [promote_step("failback")])]
    return Plan("failover:" + "+".join(kinds), w.sc.setup, [writers, outage, on_r, back], w.sc.threads, deleted)


