"""A real outage, as an operator lives it (issue 22): every thread comes back whole.

Two regions on 127.0.0.1 (tests/regions.py). Several threads of an agent with
interrupts run on the primary (the old region, O) while replication copies
what they write to the replica region (P) object by object (and item by item,
for a global table), shuffled, with lag. At a random moment O goes down
(connections refused, or accepted and never answered) in the middle of a step
whose index commit never happens: its objects stay in O, uncommitted. Then the
README's runbooks, step by step:

1. ``promote()`` from a saver configured as the application was;
2. fresh processes configured with P as their primary (with O as their
   ``Replica``, and without one) read every thread: the latest state and the
   whole history, each checkpoint one that O committed;
3. every thread continues in P (interrupts resumed there: the same tasks of
   the same checkpoints write again);
4. O comes back; O's stale replication queue is refused, or applied (what a
   refusal cannot hold back: a global table's items always, and the immutable
   objects; a manifest head is what the runbook's refusal is for);
5. P's writes replicate back; ``promote()`` from a saver configured with P as
   primary makes O the one written to again;
6. a fresh process configured as at first reads every thread as P left it:
   P's line wins whole (pending writes of one task are never mixed from both
   regions), and nothing O's index never committed is readable.
"""

from __future__ import annotations

import operator
import random
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from helpers import long_form
from regions import REPLICA_BUCKET, REPLICA_REGION, Replicator, saver_client_config, saver_retry
from s3_saver import ConfigurationError, Replica, S3Saver, StoreUnavailableError

MODES = ("manifest", "dynamodb", "dynamodb-global")
OUTAGES = ("refuse", "hang")
STALE = ("refused", "applied")
# make test-all and make soak: 5 threads of 3 steps each; make test: 4 of 2.
THREADS = 5 if long_form() else 4
STEPS = THREADS * (3 if long_form() else 2)


class State(TypedDict):
    msgs: Annotated[list, operator.add]
    side: Annotated[list, operator.add]
    approved: str


def _graph(saver: Any):
    def draft(state: State) -> dict:
        return {"msgs": [f"draft {len(state['msgs'])}"]}

    def attach(state: State) -> dict:
        return {"msgs": ["x" * 70_000]}  # a value in an object of its own

    def side(state: State) -> dict:
        # Beside `ask`: its writes stay pending on the checkpoint `ask` interrupts.
        return {"side": [f"side {len(state['msgs'])}"]}

    def ask(state: State) -> dict:
        answer = interrupt("approve?")
        return {"approved": answer, "msgs": [f"approved by {answer}"]}

    builder = StateGraph(State)
    for name, node in (("draft", draft), ("attach", attach), ("side", side), ("ask", ask)):
        builder.add_node(name, node)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "attach")
    builder.add_edge("attach", "side")
    builder.add_edge("attach", "ask")
    builder.add_edge("side", END)
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=saver)


def _config(thread_id: str, checkpoint_id: str | None = None) -> dict:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _advance(graph: Any, thread_id: str, who: str) -> None:
    """One step of a thread: answer its interrupt, or start a new turn. Every
    write is committed when it returns (what was committed is read right after)."""
    config = _config(thread_id)
    if graph.get_state(config).next == ("ask",):
        graph.invoke(Command(resume=who), config, durability="sync")
    else:
        graph.invoke({"msgs": [f"{who} says hi"], "side": [], "approved": ""}, config, durability="sync")


def _kw(outage: str) -> dict:
    # A region that never answers costs a read timeout per attempt: one attempt.
    return {"recheck_after": 3600, "failover_after": 1.0 if outage == "hang" else 3.0}


def _old_saver(regions: Any, mode: str, outage: str, *, setup: bool = True) -> S3Saver:
    """Configured as the application was: O (behind the proxy) primary, P its replica."""
    index_mode = "manifest" if mode == "manifest" else "dynamodb"
    return regions.make_saver(index_mode, global_table=mode == "dynamodb-global", setup=setup, **_kw(outage))


