"""Deterministic simulation: operations interleaved call by call, with faults, against a model.

See tests/sim/__init__.py for the harness. In both index modes:

* ``test_every_pair``: each operation pair of ``workload.PAIRS`` once (seeded faults;
  budget 8 s, 60 s in make test-all, a soak repeats it), in two halves (make test runs the
  first, CI both);
* ``test_exhaustive``: small pairs, every interleaving of their calls (no faults),
  then one fault (lost reply, request not sent, cut then retried or abandoned) at
  every call, up to a cap per pair, within the budget;
* ``test_random``: seeded random schedules of 2-3 processes until the budget is spent;
* ``test_stale_cache``: fixed schedules of the kinds where another process archives, or
  restores by writing, between this process's cache fill and its call;
* ``test_failover``: two regions (tests/sim/failover.py): writers on P, an outage before
  any call, ``promote``, writers on R, failback, a fresh process reading; half the budget
  on seeded outages, half on one seed with the outage before each of its calls in turn
  (budget 8 s, 120 s in make test-all);
* ``test_idle_preempted_once``: archive_idle beside writers, the run preempted once
  after each of its calls in turn (from a seeded start, within the budget); and
  ``test_idle_restore_between_archive_and_drop_pinned``, the one that found issue 41;
* ``test_failover_pinned``: the two-region schedules that found a defect, replayed;
  ``test_failback_keeps_or_sets_aside_what_r_committed_pinned``: a failback that passed over a write R committed;
* ``test_restore_beside_delete_*_pinned``, ``test_delete_beside_an_archive_switch_pinned``,
  ``test_copy_or_import_then_delete_leaves_nothing_pinned``,
  ``test_prune_finishing_a_delete_removes_its_run_hints_pinned``,
  ``test_copy_beside_a_writer_replacing_a_write_pinned``: restore_thread, archive_thread, prune,
  copy_thread or import_thread beside or before delete_thread, the schedules that found a defect;
* ``test_encrypted``: encrypted worlds (tests/sim/crypto.py: every saver with ``encryption=``,
  a LocalKey or a KmsKey on moto's KMS in turn): the pairs of ``CRYPTO_PAIRS`` (writers beside
  erase_thread, copy_thread, archive/restore, export/import) with seeded faults, then random
  schedules of every kind; checks beyond (a)-(f): no written value anywhere in storage, copies
  sealed under their own keys, an erased thread put back as before its erase unreadable
  (budget 5 s, 60 in make test-all); ``test_encrypted_erase_cut_after_every_call``: the erase
  beside a writer on a versioned bucket, encrypted, cut after each call in turn (4 s, 300);
* ``test_encrypted_migration_and_rotation``: encrypt_thread of threads written without
  encryption beside old processes writing without it, erase_thread, prune, delete_thread
  and delete_for_runs; rewrap beside writers, erase_thread, delete_thread, prune and
  copy_thread (``MIGRATE_PAIRS``, ``ROTATE_PAIRS``, after the migration alone cut once), with
  seeded faults; checks (j) and (k) of tests/sim/crypto.py (6 s, 20 in make test-all);
  ``test_encrypted_erase_between_rewrap_read_and_write``: the erase landing between the
  rewrap's read of a key record and its write; slow: ``test_encrypted_migration_and_rotation_long``
  (random schedules around each, then cuts after every call) and
  ``test_encrypted_migration_preempted_once`` (the migration preempted after each call);
  ``test_encrypted_migration_meeting_an_erase_pinned``,
  ``test_encrypted_migration_then_plaintext_writes_pinned``,
  ``test_two_encrypted_migrations_of_one_thread_pinned``;
* ``test_replay``: one schedule from the environment (the command a failure prints;
  ``SIM_ENCRYPTION=local|kms`` for an encrypted world's).

Budgets: ``SIM_BUDGET_SECONDS`` (seconds per test; defaults: every pair 8 (60 in make
test-all: the pairs a run does not reach, the next run's rotation starts at), exhaustive 6
(10 in make test-all), random 5 (15 in make test-all)),
``SIM_SEED`` (base seed; default: new each run, printed), ``SIM_KEEP_GOING=1``
(run the whole budget and report every failure instead of stopping at the first),
``SIM_FAILURES_FILE`` (append each failed schedule as a JSON line),
``SIM_EXHAUSTIVE_CAP`` (schedules per pair and fault kind, default 12), ``SIM_CHECKS``
(which of the checks a,b,c,d,e,f of tests/sim/check.py run; default all).
``make soak SOAK_MINUTES=N`` splits N minutes across these and the stateful tests.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

from conftest import INDEX_MODES
from sim import workload as W
from sim.runner import Outcome, Spec, Tally, budget_seconds, run_schedule, summarize
from sim.world import World

KEEP_GOING = os.environ.get("SIM_KEEP_GOING") == "1"
EXHAUSTIVE_PAIRS = (
    ("run", "delete"),
    ("writes", "archive"),
    ("run", "prune"),
    ("writes", "delete_runs"),
    ("archive", "restore"),
    ("run", "copy"),
    ("run", "run"),
    ("gc", "prune_archive"),
    ("writes", "export_import"),
    ("run", "gc"),
    ("fanout", "delete"),
)


def _base_seed() -> int:
    given = os.environ.get("SIM_SEED")
    return int(given) if given else random.SystemRandom().randrange(10**6)


@pytest.fixture
def world(moto_endpoint: str, request) -> World:
    return World(moto_endpoint, request.param)


def _fail(tally: Tally, what: str) -> None:
    summarize(tally.summary(what))
    if tally.failures:
        distinct: dict[str, Outcome] = {}
        for out in tally.failures:
            distinct.setdefault(out.name + " | " + out.problems[0][:80], out)
        others = "\n".join(f"  {o.spec.replay()}  # {k}" for k, o in list(distinct.items())[1:12])
        pytest.fail(
            tally.failures[0].report()
            + (f"\n\n{len(tally.failures)} schedules failed; other distinct ones:\n{others}" if len(tally.failures) > 1 else ""),
            pytrace=False,
        )


def _run(world: World, spec: Spec, tally: Tally) -> Outcome:
    out = run_schedule(world, spec)
    tally.add(out)
    return out


# The pairs in two halves: make test runs the even ones, CI (make test-slow) the odd
# ones too, make test-all and make soak both.
@pytest.mark.parametrize("half", (0, pytest.param(1, marks=pytest.mark.slow)))
@pytest.mark.parametrize("world", INDEX_MODES, indirect=True)
def test_every_pair(world: World, half: int) -> None:
    """Each pair of its half of ``workload.PAIRS`` once (in a soak: round after round,
    new seeds), starting at a pair the base seed picks; stops when the budget (default
    8 s) is spent, saying how many pairs it covered."""
    base = _base_seed()
    tally = Tally()
    soak = bool(os.environ.get("SOAK_MINUTES"))
    # make test: a few pairs from a random start (the seed's); the rotation and make
    # test-all reach the others.
    deadline = time.monotonic() + budget_seconds(8, long=60)
    mine = W.PAIRS[half::2]
    pairs = mine[base % len(mine):] + mine[: base % len(mine)]
    i = 0
    stop = False
    while not stop:
        for pair in pairs:
            out = _run(world, Spec(world.mode, "+".join(pair), base + i), tally)
            i += 1
            if (not out.ok and not KEEP_GOING) or time.monotonic() >= deadline:
                stop = True
                break
        stop = stop or not soak
    covered = min(i, len(pairs))
    _fail(tally, f"{world.mode} every pair ({covered} of {len(pairs)} pairs, seeds {base}..{base + i - 1})")


@pytest.mark.parametrize("world", INDEX_MODES, indirect=True)
def test_exhaustive(world: World) -> None:
    """Per small pair: its interleavings (depth first over which process sends the
    next call, no faults), then one fault (lost reply, not sent, cut then retried or
    abandoned) at each call of one interleaving, in a seeded order; ``cap`` of each."""
    budget = budget_seconds(6, long=10)
    cap = int(os.environ.get("SIM_EXHAUSTIVE_CAP", "12"))
    deadline = time.monotonic() + budget
    base = _base_seed()
    tally = Tally()

    def spent(out: Outcome) -> bool:
        return (not out.ok and not KEEP_GOING) or time.monotonic() >= deadline

    for i, pair in enumerate(EXHAUSTIVE_PAIRS):
        name = "+".join(pair)
        path: list[int] | None = []
        for _ in range(cap):
            out = _run(world, Spec(world.mode, name, base + i, "none", path), tally)
            if spent(out):
                return _fail(tally, f"{world.mode} exhaustive (base seed {base}, {budget:.0f} s, cap {cap})")
            path = out.next_path
            if path is None:
                break
        out = _run(world, Spec(world.mode, name, base + i, "one", [-1, 0, 0]), tally)
        if spent(out):
            break
        faults = [(k, f, r) for k in range(out.events) for f in (1, 2, 3, 4) for r in ((0, 1) if f >= 3 else (0,))]
        random.Random(base + i).shuffle(faults)
        for k, f, r in faults[:cap]:
            out = _run(world, Spec(world.mode, name, base + i, "one", [k, f, r]), tally)
            if spent(out):
                return _fail(tally, f"{world.mode} exhaustive (base seed {base}, {budget:.0f} s, cap {cap})")
    _fail(tally, f"{world.mode} exhaustive (base seed {base}, {budget:.0f} s, cap {cap})")


@pytest.mark.parametrize("world", INDEX_MODES, indirect=True)
def test_random(world: World) -> None:
    budget = budget_seconds(5, long=15)
    deadline = time.monotonic() + budget
    base = _base_seed()
    tally = Tally()
    i = 0
    while time.monotonic() < deadline:
        out = _run(world, Spec(world.mode, "random", base + i), tally)
        i += 1
        if not out.ok and not KEEP_GOING:
            break
    _fail(tally, f"{world.mode} random (seeds {base}..{base + i - 1}, {budget:.0f} s)")


# erase_thread with a writer, on versioned buckets (a delete leaves versions there):
# cut after every call of the schedule (the erase's and the writer's), then retried by
# a fresh process. The pairs of workload.PAIRS run it beside the other operations.
# "relive": delete_thread, a new run starting the thread afresh, then erase_thread (its earlier life's keys).
ERASE_SCENARIOS = ("erase", "erase+writes", "relive")  # alone, the version check applies to every schedule


@pytest.mark.parametrize("mode", INDEX_MODES)
def test_erase_cut_after_every_call(moto_endpoint: str, mode: str) -> None:
    """Each scenario once without a fault (its calls counted), then cut after its
    k-th call and retried, for every k from one the base seed picks, within its
    share of the budget (default 10 s: a few calls, others on the next run;
    make test-all and make soak: every call)."""
    world = World(moto_endpoint, mode, versioned=True)
    base = _base_seed()
    tally = Tally()
    share = budget_seconds(6, long=1800) / len(ERASE_SCENARIOS)
    cut, covered, total = 3, 0, 0  # scheduler.FAULTS[3]: cut after the call was applied
    for i, scenario in enumerate(ERASE_SCENARIOS):
        deadline = time.monotonic() + share
        seed = base + i
        out = _run(world, Spec(mode, scenario, seed, "one", [-1, 0, 0], versioned=True), tally)
        total += out.events
        for j in range(out.events):
            if (tally.failures and not KEEP_GOING) or time.monotonic() >= deadline:
                break
            k = (base + j) % out.events
            _run(world, Spec(mode, scenario, seed, "one", [k, cut, 0], versioned=True), tally)
            covered += 1
    _fail(tally, f"{mode} erase cut after every call ({covered} of {total} calls, base seed {base})")


def test_erase_after_a_prune_pinned(moto_endpoint: str) -> None:
    """Seed 332802 (manifest, versioned): a prune dropped the last checkpoints of
    run 1 and deleted its run hint, which the bucket kept as a noncurrent version
    naming the thread; no head named run 1 any more, so the erase left the
    version and its delete marker. The prune now records the hint for the erase."""
    tally = Tally()
    _run(World(moto_endpoint, "manifest", versioned=True), Spec("manifest", "erase", 332802, "one", [-1, 0, 0], versioned=True), tally)
    _fail(tally, "manifest erase seed 332802")


def test_erase_after_a_new_life_pinned(moto_endpoint: str) -> None:
    """Seed 1 of "relive" (manifest, versioned): delete_thread deleted the run hints
    of runs 1 and 2 (a noncurrent version and a delete marker each, naming the
    thread); a new run started the thread afresh, whose head names neither run,
    so the erase left them. The delete now records them for the erase. The
    version check did not apply before: it asked that no write succeed after the
    first delete (``check.erased_cleanly``), and no schedule started a new life."""
    tally = Tally()
    _run(World(moto_endpoint, "manifest", versioned=True), Spec("manifest", "relive", 1, "one", [-1, 0, 0], versioned=True), tally)
    _fail(tally, "manifest relive seed 1")


def test_copy_beside_a_writer_replacing_a_write_pinned(moto_endpoint: str) -> None:
    """Seed 121080 of "writes+copy" (DynamoDB, random faults): copy_thread read the
    source, then a put_writes retried after a cut replaced a special channel's
    write (the last wins) and deleted the old part's object; the copy raised
    MissingObjectError copying it. A copy now reads the source again when an
    object it read went meanwhile."""
    tally = Tally()
    _run(World(moto_endpoint, "dynamodb"), Spec("dynamodb", "writes+copy", 121080, "random"), tally)
    _fail(tally, "dynamodb writes+copy seed 121080")


def test_copy_read_again_leaves_nothing_of_its_first_attempt_pinned(moto_endpoint: str) -> None:
    """Seed 862722 of "random" (DynamoDB, random faults: delete_runs+copy_delete+subput):
    a delete_for_runs deleted an object the copy had read, the copy read its source
    again and copied under a new tag, and the first attempt's copies stayed, named by
    no index: the copy's delete_thread never found them (c). A copy now deletes what
    an attempt it gives up on copied."""
    tally = Tally()
    _run(World(moto_endpoint, "dynamodb"), Spec("dynamodb", "random", 862722, "random"), tally)
    _fail(tally, "dynamodb random seed 862722")


# restore_thread beside delete_thread ("restore+delete", no faults) in the schedules
# that found a defect: (mode, seed).
RESTORE_DELETE_ENTRY_PINNED = (
    # The restore's activity entry was written beside its switch, named by no record:
    # the delete before the switch (manifest: the restore then found the thread gone)
    # or after it (DynamoDB) left it. The switch now records it, and a refused
    # switch takes it back: (c).
    ("manifest", 1),
    ("dynamodb", 1),
)


@pytest.mark.parametrize(("mode", "seed"), RESTORE_DELETE_ENTRY_PINNED)
def test_restore_beside_delete_leaves_no_activity_entry_pinned(moto_endpoint: str, mode: str, seed: int) -> None:
    tally = Tally()
    _run(World(moto_endpoint, mode), Spec(mode, "restore+delete", seed, "none"), tally)
    _fail(tally, f"{mode} restore+delete seed {seed}")


# restore_thread meeting a delete_thread ("restore+delete", no faults): (mode, seed).
RESTORE_DELETE_ANSWER_PINNED = (
    # The delete took the archive object between the restore's read of the thread's
    # record and its GET: the restore raised MissingObjectError, an answer the model
    # gives no restore (it has no effect, and says the archive is lost when it was
    # deleted). The record, read again, no longer names that archive: "live", as
    # a restore that began after the delete answers (restore_before_write did so).
    ("dynamodb", 5),
    ("manifest", 0),
)


@pytest.mark.parametrize(("mode", "seed"), RESTORE_DELETE_ANSWER_PINNED)
def test_restore_meeting_a_delete_answers_live_pinned(moto_endpoint: str, mode: str, seed: int) -> None:
    tally = Tally()
    _run(World(moto_endpoint, mode), Spec(mode, "restore+delete", seed, "none"), tally)
    _fail(tally, f"{mode} restore+delete seed {seed}")


# A copy or an import then a delete of it (workload kinds copy_delete, import_delete), no
# faults: the copy's (the import's) activity entry, written beside its commit and named by
# no record, stayed after the delete in every such schedule: (c). (scenario, seed).
COPY_IMPORT_DELETE_PINNED = (("copy_delete+run", 0), ("import_delete+writes", 0))


@pytest.mark.parametrize(("scenario", "seed"), COPY_IMPORT_DELETE_PINNED)
@pytest.mark.parametrize("world", INDEX_MODES, indirect=True)
def test_copy_or_import_then_delete_leaves_nothing_pinned(world: World, scenario: str, seed: int) -> None:
    tally = Tally()
    _run(world, Spec(world.mode, scenario, seed, "none"), tally)
    _fail(tally, f"{world.mode} {scenario} seed {seed}")


def test_prune_finishing_a_delete_removes_its_run_hints_pinned(moto_endpoint: str) -> None:
    """Seed 8 of "prune_copy+delete" (manifest, random faults): the delete's switch
    landed and its answer was lost; a prune then found the delete's graveyard and
    cleared it, and the delete, called again, no longer found the thread's runs:
    their hints stayed, naming the deleted thread (c). Whichever call clears a
    delete's graveyard now removes the hints of its runs first."""
    tally = Tally()
    _run(World(moto_endpoint, "manifest"), Spec("manifest", "prune_copy+delete", 8, "random"), tally)
    _fail(tally, "manifest prune_copy+delete seed 8")


