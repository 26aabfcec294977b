"""The replica region (issue 13): outage reads, lag safety, on_lag="raise", promote/verify, configuration.

Two regions on 127.0.0.1 (tests/regions.py): the primary behind a proxy a test
takes down (refuse / hang / fail), the replica on moto direct, replication done
by the harness's Replicator (captured, then delivered in order, shuffled, or
never). tests/test_replica_drill.py runs the whole failover drill; this file
covers the rest of the issue's Tests section, each test over the index modes:
"manifest" (the index travels in the bucket), "dynamodb-global" (the harness
replicates the table's items too) and, where promote's rebuild matters,
"dynamodb" (the table there is filled by promote(): reads wait for it).

Known bugs of s3_saver found here are pinned by strict xfails (reason "BUG: ...").
"""

from __future__ import annotations

import asyncio
import operator
import os
import random
import time
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from helpers import concat, long_form
from s3_saver import ConfigurationError, PrimaryUnavailableError, Replica, ReplicationLagError, S3Saver

# Modes whose replica can serve reads before promote() (the index is replicated).
READ_MODES = ("manifest", "dynamodb-global")
ALL_MODES = ("manifest", "dynamodb", "dynamodb-global")
FAILURES = ("refuse", "hang", "fail")
RETRY_ATTEMPTS = 2  # tests/regions.py saver_retry()


def _saver(regions: Any, mode: str, *, table: bool = True, **kw: Any) -> S3Saver:
    """A saver on the primary (behind the proxy) with the replica; DynamoDB modes
    get the replica region's table (``table=False``: not yet)."""
    index_mode = "manifest" if mode == "manifest" else "dynamodb"
    saver = regions.make_saver(index_mode, global_table=mode == "dynamodb-global", **kw)
    if index_mode == "dynamodb" and table and regions.replica.table not in regions.replica.dynamodb.list_tables()["TableNames"]:
        regions.create_replica_table()
    return saver


def _on_primary(saver: S3Saver) -> int:
    """Requests sent to the primary since the last stats reset."""
    return saver.stats.total_requests - saver.replica_stats.total_requests


def _per_read(saver: S3Saver) -> int:
    """Requests in a read's first round trip: the Query and the thread's record
    (DynamoDB), or the head's GET (manifest). An attempt on a failing primary
    sends them again."""
    return 2 if saver.table else 1


def _primary_attempts(saver: S3Saver) -> int:
    return _on_primary(saver) // _per_read(saver)


def _config(thread_id: str, checkpoint_id: str | None = None) -> dict:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


# --- A conversation: checkpoints, a value in an object of its own, pending writes, an interrupt ---


class State(TypedDict):
    msgs: Annotated[list, operator.add]
    side: Annotated[list, operator.add]
    log: Annotated[list, DeltaChannel(concat, snapshot_frequency=2)]
    approved: str


BIG = 70_000  # > the 64 KB inline threshold: the value gets an object of its own


def _graph(saver: Any):
    def draft(state: State) -> dict:
        return {"msgs": [f"draft {len(state['msgs'])}"], "log": [["draft"]]}

    def attach(state: State) -> dict:
        return {"msgs": ["x" * BIG], "log": [["attach"]]}

    def side(state: State) -> dict:
        # Runs beside `ask`: its writes stay pending on the checkpoint `ask` interrupts.
        return {"side": [f"side {len(state['msgs'])}"], "log": [["side"]]}

    def ask(state: State) -> dict:
        answer = interrupt("approve?")
        return {"approved": answer, "msgs": [f"approved by {answer}"], "log": [["ask"]]}

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


FIRST = {"msgs": ["hello"], "side": [], "log": [["in"]], "approved": ""}


# --- 1. Outage: reads fall over, bounded, held by recheck_after --------------------------------


def _take_down(regions: Any, failure: str) -> None:
    if failure == "fail":
        regions.proxy.fail(503)
    else:
        getattr(regions.proxy, failure)()


def _expected_attempts(failure: str) -> int:
    # A hung primary costs a read timeout (2 s) per attempt: failover_after=1 stops
    # the retries after the first one. A refused or failing one gets both attempts.
    return 1 if failure == "hang" else RETRY_ATTEMPTS


def _outage_kw(failure: str) -> dict:
    return {"recheck_after": 3600, "failover_after": 1.0 if failure == "hang" else 3.0}


class Api:
    """The graph's and the saver's calls, sync or async (on a loop of the test's own)."""

    def __init__(self, kind: str, saver: S3Saver) -> None:
        self.kind, self.saver, self.graph = kind, saver, _graph(saver)
        self.loop = asyncio.new_event_loop() if kind == "async" else None

    def _run(self, coro: Any) -> Any:
        assert self.loop is not None
        return self.loop.run_until_complete(self._keep_source(coro))

    run = _run  # any coroutine of the saver's, on this loop

    async def _keep_source(self, coro: Any) -> Any:
        try:
            return await coro
        finally:
            # last_read is per asyncio task: read it inside the task that read.
            self._async_source = self.saver.last_read

    async def _all(self, aiter: Any) -> list:
        return [item async for item in aiter]

    @property
    def source(self) -> Any:
        """``saver.last_read`` after the last call."""
        return self.saver.last_read if self.loop is None else self._async_source

    def invoke(self, value: Any, config: dict) -> Any:
        if self.loop is None:
            return self.graph.invoke(value, config)
        return self._run(self.graph.ainvoke(value, config))

    def state(self, config: dict) -> Any:
        return self.graph.get_state(config) if self.loop is None else self._run(self.graph.aget_state(config))

    def tuple(self, config: dict) -> Any:
        return self.saver.get_tuple(config) if self.loop is None else self._run(self.saver.aget_tuple(config))

    def history(self, config: dict) -> list:
        if self.loop is None:
            return list(self.graph.get_state_history(config))
        return self._run(self._all(self.graph.aget_state_history(config)))

    def all(self) -> list:
        """list(None): every thread's checkpoints."""
        return list(self.saver.list(None)) if self.loop is None else self._run(self._all(self.saver.alist(None)))

    def threads(self) -> list:
        return list(self.saver.list_threads()) if self.loop is None else self._run(self._all(self.saver.alist_threads()))

    def delta(self, config: dict) -> dict:
        if self.loop is None:
            return self.saver.get_delta_channel_history(config=config, channels=["log"])
        return self._run(self.saver.aget_delta_channel_history(config=config, channels=["log"]))

    def close(self) -> None:
        if self.loop is not None:
            self._run(self.saver.aclose())
            self.loop.close()


@pytest.fixture
def apis() -> Any:
    made: list[Api] = []

    def make(kind: str, saver: S3Saver) -> Api:
        made.append(Api(kind, saver))
        return made[-1]

    yield make
    for api in made:
        api.close()