def _new_saver(regions: Any, mode: str, outage: str, *, replica: bool = True) -> S3Saver:
    """Configured as runbook step 3 says: P primary, O (behind the proxy) its replica."""
    from regions import PRIMARY_BUCKET, PRIMARY_REGION

    kw: dict[str, Any] = {}
    if replica:
        kw["replica"] = Replica(
            PRIMARY_BUCKET,
            region_name=PRIMARY_REGION,
            endpoint_url=regions.proxy.url,
            global_table=mode == "dynamodb-global",
            **_kw(outage),
        )
    saver = S3Saver(
        REPLICA_BUCKET,
        table=regions.replica.table if mode != "manifest" else None,
        region_name=REPLICA_REGION,
        endpoint_url=regions.moto,
        client_config=saver_client_config(),
        retry=saver_retry(),
        **kw,
    )
    regions.savers.append(saver)
    return saver


def _fail_commits(saver: S3Saver) -> None:
    """The next index commits of ``saver`` never happen (its objects are written):
    what an outage does between a write's two requests."""
    index = saver._ctx.index

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("the region went down before the index commit")
        yield  # pragma: no cover - a generator, as the index's methods are

    index.commit_checkpoint = refused
    index.commit_writes = refused


def _snapshot(saver: S3Saver, thread_id: str) -> dict[str, Any]:
    """Every checkpoint of a thread as ``saver`` reads it: id -> (checkpoint's
    channel values, parent, pending writes as a set)."""
    out = {}
    for t in saver.list(_config(thread_id)):
        cid = t.config["configurable"]["checkpoint_id"]
        parent = t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
        writes = frozenset((task, channel, repr(value)) for task, channel, value in t.pending_writes or ())
        out[cid] = (repr(sorted(t.checkpoint["channel_values"].items())), parent, writes)
    return out


def _by_task(writes: frozenset) -> dict[str, frozenset]:
    out: dict[str, set] = {}
    for task, channel, value in writes:
        out.setdefault(task, set()).add((channel, value))
    return {task: frozenset(parts) for task, parts in out.items()}


def _cases() -> list[Any]:
    every = [(m, o, s) for m in MODES for o in OUTAGES for s in STALE]
    if long_form():
        return every
    # Each mode, each outage kind and each stale queue at least once (4 of 12; make
    # test-all and make soak run all): make test runs one per index mode, CI (make
    # test-slow) the other two.
    slow = pytest.mark.slow
    return [pytest.param("manifest", "hang", "applied", marks=slow), ("manifest", "refuse", "refused"),
            ("dynamodb", "hang", "refused"), pytest.param("dynamodb-global", "refuse", "applied", marks=slow)]