def test_delete_beside_an_archive_switch_pinned(moto_endpoint: str) -> None:
    """Seed 20 of "prune_archive+delete" (DynamoDB): the delete read the thread's
    record (live), the archive switched, then the delete's switch took the archive
    reference out on what it had read, naming no archive object to delete: the
    object stayed, named by nothing (c). The switch now holds only on the record
    as read (else it is read and decided again)."""
    tally = Tally()
    _run(World(moto_endpoint, "dynamodb"), Spec("dynamodb", "prune_archive+delete", 20, "none"), tally)
    _fail(tally, "dynamodb prune_archive+delete seed 20")


# Schedules of the stale kinds (workload.Workshop.stale), one per last call of the
# stale process: the first seed whose workload makes it that call (picked before
# the schedule runs), so that each runs on every change. The pairs of
# workload.PAIRS and the random schedules explore these kinds further.
STALE_SCHEDULES = (
    ("stale_restore+read", "delete_for_runs"),  # after another process restored: issue 32
    *(
        pytest.param(scenario, call, marks=pytest.mark.slow)
        for scenario, call in (
            ("stale_restore+read", "put("),
            ("stale_restore+read", "put_writes"),
            ("stale_restore+read", "archive_thread"),
            ("stale_archive+read", "delete_for_runs"),
            ("stale_archive+read", "put_writes"),
        )
    ),
)


