"""Group commit: a process's concurrent commits to one thread's manifest head go
out as one swap, so a process never conflicts with itself (issue 23).

Two halves: a fan-out graph on real servers (both index modes, sync and async:
every write call is its object and its share of an index write, no head read
back), and the hand-offs of ``GroupCommit`` driven step by step (a lead cut
short, a refused commit inside a batch, a wait that runs out)."""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from helpers import config
from s3_saver._index.manifest import group as group_module
from s3_saver._index.manifest.doc import Head
from s3_saver._index.manifest.group import GroupCommit
from s3_saver._transport.protocol import Signal, Wait, gather

BRANCHES = 8


class _State(TypedDict):
    out: Annotated[list, operator.add]


def _fan_out(saver):
    builder = StateGraph(_State)
    for i in range(BRANCHES):
        builder.add_node(f"n{i}", lambda s, i=i: {"out": [i]})
        builder.add_edge(START, f"n{i}")
        builder.add_edge(f"n{i}", END)
    return builder.compile(checkpointer=saver)


def _count_writes(saver) -> list[int]:
    calls = [0]
    for name in ("put", "put_writes", "aput", "aput_writes"):
        real = getattr(saver, name)

        def counted(*args, _real=real, **kwargs):
            calls[0] += 1
            return _real(*args, **kwargs)

        setattr(saver, name, counted)
    return calls


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fan_out_step_writes_without_conflicts(saver, index_mode, driver) -> None:
    """Eight branches' ``put_writes`` arrive together: in the manifest mode they
    share head swaps instead of racing on one ETag (before: 412, GET and PUT
    again, 58 requests per invoke sync and 76 async, now 19 and 17)."""
    graph, cfg = _fan_out(saver), config(f"fan-{driver}")
    graph.invoke({"out": []}, cfg)  # the thread exists and this process holds its head
    calls = _count_writes(saver)
    saver.stats.reset()
    if driver == "sync":
        for _ in range(3):
            result = graph.invoke({"out": []}, cfg)
    else:
        async def run():
            try:
                for _ in range(3):
                    out = await graph.ainvoke({"out": []}, cfg)
                return out
            finally:
                await saver.aclose()

        result = asyncio.run(run())
    assert sorted(result["out"]) == sorted(list(range(BRANCHES)) * 4)
    requests = dict(saver.stats.snapshot().requests)
    writes = calls[0]
    assert writes >= 3 * (BRANCHES + 2)
    # Each write call: its object, and at most one index write (shared in a group).
    assert requests.get(("s3", "put_object"), 0) <= 2 * writes, requests
    if index_mode == "manifest":
        # The head is read back only by each invoke's first get_tuple: no 412 was met.
        assert requests.get(("s3", "get_object"), 0) <= 3, requests
        assert requests[("s3", "put_object")] < 2 * writes, requests  # swaps were shared


# -- hand-offs, step by step -------------------------------------------------------------------
class _Swaps:
    """A head and the swaps made on it: each ``update`` checks, yields one round
    trip (a stand-in call the test answers), then applies the change."""

    def __init__(self) -> None:
        self.head = Head("t")
        self.swaps: list[list[str]] = []

    def update(self, change, check):
        yield from check(self.head)
        yield ("swap",)
        new = change(self.head)
        if new is not None:
            self.swaps.append([e for e in new.writes if e not in self.head.writes])
            self.head = new
        return self.head


def _commit(group: GroupCommit, swaps: _Swaps, name: str, refuse: bool = False):
    def change(head):
        return Head("t", writes=[*head.writes, name])

    def check(head):
        yield from ()
        if refuse:
            raise RuntimeError(f"{name} refused")

    return group.commit("t", change, check, swaps.update)


def _step(op, reply=None):
    """Advance ``op``: its next instruction, or ("done", error) when it ended."""
    try:
        return op.send(reply)
    except StopIteration:
        return ("done", None)
    except Exception as exc:
        return ("done", exc)