@pytest.mark.parametrize(("mode", "outage", "stale"), _cases())
def test_outage_promote_continue_failback(regions, mode: str, outage: str, stale: str) -> None:
    rng = random.Random(f"{mode}/{outage}/{stale}")
    global_table = mode == "dynamodb-global"
    old = _old_saver(regions, mode, outage)
    replicator, reverse = regions.replicator, regions.reverse
    if global_table:
        regions.create_replica_table()
    elif mode == "dynamodb":
        old.setup_replica()  # an empty table there, for promote() to rebuild
        replicator = Replicator.between(regions.primary, regions.replica, tables=False)
        reverse = replicator.reversed()
    threads = [f"t{i}" for i in range(THREADS)]
    graph = _graph(old)

    # --- O runs the threads; replication lags, shuffled -------------------------------
    committed: dict[str, dict[str, Any]] = {t: {} for t in threads}
    for step in range(STEPS):
        thread_id = threads[step] if step < THREADS else rng.choice(threads)
        _advance(graph, thread_id, "primary")
        committed[thread_id].update(_snapshot(old, thread_id))
        replicator.capture()
        replicator.deliver(rng.randint(0, len(replicator.pending)), rng)

    # --- The outage, in the middle of a step: objects written, no index commit ---------
    cut = rng.choice(threads)
    before = set(regions.primary.keys())
    _fail_commits(old)
    with pytest.raises(StoreUnavailableError):
        _advance(graph, cut, "primary")
    uncommitted = set(regions.primary.keys()) - before
    assert uncommitted, "the cut step wrote no object"
    layout = old._ctx.layout
    cut_ids = {p.checkpoint_id for p in map(layout.parse_object_key, uncommitted) if p is not None}
    # Without a global table no index replicates: promote rebuilds from objects,
    # and nothing there tells a committed write from one the outage cut (README).
    provable = mode != "dynamodb"
    replicator.capture()
    replicator.deliver(rng.randint(0, len(replicator.pending)), rng)
    getattr(regions.proxy, outage)()

    # --- 1. Promote, from a saver configured as the application was --------------------
    promotion = _old_saver(regions, mode, outage, setup=False).promote()
    assert not promotion.checked

    # --- 2. Fresh processes with P as primary read every thread whole -----------------
    fresh = _new_saver(regions, mode, outage)
    readers = [fresh]
    if not global_table:
        # Promote left the index whole: a process without a Replica reads it too.
        # (A global table's items are both regions': promote leaves them, and
        # every process, configured with its Replica, passes over what never arrived.)
        readers.append(_new_saver(regions, mode, outage, replica=False))
    for reader in readers:
        for thread_id in threads:
            seen = _snapshot(reader, thread_id)
            for cid, (values, parent, writes) in seen.items():
                if not provable and cid in cut_ids:
                    continue
                assert cid in committed[thread_id], f"{thread_id}: {cid} was never committed in O"
                known_values, known_parent, known_writes = committed[thread_id][cid]
                assert (values, parent) == (known_values, known_parent), f"{thread_id}/{cid} differs"
                assert writes <= known_writes or not provable, f"{thread_id}/{cid}: pending writes O never committed"
            state = _graph(reader).get_state(_config(thread_id))
            if seen:
                assert state.config["configurable"]["checkpoint_id"] == max(seen)
            history = list(_graph(reader).get_state_history(_config(thread_id)))
            assert [s.config["configurable"]["checkpoint_id"] for s in history] == sorted(seen, reverse=True)

    # --- 3. Every thread continues in P ------------------------------------------------
    new_graph = _graph(fresh)
    for thread_id in threads:
        _advance(new_graph, thread_id, "replica")
        _advance(new_graph, thread_id, "replica")
    in_p = {t: _snapshot(fresh, t) for t in threads}
    latest_p = {t: new_graph.get_state(_config(t)) for t in threads}

    # --- 4. O is back: its stale queue refused or applied; P's writes replicate back ---
    regions.proxy.up()
    reverse.capture()  # P's writes are newer than O's stale ones (a global table: last writer wins)
    if stale == "applied":
        replicator.deliver(where=lambda e: not (mode == "manifest" and _is_head(e.key)))
    else:
        # A global table's items replicate anyway: S3's refusal holds back objects only.
        replicator.drop_pending(where=lambda e: not (global_table and e.kind in ("item", "delete-item")))
        replicator.deliver()
    if global_table:
        # O's stale items are in P's table now, their objects maybe not: P still
        # serves every thread, as it left it (the application runs on until failback).
        during = _new_saver(regions, mode, outage)
        for thread_id in threads:
            state = _graph(during).get_state(_config(thread_id))
            assert state.config == latest_p[thread_id].config, thread_id
            ids = [s.config["configurable"]["checkpoint_id"] for s in _graph(during).get_state_history(_config(thread_id))]
            assert set(in_p[thread_id]) <= set(ids), thread_id
    reverse.run()

    # --- 5. Failback -------------------------------------------------------------------
    back = _new_saver(regions, mode, outage).promote()
    assert back.checked

    # --- 6. A fresh process configured as at first reads what P left ------------------
    final = _old_saver(regions, mode, outage, setup=False)
    final_graph = _graph(final)
    for thread_id in threads:
        state = final_graph.get_state(_config(thread_id))
        assert (state.values, state.next, state.config) == (
            latest_p[thread_id].values,
            latest_p[thread_id].next,
            latest_p[thread_id].config,
        ), thread_id
        seen = _snapshot(final, thread_id)
        for cid, (values, parent, writes) in in_p[thread_id].items():
            assert cid in seen and seen[cid][:2] == (values, parent), f"{thread_id}/{cid}: not as P left it"
            # Per task, P's run of it whole; a task P never ran there: O's, as O committed it.
            theirs = committed[thread_id].get(cid, (None, None, frozenset()))[2]
            mine, now = _by_task(writes), _by_task(seen[cid][2])
            for task, parts in now.items():
                own = _by_task(theirs).get(task)
                expected = mine.get(task, own)
                if task in mine and own is not None and mine[task] <= own:
                    # P holds only parts O committed (its interrupt, replicated
                    # before the outage): P never ran the task, O's run stays
                    # whole (issue 34). (P's own run answers "replica": never O's.)
                    expected = own
                assert parts == expected, f"{thread_id}/{cid}: task {task} mixed"
            assert set(mine) <= set(now), f"{thread_id}/{cid}: P's writes lost"
        for cid, (values, parent, writes) in seen.items():
            if cid not in in_p[thread_id]:
                # O's own, never replicated: as O committed it.
                assert committed[thread_id].get(cid) == (values, parent, writes), f"{thread_id}/{cid}"
        if provable:
            for cid in cut_ids & set(seen):
                assert cid in in_p[thread_id] or cid in committed[thread_id], f"{thread_id}: uncommitted {cid} readable"
        list(final_graph.get_state_history(_config(thread_id)))
    # verify: P's writes all came back; what O alone holds is what never replicated.
    replicator.run()  # replication from O again (a global table: the settle's deletes too)
    report = final.verify()
    assert report.replica_only == (), report.replica_only
    for gap in report.unreplicated:
        # O's own (a checkpoint P made is never one): with a global table P may have
        # read it all the same, from its item, which carries the body (its object
        # is the one that never arrived).
        own = gap.checkpoint_id in committed[gap.thread_id]
        assert own or gap.checkpoint_id in cut_ids or gap.kind == "writes", gap
    # And the thread goes on in O.
    _advance(final_graph, cut, "primary again")