@pytest.mark.parametrize("kind", ("sync", "async"))
@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("mode", READ_MODES)
def test_outage_reads_come_from_the_replica(regions, apis, mode: str, failure: str, kind: str) -> None:
    # The setup runs on a saver with the default failover budget: the outage saver's
    # failover_after=1 would turn one slow answer of a busy machine into a failed write.
    setup = apis(kind, _saver(regions, mode))
    config = _config("talk")

    # The primary runs the thread to an interrupt (and another thread); all of it replicates.
    setup.invoke(FIRST, config)
    setup.invoke({"msgs": ["other"], "side": [], "log": [], "approved": ""}, _config("second"))
    regions.replicator.run()
    state, history, threads, delta = setup.state(config), setup.history(config), setup.threads(), setup.delta(config)
    everything = setup.all()
    assert state.next == ("ask",) and len(history) >= 4 and len(threads) == 2 and len(everything) > len(history)
    assert delta["log"]["writes"]
    # Then the primary goes on (the interrupt resumed, a new thread): never replicated.
    setup.invoke(Command(resume="primary"), config)
    setup.invoke(FIRST, _config("late"))

    saver = _saver(regions, mode, **_outage_kw(failure))
    api = apis(kind, saver)
    api.threads()  # warm: the prefix's index-mode marker is read once, on the healthy primary
    _take_down(regions, failure)
    saver.stats.reset()
    regions.proxy.reset_counts()
    assert api.state(config) == state  # the primary's last replicated state
    source = api.source
    assert source.site == "replica" and source.failover and source.cause and not source.stale, source
    attempts = _primary_attempts(saver)
    assert attempts == _expected_attempts(failure), (failure, saver.stats)
    if failure == "fail":
        assert regions.proxy.answered == attempts * _per_read(saver)
    elif failure == "hang":
        assert regions.proxy.requests == attempts * _per_read(saver)  # one read timeout, not two

    # Within recheck_after every read goes straight to the replica: 0 requests to the primary.
    saver.stats.reset()
    assert api.history(config) == history
    assert api.threads() == threads
    assert api.all() == everything
    assert api.delta(config) == delta
    assert api.state(_config("late")).values == {}  # never replicated: no such thread there
    assert _on_primary(saver) == 0 and saver.replica_stats.total_requests > 0
    assert api.source.site == "replica" and api.source.failover

    # Writes wait for promote() (a hung primary is left out: each write costs its read timeouts).
    if failure != "hang":
        with pytest.raises(PrimaryUnavailableError, match="promote"):
            api.invoke(Command(resume="replica"), config)


@pytest.mark.parametrize("kind", ("sync", "async"))
@pytest.mark.parametrize("mode", READ_MODES)
def test_recheck_after_zero_tries_the_primary_again_and_failback_is_automatic(regions, apis, mode: str, kind: str) -> None:
    saver = _saver(regions, mode, recheck_after=0)
    api = apis(kind, saver)
    config = _config("talk")
    api.invoke(FIRST, config)
    regions.replicator.run()
    replicated = api.state(config)
    api.invoke(Command(resume="primary"), config)  # never replicated
    newest = api.state(config)
    assert newest.values["approved"] == "primary"

    regions.proxy.fail(503)
    for _ in range(2):  # recheck_after=0: every read tries the primary first
        saver.stats.reset()
        assert api.tuple(config).config == replicated.config
        assert api.source.site == "replica" and api.source.failover
        assert _primary_attempts(saver) == RETRY_ATTEMPTS and saver.replica_stats.total_requests > 0
    # get_state makes several saver reads (the checkpoint, the DeltaChannel's writes...):
    # each tries the primary again, each with the policy's attempts.
    saver.stats.reset()
    assert api.state(config) == replicated
    assert _on_primary(saver) >= 2 * RETRY_ATTEMPTS and _on_primary(saver) % RETRY_ATTEMPTS == 0, saver.stats

    regions.proxy.up()
    saver.stats.reset()
    assert api.state(config) == newest  # the primary serves again, its newest writes included
    assert api.source.site == "primary" and not api.source.failover and api.source.cause is None
    assert saver.replica_stats.total_requests == 0 and saver.stats.total_requests > 0


def test_dynamodb_without_a_global_table_reads_wait_for_promote(regions) -> None:
    # The replica region's table is filled by promote() only: never read before.
    saver = _saver(regions, "dynamodb", recheck_after=3600)
    replicator = _replicator(regions, "dynamodb")
    graph = _graph(saver)
    graph.invoke(FIRST, _config("talk"))
    replicator.run()  # the bucket only
    replicated = graph.get_state(_config("talk"))

    regions.proxy.refuse()
    saver.stats.reset()
    with pytest.raises(PrimaryUnavailableError, match=r"promote\(\)") as raised:
        graph.get_state(_config("talk"))
    assert "global table" in str(raised.value)
    assert _primary_attempts(saver) == RETRY_ATTEMPTS and saver.replica_stats.total_requests == 0
    saver.stats.reset()
    with pytest.raises(PrimaryUnavailableError):  # nothing else can answer: the primary is tried again
        list(saver.list(_config("talk")))
    assert _primary_attempts(saver) == RETRY_ATTEMPTS and saver.replica_stats.total_requests == 0

    promotion = saver.promote()
    assert not promotion.checked and promotion.rebuilt == len(list(saver.list(_config("talk"))))
    state = graph.get_state(_config("talk"))
    assert (state.values, state.next, state.config) == (replicated.values, replicated.next, replicated.config)


# --- 2. Lag: objects arriving one by one, in random orders: never a partial checkpoint ----------

# Orders per mode: make test-all and make soak run twice as many.
LAG_SEEDS = int(os.environ.get("S3_SAVER_LAG_SEEDS", "16" if long_form() else "8"))
# One summary line per mode is appended here ("" : none).
LAG_STATS = os.environ.get("S3_SAVER_LAG_STATS", "")
def _item_key(event: Any) -> Any:
    """The parsed sort key of an index item event (DynamoDB), else None."""
    from s3_saver._format.keys import parse_sort_key

    if event.kind != "item":
        return None
    try:
        return parse_sort_key(event.item["sk"]["S"])
    except Exception:
        return None


def _object_key(event: Any) -> Any:
    """The parsed key of a checkpoint, blob or writes object event, else None
    (a manifest head, a listing record, an item)."""
    from s3_saver._format.keys import KeyLayout

    return KeyLayout("").parse_object_key(event.key) if event.kind == "object" else None


def _of_checkpoint(event: Any, checkpoint_id: str, kinds: tuple[str, ...] = ("checkpoint", "blob", "writes")) -> bool:
    """An object (or an item) of this checkpoint's."""
    parsed = _object_key(event) or _item_key(event)
    return parsed is not None and parsed.kind in kinds and parsed.checkpoint_id == checkpoint_id


def _is_index(event: Any) -> bool:
    """An event of the index: a table's item, or a manifest's object (its head,
    the thread listing), not a checkpoint's, value's or writes' object."""
    return event.kind == "item" or (event.kind == "object" and _object_key(event) is None)


