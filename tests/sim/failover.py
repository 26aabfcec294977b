"""Two regions in the simulation: an outage, promote, the promoted region written to, failback.

The world (:class:`RegionWorld`): a primary P and a replica R, each a versioned
bucket (and, in DynamoDB mode, a table: a global table's replica, or one that
``promote`` rebuilds), replicated by tests/regions.py's ``Replicator`` (P to R,
and R back to P). Every write call the scheduler sends captures what changed; the
scheduler decides, before each call, whether one pending change lands (any
change, in any order: objects, manifest heads, table items). The outage starts
before a chosen call (``Spec.path[0]``; -1: once the writers are done; none
given: a seeded chance at every call): from then on P refuses every call, its
manifest heads not replicated yet never land (the runbook refuses the old
region's queue: a late head would replace the promoted region's), and its
objects still may. When P returns, its stale queue is refused or applied (a
global table's items replicate either way, the last writer of an item winning).

A schedule has four phases (one ``Scheduler`` across them, its faults in all):

1. writers on P: a run (checkpoint X, task T's interrupt on X, X's child Y,
   T's resume on X: issue 34's sequence 1), writes of another task, a thread
   written then deleted; the outage cuts them at any call;
2. ``promote()`` from a saver configured as the application was (cut and
   called again by a fresh process), beside a lagging reader of P's thread;
3. writers on R (configured with R as primary): the thread continued from
   what R reads, and T run again there;
4. P answers again: R's changes replicate back (shuffled), P's stale queue is
   refused or its objects applied, and ``promote()`` from a saver configured
   with R as primary makes P the one written to (cut and called again).

The reference is what each region committed (:func:`check`): a fresh process
configured as at first reads every thread, and

(f) every checkpoint it reads was written by a put of P or R whose index write
    was applied (a rebuilt index may also take a complete one that P never
    committed: README), as that put wrote it; each task's pending writes are
    one region's run of it (P's committed calls, or those R held and its own);
    every checkpoint and pending-write call that answered ok is readable or
    listed by ``verify().set_aside`` with its reason;
(g) a reader configured as the application was, reading during the outage,
    gets a state P committed with no hole (each checkpoint's parent with it,
    pending writes P wrote) or ``ReplicationLagError`` (DynamoDB without a
    global table: ``PrimaryUnavailableError``, nothing to read before promote);
(b) ``audit`` of P after the failback finds nothing missing or broken.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from botocore.exceptions import EndpointConnectionError
from regions import DELETE_OBJECT, OBJECT, Regions, Replicator, Site
from sim import check as C
from sim import model as M
from sim.committed import Committed, check_final, check_lagging
from sim.failover_plan import Plan, Promote, build
from sim.runner import Outcome, Spec, fault_plan
from sim.scheduler import Process, RandomChooser, Scheduler
from sim.world import SIM_INLINE_THRESHOLD, World

P_REGION, R_REGION = "us-east-1", "eu-west-1"
# The outage's chance per call of the writers, when the spec names no call: one of
# these per schedule (0: once they are done, their last commits maybe not replicated).
OUTAGE_ODDS = (1 / 8, 1 / 25, 0.0)
_WRITES = {
    "put_object", "copy_object", "delete_object", "delete_objects", "complete_multipart_upload",
    "put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item",
}


class RegionWorld(World):
    """P and R on the moto server; fresh buckets (and tables) for every schedule."""

    def __init__(self, endpoint: str, mode: str, *, label: str | None = None) -> None:
        self.global_table = False
        self.p: Site | None = None
        super().__init__(endpoint, mode, rotate_every=1, label=label, versioned=True)

    def _rotate(self) -> None:  # World.__init__'s bucket: none until begin()
        import boto3

        config = self.s3.meta.config
        self.s3_r = boto3.client("s3", endpoint_url=self.endpoint, region_name=R_REGION, config=config)
        self.dynamodb_r = boto3.client("dynamodb", endpoint_url=self.endpoint, region_name=R_REGION, config=config)

    def begin(self, global_table: bool) -> str:
        """New buckets and tables for one schedule, set up and replicated; its prefix."""
        from s3_saver import S3Saver

        old = (self.p, self.r) if self.p is not None else None
        self._generation += 1
        self.global_table = global_table and self.mode == "dynamodb"
        name = f"simf-{self.mode[:3]}-{self.label}-{self._generation}".lower()
        table = name if self.mode == "dynamodb" else None
        self.p = Site(name + "-p", P_REGION, table, self.s3, self.dynamodb)  # type: ignore[arg-type]
        self.r = Site(name + "-r", R_REGION, table, self.s3_r, self.dynamodb_r)  # type: ignore[arg-type]
        self.p.s3.create_bucket(Bucket=self.p.bucket)
        self.r.s3.create_bucket(Bucket=self.r.bucket, CreateBucketConfiguration={"LocationConstraint": R_REGION})
        for site in (self.p, self.r):
            site.s3.put_bucket_versioning(Bucket=site.bucket, VersioningConfiguration={"Status": "Enabled"})
        self.bucket, self.table = self.p.bucket, table
        prefix = f"f{next(self._schedules)}"
        setup = self.saver(prefix)
        setup.setup()
        if self.global_table:
            Regions.create_replica_table(SimpleNamespace(primary=self.p, replica=self.r))  # type: ignore[arg-type]
        else:
            setup.setup_replica()  # R's (empty) table, for promote to rebuild; both buckets versioned
        self.layout = setup._ctx.layout
        self.forward = Replicator.between(self.p, self.r, tables=self.global_table)
        self.reverse = self.forward.reversed()
        self._senders = {
            role: S3Saver(site.bucket, table=table, prefix=prefix, region_name=site.region,
                          s3_client=site.s3, dynamodb_client=site.dynamodb)
            for role, site in (("P", self.p), ("R", self.r))
        }
        self.down = False
        self.phase = 0
        self.phase_calls = 0
        self.outage_at: int | None = None
        self.outage_odds = 0.0
        self.refused = 0
        self.indexed: set[int] = set()  # id() of the logical operations with an index write applied
        if old is not None and table is not None:
            for site in old:
                try:  # moto keeps every table in memory
                    site.dynamodb.delete_table(TableName=site.table)
                except Exception:
                    pass
        return prefix

    def saver(self, prefix: str, role: str = "P", **options: Any) -> Any:
        """A new saver as a process configured with ``role``'s region as its
        primary and the other as its Replica would build it."""
        from s3_saver import Replica, S3Saver

        assert self.p is not None
        options.setdefault("inline_threshold", SIM_INLINE_THRESHOLD)
        here, there = (self.p, self.r) if role == "P" else (self.r, self.p)
        replica = Replica(there.bucket, region_name=there.region, global_table=self.global_table,
                          s3_client=there.s3, dynamodb_client=there.dynamodb)
        saver = S3Saver(here.bucket, table=here.table, prefix=prefix, region_name=here.region,
                        s3_client=here.s3, dynamodb_client=here.dynamodb, replica=replica, **options)
        self.savers.append(saver)
        return saver

    # -- calls, replication, the outage ---------------------------------------------
    def send(self, call: Any, writer: Any = None) -> Any:
        """The call in the region its ``Where`` names (refused in P during the
        outage); a write's changes captured for replication."""
        region = "R" if call.where is not None and call.where.bucket == self.r.bucket else "P"
        if region == "P" and self.down:
            self.refused += 1
            return EndpointConnectionError(endpoint_url=f"s3://{self.p.bucket} (the outage)")
        self.calls_sent += 1
        result = self._senders[region]._sync._send(replace(call, where=None))
        if isinstance(result, BaseException) or call.operation not in _WRITES:
            return result
        if writer is not None and self._index_write(call):
            self.indexed.add(id(writer))
        replicator = self.forward if region == "P" else self.reverse
        if call.service == "dynamodb":
            replicator.capture(objects=False)
        else:
            keys = [call.params["Key"]] if "Key" in call.params else [
                o["Key"] for o in call.params.get("Delete", {}).get("Objects", ())]
            if keys:  # what this call changed (a listing of its keys, not of the bucket)
                replicator.capture(os.path.commonprefix(keys), items=False)
        return result

    def _index_write(self, call: Any) -> bool:
        """A write to the index (a table, a manifest head): what may commit."""
        if call.service == "dynamodb":
            return True
        key = call.params.get("Key")
        return key is not None and self.layout.parse_object_key(key) is None

    def _head(self, event: Any) -> bool:
        """A manifest head (or another object that is no write's): the index in the bucket."""
        return event.kind in (OBJECT, DELETE_OBJECT) and self.layout.parse_object_key(event.key) is None

    def enter(self, phase: int, scheduler: Scheduler, rng: random.Random) -> None:
        self.phase, self.phase_calls = phase, 0
        if phase == 2 and not self.down:
            self.outage(scheduler)
        if phase == 4:
            self.back_up(scheduler, rng)

    def between_calls(self, scheduler: Any) -> None:
        chooser = scheduler.chooser
        if self.phase == 1 and not self.down:
            if self.outage_at is not None:
                hit = self.outage_at >= 0 and self.phase_calls >= self.outage_at
            else:
                hit = chooser.choose("outage", [1 - self.outage_odds, self.outage_odds]) == 1
            if hit:
                self.outage(scheduler)
        self.phase_calls += 1
        if self.phase > 3:
            return
        # Until the outage, anything P changed; after it, only objects (their
        # replication may complete late: issue 34's sequence 1).
        eligible = [e for e in self.forward.pending if not self.down or e.kind in (OBJECT, DELETE_OBJECT)]
        if eligible and chooser.choose("replicate", [1.0, 1.0]) == 1:
            event = eligible[chooser.choose("event", [1.0] * len(eligible))]
            self.forward.deliver(where=lambda e: e is event)
            scheduler.trace.append(f"{scheduler.tick:4d} replicated to R: {event!r}")

    def outage(self, scheduler: Scheduler) -> None:
        """P refuses every call from now on. Its heads not replicated yet never
        land (the runbook refuses the old region's queue before promote: a late
        head would replace the promoted region's)."""
        self.down = True
        dropped = self.forward.drop_pending(where=self._head)
        scheduler.trace.append(
            f"{scheduler.tick:4d} ---- outage: P refused from here; {len(dropped)} heads never replicate, "
            f"{len(self.forward.pending)} changes pending"
        )

    def back_up(self, scheduler: Scheduler, rng: random.Random) -> None:
        """P answers again. Its stale queue is refused (the runbook; a global
        table's items replicate all the same, the last writer of an item winning)
        or applied; then R's changes replicate back (shuffled, the newest version
        of a key current), as the failback runbook waits for."""
        self.down = False
        self.reverse.capture()  # R's writes are newer than P's stale ones
        refused = rng.random() < 0.5
        if refused:
            self.forward.drop_pending(where=lambda e: e.kind in (OBJECT, DELETE_OBJECT))
        stale = self.forward.deliver(rng=rng)
        back = self.reverse.deliver(rng=rng, keep_version_order=True)
        scheduler.trace.append(
            f"{scheduler.tick:4d} ---- P back: its stale queue {'refused' if refused else 'applied'} "
            f"({len(stale)} changes landed in R); {len(back)} changes of R replicated to P"
        )