def _is_head(key: Any) -> bool:
    from s3_saver._format.keys import KeyLayout

    return isinstance(key, str) and KeyLayout("").parse_object_key(key) is None


@pytest.mark.parametrize("mode", MODES)
def test_verify_counts_the_same_writes_made_in_both_regions_once(regions, mode: str) -> None:
    """The same task's writes, made in each region (a resume run in both), are the
    same bytes under two tokens: verify reports neither as missing."""
    old = _old_saver(regions, mode, "refuse")
    if mode != "manifest":
        regions.create_replica_table()
    replicator = regions.replicator if mode != "dynamodb" else Replicator.between(regions.primary, regions.replica, tables=False)
    config = old.put(_config("same"), _checkpoint(), {"source": "loop", "step": 0}, {"a": "1"})
    replicator.run()
    if mode == "dynamodb":  # no table replicates: the same entry, written there by hand
        _new_saver(regions, mode, "refuse", replica=False).put(_config("same"), _checkpoint(config), {"source": "loop", "step": 0}, {"a": "1"})
    writes = [("a", "from the task"), ("__interrupt__", "why")]
    old.put_writes(config, writes, "task-1")
    _new_saver(regions, mode, "refuse", replica=False).put_writes(config, writes, "task-1")
    assert len([k for k in regions.primary.keys() if "/writes/" in k]) == 2
    assert len([k for k in regions.replica.keys() if "/writes/" in k]) == 2
    report = old.verify(["same"])
    assert report.in_sync, report


def _checkpoint(config: dict | None = None) -> dict:
    from helpers import checkpoint

    cid = config["configurable"]["checkpoint_id"] if config else None
    return checkpoint({"a": "value"}, {"a": "1"}, cid)


def _failback_ready(regions: Any, mode: str) -> dict[str, Any]:
    """Threads run in O (some of it never replicated: thread a's last step, thread c),
    O down, promoted, a and b continued in P, O back with P's writes replicated to
    it: a failback to run. Returns each thread as O's failback must leave it:
    (its latest config in P, every checkpoint P or O alone committed)."""
    global_table = mode == "dynamodb-global"
    old = _old_saver(regions, mode, "refuse")
    replicator, reverse = regions.replicator, regions.reverse
    if global_table:
        regions.create_replica_table()
    elif mode == "dynamodb":
        old.setup_replica()
        replicator = Replicator.between(regions.primary, regions.replica, tables=False)
        reverse = replicator.reversed()
    graph = _graph(old)
    for thread_id in ("a", "b"):
        _advance(graph, thread_id, "primary")
    replicator.run()
    _advance(graph, "a", "primary")  # never replicates, nor does thread c
    _advance(graph, "c", "primary")
    own = {t: _snapshot(old, t) for t in ("a", "b", "c")}
    replicator.capture()
    regions.proxy.refuse()
    _old_saver(regions, mode, "refuse", setup=False).promote()
    fresh = _new_saver(regions, mode, "refuse")
    for thread_id in ("a", "b"):
        _advance(_graph(fresh), thread_id, "replica")
    expected = {}
    for thread_id in ("a", "b", "c"):
        latest = fresh.get_tuple(_config(thread_id))
        # A thread P never had (c): O's own latest.
        config = latest.config if latest else _config(thread_id, max(own[thread_id]))
        expected[thread_id] = (config, {**own[thread_id], **_snapshot(fresh, thread_id)})
    regions.proxy.up()
    reverse.capture()
    replicator.drop_pending(where=lambda e: not (global_table and e.kind in ("item", "delete-item")))
    replicator.deliver()
    reverse.run()
    return expected