def _stale_seed(mode: str, scenario: str, call: str) -> int:
    for seed in range(100):
        rng = random.Random(f"{mode}/{scenario}/{seed}")  # as run_schedule seeds the workload
        built = W.build(rng, "seed-search", lambda v: f"{int(v or 0) + 1}", tuple(scenario.split("+")))
        if built.processes[0][-1].name.startswith(call):
            return seed
    raise AssertionError(f"no seed below 100 makes {scenario}'s last call {call}")


@pytest.mark.parametrize(("scenario", "call"), STALE_SCHEDULES)
@pytest.mark.parametrize("world", INDEX_MODES, indirect=True)
def test_stale_cache(world: World, scenario: str, call: str) -> None:
    """Another process archives, or restores by writing, between this process's
    cache fill and its call: the call is decided on the thread as it is."""
    seed = _stale_seed(world.mode, scenario, call)
    tally = Tally()
    _run(world, Spec(world.mode, scenario, seed, "none"), tally)
    _fail(tally, f"{world.mode} {scenario} seed {seed} (last call {call})")


# archive_idle beside writers, preempted once: the run goes k calls, then the other
# processes run (to their end, or until they wait), then the run finishes. The race
# of issue 41 needs a writer's whole restore (about 30 calls) between a run's archive
# switch and its drop of the entry it read, which random schedules rarely reach.
IDLE_SCENARIOS = ("idle+run", "idle+fanout")
_OTHERS_RUN = [1] * 400  # past the run's k calls: always the next process (index 1)