def test_commits_queued_behind_a_lead_share_the_next_swap() -> None:
    group, swaps = GroupCommit(threading.Lock()), _Swaps()
    a, b, c = (_commit(group, swaps, n) for n in "abc")
    assert _step(a) == ("swap",)  # a leads: its swap is under way
    wait_b, wait_c = _step(b), _step(c)
    assert isinstance(wait_b, Wait) and isinstance(wait_c, Wait)
    assert _step(a) == ("done", None)
    assert swaps.swaps == [["a"]]
    assert wait_b.signal.is_set() and not wait_c.signal.is_set()  # b leads now, c waits for it
    assert _step(b) == ("swap",)
    assert _step(b) == ("done", None)
    assert swaps.swaps == [["a"], ["b", "c"]]  # one swap for both
    assert wait_c.signal.is_set()
    assert _step(c) == ("done", None)


def test_a_refused_commit_is_answered_alone_and_the_batch_goes_on() -> None:
    group, swaps = GroupCommit(threading.Lock()), _Swaps()
    a = _commit(group, swaps, "a")
    b, c, d = _commit(group, swaps, "b"), _commit(group, swaps, "c", refuse=True), _commit(group, swaps, "d")
    _step(a)
    for op in (b, c, d):
        assert isinstance(_step(op), Wait)
    _step(a)
    assert _step(b) == ("swap",)
    assert _step(b) == ("done", None)
    assert swaps.swaps[-1] == ["b", "d"]
    done, error = _step(c)
    assert done == "done" and str(error) == "c refused"
    assert _step(d) == ("done", None)


def test_a_lead_cut_short_hands_its_batch_on() -> None:
    group, swaps = GroupCommit(threading.Lock()), _Swaps()
    a, b, c = (_commit(group, swaps, n) for n in "abc")
    _step(a)
    wait_b, wait_c = _step(b), _step(c)
    _step(a)  # b leads, with c in its batch
    assert wait_b.signal.is_set() and not wait_c.signal.is_set()
    assert _step(b) == ("swap",)
    b.close()  # the process running b dies mid-swap (its request may or may not land)
    assert wait_c.signal.is_set()  # c was handed back, first in line: it leads
    assert _step(c) == ("swap",)
    assert _step(c) == ("done", None)
    assert swaps.swaps == [["a"], ["c"]]
    # Nothing is left waiting: the next commit leads at once.
    d = _commit(group, swaps, "d")
    assert _step(d) == ("swap",)
    assert _step(d) == ("done", None)


def test_a_commit_cut_short_while_queued_or_handed_the_lead_blocks_nobody() -> None:
    group, swaps = GroupCommit(threading.Lock()), _Swaps()
    a, b, c, d = (_commit(group, swaps, n) for n in "abcd")
    _step(a)
    wait_b, wait_c, wait_d = _step(b), _step(c), _step(d)
    assert isinstance(wait_c, Wait)
    c.close()  # queued: leaves the queue
    _step(a)
    assert wait_b.signal.is_set()
    b.close()  # handed the lead, never ran it: d leads
    assert wait_d.signal.is_set()
    assert _step(d) == ("swap",)
    assert _step(d) == ("done", None)
    assert swaps.swaps == [["a"], ["d"]]


def test_a_commit_whose_lead_is_slow_swaps_on_its_own() -> None:
    group, swaps = GroupCommit(threading.Lock()), _Swaps()
    a, b = _commit(group, swaps, "a"), _commit(group, swaps, "b")
    _step(a)
    assert isinstance(_step(b), Wait)
    # The wait ran out (the driver answers a Wait with None either way): b goes alone.
    assert _step(b) == ("swap",)
    assert _step(b) == ("done", None)
    assert _step(a) == ("done", None)
    assert sorted(sum(swaps.swaps, [])) == ["a", "b"]