def _cuts() -> list[tuple[str, int]]:
    # Round trips into the failback's promote: it takes 23-27 here (verify's
    # listings, then each thread's reads and its index written).
    if long_form():
        return [(mode, cut) for mode in MODES for cut in range(1, 23)]
    return [("manifest", 3), ("dynamodb", 12), ("dynamodb-global", 21)]


@pytest.mark.parametrize(("mode", "cut"), _cuts())
def test_failback_cut_short_then_called_again(regions, monkeypatch, mode: str, cut: int) -> None:
    """promote() into the old region cut at a round trip (the operator's shell dies),
    then called again from a fresh saver: every thread reads as P left it, with what O
    alone committed beside it. (O's thread c: O's own; a: both lines.)"""
    from soundness_support import Cut

    expected = _failback_ready(regions, mode)
    cutting = Cut(monkeypatch, cut)
    try:
        _new_saver(regions, mode, "refuse").promote()
    except ConnectionError:
        pass
    monkeypatch.undo()
    again = _new_saver(regions, mode, "refuse").promote()
    assert again.checked and cutting.fired
    final = _old_saver(regions, mode, "refuse", setup=False)
    for thread_id, (latest, checkpoints) in expected.items():
        found = final.get_tuple(_config(thread_id))
        assert (found.config if found else None) == latest, thread_id
        assert _snapshot(final, thread_id) == checkpoints, thread_id


def _held_back_resume(regions: Any, mode: str, *, resume_in_replica: bool) -> tuple[Any, dict, str, list]:
    """Issue 34's sequence. O commits X, task T's interrupt on X, and X's child Y,
    all replicated; then T's resume writes on X, whose objects replicate and whose
    index (a manifest head, a global table's items, or a rebuild that ran before
    they arrived) never does: the outage. P is promoted and goes on from Y
    (``resume_in_replica``: P runs T itself too, its own resume on X). O comes
    back, P's writes replicate to it, and O is promoted again. Returns the saver
    configured as at first, X's config, and T."""
    from helpers import checkpoint

    global_table = mode == "dynamodb-global"
    old = _old_saver(regions, mode, "refuse")
    replicator, reverse = regions.replicator, regions.reverse
    if global_table:
        regions.create_replica_table()
    elif mode == "dynamodb":
        old.setup_replica()
        replicator = Replicator.between(regions.primary, regions.replica, tables=False)
        reverse = replicator.reversed()
    task = "task-T"
    x = old.put(_config("t"), checkpoint({"n": 0}, {"n": "1"}), {"source": "loop", "step": 0}, {"n": "1"})
    old.put_writes(x, [("__interrupt__", "approve?")], task)
    old.put(x, checkpoint({"n": 0}, {"n": "1"}), {"source": "loop", "step": 1}, {})
    replicator.run()
    old.put_writes(x, [("__resume__", "yes"), ("n", 1)], task)
    replicator.capture()
    late = [e for e in replicator.pending if e.kind == "object" and not _is_head(e.key)]
    assert late, "the resume wrote no object"
    regions.proxy.refuse()
    _old_saver(regions, mode, "refuse", setup=False).promote()
    fresh = _new_saver(regions, mode, "refuse")
    latest = fresh.get_tuple(_config("t"))
    fresh.put(latest.config, checkpoint({"n": 5}, {"n": "2"}), {"source": "loop", "step": 2}, {"n": "2"})
    # The resume's objects arrive now (a rebuild already ran); its index never.
    replicator.deliver(where=lambda e: e in late)
    replicator.drop_pending()
    if resume_in_replica:
        fresh.put_writes(x, [("__resume__", "no"), ("n", 2)], task)
    in_p = sorted(fresh.get_tuple(x).pending_writes)
    regions.proxy.up()
    reverse.run()
    assert _new_saver(regions, mode, "refuse").promote().checked
    return _old_saver(regions, mode, "refuse", setup=False), x, task, in_p