def _preempted_at(k: int) -> list[int]:
    return [0] * k + _OTHERS_RUN


@pytest.mark.parametrize("world", INDEX_MODES, indirect=True)
def test_idle_preempted_once(world: World) -> None:
    """Each idle scenario once unpreempted (its run's calls counted), then preempted
    after its run's k-th call, for every k from one the base seed picks, within the
    budget (default 6 s: a few k; make test-all: every one)."""
    base = _base_seed()
    tally = Tally()
    share = budget_seconds(6, long=120) / len(IDLE_SCENARIOS)
    covered, total = 0, 0
    for i, scenario in enumerate(IDLE_SCENARIOS):
        deadline = time.monotonic() + share
        seed = base + i
        first = _run(world, Spec(world.mode, scenario, seed, "none", []), tally)
        calls = sum(1 for line in first.trace if " P0." in line and "#" in line)
        total += calls
        for j in range(calls):
            if (tally.failures and not KEEP_GOING) or time.monotonic() >= deadline:
                break
            _run(world, Spec(world.mode, scenario, seed, "none", _preempted_at((base + j) % calls)), tally)
            covered += 1
    _fail(tally, f"{world.mode} idle preempted once ({covered} of {total} preemption points, base seed {base})")


@pytest.mark.parametrize("world", INDEX_MODES, indirect=True)
def test_idle_restore_between_archive_and_drop_pinned(world: World) -> None:
    """Seed 0 of "idle+run", preempted right after the run's archive switch (the
    call after the archive object's PUT): the writer restores the thread (the
    day's activity entry written again, by the restore and by its commit) before
    the run's drops, which took it by day and thread alone; the writer's process
    remembered its entry of the day, so no run found the thread again: (f)."""
    tally = Tally()
    first = _run(world, Spec(world.mode, "idle+run", 0, "none", []), tally)
    put = next(line for line in first.trace if " P0." in line and "put_object" in line and "/archive/" in line)
    switch = int(put.split()[0]) + 1
    _run(world, Spec(world.mode, "idle+run", 0, "none", _preempted_at(switch)), tally)
    _fail(tally, f"{world.mode} idle+run seed 0 preempted after the archive switch (call {switch})")