def _wipe_replica(regions: Any) -> None:
    """The replica region empty again (every object version, every item), its table kept."""
    site = regions.replica
    for page in site.s3.get_paginator("list_object_versions").paginate(Bucket=site.bucket):
        versions = page.get("Versions", []) + page.get("DeleteMarkers", [])
        doomed = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in versions]
        if doomed:
            site.s3.delete_objects(Bucket=site.bucket, Delete={"Objects": doomed, "Quiet": True})
    items = site.items()
    if items:
        names = [k["AttributeName"] for k in site.dynamodb.describe_table(TableName=site.table)["Table"]["KeySchema"]]
        for item in items:
            site.dynamodb.delete_item(TableName=site.table, Key={n: item[n] for n in names})


def _writes_by_task(pending: list) -> dict[str, list]:
    found: dict[str, list] = {}
    for task_id, channel, value in pending:
        found.setdefault(task_id, []).append((channel, value))
    return found


def _cid(found: Any) -> str:
    return found.config["configurable"]["checkpoint_id"]


def _parents(history: list) -> list[str | None]:
    return [t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None for t in history]


def _check_tuple(found: Any, primary: dict, where: str) -> str:
    """``found`` is a complete checkpoint the primary had: checkpoint (values), metadata
    and parent equal to the primary's; its pending writes are those of some of its tasks,
    each task's whole (the primary had them so before its last writes). Returns
    "all writes" or "fewer writes"."""
    cid = _cid(found)
    assert cid in primary, f"{where}: checkpoint {cid} never existed on the primary"
    want = primary[cid]
    assert found.config == want.config, where
    assert found.checkpoint == want.checkpoint, f"{where}: the values of {cid} differ (a mixed checkpoint)"
    assert found.metadata == want.metadata, where
    assert found.parent_config == want.parent_config, where
    mine, theirs = _writes_by_task(found.pending_writes or []), _writes_by_task(want.pending_writes or [])
    for task_id, writes in mine.items():
        assert writes == theirs.get(task_id), f"{where}: the pending writes of task {task_id} of {cid} are partial"
    return "all writes" if mine.keys() == theirs.keys() else "fewer writes"


class LagCounts(dict):
    def add(self, what: str) -> None:
        self[what] = self.get(what, 0) + 1

    def total(self, prefix: str) -> int:
        return sum(n for what, n in self.items() if what.startswith(prefix))

    def __str__(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.items()))


def _index_newest(plain: S3Saver, thread_id: str) -> str | None:
    """The newest checkpoint the replica's index names now, complete or not."""
    entry = plain._sync.run(plain._ctx.index.latest(thread_id, ""))
    return entry.checkpoint_id if entry is not None else None


# The global table's case, the longest, runs in make test-all and CI (make test-slow).
@pytest.mark.parametrize("mode", ("manifest", pytest.param("dynamodb-global", marks=pytest.mark.slow)))
def test_lag_every_read_is_a_complete_checkpoint_the_primary_had(regions, mode: str) -> None:
    """Property test: the same events (a conversation on the primary, recorded there
    before anything replicates) delivered one at a time in LAG_SEEDS random orders (even
    seeds: a key's versions keep their order; odd: an older manifest head may land after
    a newer one; every fourth: the index's events first, newest first); after each delivery the replica's latest (get_tuple, and the
    DeltaChannel history of what it served) and its history (list) are read.

    Every answer is None (nothing indexed yet), a ReplicationLagError, or checkpoints
    equal to the primary's of the same id, never a partial one; one served older than
    the newest the replica's index names (read as it is, by a saver without lag policy)
    says so (``last_read.stale``). The reader is one saver per order whose primary
    refuses (after its first read, reads go straight to the replica): it keeps its
    per-process memory of the newest checkpoint seen for the whole order, as a process
    living through the outage does, and starts afresh with the next order."""
    from regions import Replicator

    writer = _saver(regions, mode)
    graph = _graph(writer)
    config = _config("lag")
    graph.invoke(FIRST, config)
    # The primary's state of every checkpoint, before anything replicates.
    primary = {_cid(t): t for t in writer.list(config)}
    deltas = {cid: writer.get_delta_channel_history(config=t.config, channels=["log"]) for cid, t in primary.items()}
    latest, latest_state = writer.get_tuple(config), graph.get_state(config)
    states = [(s.values, s.next, s.config, s.metadata) for s in graph.get_state_history(config)]
    assert latest_state.next == ("ask",) and latest.pending_writes and len(primary) >= 4
    assert any(len(repr(t.checkpoint["channel_values"])) > BIG for t in primary.values())
    events = regions.replicator.capture()
    regions.proxy.refuse()  # from now on the replica answers every read
    plain = S3Saver(  # the replica's index as it is (no lag policy): what "newest" is
        regions.replica.bucket,
        table=regions.replica.table if mode != "manifest" else None,
        region_name=regions.replica.region,
        endpoint_url=regions.moto,
    )
    regions.savers.append(plain)

    latest_reads, history_reads = LagCounts(), LagCounts()
    started = time.monotonic()

    def counts() -> str:
        return f"latest reads: {latest_reads}; history reads: {history_reads}"

    for seed in range(LAG_SEEDS):
        _wipe_replica(regions)
        rng = random.Random(seed)
        keep = seed % 2 == 0
        replicator = Replicator.between(regions.primary, regions.replica)
        replicator.pending = list(events)
        # A reader of its own per order: it remembers the newest checkpoint it saw.
        reader = _saver(regions, mode, table=False, setup=False, recheck_after=3600)
        served: list[str] = []  # what this reader served as the latest so far
        step = 0
        # Every fourth order delivers the index first, newest event first (a table's
        # newest checkpoint item, a manifest's newest head), then the objects
        # shuffled: the replica's index names a checkpoint with nothing complete
        # to stand in for it, by design. A shuffled order meets that narrow case
        # only by chance, which one more event changes: the table's ownership
        # record left 8 orders without a lag error of a latest read.
        index_first = seed % 4 == 3
        if index_first:
            objects = [e for e in events if not _is_index(e)]
            rng.shuffle(objects)
            replicator.pending = [e for e in events if _is_index(e)][::-1] + objects
        while replicator.pending:
            replicator.deliver(1, None if index_first else rng, keep_version_order=keep)
            step += 1
            where = f"{mode} seed {seed} step {step}/{len(events)}"
            newest = _index_newest(plain, "lag")
            try:
                _read_latest(reader, config, primary, deltas, newest, served, latest_reads, where)
                _read_history(reader, config, primary, newest, history_reads, where)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n(so far: {counts()})") from exc
        # All delivered: the primary's latest (an older head landed last: said stale).
        final = reader.get_tuple(config)
        if keep:
            assert final == latest and not reader.last_read.stale, f"seed {seed}: {final} ({counts()})"
            state = _graph(reader).get_state(config)
            assert (state.values, state.next, state.config) == (latest_state.values, latest_state.next, latest_state.config)
            history = [(s.values, s.next, s.config, s.metadata) for s in _graph(reader).get_state_history(config)]
            assert history == states, f"seed {seed}"
        elif final is None:
            # The head landed last names no checkpoint: told as stale.
            assert _index_newest(plain, "lag") is None and reader.last_read.stale, f"seed {seed}"
        else:
            assert final is not None and (final == latest or reader.last_read.stale), (
                f"seed {seed}: {final}, {reader.last_read}, the index names {_index_newest(plain, 'lag')} ({counts()})"
            )
        reader.close()

    took = time.monotonic() - started
    summary = (
        f"{mode}: {LAG_SEEDS} orders x {len(events)} events ({len(primary)} checkpoints, reads after each), "
        f"{took:.1f} s; {counts()}"
    )
    print(summary)
    if LAG_STATS:
        os.makedirs(os.path.dirname(LAG_STATS) or ".", exist_ok=True)
        with open(LAG_STATS, "a") as out:
            out.write(summary + "\n")
    # The orders did make the replica lag: stale answers were met and, with a table,
    # lag errors of each kind: a latest read with nothing complete to stand in (the
    # index-first orders), a history through an item not arrived, a DeltaChannel
    # replay short of an item. A manifest's reader meets lag errors in some orders
    # too (objects a head names, not arrived), not by design: only stale answers
    # are required of it.
    assert latest_reads.total("stale"), summary
    if mode != "manifest":
        assert latest_reads.total("error"), summary
        assert history_reads.total("error") and latest_reads.total("delta error"), summary