@pytest.mark.parametrize("mode", MODES)
def test_failback_keeps_the_old_primarys_writes_the_promoted_region_only_saw_in_part(regions, mode: str) -> None:
    """The promoted region holds T's interrupt (replicated), never T's resume:
    its parts are O's, a subset, and O's whole run of T stays (issue 34, 1)."""
    final, x, task, _ = _held_back_resume(regions, mode, resume_in_replica=False)
    found = final.get_tuple(x)
    assert sorted((t, c, v) for t, c, v in found.pending_writes) == [
        (task, "__interrupt__", "approve?"), (task, "__resume__", "yes"), (task, "n", 1)
    ], found.pending_writes
    assert final.verify(["t"]).set_aside == ()


# A global table is left out: its replication itself replaces O's parts of a task
# P ran again (last writer wins per part, before any merge), as documented.
@pytest.mark.parametrize("mode", ("manifest", "dynamodb"))
def test_failback_reports_the_old_primarys_run_that_the_promoted_one_replaced(regions, mode: str) -> None:
    """The promoted region ran T itself (its own resume on X): its run wins whole,
    and verify() names O's committed parts the merge set aside, with the reason."""
    final, x, task, in_p = _held_back_resume(regions, mode, resume_in_replica=True)
    # P's run as P read it (a global table: its own parts only, see one_line).
    assert {(task, "__resume__", "no"), (task, "n", 2)} <= set(in_p), in_p
    assert sorted(final.get_tuple(x).pending_writes) == in_p
    report = final.verify(["t"])
    assert {(g.thread_id, g.checkpoint_id, g.kind, g.task_id) for g in report.set_aside} == {
        ("t", x["configurable"]["checkpoint_id"], "writes", task)
    }, report.set_aside
    (gap,) = report.set_aside
    assert "another run of the task" in gap.reason and REPLICA_BUCKET in gap.reason, gap.reason
    assert len(gap.missing) == 2 and all("/writes/" in key for key in gap.missing), gap.missing


@pytest.mark.parametrize("mode", MODES)
def test_failback_refuses_an_unversioned_bucket(regions, mode: str) -> None:
    """Without versioning the old region's own index is gone (a manifest head
    replicated over): a failback refuses, naming the bucket (issue 34, item 2)."""
    from regions import PRIMARY_BUCKET

    old = _old_saver(regions, mode, "refuse")
    replicator = regions.replicator
    if mode == "dynamodb-global":
        regions.create_replica_table()
    elif mode == "dynamodb":
        old.setup_replica()
        replicator = Replicator.between(regions.primary, regions.replica, tables=False)
    old.put(_config("u"), _checkpoint(), {"source": "loop", "step": 0}, {"a": "1"})
    replicator.run()
    regions.primary.s3.put_bucket_versioning(Bucket=PRIMARY_BUCKET, VersioningConfiguration={"Status": "Suspended"})
    keys = set(regions.replica.keys()) | set(regions.primary.keys())
    with pytest.raises(ConfigurationError, match=f"versioning on s3://{PRIMARY_BUCKET} .*Suspended"):
        _new_saver(regions, mode, "refuse").promote()
    assert set(regions.replica.keys()) | set(regions.primary.keys()) == keys  # nothing merged


def test_failback_sets_aside_the_old_primarys_parts_its_stale_items_put_beside_the_promoted_run(regions) -> None:
    """A global table: O commits task T's interrupt on X, its item still in O's
    queue at the outage; P runs T itself (its resume); O's queue, applied when O
    returns, puts the interrupt's item beside P's run. The failback keeps P's run,
    and verify() names O's interrupt with the reason (the simulation's seed 8)."""
    from helpers import checkpoint

    mode = "dynamodb-global"
    old = _old_saver(regions, mode, "refuse")
    regions.create_replica_table()
    replicator, reverse = regions.replicator, regions.reverse
    task = "task-T"
    x = old.put(_config("t"), checkpoint({"n": 0}, {"n": "1"}), {"source": "loop", "step": 0}, {"n": "1"})
    replicator.run()
    old.put_writes(x, [("__interrupt__", "approve?")], task)
    replicator.capture()  # its object and item wait in O's queue
    regions.proxy.refuse()
    _old_saver(regions, mode, "refuse", setup=False).promote()
    _new_saver(regions, mode, "refuse").put_writes(x, [("__resume__", "no"), ("n", 2)], task)
    regions.proxy.up()
    reverse.capture()  # P's writes are newer than O's stale ones
    replicator.deliver()  # O's stale queue: a global table's items replicate whatever S3 refuses
    reverse.run()
    assert _new_saver(regions, mode, "refuse").promote().checked
    final = _old_saver(regions, mode, "refuse", setup=False)
    assert sorted(final.get_tuple(x).pending_writes) == [(task, "__resume__", "no"), (task, "n", 2)]
    (gap,) = final.verify(["t"]).set_aside
    assert (gap.thread_id, gap.checkpoint_id, gap.kind, gap.task_id) == ("t", x["configurable"]["checkpoint_id"], "writes", task)
    assert "another run of the task" in gap.reason and REPLICA_BUCKET in gap.reason, gap.reason
    assert len(gap.missing) == 1 and "/writes/" in gap.missing[0], gap.missing