# -- the general form: a job per commit, one swap per batch, each answered alone ----------------
def _jobs(group: GroupCommit, swaps: list[list[str]], name: str, fail: set[str] | None = None):
    """A commit whose job is ``name``; the swap answers each job with its name upper-cased,
    and raises when its batch holds a job of ``fail``."""

    def swap(jobs):
        yield ("swap", *jobs)
        swaps.append(list(jobs))
        if fail and fail & set(jobs):
            raise RuntimeError(f"swap of {jobs} failed")
        return [j.upper() for j in jobs]

    return group.join("h", name, swap)


def test_each_job_gets_its_own_answer_and_a_failed_swap_fails_only_its_batch() -> None:
    group, swaps = GroupCommit(threading.Lock()), []
    a = _jobs(group, swaps, "a", fail={"a"})
    assert _step(a)[0] == "swap"  # a leads alone
    b, c = _jobs(group, swaps, "b"), _jobs(group, swaps, "c")
    assert isinstance(_step(b), Wait) and isinstance(_step(c), Wait)
    done, error = _step(a)
    assert done == "done" and str(error) == "swap of ['a'] failed"  # a's swap failed: a's answer
    assert _step(b) == ("swap", "b", "c")  # the next batch goes on, its own swap
    assert _result(b) == "B"
    assert _result(c) == "C"
    assert swaps == [["a"], ["b", "c"]]


def _result(op):
    try:
        op.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("not done")


def test_a_commit_queued_behind_a_moving_queue_waits_its_turn(monkeypatch) -> None:
    """A wait that runs out while leads keep finishing is no slow lead: the commit stays in
    line (before, it swapped alone and met the lead's swap). Two per swap here."""
    monkeypatch.setattr(group_module, "BATCH_MAX", 2)
    group, swaps = GroupCommit(threading.Lock()), []
    a, b, c, d = (_jobs(group, swaps, n) for n in "abcd")
    assert _step(a)[0] == "swap"
    wait_d = [_step(op) for op in (b, c, d)][-1]
    assert _result(a) == "A"  # b leads, c goes with it; d stays in line
    assert _step(b) == ("swap", "b", "c")
    assert not wait_d.signal.is_set()
    assert isinstance(_step(d), Wait)  # its wait ran out, but a lead finished meanwhile: it waits on
    assert _result(b) == "B" and wait_d.signal.is_set()  # d leads now
    assert _step(d) == ("swap", "d")
    assert _result(d) == "D" and _result(c) == "C"
    assert swaps == [["a"], ["b", "c"], ["d"]]


# -- gather: a waiting operation never holds back the others ----------------------------------
def test_gather_goes_on_with_the_others_while_one_waits() -> None:
    """One operation waits (a commit queued behind a lead); the other's calls go out wave
    after wave, answered, without waiting for it; once only waiting ones are left, the
    gather waits for the first of their signals."""
    signal = Signal()

    def waiting():
        yield Wait(signal, 10.0)
        return "waited"

    def working():
        first = yield ("call-1",)
        second = yield ("call-2",)
        return first + second

    op = gather(waiting(), working())
    assert op.send(None) == ("call-1",)  # the wait does not come first
    assert op.send([1]) == ("call-2",)
    last = op.send([2])
    assert isinstance(last, Wait) and not last.signal.is_set()
    signal.set()
    assert last.signal.is_set()  # the gather's wait ends with the operation's
    with pytest.raises(StopIteration) as done:
        op.send(None)
    assert done.value.value == ["waited", [1, 2]]


def test_a_gather_closed_early_closes_its_operations() -> None:
    """Closed (a cut, a cancelled task), a gather closes its operations at once, not when
    they are collected: a group commit's lead among them hands on now (held elsewhere, as
    a reference cycle would hold it, it would keep every commit of its head waiting)."""
    closed = []

    def one(name):
        try:
            yield (name,)
        finally:
            closed.append(name)

    held = [one("a"), one("b")]
    op = gather(*held)
    assert op.send(None) == ("a", "b")
    op.close()
    assert sorted(closed) == ["a", "b"]