def _read_latest(
    reader: S3Saver,
    config: dict,
    primary: dict,
    deltas: dict,
    newest: str | None,
    served: list[str],
    counts: LagCounts,
    where: str,
) -> None:
    try:
        found = reader.get_tuple(config)
    except ReplicationLagError as exc:
        assert "replication lag" in str(exc), where
        counts.add("error")
        return
    if found is None:
        assert newest is None, f"{where}: None, the index names {newest}"
        if served:  # the thread this reader served before reads as absent: told as stale
            # newest_id: the newest the reader saw in the index (served or passed over).
            assert reader.last_read.stale and reader.last_read.newest_id >= max(served), f"{where}: {reader.last_read}"
            counts.add("none (stale)")
        else:
            counts.add("none")
        return
    writes = _check_tuple(found, primary, where)
    source, cid = reader.last_read, _cid(found)
    served.append(cid)
    assert source.site == "replica" and source.checkpoint_id == cid, (where, source)
    if newest is not None and cid < newest:
        assert source.stale, f"{where}: {cid} served as the latest, the index names {newest}: {source}"
    if source.stale:
        # A newer checkpoint, or more pending writes of this one, seen before.
        assert source.newest_id > cid or source.skipped or source.writes_behind, (where, source)
        assert source.behind_seconds is not None and source.behind_seconds >= 0, (where, source)
    else:
        assert cid == newest and not source.skipped, (where, source)
    counts.add(("stale" if source.stale else "exact") + f" ({writes})")
    # The DeltaChannel's writes up to it (what get_state replays): the primary's, or lag.
    try:
        delta = reader.get_delta_channel_history(config=found.config, channels=["log"])
    except ReplicationLagError as exc:
        assert "replication lag" in str(exc), where
        counts.add("delta error")
        return
    assert delta == deltas[cid], f"{where}: the DeltaChannel history of {cid} is {delta}, on the primary {deltas[cid]}"


def _read_history(
    reader: S3Saver, config: dict, primary: dict, newest: str | None, counts: LagCounts, where: str
) -> None:
    try:
        history = list(reader.list(config))
    except ReplicationLagError as exc:
        assert "replication lag" in str(exc), where
        counts.add("error")
        return
    if not history:
        if newest is not None:  # all it names is incomplete yet: passed over, and said so
            assert reader.last_read.stale and newest in reader.last_read.skipped, (where, reader.last_read)
        counts.add("empty" + (" (stale)" if newest is not None else ""))
        return
    for i, found in enumerate(history):
        _check_tuple(found, primary, f"{where} history[{i}]")
    ids = [_cid(t) for t in history]
    assert ids == sorted(ids, reverse=True), where
    # No hole: each one's parent is the next one, down to the first checkpoint.
    parents = _parents(history)
    assert parents == ids[1:] + [None], f"{where}: a history with a hole: {ids} (parents {parents})"
    stale = reader.last_read.stale
    if newest is not None and ids[0] < newest:
        assert stale, f"{where}: the history from {ids[0]}, the index names {newest}"
    if not stale:
        assert ids[0] == newest, where
    counts.add("stale" if stale else "exact")


@dataclass
class Lagging:
    reader: S3Saver  # a saver whose primary refuses: it reads the replica
    primary: dict  # the primary's tuples by checkpoint id
    order: list[str]  # their ids, oldest first
    states: dict  # the primary's get_state by checkpoint id


def _lagging(
    regions: Any, mode: str, hold: Any, *, resume: bool = False, list_deltas: bool = True, **reader_kw: Any
) -> Lagging:
    """A conversation on the primary (thread "gap": to the interrupt, ``resume``: and on
    to its end), replicated whole but for the events ``hold(event, checkpoint ids oldest
    first)`` picks (they never arrive); then the primary refuses. ``list_deltas``: the
    writer's (False: each checkpoint holds its lists whole, reads no ancestor's piece)."""
    writer = _saver(regions, mode, list_deltas=list_deltas)
    graph = _graph(writer)
    graph.invoke(FIRST, _config("gap"))
    if resume:
        graph.invoke(Command(resume="yes"), _config("gap"))
    primary = {_cid(t): t for t in writer.list(_config("gap"))}
    order = sorted(primary)
    states = {cid: graph.get_state(_config("gap", cid)) for cid in order}
    regions.replicator.capture()
    assert regions.replicator.drop_pending(lambda e: hold(e, order))
    regions.replicator.deliver()
    regions.proxy.refuse()
    reader = _saver(regions, mode, table=False, setup=False, recheck_after=3600, **reader_kw)
    return Lagging(reader, primary, order, states)


def _fresh_on_replica(regions: Any, mode: str) -> S3Saver:
    """A new process configured as the failover runbook's step 3 says: the replica
    region as its primary, the old one (down) as its Replica (a global table's)."""
    replica = None
    if mode == "dynamodb-global":
        replica = Replica(regions.primary.bucket, region_name=regions.primary.region, endpoint_url=regions.proxy.url, global_table=True)
    saver = S3Saver(
        regions.replica.bucket,
        table=regions.replica.table if mode != "manifest" else None,
        region_name=regions.replica.region,
        endpoint_url=regions.moto,
        replica=replica,
    )
    regions.savers.append(saver)
    return saver