@pytest.mark.parametrize("mode", MODES)
def test_a_task_run_again_after_promote_reads_whole_beside_the_old_regions_first_part(regions, mode: str) -> None:
    """O commits task T's interrupt and its resume on X; every item and object
    replicates but the item of the resume's __resume__ part: the outage. P, promoted,
    runs T's resume again: its regular part loses to O's, first committed (as in one
    region), its __resume__ part goes in. P's call reads whole, in P and after the
    failback; what O committed and the merge did not keep is set aside (the
    simulation's DynamoDB seed 686044: with a global table P read its __resume__
    alone, O's regular part passed over as another region's run)."""
    from helpers import checkpoint

    global_table = mode == "dynamodb-global"
    old = _old_saver(regions, mode, "refuse")
    replicator, reverse = regions.replicator, regions.reverse
    if global_table:
        regions.create_replica_table()
    elif mode == "dynamodb":
        old.setup_replica()
        replicator = Replicator.between(regions.primary, regions.replica, tables=False)
        reverse = replicator.reversed()
    task = "task-T"
    x = old.put(_config("t"), checkpoint({"n": 0}, {"n": "1"}), {"source": "loop", "step": 0}, {"n": "1"})
    old.put_writes(x, [("__interrupt__", "approve?")], task)
    old.put_writes(x, [("__resume__", "yes"), ("n", 1)], task)
    replicator.capture()
    held_back = [e for e in replicator.pending if e.kind == "item" and e.key["sk"]["S"].endswith("!s4")]
    assert held_back or not global_table, "the resume's __resume__ part has no item"
    replicator.deliver(where=lambda e: e not in held_back)  # the item stays in O's queue
    regions.proxy.refuse()
    _old_saver(regions, mode, "refuse", setup=False).promote()
    fresh = _new_saver(regions, mode, "refuse")
    fresh.put_writes(x, [("__resume__", "no"), ("n", 2)], task)
    # P's call whole: its __resume__, and the regular write O committed first.
    in_p = set(fresh.get_tuple(x).pending_writes)
    assert {(task, "__resume__", "no"), (task, "n", 1)} <= in_p, in_p
    regions.proxy.up()
    reverse.capture()  # P's writes are newer than O's stale item: P's write of the slot wins
    replicator.deliver()
    reverse.run()
    assert _new_saver(regions, mode, "refuse").promote().checked
    final = _old_saver(regions, mode, "refuse", setup=False)
    found = set(final.get_tuple(x).pending_writes)
    report = final.verify(["t"])
    if not global_table:
        # One index held O's run and P's call after it: nothing left out.
        assert found == in_p == {(task, "__interrupt__", "approve?"), (task, "__resume__", "no"), (task, "n", 1)}, found
        assert report.set_aside == (), report.set_aside
        return
    # A global table: P's run of T (one region's parts per task, see one_line) wins
    # whole; O's interrupt, committed, is left out and reported with its reason.
    assert found == in_p == {(task, "__resume__", "no"), (task, "n", 1)}, found
    (gap,) = report.set_aside
    assert (gap.checkpoint_id, gap.kind, gap.task_id) == (x["configurable"]["checkpoint_id"], "writes", task), gap
    assert "another run of the task" in gap.reason and len(gap.missing) == 1, gap