# Two regions (tests/sim/failover.py): writers on P, an outage, promote, writers on
# R, failback, a fresh process reading. Half the budget on schedules whose outage
# comes at a seeded chance; the other half on one seed's schedule with the outage
# before each of its calls in turn (-1: after them), from a call the base seed picks.
@pytest.mark.parametrize("mode", INDEX_MODES)
def test_failover(moto_endpoint: str, mode: str) -> None:
    """Promote and failback with lagging replication (objects, heads and items
    landing in any order), an outage cut before any call, and faults in every phase."""
    from sim.failover import RegionWorld, run_failover

    regions = RegionWorld(moto_endpoint, mode)
    base = _base_seed()
    tally = Tally()
    budget = budget_seconds(8, long=120)
    began = time.monotonic()
    deadline = began + budget
    i = 0
    while time.monotonic() < began + budget / 2 and (not tally.failures or KEEP_GOING):
        _run_failover(run_failover, regions, Spec(mode, "failover", base + i), tally)
        i += 1
    first = _run_failover(run_failover, regions, Spec(mode, "failover", base, path=[-1]), tally)
    total = max(first.cut_points, 1)
    covered = 0
    for j in range(total):
        if (tally.failures and not KEEP_GOING) or time.monotonic() >= deadline:
            break
        _run_failover(run_failover, regions, Spec(mode, "failover", base, path=[(base + j) % total]), tally)
        covered += 1
    _fail(tally, f"{mode} failover ({i} random schedules, seeds {base}..{base + i - 1}; seed {base}: outage before "
                 f"{covered} of its {total} calls)")


# Two-region schedules that found a defect (mode, seed, outage call: None a seeded chance).
FAILOVER_PINNED = (
    # A global table: P's interrupt of task T, its item stale in P's queue at the outage; R
    # ran T itself (its resume); P's queue applied on its return put the interrupt beside
    # R's run; the failback's merge kept R's run (one_line) and dropped P's committed
    # interrupt with no set-aside record, so verify() did not list it.
    ("dynamodb", 8, None),
    # Promote's rebuild (no global table): P's put_writes (resume of T1: its __resume__
    # part and its regular part) cut after the first object, never committed; the rebuild
    # indexed that one part, a resume no index committed, readable beside the interrupt.
    ("dynamodb", 1016, -1),
    # A global table: P's resume of T (its regular part and its __resume__ part), the
    # regular part's item replicated, the other's not, at the outage; R ran T's resume
    # again: its regular part lost to P's (first committed wins) and its __resume__
    # part went in. Readers keep one region's parts per task (one_line): the part R
    # kept still named P, so R's call read as its __resume__ alone, and so did the
    # failback's merge. R's commit now adopts the part it lost to.
    ("dynamodb", 686044, None),
)


@pytest.mark.parametrize(("mode", "seed", "outage"), FAILOVER_PINNED)
def test_failover_pinned(moto_endpoint: str, mode: str, seed: int, outage: int | None) -> None:
    from sim.failover import RegionWorld, run_failover

    tally = Tally()
    _run_failover(run_failover, RegionWorld(moto_endpoint, mode), Spec(mode, "failover", seed, path=None if outage is None else [outage]), tally)
    _fail(tally, f"{mode} failover seed {seed}")


def _run_failover(run: Any, regions: Any, spec: Spec, tally: Tally) -> Outcome:
    out = run(regions, spec)
    tally.add(out)
    return out


# Manifest: both regions resumed one task on one checkpoint (P's writes in its
# stale queue, R's committed on a checkpoint R's head did not hold yet: writes
# may come before their checkpoint's put); the failback kept P's and passed
# over R's, neither readable nor set aside by verify().
@pytest.mark.parametrize(("seed", "path"), [(422749, [-1]), (56765, None)])
def test_failback_keeps_or_sets_aside_what_r_committed_pinned(moto_endpoint: str, seed: int, path: list[int] | None) -> None:
    from sim.failover import RegionWorld, run_failover

    tally = Tally()
    tally.add(run_failover(RegionWorld(moto_endpoint, "manifest"), Spec("manifest", "failover", seed, "random", path)))
    _fail(tally, f"manifest failover seed {seed}")


# Encrypted worlds (tests/sim/crypto.py): every saver with encryption=, a LocalKey or a KmsKey
# on moto's KMS, alternating schedule by schedule. Writers beside erase_thread, copy_thread,
# archive/restore and export/import, with seeded faults (lost answers, requests not sent,
# processes cut then retried or abandoned); then the plaintext checks and (g), (h), (i).
CRYPTO_PAIRS: tuple[tuple[str, str], ...] = (
    ("run", "erase"),
    ("writes", "erase"),
    ("fanout", "erase"),
    ("erase", "copy"),
    ("erase", "archive_restore"),
    ("erase", "export_import"),
    ("relive", "run"),
    ("run", "copy"),
    ("writes", "copy"),
    ("run", "archive_restore"),
    ("writes", "archive"),
    ("fanout", "archive"),
    ("run", "restore"),
    ("erase", "delete"),
    ("copy", "archive_restore"),
    ("run", "export_import"),
    ("erase", "read"),
)
ENCRYPTIONS = ("local", "kms")