def test_global_table_latest_passes_over_a_parent_whose_item_never_arrived(regions) -> None:
    """Issue 22, item 2: the newest checkpoint is incomplete (an object missing) and its
    parent's item never arrives: the newest complete one older than the parent answers,
    before promote (read over) and after it (a fresh process on the promoted region)."""

    def hold(event: Any, order: list[str]) -> bool:
        key = _item_key(event)
        if key is not None:
            return key.kind in ("checkpoint", "link") and key.checkpoint_id == order[-2]
        parsed = _object_key(event)  # the newest's large value (its checkpoint may ride in its item)
        return parsed is not None and parsed.kind == "blob" and parsed.checkpoint_id == order[-1]

    lag = _lagging(regions, "dynamodb-global", hold)
    found = lag.reader.get_tuple(_config("gap"))
    assert _cid(found) == lag.order[-3] and _check_tuple(found, lag.primary, "latest") == "all writes"
    assert lag.reader.last_read.stale and set(lag.reader.last_read.skipped) == set(lag.order[-2:])
    promotion = lag.reader.promote()
    assert f"gap//{lag.order[-1]}" in promotion.incomplete
    fresh = _fresh_on_replica(regions, "dynamodb-global")
    assert _cid(fresh.get_tuple(_config("gap"))) == lag.order[-3]
    assert [_cid(t) for t in fresh.list(_config("gap"))] == lag.order[-3::-1]


def test_promote_rebuild_keeps_a_checkpoint_whose_parent_object_never_arrived(regions) -> None:
    """Issue 22, item 3: DynamoDB without a global table. The newest checkpoint's own
    step set channels that never hold a value (``branch:to:*``); its parent's object
    never arrived. The checkpoint is complete: the rebuild indexes it, and the thread
    resumes from it (not from an older one)."""

    def hold(event: Any, order: list[str]) -> bool:
        parsed = _object_key(event)
        return parsed is not None and parsed.kind == "checkpoint" and parsed.checkpoint_id == order[-2]

    # Lists stored whole: with deltas the newest reads a piece the parent's
    # object holds, and is rightly left out (see the test after this one).
    lag = _lagging(regions, "dynamodb", hold, list_deltas=False)
    newest = lag.primary[lag.order[-1]]
    assert any(ch.startswith("branch:to:") for ch in newest.checkpoint["channel_versions"])
    promotion = lag.reader.promote()
    assert promotion.rebuilt is not None and f"gap//{lag.order[-1]}" not in promotion.incomplete
    assert promotion.incomplete == ()  # the parent left no object: nothing of it to index
    for reader in (lag.reader, _fresh_on_replica(regions, "dynamodb")):
        found = reader.get_tuple(_config("gap"))
        assert _cid(found) == lag.order[-1] and _check_tuple(found, lag.primary, "latest") == "all writes"


def test_promote_rebuild_leaves_out_a_delta_that_reads_a_piece_of_a_missing_object(regions) -> None:
    """Lists stored as deltas: the newest checkpoint reads a piece its parent's
    object holds, and that object never arrived. The rebuild leaves the newest out
    (never served partial), and the thread reads from the newest complete one."""

    def hold(event: Any, order: list[str]) -> bool:
        parsed = _object_key(event)
        return parsed is not None and parsed.kind == "checkpoint" and parsed.checkpoint_id == order[-2]

    lag = _lagging(regions, "dynamodb", hold)
    newest = lag.primary[lag.order[-1]]
    assert newest.checkpoint["channel_values"]["msgs"]  # a list its parent's object holds a piece of
    promotion = lag.reader.promote()
    assert f"gap//{lag.order[-1]}" in promotion.incomplete
    found = _fresh_on_replica(regions, "dynamodb").get_tuple(_config("gap"))
    assert _cid(found) == lag.order[-3]
    assert found.checkpoint["channel_values"] == lag.primary[lag.order[-3]].checkpoint["channel_values"]


def test_manifest_promote_settles_and_lists_a_thread_whose_listing_object_never_arrived(regions) -> None:
    """The head of a thread arrived; its listing object (a second object, replicated
    apart) and its first checkpoint's object did not. Promote finds the thread by its
    head, drops the checkpoint whose object is missing, and lists the thread again: a
    fresh process without a Replica lists it and reads its latest and whole history.
    (Found by the outage drill: the head named a checkpoint no promote had looked at.)"""
    from s3_saver._format.keys import KeyLayout

    def hold(event: Any, order: list[str]) -> bool:
        parsed = _object_key(event)
        if parsed is not None:
            return parsed.kind == "checkpoint" and parsed.checkpoint_id == order[0]
        return event.kind == "object" and KeyLayout("").threads_root in event.key  # the listing object

    lag = _lagging(regions, "manifest", hold)
    assert [t.thread_id for t in lag.reader.list_threads()] == []  # not listed in the replica
    promotion = lag.reader.promote()
    assert promotion.incomplete == (f"gap//{lag.order[0]}",)
    fresh = S3Saver(regions.replica.bucket, region_name=regions.replica.region, endpoint_url=regions.moto)
    regions.savers.append(fresh)
    assert [t.thread_id for t in fresh.list_threads()] == ["gap"]
    assert _cid(fresh.get_tuple(_config("gap"))) == lag.order[-1]
    assert [_cid(t) for t in fresh.list(_config("gap"))] == lag.order[:0:-1]


def _deliver_held(regions: Any) -> None:
    """What ``_lagging`` held back arrives after all."""
    regions.replicator.pending.extend(regions.replicator.dropped)
    regions.replicator.dropped.clear()
    regions.replicator.deliver()


def test_global_table_history_missing_a_checkpoint_item_is_not_served_whole(regions) -> None:
    """A global table replicates item by item: the item (and link item) of the
    second checkpoint has not arrived, all objects have. The newest checkpoint is
    complete and served; a history through the missing item raises (each item
    names its parent), below it the history is whole; once it arrives, all is."""

    def hold(event: Any, order: list[str]) -> bool:
        key = _item_key(event)
        return key is not None and key.kind in ("checkpoint", "link") and key.checkpoint_id == order[1]

    lag = _lagging(regions, "dynamodb-global", hold)
    reader, order, config = lag.reader, lag.order, _config("gap")
    assert _cid(reader.get_tuple(config)) == order[-1] and not reader.last_read.stale
    with pytest.raises(ReplicationLagError, match="replication lag") as raised:
        list(reader.list(config))
    assert order[1] in str(raised.value) and "inside the history" in str(raised.value)
    with pytest.raises(ReplicationLagError, match=order[1]):
        list(reader.list(None))  # every thread's: the same hole
    assert [_cid(t) for t in reader.list(config, before=_config("gap", order[1]))] == [order[0]]
    _deliver_held(regions)
    history = list(reader.list(config))
    assert [_cid(t) for t in history] == order[::-1] and _parents(history) == order[-2::-1] + [None]


def test_global_table_delta_channel_missing_a_writes_item_is_not_replayed_partial(regions) -> None:
    """The pending writes (items) of the checkpoint before the newest, among them
    the task `attach`'s write to the DeltaChannel that the newest replays, have not
    arrived. The newest checkpoint's item names them (the slots it was made from):
    its DeltaChannel replay raises instead of showing values the primary never had."""

    def hold(event: Any, order: list[str]) -> bool:
        key = _item_key(event)
        return key is not None and key.kind == "writes" and key.checkpoint_id == order[-2]

    lag = _lagging(regions, "dynamodb-global", hold)
    config = _config("gap")
    with pytest.raises(ReplicationLagError, match="replication lag") as raised:
        _graph(lag.reader).get_state(config)
    assert "pending writes" in str(raised.value) and lag.order[-2] in str(raised.value)
    with pytest.raises(ReplicationLagError, match=lag.order[-2]):
        lag.reader.get_delta_channel_history(config=_config("gap", lag.order[-1]), channels=["log"])
    _deliver_held(regions)
    state, want = _graph(lag.reader).get_state(_config("gap", lag.order[-1])), lag.states[lag.order[-1]]
    assert (state.values, state.next, state.config) == (want.values, want.next, want.config)