# -- one schedule -----------------------------------------------------------------------------
def run_failover(world: RegionWorld, spec: Spec) -> Outcome:
    began = time.perf_counter()
    world.requests()
    rng = random.Random(f"{spec.mode}/{spec.scenario}/{spec.seed}")
    random.seed(spec.seed)
    prefix = world.begin(global_table=rng.random() < 0.5)
    plan = build(rng, prefix, world.saver(prefix).get_next_version)
    flavour = ("global table" if world.global_table else "rebuild") if world.mode == "dynamodb" else "heads"
    out = Outcome(spec, name=f"{plan.name} ({flavour})", setup=[a.name for a in plan.setup])
    setup = world.saver(prefix)
    for action in plan.setup:
        try:
            action.invoke(setup)
        except Exception as exc:
            out.problems.append(f"setup {action.name} raised {C._err(exc)}")
            return _done(out, world, began)
    world.forward.sync()  # the setup is in both regions before the schedule
    world.outage_at = spec.path[0] if spec.path else None
    world.outage_odds = rng.choice(OUTAGE_ODDS)
    scheduler = Scheduler(world, RandomChooser(rng), fault_plan(rng, spec.faults))
    pids = itertools.count()
    roles: dict[int, str] = {}
    history: list[Any] = []
    try:
        for phase, procs in enumerate(plan.phases, 1):
            world.enter(phase, scheduler, rng)
            processes = []
            for role, steps in procs:
                pid = next(pids)
                roles[pid] = role
                processes.append(Process(pid=pid, steps=steps, prefix=prefix, options={"role": role}))
            history += scheduler.run(processes)
            if phase == 1:
                out.cut_points = world.phase_calls
                out.setup.append(f"outage before call {world.outage_at} of the writers' {world.phase_calls}"
                                 if world.outage_at is not None else "outage at a seeded chance")
    finally:
        out.trace = scheduler.trace
        out.events = scheduler.tick
    out.history = [
        f"{roles[op.pid]}:{op.label}: {op.start}..{op.end if op.end is not None else '-'}: "
        + (op.outcome[0] if op.outcome[0] != "raised" else f"raised {C._err(op.outcome[1])}")
        + (f" (attempts {op.attempts})" if op.attempts > 1 else "")
        for op in history if op.outcome is not None
    ]
    check(world, prefix, plan, history, roles, out.problems)
    return _done(out, world, began)


def _done(out: Outcome, world: RegionWorld, began: float) -> Outcome:
    out.calls = world.requests() + world.refused
    out.seconds = time.perf_counter() - began
    return out


def check(world: RegionWorld, prefix: str, plan: Plan, history: list[Any], roles: dict[int, str], problems: list[str]) -> None:
    ref = Committed(plan, history, roles, world.indexed)
    rebuilt = world.mode == "dynamodb" and not world.global_table
    for op in history:
        if op.outcome is None:
            continue
        model = op.step.model
        if roles[op.pid] == "P" and isinstance(model, (M.GetTuple, M.ListCheckpoints)):
            check_lagging(op, rebuilt, ref, problems)
        elif (isinstance(model, Promote) or roles[op.pid] == "R") and op.outcome[0] == "raised":
            # The runbook's calls, and writes to the promoted region: nothing refuses them.
            problems.append(f"(f) {roles[op.pid]}:{op.label} raised {C._err(op.outcome[1])}")
    check_final(world, prefix, plan, ref, problems)