@pytest.mark.parametrize("mode", INDEX_MODES)
def test_encrypted(moto_endpoint: str, mode: str) -> None:
    """The pairs of CRYPTO_PAIRS from one the base seed picks (local and KMS keys in turn),
    until the budget is spent (default 5 s: a few pairs, the next run's rotation starts
    elsewhere; make test-all 60 s, then random schedules of every kind, encrypted)."""
    worlds = {kind: World(moto_endpoint, mode, encryption=kind) for kind in ENCRYPTIONS}
    base = _base_seed()
    tally = Tally()
    deadline = time.monotonic() + budget_seconds(5, long=60)
    i = 0
    while time.monotonic() < deadline and (not tally.failures or KEEP_GOING):
        kind = ENCRYPTIONS[(base + i) % len(ENCRYPTIONS)]
        scenario = "+".join(CRYPTO_PAIRS[(base + i) % len(CRYPTO_PAIRS)]) if i < len(CRYPTO_PAIRS) else "random"
        _run(worlds[kind], Spec(mode, scenario, base + i, encryption=kind), tally)
        i += 1
    _fail(tally, f"{mode} encrypted ({min(i, len(CRYPTO_PAIRS))} of {len(CRYPTO_PAIRS)} pairs, "
                 f"{max(0, i - len(CRYPTO_PAIRS))} random, seeds {base}..{base + i - 1})")


@pytest.mark.parametrize("mode", INDEX_MODES)
def test_encrypted_erase_cut_after_every_call(moto_endpoint: str, mode: str) -> None:
    """erase_thread beside a writer on a versioned bucket, encrypted: cut after its k-th
    call and retried by a fresh process, for k from one the base seed picks (a few in
    make test; every call in make test-all), local and KMS keys in turn."""
    base = _base_seed()
    tally = Tally()
    worlds = {kind: World(moto_endpoint, mode, versioned=True, encryption=kind) for kind in ENCRYPTIONS}
    share = budget_seconds(4, long=300) / 2
    covered, total = 0, 0
    for i, scenario in enumerate(("erase+writes", "relive")):
        kind = ENCRYPTIONS[(base + i) % 2]
        deadline = time.monotonic() + share
        spec = dict(versioned=True, encryption=kind)
        out = _run(worlds[kind], Spec(mode, scenario, base + i, "one", [-1, 0, 0], **spec), tally)
        total += out.events
        for j in range(out.events):
            if (tally.failures and not KEEP_GOING) or time.monotonic() >= deadline:
                break
            _run(worlds[kind], Spec(mode, scenario, base + i, "one", [(base + j) % out.events, 3, 0], **spec), tally)
            covered += 1
    _fail(tally, f"{mode} encrypted erase cut after every call ({covered} of {total} calls, base seed {base})")


# A migration (encrypt_thread) of a thread written without encryption, beside old processes
# writing without it ("plain_*"), erase_thread, prune, delete_thread and delete_for_runs;
# a rotation (rewrap) beside writers on the new key, erase_thread (and an erase after a new
# life), delete_thread, prune and copy_thread. Checks beyond (a)-(i) (tests/sim/crypto.py):
# (j) a migration cut short leaves its thread read from exactly one place, as before; one
# answering complete left no plaintext of it; a final migration finishes, and one after it
# finds nothing to do; (k) after the rotation every live key record is under the new key, a
# process with the new key alone reads everything, and an erased key is never live again.
MIGRATE_PAIRS: tuple[tuple[str, str], ...] = (
    ("plain_run", "migrate"),
    ("plain_writes", "migrate"),
    ("migrate", "erase"),
    ("migrate", "prune"),
    ("migrate", "delete"),
    ("plain_fanout", "migrate"),
    ("migrate", "migrate"),
    ("migrate", "delete_runs"),
)
ROTATE_PAIRS: tuple[tuple[str, str], ...] = (
    ("run", "rewrap"),
    ("writes", "rewrap"),
    ("erase", "rewrap"),
    ("relive", "rewrap"),
    ("rewrap", "delete"),
    ("rewrap", "prune"),
    ("fanout", "rewrap"),
    ("rewrap", "rewrap"),
    ("copy", "rewrap"),
)
# Interleaved, so that a few schedules see both operations.
MIGRATE_ROTATE = tuple(x for pair in zip(MIGRATE_PAIRS, ROTATE_PAIRS) for x in pair) + ROTATE_PAIRS[len(MIGRATE_PAIRS):]