def test_global_table_prune_marks_what_stays_so_a_replica_serves_the_pruned_history(regions) -> None:
    """A prune takes the older checkpoints out of the history: the oldest that stays
    names a parent the index no longer lists. The prune marks it (``pg``) in the
    transaction that takes the parent out, so a replica reading the table tells
    the removal from a hole; until the mark arrives, a hole is what it is."""
    from s3_saver._format import keys as _keys
    from s3_saver._format.keys import KeyLayout

    writer = _saver(regions, "dynamodb-global")
    config = _config("gap")
    _graph(writer).invoke(FIRST, config)
    regions.replicator.run()
    writer.prune(["gap"], keep_last=2)
    kept = [_cid(t) for t in writer.list(config)]
    assert len(kept) == 2
    key = {"pk": {"S": KeyLayout("").partition_key("gap")}, "sk": {"S": _keys.checkpoint_sort_key("", kept[-1])}}
    item = regions.primary.dynamodb.get_item(TableName=regions.primary.table, Key=key)["Item"]
    assert item["pg"] == {"BOOL": True}
    pruned = regions.replicator.capture()
    marked = [e for e in pruned if e.kind == "item" and "pg" in e.item]
    assert marked
    regions.proxy.refuse()
    reader = _saver(regions, "dynamodb-global", table=False, setup=False, recheck_after=3600)
    # The prune's other changes first (the parent leaves, or is hidden): a hole.
    regions.replicator.deliver(where=lambda e: e not in marked)
    with pytest.raises(ReplicationLagError, match="inside the history"):
        list(reader.list(config))
    regions.replicator.deliver()
    assert [_cid(t) for t in reader.list(config)] == kept


# --- 3. on_lag="raise", a checkpoint by id, a gap inside a history ---------------------------------


@pytest.mark.parametrize("mode", READ_MODES)
def test_a_lagging_latest_older_or_raise(regions, mode: str) -> None:
    # The newest checkpoint's objects (its values' blob, its pending writes) have not arrived.
    lag = _lagging(regions, mode, lambda e, order: _of_checkpoint(e, order[-1]) and _object_key(e))
    reader, primary, order = lag.reader, lag.primary, lag.order
    strict = _saver(regions, mode, table=False, setup=False, recheck_after=3600, on_lag="raise")
    config = _config("gap")

    # on_lag="older": the newest complete checkpoint of the same line, said stale.
    older = reader.get_tuple(config)
    assert _cid(older) == order[-2] and _check_tuple(older, primary, "older") == "all writes"
    source = reader.last_read
    assert source.stale and source.skipped == (order[-1],) and source.checkpoint_id == order[-2], source
    assert source.newest_id == order[-1] and source.behind_seconds > 0, source
    # What LangGraph shows: that checkpoint (for the latest, LangGraph applies the pending
    # writes of a step whose tasks all finished, as the primary did before its next put).
    graph = _graph(reader)
    assert graph.get_state(config).config == lag.states[order[-2]].config and reader.last_read.stale
    by_id = graph.get_state(_config("gap", order[-2]))
    want = lag.states[order[-2]]
    assert (by_id.values, by_id.next, by_id.config, by_id.metadata) == (want.values, want.next, want.config, want.metadata)
    # A history starts below the checkpoints not complete yet, and says so.
    history = list(reader.list(config))
    assert [_cid(t) for t in history] == order[-2::-1] and reader.last_read.stale
    assert reader.last_read.skipped == (order[-1],)
    assert [_cid(t) for t in reader.list(None)] == order[-2::-1]  # every thread's: the same, thread by thread

    # on_lag="raise": the latest, and a history starting at it, raise.
    with pytest.raises(ReplicationLagError, match="replication lag") as raised:
        strict.get_tuple(config)
    assert order[-1] in str(raised.value)
    with pytest.raises(ReplicationLagError, match="replication lag"):
        list(strict.list(config))
    # Both: a checkpoint asked for by id has no stand-in.
    for saver in (reader, strict):
        with pytest.raises(ReplicationLagError, match="replication lag"):
            saver.get_tuple(_config("gap", order[-1]))
        assert _check_tuple(saver.get_tuple(_config("gap", order[-2])), primary, "by id") == "all writes"


@pytest.mark.parametrize("on_lag", ("older", "raise"))
@pytest.mark.parametrize("mode", READ_MODES)
def test_a_history_with_a_gap_below_a_complete_checkpoint_raises(regions, mode: str, on_lag: str) -> None:
    # The objects of the second newest checkpoint (its blob: the 70 KB value, which
    # the newest holds in a blob of its own: lists stored whole) have not arrived;
    # the newest is complete.
    def hold(event: Any, order: list[str]) -> bool:
        return bool(_object_key(event)) and _of_checkpoint(event, order[-2])

    lag = _lagging(regions, mode, hold, resume=True, on_lag=on_lag, list_deltas=False)
    reader, order = lag.reader, lag.order
    config = _config("gap")
    newest = reader.get_tuple(config)
    assert _cid(newest) == order[-1] and not reader.last_read.stale
    with pytest.raises(ReplicationLagError, match="replication lag") as raised:
        list(reader.list(config))
    assert order[-2] in str(raised.value) and "inside the history" in str(raised.value)
    # Below the gap the history is whole.
    assert [_cid(t) for t in reader.list(config, before=_config("gap", order[-2]))] == order[-3::-1]


def _head_newest(event: Any) -> str | None:
    """The newest checkpoint a manifest head version (an event's body) names."""
    from s3_saver._index.manifest.doc import decode_head

    head = decode_head("gap", event.body, event.key, None)
    return max((e.checkpoint_id for e in head.entries), default=None)


@pytest.mark.parametrize("on_lag", ("older", "raise"))
def test_an_older_manifest_head_after_a_newer_one_is_said_stale(regions, on_lag: str) -> None:
    from regions import Replicator

    from s3_saver._format.keys import KeyLayout

    writer = _saver(regions, "manifest")
    _graph(writer).invoke(FIRST, _config("gap"))
    primary = {_cid(t): t for t in writer.list(_config("gap"))}
    order = sorted(primary)
    events = regions.replicator.capture()
    head_key = KeyLayout("").manifest_head_key("gap")
    # The head's versions that name checkpoints, but not yet the newest.
    older = [e for e in events if e.kind == "object" and e.key == head_key and _head_newest(e) not in (None, order[-1])]
    assert older
    regions.replicator.deliver()
    regions.proxy.refuse()
    reader = _saver(regions, "manifest", setup=False, recheck_after=3600, on_lag=on_lag)
    config = _config("gap")
    assert reader.get_tuple(config) == primary[order[-1]] and not reader.last_read.stale

    # An older version of the head lands last (S3 replication keeps no order between versions).
    late = Replicator.between(regions.primary, regions.replica)
    late.pending = [older[-1]]
    late.deliver()
    if on_lag == "raise":
        with pytest.raises(ReplicationLagError, match="replication lag") as raised:
            reader.get_tuple(config)
        assert order[-1] in str(raised.value)
        return
    found = reader.get_tuple(config)
    assert _cid(found) == _head_newest(older[-1]) < order[-1]
    _check_tuple(found, primary, "older head")
    source = reader.last_read
    assert source.stale and source.newest_id == order[-1] and source.skipped == () and source.behind_seconds > 0, source