# Manifest mode: with a global table the delete's items replicate all the same (only
# objects are refused), so P learns of the delete; this passed before the fix there.
@pytest.mark.parametrize("mode", ("manifest",))
def test_failback_after_a_delete_that_never_replicated(regions, mode: str) -> None:
    """O deletes a thread; the delete never reaches P (the runbook refuses O's
    queue). P's copies of its objects never replicate back (a replica's copies do
    not), so waiting cannot make O hold them: the failback goes ahead, the thread
    stays deleted in O, and what P held of it is set aside (found by the simulation)."""
    old = _old_saver(regions, mode, "refuse")
    if mode == "dynamodb-global":
        regions.create_replica_table()
    old.put(_config("u"), _checkpoint(), {"source": "loop", "step": 0}, {"a": "1"})
    regions.replicator.run()
    old.delete_thread("u")
    regions.replicator.capture()
    regions.replicator.drop_pending(where=lambda e: e.kind in ("object", "delete-object"))  # refused
    regions.proxy.refuse()
    _old_saver(regions, mode, "refuse", setup=False).promote()
    regions.proxy.up()
    regions.replicator.deliver()  # a global table's items replicate all the same
    regions.reverse.run()
    assert _new_saver(regions, mode, "refuse").promote().checked
    final = _old_saver(regions, mode, "refuse", setup=False)
    assert final.get_tuple(_config("u")) is None
    (gap,) = final.verify(["u"]).set_aside  # what P held of it, committed there
    assert (gap.thread_id, gap.kind) == ("u", "checkpoint") and "not all in" in gap.reason, gap


# A global table is left out: O's stale items reach P (X's among them) before the
# failback, and P's run replaces O's parts of T slot by slot (see the test above).
@pytest.mark.parametrize("mode", ("manifest", "dynamodb"))
def test_failback_keeps_the_promoted_regions_writes_on_a_checkpoint_its_index_lacked(regions, mode: str) -> None:
    """O commits X, then runs task T on X (its interrupt, its resume): their
    objects replicate, their index never does (a manifest head, or a rebuild
    that ran before they arrived). P, promoted,
    resumes T on X: its writes commit before X's checkpoint is in its index
    (writes may come before their checkpoint's put). The failback keeps X, with
    P's run of T readable (it holds a call O lacks), and verify() names O's run
    as set aside: each committed write is readable or reported, none passed over
    (the simulation's manifest seeds 422749 and 56765)."""
    from helpers import checkpoint

    old = _old_saver(regions, mode, "refuse")
    replicator, reverse = regions.replicator, regions.reverse
    if mode == "dynamodb":
        old.setup_replica()
        replicator = Replicator.between(regions.primary, regions.replica, tables=False)
        reverse = replicator.reversed()
    root = old.put(_config("t"), checkpoint({"n": 0}, {"n": "1"}), {"source": "loop", "step": 0}, {"n": "1"})
    replicator.run()
    task = "task-T"
    x = old.put(root, checkpoint({"n": 1}, {"n": "2"}), {"source": "loop", "step": 1}, {"n": "2"})
    old.put_writes(x, [("__interrupt__", "approve?")], task)
    old.put_writes(x, [("__resume__", "yes"), ("n", 1)], task)
    replicator.capture()
    late = [e for e in replicator.pending if e.kind == "object" and not _is_head(e.key)]
    replicator.drop_pending(where=lambda e: e not in late)  # O's index stays in O
    regions.proxy.refuse()
    _old_saver(regions, mode, "refuse", setup=False).promote()
    replicator.deliver(where=lambda e: e in late)  # after the promote (a rebuild ran without them)
    fresh = _new_saver(regions, mode, "refuse")
    assert fresh.get_tuple(x) is None  # P's index does not hold X
    fresh.put_writes(x, [("__resume__", "no"), ("n", 2)], task)
    regions.proxy.up()
    reverse.capture()  # P's writes are newer than O's stale ones
    reverse.run()
    assert _new_saver(regions, mode, "refuse").promote().checked
    final = _old_saver(regions, mode, "refuse", setup=False)
    found = final.get_tuple(x)
    assert found is not None and sorted(found.pending_writes) == [(task, "__resume__", "no"), (task, "n", 2)], found
    report = final.verify(["t"])
    assert {(g.thread_id, g.checkpoint_id, g.kind, g.task_id) for g in report.set_aside} == {
        ("t", x["configurable"]["checkpoint_id"], "writes", task)
    }, report.set_aside
    (gap,) = report.set_aside
    assert "another run of the task" in gap.reason and REPLICA_BUCKET in gap.reason, gap.reason
    assert len(gap.missing) == 3 and all("/writes/" in key for key in gap.missing), gap.missing