@pytest.mark.parametrize("mode", INDEX_MODES)
def test_encrypted_migration_and_rotation(moto_endpoint: str, mode: str) -> None:
    """The migration alone cut short once, then the pairs of MIGRATE_PAIRS and ROTATE_PAIRS
    in turn from one the base seed picks, with seeded faults (local and KMS keys in turn),
    until the budget is spent (default 6 s: a handful; make test-all 20 s)."""
    worlds = {kind: World(moto_endpoint, mode, encryption=kind) for kind in ENCRYPTIONS}
    base = _base_seed()
    tally = Tally()
    deadline = time.monotonic() + budget_seconds(6, long=20)
    pairs = MIGRATE_ROTATE[base % len(MIGRATE_ROTATE):] + MIGRATE_ROTATE[: base % len(MIGRATE_ROTATE)]
    i = 0
    # First the migration alone, cut after a call the seed picks (retried or abandoned).
    kind = ENCRYPTIONS[base % len(ENCRYPTIONS)]
    first = _run(worlds[kind], Spec(mode, "migrate", base, "one", [-1, 0, 0], encryption=kind), tally)
    cut = [base % first.events, 3 + base % 2, (base // 2) % 2]
    _run(worlds[kind], Spec(mode, "migrate", base, "one", cut, encryption=kind), tally)
    while i < len(pairs) and time.monotonic() < deadline and (not tally.failures or KEEP_GOING):
        kind = ENCRYPTIONS[(base + i) % len(ENCRYPTIONS)]
        _run(worlds[kind], Spec(mode, "+".join(pairs[i]), base + i, encryption=kind), tally)
        i += 1
    _fail(tally, f"{mode} encrypted migration and rotation (the migration alone cut at {cut}; {i} of {len(pairs)} "
                 f"pairs, seeds {base}..{base + i - 1})")


# Cut after every call: the migration alone (its thread then read from exactly one place, as
# before), beside an old process's writes and beside an erase; the rotation beside an erase.
MIGRATE_ROTATE_CUTS = ("migrate", "plain_writes+migrate", "migrate+erase", "erase+rewrap", "relive+rewrap")


@pytest.mark.slow
@pytest.mark.parametrize("mode", INDEX_MODES)
def test_encrypted_migration_and_rotation_long(moto_endpoint: str, mode: str) -> None:
    """Half the budget on seeded random schedules around a migration (random_migrate) or a
    rotation (random_rewrap), in turn; half on the schedules of MIGRATE_ROTATE_CUTS, each cut
    after its k-th call and retried or abandoned, for k from one the base seed picks
    (default 60 s; make test-all 300 s)."""
    worlds = {kind: World(moto_endpoint, mode, encryption=kind) for kind in ENCRYPTIONS}
    base = _base_seed()
    tally = Tally()
    budget = budget_seconds(60, long=300)
    deadline = time.monotonic() + budget / 2
    i = 0
    while time.monotonic() < deadline and (not tally.failures or KEEP_GOING):
        kind = ENCRYPTIONS[(base + i) % len(ENCRYPTIONS)]
        scenario = sorted(W.RANDOM_CRYPTO)[(base + i) % len(W.RANDOM_CRYPTO)]
        _run(worlds[kind], Spec(mode, scenario, base + i, encryption=kind), tally)
        i += 1
    share = budget / 2 / len(MIGRATE_ROTATE_CUTS)
    covered, total = 0, 0
    for j, scenario in enumerate(MIGRATE_ROTATE_CUTS):
        kind = ENCRYPTIONS[(base + j) % 2]
        until = time.monotonic() + share
        out = _run(worlds[kind], Spec(mode, scenario, base + j, "one", [-1, 0, 0], encryption=kind), tally)
        total += out.events
        for k in range(out.events):
            if (tally.failures and not KEEP_GOING) or time.monotonic() >= until:
                break
            _run(worlds[kind], Spec(mode, scenario, base + j, "one", [(base + k) % out.events, 3, k % 2], encryption=kind), tally)
            covered += 1
    _fail(tally, f"{mode} encrypted migration and rotation, long ({i} random schedules, seeds {base}..{base + i - 1}; "
                 f"cut after {covered} of {total} calls)")


def _calls_of(out: Outcome, pid: int) -> list[str]:
    """The trace lines of process ``pid``'s calls, in order."""
    return [line for line in out.trace if f" P{pid}." in line and "#" in line]


@pytest.mark.parametrize("mode", INDEX_MODES)
def test_encrypted_erase_between_rewrap_read_and_write(moto_endpoint: str, mode: str) -> None:
    """rewrap (P0) preempted right after its GET of the thread's key record: erase_thread
    (P1) runs whole, destroying the key, then the rewrap writes. Its PUT is refused (the
    record changed since read) and the erasure stays; (k) and (i) check it never comes back."""
    world = World(moto_endpoint, mode, encryption="local")
    tally = Tally()
    first = _run(world, Spec(mode, "rewrap+erase", 0, "none", []), tally)
    calls = _calls_of(first, 0)
    k = next(i for i, line in enumerate(calls) if "get_object" in line and "/t/" in line) + 1
    out = _run(world, Spec(mode, "rewrap+erase", 0, "none", _preempted_at(k)), tally)
    _fail(tally, f"{mode} rewrap+erase seed 0 preempted after the rewrap's read (call {k})")
    # The race was met: the rewrap's PUT came after the erase's, and was refused.
    refused = [line for line in _calls_of(out, 0) if "put_object" in line and "/t/" in line]
    assert refused and all("PreconditionFailed" in line for line in refused), "\n".join(out.trace)


@pytest.mark.slow
@pytest.mark.parametrize("world", INDEX_MODES, indirect=True)
def test_encrypted_migration_preempted_once(world: World) -> None:
    """encrypt_thread (P0) beside an old process's writes (P1, no encryption) or an erase:
    the migration preempted after its k-th call, the other process run to its end there,
    for every k from one the base seed picks, within the budget (default 20 s; make
    test-all 300 s), local and KMS keys in turn."""
    base = _base_seed()
    tally = Tally()
    worlds = {kind: World(world.endpoint, world.mode, encryption=kind) for kind in ENCRYPTIONS}
    scenarios = ("migrate+plain_writes", "migrate+plain_run", "migrate+erase")
    share = budget_seconds(20, long=300) / len(scenarios)
    covered, total = 0, 0
    for i, scenario in enumerate(scenarios):
        kind = ENCRYPTIONS[(base + i) % 2]
        deadline = time.monotonic() + share
        first = _run(worlds[kind], Spec(world.mode, scenario, base + i, "none", [], encryption=kind), tally)
        calls = len(_calls_of(first, 0))
        total += calls
        for j in range(calls):
            if (tally.failures and not KEEP_GOING) or time.monotonic() >= deadline:
                break
            _run(worlds[kind], Spec(world.mode, scenario, base + i, "none", _preempted_at((base + j) % calls), encryption=kind), tally)
            covered += 1
    _fail(tally, f"{world.mode} encrypted migration preempted once ({covered} of {total} preemption points, base seed {base})")


def test_encrypted_migration_meeting_an_erase_pinned(moto_endpoint: str) -> None:
    """Seed 106 of "migrate+erase" (manifest, local key, random faults): encrypt_thread read
    the thread (checkpoints there), then the erase deleted them before the migration's
    archive read them: the archive's "no checkpoints to archive" (a ConfigurationError)
    came out of encrypt_thread, an answer for no order (and one that would stop an
    encrypt_existing run). The migration now reads the thread again: "empty"."""
    tally = Tally()
    _run(World(moto_endpoint, "manifest", encryption="local"), Spec("manifest", "migrate+erase", 106, encryption="local"), tally)
    _fail(tally, "manifest encrypted migrate+erase seed 106")


def test_encrypted_migration_then_plaintext_writes_pinned(moto_endpoint: str) -> None:
    """Seed 208679 of "migrate+plain_writes" (manifest, KMS, preempted after call 42): the
    migration finished, then an old process without encryption added a write to a
    checkpoint it had sealed (a plaintext object the head names). The harness's two
    encrypt_existing runs, the grace period over, answered ``complete``: the migration
    asked a thread's metadata and inline bodies only, never its writes kept in objects,
    and a read of the thread was refused. It now asks each such write's first bytes."""
    tally = Tally()
    spec = Spec("manifest", "migrate+plain_writes", 208679, "none", [0] * 42, encryption="kms")
    _run(World(moto_endpoint, "manifest", encryption="kms"), spec, tally)
    _fail(tally, "manifest encrypted migrate+plain_writes seed 208679")


def test_two_encrypted_migrations_of_one_thread_pinned(moto_endpoint: str) -> None:
    """Seed 290916 of "migrate+migrate" (manifest, local key, random faults): two processes
    migrated one thread; the second's archive read objects the first had moved (its
    restore under fresh keys deleted them) and raised MissingObjectError out of
    encrypt_thread. A missing object now reads the index again when it changed.

    Seed 924584 of "random_migrate" (the same two migrations): the second, cut and run again by a fresh
    process, read the head naming the first's archive, then the first finished its
    restore and deleted that archive; the second's HeadObject of it raised
    MissingObjectError. A missing archive now reads the record again when it names
    another archive, or none."""
    tally = Tally()
    world = World(moto_endpoint, "manifest", encryption="local")
    _run(world, Spec("manifest", "migrate+migrate", 290916, encryption="local"), tally)
    _run(world, Spec("manifest", "random_migrate", 924584, encryption="local"), tally)
    _fail(tally, "manifest encrypted migrate+migrate seed 290916, random_migrate seed 924584")


def test_encrypted_prune_meeting_an_erase_pinned(moto_endpoint: str) -> None:
    """Seed 358341 of the random schedules (manifest, KMS): "prune_copy+run+erase"; the
    prune read the thread while the erase had destroyed its key and not yet deleted its
    entries, and raised ThreadErasedError, an answer the model gave no prune (a harness
    gap, not the saver's: prune and delete_for_runs may now meet a thread being erased)."""
    tally = Tally()
    _run(World(moto_endpoint, "manifest", encryption="kms"), Spec("manifest", "random", 358341, encryption="kms"), tally)
    _fail(tally, "manifest encrypted random seed 358341")


def test_replay(moto_endpoint: str) -> None:
    if "SIM_SEED" not in os.environ or "SIM_SCENARIO" not in os.environ:
        pytest.skip("replays one schedule: SIM_SEED=.. SIM_MODE=.. SIM_SCENARIO=.. [SIM_FAULTS=..] [SIM_PATH=..]")
    path = os.environ.get("SIM_PATH")
    spec = Spec(
        os.environ.get("SIM_MODE", "dynamodb"),
        os.environ["SIM_SCENARIO"],
        int(os.environ["SIM_SEED"]),
        os.environ.get("SIM_FAULTS", "random"),
        None if path is None else ([] if path == "-" else [int(x) for x in path.split(",")]),
        versioned=os.environ.get("SIM_VERSIONED") == "1",
        encryption=os.environ.get("SIM_ENCRYPTION") or None,
    )
    if spec.scenario == "failover":
        from sim.failover import RegionWorld, run_failover

        out = run_failover(RegionWorld(moto_endpoint, spec.mode), spec)
    else:
        out = run_schedule(World(moto_endpoint, spec.mode, versioned=spec.versioned, encryption=spec.encryption), spec)
    print("\n".join(out.trace))
    if not out.ok:
        pytest.fail(out.report(), pytrace=False)