# --- 4. promote() while replication lags; verify() after a forced one ------------------------------


def _replicator(regions: Any, mode: str) -> Any:
    """S3 replication (and in dynamodb-global mode, the table's items): plain "dynamodb"
    mode has no global table, its replica table is filled by promote() only."""
    from regions import Replicator

    if mode == "dynamodb":
        return Replicator.between(regions.primary, regions.replica, tables=False)
    return regions.replicator


def _never_replicated(events: list) -> set[tuple]:
    """The checkpoints and pending writes whose objects these events carry (as in the drill)."""
    found = set()
    for event in events:
        parsed = _object_key(event)
        if parsed is None:
            continue  # a manifest head, a listing record, an item: the index, not a write
        if parsed.kind == "writes":
            found.add((parsed.thread_id, parsed.ns, parsed.checkpoint_id, "writes", parsed.task_id))
        else:
            found.add((parsed.thread_id, parsed.ns, parsed.checkpoint_id, "checkpoint", None))
    return found


def _gaps(gaps: tuple) -> set[tuple]:
    return {(g.thread_id, g.ns, g.checkpoint_id, g.kind, g.task_id) for g in gaps}


def _lagging_writes(regions: Any, mode: str, saver: S3Saver) -> tuple[Any, set[tuple]]:
    """A thread replicated to its interrupt, then resumed on the primary and a thread
    started there, neither replicated (pending). Returns (the state replicated, what is not)."""
    replicator = _replicator(regions, mode)
    graph = _graph(saver)
    graph.invoke(FIRST, _config("talk"))
    replicator.run()
    replicated = graph.get_state(_config("talk"))
    graph.invoke(Command(resume="primary"), _config("talk"))
    graph.invoke(FIRST, _config("late"))
    lagging = _never_replicated(replicator.capture())
    assert {e[0] for e in lagging} == {"talk", "late"}
    return replicated, lagging


@pytest.mark.parametrize("mode", ALL_MODES)
def test_promote_refuses_while_replication_lags_and_force_leaves_them_for_verify(regions, mode: str) -> None:
    saver = _saver(regions, mode, recheck_after=3600)
    replicated, lagging = _lagging_writes(regions, mode, saver)
    checkpoints = sum(_cid(t) <= _cid(replicated) for t in saver.list(_config("talk")))  # up to the interrupt
    before = saver.verify()
    assert _gaps(before.unreplicated) == lagging and before.replica_only == ()
    assert before.primary == f"s3://{regions.primary.bucket} ({regions.primary.region})" and before.threads == 2

    # The primary answers and holds writes the replica lacks: nothing is swapped.
    with pytest.raises(ReplicationLagError, match="replication lag") as raised:
        saver.promote()
    assert "force=True" in str(raised.value) and "'late'" in str(raised.value)
    assert (saver.bucket, saver.region_name) == (regions.primary.bucket, regions.primary.region)
    assert saver.verify() == before
    assert _graph(saver).get_state(_config("talk")).values["approved"] == "primary"
    assert saver.last_read.site == "primary"

    # force=True: the replica region is written to from now on; what never arrived stays
    # in the old primary, which verify() (seen from the new primary) reports as replica_only.
    promotion = saver.promote(force=True)
    assert promotion.checked and promotion.rebuilt is None
    # Settled from both indexes (the old primary answers): every entry committed
    # there whose objects arrived; those whose objects did not are named.
    assert set(promotion.incomplete) == {f"{t}/{ns}/{cid}" for t, ns, cid, kind, _ in lagging if kind == "checkpoint"}
    lagging_writes = {f"{t}/{ns}/{cid}/{task}" for t, ns, cid, kind, task in lagging if kind == "writes"}
    assert set(promotion.incomplete_writes) <= lagging_writes
    assert len(list(saver.list(_config("talk")))) == checkpoints
    assert (saver.bucket, saver.region_name) == (regions.replica.bucket, regions.replica.region)
    assert promotion.primary == f"s3://{regions.replica.bucket} ({regions.replica.region})"
    after = saver.verify(["talk", "late"])
    assert after.primary == promotion.primary and after.replica == before.primary
    assert after.unreplicated == () and _gaps(after.replica_only) == lagging
    # The new primary serves the state that had replicated (the interrupt), from its own index.
    graph = _graph(saver)
    state = graph.get_state(_config("talk"))
    assert (state.values, state.next, state.config) == (replicated.values, replicated.next, replicated.config)
    assert saver.last_read.site == "primary" and graph.get_state(_config("late")).values == {}
    # ... and takes writes: the interrupt resumed there.
    assert graph.invoke(Command(resume="replica"), _config("talk"))["approved"] == "replica"
    assert _gaps(saver.verify(["talk", "late"]).replica_only) == lagging  # the old primary's: still reported


@pytest.mark.parametrize(
    "mode",
    [
        "manifest",
        "dynamodb-global",
        "dynamodb",
    ],
)
def test_verify_after_a_forced_promote_reports_a_thread_only_the_old_primary_holds(regions, mode: str) -> None:
    saver = _saver(regions, mode, recheck_after=3600)
    _, lagging = _lagging_writes(regions, mode, saver)
    saver.promote(force=True)
    report = saver.verify()  # "every thread either index lists"
    assert report.threads == 2 and _gaps(report.replica_only) == lagging, sorted({g.thread_id for g in report.replica_only})


# --- 5. Configuration errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"bucket": ""}, "Replica.bucket"),
        ({"bucket": None}, "Replica.bucket"),
        ({"bucket": "rep", "failover_after": -1}, "Replica.failover_after"),
        ({"bucket": "rep", "failover_after": True}, "Replica.failover_after"),
        ({"bucket": "rep", "recheck_after": -0.5}, "Replica.recheck_after"),
        ({"bucket": "rep", "recheck_after": "30"}, "Replica.recheck_after"),
        ({"bucket": "rep", "on_lag": "x"}, "Replica.on_lag"),
    ],
)
def test_replica_settings_are_checked(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigurationError, match=field.replace(".", r"\.")):
        Replica(**kwargs)


