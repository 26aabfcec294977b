"""Concurrent writers on one thread: nothing lost, nothing duplicated, every index mode.

Each test runs on three stores: the DynamoDB index and the manifest index on moto,
and the manifest index on SeaweedFS (a real server, its own bucket per test). Writers
are threads sharing one saver (shared caches), threads with a saver each (what
separate processes or Lambdas look like: no shared caches), and asyncio tasks on one
saver. What is checked is what a reader sees afterwards, also from a fresh saver with
empty caches; where the outcome does not depend on the order in which the writers
won, it is compared with InMemorySaver given the same calls.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from conftest import INDEX_MODES, make_saver, seaweedfs_saver
from helpers import checkpoint, config
from s3_saver import S3Saver
from s3_saver._index.manifest.backend import ManifestIndex

WORKERS = 8
INTERRUPT, RESUME, ERROR = "__interrupt__", "__resume__", "__error__"
assert {INTERRUPT, RESUME, ERROR} <= set(WRITES_IDX_MAP)

BACKENDS = [*INDEX_MODES, "seaweedfs"]  # seaweedfs: the manifest index on a real S3 server


@pytest.fixture(params=BACKENDS)
def new_saver(request) -> Iterator[Callable[[], S3Saver]]:
    """A factory of savers on one ready store, each with its own clients and caches."""
    made: list[S3Saver] = []
    if request.param == "seaweedfs":
        ep, bucket = request.getfixturevalue("seaweedfs_bucket")

        def build() -> S3Saver:
            return seaweedfs_saver(ep, bucket)
    else:
        ep, mode = request.getfixturevalue("endpoint"), request.param

        def build() -> S3Saver:
            return make_saver(ep, mode)

    def factory() -> S3Saver:
        s = build()
        made.append(s)
        return s

    factory().setup()
    yield factory
    for s in made:
        s.close()


def run_threads(fn: Callable[[int], Any], n: int = WORKERS) -> list[Any]:
    """``fn(0..n-1)`` on n threads released together; re-raises the first failure."""
    barrier = threading.Barrier(n)

    def go(w: int) -> Any:
        barrier.wait()
        return fn(w)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


def next_checkpoint(saver: Any, parent: dict, step: int, version: str | None) -> tuple[dict, str]:
    v = saver.get_next_version(version, None)
    cp = checkpoint({"step": step}, {"step": v})
    return saver.put(parent, cp, {"source": "loop", "step": step}, {"step": v}), v


# -- put_writes from many writers ---------------------------------------------------------
def worker_calls(w: int, k: int) -> list[tuple[str, list, str]]:
    """The put_writes calls of worker ``w`` in round ``k``, in order.

    Task ids "task-w"/"mixed-w" belong to worker w alone, so their outcome does not
    depend on which writer wins: regular writes retried with other values (first
    wins), a special channel written twice by this worker (last wins), a call mixing
    regular and special writes. Tasks "race" and "shared" are contested: every worker
    writes the same regular slots and the same special slot, and exactly one writer
    must win each (a regular part whole: both of its writes from the same worker).
    """
    return [
        (f"task-{w}", [("items", f"r{k}-w{w}-a"), ("other", f"r{k}-w{w}-b"), (INTERRUPT, f"r{k}-int-w{w}-first")], ""),
        ("race", [("items", f"r{k}-race-w{w}-0"), ("items", f"r{k}-race-w{w}-1")], ""),
        ("shared", [(INTERRUPT, f"r{k}-shared-w{w}")], ""),
        # The task again: its regular writes are ignored, its interrupt replaces the first.
        (f"task-{w}", [("items", "retried-a"), ("other", "retried-b"), (INTERRUPT, f"r{k}-int-w{w}-last")], ""),
        (f"mixed-{w}", [("items", f"r{k}-mixed-w{w}"), (ERROR, f"r{k}-err-w{w}"), (RESUME, f"r{k}-res-w{w}")], "p"),
    ]


CONTESTED = ("race", "shared")
ROUNDS = 2


def check_round(got: list[tuple[str, str, Any]], expected: list[tuple[str, str, Any]], k: int) -> None:
    own = [w for w in got if w[0] not in CONTESTED]
    assert Counter(own) == Counter(expected), "own writes lost or duplicated"
    race = [w for w in got if w[0] == "race"]
    assert len(race) == 2, race
    winner = race[0][2].split("-")[2]  # r{k}-race-w{w}-i
    assert race == [("race", "items", f"r{k}-race-{winner}-0"), ("race", "items", f"r{k}-race-{winner}-1")]
    shared = [w for w in got if w[0] == "shared"]
    assert len(shared) == 1 and shared[0][1] == INTERRUPT, shared
    assert shared[0][2] in {f"r{k}-shared-w{w}" for w in range(WORKERS)}


def expected_rounds(ids: list[str]) -> list[list[tuple[str, str, Any]]]:
    """InMemorySaver given the order-independent calls of every round."""
    memory = InMemorySaver()
    cfg, out = config("t"), []
    for k, cid in enumerate(ids):
        cfg = memory.put(cfg, checkpoint({"step": k}, {"step": str(k)}, cid), {"step": k}, {"step": str(k)})
        for w in range(WORKERS):
            for task_id, writes, path in worker_calls(w, k):
                if task_id not in CONTESTED:
                    memory.put_writes(cfg, writes, task_id, path)
        out.append(list(memory.get_tuple(cfg).pending_writes))
    return out


def verify_writes(reader: S3Saver, ids: list[str]) -> None:
    expected = expected_rounds(ids)
    for k, cid in enumerate(ids):
        tup = reader.get_tuple(config("t", checkpoint_id=cid))
        assert tup is not None and tup.checkpoint["channel_values"] == {"step": k}
        check_round(list(tup.pending_writes), expected[k], k)
    latest = reader.get_tuple(config("t"))
    assert latest.config["configurable"]["checkpoint_id"] == ids[-1]


def write_rounds(savers: list[S3Saver]) -> list[str]:
    """ROUNDS rounds: all workers write to checkpoint k while worker 0 also puts k+1."""
    first = savers[0].put(config("t"), checkpoint({"step": 0}, {"step": "1"}), {"step": 0}, {"step": "1"})
    ids = [first["configurable"]["checkpoint_id"]]
    box = {"cfg": first, "version": "1"}

    for k in range(ROUNDS):
        target = box["cfg"]

        def work(w: int) -> None:
            s = savers[w]
            for i, (task_id, writes, path) in enumerate(worker_calls(w, k)):
                s.put_writes(target, writes, task_id, path)
                if w == 0 and i == 2 and k < ROUNDS - 1:  # the next checkpoint, mid-stream
                    box["cfg"], box["version"] = next_checkpoint(s, target, k + 1, box["version"])

        run_threads(work)
        if k < ROUNDS - 1:
            ids.append(box["cfg"]["configurable"]["checkpoint_id"])
    return ids


@pytest.mark.parametrize("sharing", ["one-saver", "saver-each"])
def test_put_writes_from_threads(new_saver: Callable[[], S3Saver], sharing: str) -> None:
    if sharing == "one-saver":
        savers = [new_saver()] * WORKERS
    else:
        savers = [new_saver() for _ in range(WORKERS)]
    ids = write_rounds(savers)
    assert len(ids) == ROUNDS
    verify_writes(savers[0], ids)
    verify_writes(new_saver(), ids)  # no caches


def test_aput_writes_from_tasks(new_saver: Callable[[], S3Saver]) -> None:
    saver = new_saver()

    async def main() -> list[str]:
        try:
            cfg = await saver.aput(config("t"), checkpoint({"step": 0}, {"step": "1"}), {"step": 0}, {"step": "1"})
            ids, version = [cfg["configurable"]["checkpoint_id"]], "1"
            for k in range(ROUNDS):
                target = cfg

                async def work(w: int) -> dict | None:
                    made = None
                    for i, (task_id, writes, path) in enumerate(worker_calls(w, k)):
                        await saver.aput_writes(target, writes, task_id, path)
                        if w == 0 and i == 2 and k < ROUNDS - 1:
                            v = saver.get_next_version(version, None)
                            cp = checkpoint({"step": k + 1}, {"step": v})
                            made = (await saver.aput(target, cp, {"source": "loop", "step": k + 1}, {"step": v}), v)
                    return made

                results = await asyncio.gather(*(work(w) for w in range(WORKERS)))
                if k < ROUNDS - 1:
                    cfg, version = results[0]
                    ids.append(cfg["configurable"]["checkpoint_id"])
            return ids
        finally:
            await saver.aclose()

    ids = asyncio.run(main())
    verify_writes(saver, ids)
    verify_writes(new_saver(), ids)


# -- forks: many children of one parent at once -------------------------------------------
@pytest.mark.parametrize("sharing", ["one-saver", "saver-each"])
def test_concurrent_forks_of_one_parent(new_saver: Callable[[], S3Saver], sharing: str) -> None:
    savers = [new_saver()] * WORKERS if sharing == "one-saver" else [new_saver() for _ in range(WORKERS)]
    parent = savers[0].put(config("t"), checkpoint({"x": "root", "y": "kept"}, {"x": "1", "y": "1"}), {"step": -1},
                           {"x": "1", "y": "1"})
    # Every writer saw the parent (a run resumed from it), as LangGraph would have.
    for s in savers[1:]:
        assert s.get_tuple(parent) is not None

    def fork(w: int) -> str:
        s = savers[w]
        v = s.get_next_version("1", None)
        cp = checkpoint({"x": f"child-{w}", "y": "kept"}, {"x": v, "y": "1"})
        return s.put(parent, cp, {"source": "fork", "step": w}, {"x": v})["configurable"]["checkpoint_id"]

    children = run_threads(fork)
    assert len(set(children)) == WORKERS
    parent_id = parent["configurable"]["checkpoint_id"]
    for reader in (savers[-1], new_saver()):
        listed = [t.config["configurable"]["checkpoint_id"] for t in reader.list(config("t"))]
        assert listed == sorted(children, reverse=True) + [parent_id]
        for w, cid in enumerate(children):
            tup = reader.get_tuple(config("t", checkpoint_id=cid))
            assert tup.checkpoint["channel_values"] == {"x": f"child-{w}", "y": "kept"}
            assert tup.parent_config["configurable"]["checkpoint_id"] == parent_id
            assert tup.metadata["step"] == w and tup.metadata["source"] == "fork"
        latest = reader.get_tuple(config("t"))
        assert latest.config["configurable"]["checkpoint_id"] == max(children)


# -- many puts on one thread: the manifest seals segments while writers race ---------------
CHAINS, CHAIN_LENGTH = 4, 20


def test_many_puts_while_segments_seal(new_saver: Callable[[], S3Saver]) -> None:
    """4 chains of 20 checkpoints in 4 namespaces of one thread, written at once (80
    entries in one manifest: seals planned from heads that other writers changed).
    A saver per writer: each plans its seals from the head it saw last, which the
    other writers have changed since (a shared saver would see every change)."""
    savers = [new_saver() for _ in range(CHAINS)]

    def chain(w: int) -> list[str]:
        s, ns = savers[w], f"n{w}"
        cfg, version, ids = config("t", ns), None, []
        for step in range(CHAIN_LENGTH):
            version = s.get_next_version(version, None)
            versions = {"step": version, "doc": "1"}
            cp = checkpoint({"step": step, "doc": f"doc-{w}"}, versions)
            cfg = s.put(cfg, cp, {"source": "loop", "step": step, "chain": w}, versions if step == 0 else {"step": version})
            ids.append(cfg["configurable"]["checkpoint_id"])
            if step % 10 == 3:  # regular and special writes, sealed along with their checkpoint
                s.put_writes(cfg, [("items", f"w{w}-s{step}")], f"task-{step}")
                s.put_writes(cfg, [(INTERRUPT, f"int-w{w}-s{step}")], f"task-{step}")
        return ids

    chains = run_threads(chain, CHAINS)
    reader = new_saver()  # no caches
    index = reader._base_ctx.index
    if isinstance(index, ManifestIndex):  # the race this test is about did happen
        head = reader._sync.run(index._read_head("t"))
        assert head.segments and len(head.entries) < CHAINS * CHAIN_LENGTH
    everything = [t.config["configurable"] for t in reader.list({"configurable": {"thread_id": "t"}})]
    assert len(everything) == CHAINS * CHAIN_LENGTH
    assert Counter((c["checkpoint_ns"], c["checkpoint_id"]) for c in everything) == Counter(
        (f"n{w}", cid) for w, ids in enumerate(chains) for cid in ids
    )
    for w, ids in enumerate(chains):
        ns = f"n{w}"
        listed = [t.config["configurable"]["checkpoint_id"] for t in reader.list(config("t", ns))]
        assert listed == ids[::-1]
        assert reader.get_tuple(config("t", ns)).config["configurable"]["checkpoint_id"] == ids[-1]
        for step, cid in enumerate(ids):
            tup = reader.get_tuple(config("t", ns, cid))
            assert tup is not None, (ns, step)
            assert tup.checkpoint["channel_values"] == {"step": step, "doc": f"doc-{w}"}
            assert tup.metadata["chain"] == w and tup.metadata["step"] == step
            parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
            assert parent == (ids[step - 1] if step else None)
            expected = (
                [(f"task-{step}", "items", f"w{w}-s{step}"), (f"task-{step}", INTERRUPT, f"int-w{w}-s{step}")]
                if step % 10 == 3
                else []
            )
            assert sorted(tup.pending_writes) == sorted(expected), (ns, step)


@pytest.mark.parametrize("store", ["manifest", "seaweedfs"])
def test_special_write_replaced_before_a_seal_stays_replaced(request, store: str) -> None:
    """Process A fills a thread to just past SEAL_AT; process B replaces an __interrupt__
    write of its first checkpoint (last write wins); A's next put seals that checkpoint
    from A's cached head. The replaced value must stay replaced: that plan is dropped
    (its segment would hold the old write), and the next put seals from a fresh head."""
    if store == "seaweedfs":
        ep, bucket = request.getfixturevalue("seaweedfs_bucket")
        a, b, reader, cold = (seaweedfs_saver(ep, bucket) for _ in range(4))
    else:
        ep = request.getfixturevalue("endpoint")
        a, b, reader, cold = (make_saver(ep, "manifest") for _ in range(4))
    try:
        a.setup()
        cfg, version, first = config("t"), None, None
        for step in range(49):  # SEAL_AT is 48: A's next put seals
            cfg, version = next_checkpoint(a, cfg, step, version)
            if step == 0:
                first = cfg
                a.put_writes(first, [(INTERRUPT, "old")], "task")
        b.put_writes(first, [(INTERRUPT, "new")], "task")
        assert reader.get_tuple(first).pending_writes == [("task", INTERRUPT, "new")]
        cfg, version = next_checkpoint(a, cfg, 49, version)
        next_checkpoint(a, cfg, 50, version)
        assert cold._sync.run(cold._base_ctx.index._read_head("t")).segments  # A did seal
        assert b.get_tuple(first).pending_writes == [("task", INTERRUPT, "new")]
        assert cold.get_tuple(first).pending_writes == [("task", INTERRUPT, "new")]  # no caches
    finally:
        for s in (a, b, reader, cold):
            s.close()


# -- LangGraph's own parallel branches ------------------------------------------------------
class Fan(TypedDict):
    items: Annotated[list[str], operator.add]
    rounds: int


def branch(i: int) -> Callable[[Fan], dict]:
    def node(state: Fan) -> dict:
        return {"items": [f"b{i}-r{state.get('rounds', 0)}"]}

    return node


def fan_builder() -> StateGraph:
    """start -> 8 parallel branches -> join, twice per invoke."""
    names = [f"b{i}" for i in range(WORKERS)]
    g = StateGraph(Fan).add_node("start", lambda s: {"items": [f"start{s.get('rounds', 0)}"]})
    for i, name in enumerate(names):
        g = g.add_node(name, branch(i))
        g = g.add_edge("start", name)
    g = g.add_node("join", lambda s: {"items": [f"join{s.get('rounds', 0)}"], "rounds": s.get("rounds", 0) + 1})
    g = g.add_edge(names, "join")
    g = g.add_edge(START, "start")
    return g.add_conditional_edges("join", lambda s: END if s["rounds"] % 2 == 0 else "start")


def fan_transcript(checkpointer: Any, aio: bool) -> list[Any]:
    graph = fan_builder().compile(checkpointer=checkpointer)
    cfg = {"configurable": {"thread_id": "fan"}}

    def snap(s: Any) -> Any:
        return (s.values, s.next, s.metadata.get("step"), s.metadata.get("source"), len(s.tasks))

    async def arun() -> list[Any]:
        out = []
        try:
            for inp in ({"items": ["in1"], "rounds": 0}, {"items": ["in2"]}):
                out.append(await graph.ainvoke(inp, cfg, durability="sync"))
            out.append(snap(await graph.aget_state(cfg)))
            out.append([snap(s) async for s in graph.aget_state_history(cfg)])
        finally:
            if isinstance(checkpointer, S3Saver):
                await checkpointer.aclose()
        return out

    if aio:
        return asyncio.run(arun())
    out = [graph.invoke(inp, cfg, durability="sync") for inp in ({"items": ["in1"], "rounds": 0}, {"items": ["in2"]})]
    out.append(snap(graph.get_state(cfg)))
    out.append([snap(s) for s in graph.get_state_history(cfg)])
    return out


@pytest.mark.parametrize("aio", [False, True], ids=["invoke", "ainvoke"])
def test_parallel_branches_match_in_memory(new_saver: Callable[[], S3Saver], aio: bool) -> None:
    got = fan_transcript(new_saver(), aio)
    expected = fan_transcript(InMemorySaver(), aio)
    assert got == expected
    final = got[1]
    assert final["rounds"] == 4 and sum(x.startswith("b") for x in final["items"]) == 4 * WORKERS
    # The same history, read by a saver with no caches.
    reader = new_saver()
    graph = fan_builder().compile(checkpointer=reader)
    history = list(graph.get_state_history({"configurable": {"thread_id": "fan"}}))
    assert [(s.values, s.next, s.metadata.get("step")) for s in history] == [(v, n, st) for v, n, st, *_ in got[-1]]