def test_replica_configuration_errors(endpoint: str) -> None:
    replica = Replica("rep", region_name="eu-west-1", endpoint_url=endpoint)
    # A replica table needs a DynamoDB index on the primary: in manifest mode the index is in the bucket.
    with pytest.raises(ConfigurationError, match=r"Replica\(table='eu-index'\)"):
        S3Saver("bkt", endpoint_url=endpoint, replica=Replica("rep", table="eu-index"))
    for wrong in ("r", {"bucket": "r"}):
        with pytest.raises(ConfigurationError, match="replica must be an s3_saver.Replica"):
            S3Saver("bkt", endpoint_url=endpoint, replica=wrong)
    S3Saver("bkt", table="tbl", endpoint_url=endpoint, replica=Replica("rep", table="eu-index")).close()
    S3Saver("bkt", endpoint_url=endpoint, replica=replica).close()

    # The replica-only calls of a saver without one.
    plain = S3Saver("bkt", endpoint_url=endpoint)
    try:
        assert plain.last_read is None
        for call in (plain.promote, plain.verify, plain.setup_replica, lambda: plain.promote(force=True)):
            with pytest.raises(ConfigurationError, match="replica"):
                call()

        async def calls() -> None:
            for call in (plain.apromote, plain.averify, plain.asetup_replica):
                with pytest.raises(ConfigurationError, match="replica"):
                    await call()
            await plain.aclose()

        asyncio.run(calls())
    finally:
        plain.close()


# --- 6. setup_replica() on a fresh store -------------------------------------------------------------


@pytest.mark.parametrize("kind", ("sync", "async"))
@pytest.mark.parametrize("mode", ALL_MODES)
def test_setup_replica_creates_the_replica_bucket_and_table(endpoint: str, mode: str, kind: str) -> None:
    import boto3

    table = "fresh-index" if mode != "manifest" else None
    replica = Replica(
        "fresh-replica",
        region_name="eu-west-1",
        endpoint_url=endpoint,
        table="eu-index" if table else None,
        global_table=mode == "dynamodb-global",  # the table a global table's replica would be
    )
    saver = S3Saver("fresh-primary", table=table, region_name="us-east-1", endpoint_url=endpoint, replica=replica)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="eu-west-1")
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="eu-west-1")
    try:
        assert "fresh-replica" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
        saver.setup()
        if kind == "sync":
            saver.setup_replica()
            saver.setup_replica()  # idempotent
        else:

            async def go() -> None:
                await saver.asetup_replica()
                await saver.asetup_replica()
                await saver.aclose()

            asyncio.run(go())
        assert s3.get_bucket_location(Bucket="fresh-replica")["LocationConstraint"] == "eu-west-1"
        assert dynamodb.list_tables()["TableNames"] == (["eu-index"] if table else [])
        if table:
            made = dynamodb.describe_table(TableName="eu-index")["Table"]
            primary = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
            want = primary.describe_table(TableName=table)["Table"]
            assert made["KeySchema"] == want["KeySchema"]
        # The region set up can take over: promote (nothing to compare), then a write there.
        # Both made versioned (replication needs it): promote() checks that.
        for bucket in ("fresh-primary", "fresh-replica"):
            assert s3.get_bucket_versioning(Bucket=bucket).get("Status") == "Enabled", bucket
        promotion = saver.promote()
        assert promotion.checked and promotion.rebuilt is None and promotion.incomplete == ()
        _graph(saver).invoke(FIRST, _config("there"))
        assert s3.list_objects_v2(Bucket="fresh-replica")["KeyCount"] > 0
    finally:
        saver.close()
        s3.close()
        dynamodb.close()


@pytest.mark.parametrize("kind", ("sync", "async"))
@pytest.mark.parametrize("mode", ("manifest", "dynamodb"))
def test_setup_replica_refuses_an_unversioned_bucket(endpoint: str, mode: str, kind: str) -> None:
    """A bucket the saver did not create is left as it is, and checked: without
    versioning, setup_replica() raises naming it (issue 34, item 2)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="plain-primary")  # made by someone else, never versioned
    replica = Replica("plain-replica", region_name="eu-west-1", endpoint_url=endpoint)
    table = "plain-index" if mode == "dynamodb" else None
    saver = S3Saver("plain-primary", table=table, region_name="us-east-1", endpoint_url=endpoint, replica=replica)
    try:
        saver.setup()
        with pytest.raises(ConfigurationError, match="versioning on s3://plain-primary "):
            if kind == "sync":
                saver.setup_replica()
            else:
                asyncio.run(saver.asetup_replica())
        assert s3.get_bucket_versioning(Bucket="plain-replica").get("Status") == "Enabled"
    finally:
        saver.close()
        s3.close()


# --- 7. apromote / averify give what promote / verify give ----------------------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
def test_async_promote_and_verify_equal_sync(regions, apis, mode: str) -> None:
    ours = _saver(regions, mode, recheck_after=3600)
    theirs = _saver(regions, mode, recheck_after=3600)  # the same regions, driven async
    api = apis("async", theirs)
    _, lagging = _lagging_writes(regions, mode, ours)

    report = ours.verify()
    assert _gaps(report.unreplicated) == lagging
    assert api.run(theirs.averify()) == report
    assert api.run(theirs.averify(["talk"])) == ours.verify(["talk"]) != report
    with pytest.raises(ReplicationLagError, match="replication lag"):
        api.run(theirs.apromote())
    assert theirs.bucket == regions.primary.bucket

    promotion = ours.promote(force=True)
    assert api.run(theirs.apromote(force=True)) == promotion
    assert theirs.bucket == ours.bucket == regions.replica.bucket
    after = ours.verify(["talk", "late"])
    assert _gaps(after.replica_only) == lagging
    assert api.run(theirs.averify(["talk", "late"])) == after
    assert api.run(theirs.averify()) == ours.verify()


@pytest.mark.parametrize("on_lag", ("older", "raise"))
def test_an_older_manifest_head_without_checkpoints_is_not_read_as_no_thread(regions, on_lag: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from regions import Replicator

    from s3_saver._format.keys import KeyLayout

    writer = _saver(regions, "manifest")
    checkpoint = empty_checkpoint()
    # Pending writes stored before their checkpoint (LangGraph's put_writes can run
    # beside the put): the head's first version names no checkpoint yet.
    writer.put_writes(_config("early", checkpoint["id"]), [("msgs", ["w"])], task_id="task-1")
    writer.put(_config("early"), checkpoint, {"source": "input", "step": -1, "parents": {}}, {})
    events = regions.replicator.capture()
    head_key = KeyLayout("").manifest_head_key("early")
    heads = [e for e in events if e.kind == "object" and e.key == head_key]
    assert len(heads) == 2
    regions.replicator.deliver()
    regions.proxy.refuse()
    reader = _saver(regions, "manifest", setup=False, recheck_after=3600, on_lag=on_lag)
    assert _cid(reader.get_tuple(_config("early"))) == checkpoint["id"]

    late = Replicator.between(regions.primary, regions.replica)
    late.pending = [heads[0]]  # the first version lands after the second
    late.deliver()
    try:
        found = reader.get_tuple(_config("early"))
    except ReplicationLagError:
        return
    assert found is not None or reader.last_read.newest_id == checkpoint["id"], (found, reader.last_read)
