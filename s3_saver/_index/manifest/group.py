"""Group commit: the commits one process makes to one head at the same time go
out as one swap (a thread's manifest head; the memory store's namespace heads and
registry, ``_index/manifest/memory``).

LangGraph sends a step's ``put_writes`` from every task of a super-step at once
(a fan-out of N branches: N calls), and a step's ``put`` beside them. Each is a
compare-and-swap of the thread's head on the ETag this process holds: alone,
they would all swap on the same ETag, one would win, and every other would read
the head back and swap again (412, GET, PUT: N² requests for N branches). Here
the first commit takes the lead, and the commits that come while its swap is
under way queue behind it; when it is done, the next one in the queue leads the
swap of all of them. A process then never conflicts with itself.

What keeps this safe: the swap of a batch is the same compare-and-swap as one
commit's (``ManifestIndex._update``): each commit's fence check runs on the head
it swaps, and its change is applied on top of the others'. A commit refused by
its check (``Fenced``, ``ParentGone``) is left out of the batch and answered
with its own refusal, decided on the head swapped or on one read now (never on
the cached head alone); the others go on. A lead cut short (its operation closed:
a crash, a cancelled task) hands its batch back to the queue and the next commit
leads. A commit that waited ``WAIT_FOR_LEAD`` seconds (or the index's own) without being taken, while
no lead of its head finished, swaps on its own: at worst the two conflict, as two
processes do. (A long queue moving one batch at a time is no slow lead: a burst of
hundreds of puts into one namespace waits its turns.)

``commit`` is the thread manifest's form (a change and a check per commit, one
compare-and-swap loop); ``join`` the general one: each commit brings a job, and the
lead runs one ``swap`` of the jobs of its batch, which answers each job on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from s3_saver._index.manifest.doc import Head
from s3_saver._transport.protocol import Op, Signal, Wait

WAIT_FOR_LEAD = 1.0  # seconds; a swap takes one round trip, its retries a few
BATCH_MAX = 64

_QUEUED, _TAKEN, _LEAD, _ALONE, _DONE, _GONE = "queued", "taken", "lead", "alone", "done", "gone"

Change = Callable[[Head], "Head | None"]
Check = Callable[[Head], Op[None]]
Update = Callable[[Change, Check], Op[Any]]


Swap = Callable[[list[Any]], Op[list[Any]]]
"""One swap for the jobs of a batch (in queue order): returns one answer per job, an
exception being that job's error, anything else its result."""


@dataclass(eq=False)
class _Commit:
    job: Any
    # Set once, when ``state`` becomes _LEAD or _DONE (the only states it waits for).
    signal: Signal = field(default_factory=Signal)
    state: str = _QUEUED
    error: BaseException | None = None
    result: Any = None


@dataclass(eq=False)
class _Thread:
    busy: bool = False  # a lead is swapping
    queue: list[_Commit] = field(default_factory=list)
    turns: int = 0  # leads finished: a queue that moves has no slow lead


class GroupCommit:
    """The queues of one index (one process), per head. Its lock guards the
    queues only; no request is ever made under it."""

    def __init__(self, lock: Any, wait: float = WAIT_FOR_LEAD) -> None:
        self._lock = lock
        self._wait = wait
        self._threads: dict[str, _Thread] = {}

    def commit(self, thread_id: str, change: Change, check: Check, update: Update) -> Op[None]:
        """Apply ``change`` to the head of ``thread_id`` (after ``check``), in one
        swap with whatever other commits of this process wait for that head.
        ``update(change, check)`` is the compare-and-swap loop."""
        yield from self.join(thread_id, (change, check), lambda jobs: _swap(update, jobs))

    def join(self, head: str, job: Any, swap: Swap) -> Op[Any]:
        """Run ``job`` in one ``swap`` of the head named ``head`` with whatever other
        jobs of this process wait for that head; returns its answer (raises it, an
        exception). A ``swap`` that raises fails the jobs of its batch, and only them."""
        me = _Commit(job)
        with self._lock:
            queue = self._threads.setdefault(head, _Thread())
            if queue.busy:
                queue.queue.append(me)
            else:
                queue.busy, me.state = True, _LEAD
        try:
            while me.state in (_QUEUED, _TAKEN):
                turns = queue.turns
                yield Wait(me.signal, self._wait)
                with self._lock:
                    # Not taken yet, and no lead finished meanwhile: the lead is slow
                    # (or gone without a word), go alone.
                    if me.state == _QUEUED and queue.turns == turns:
                        queue.queue.remove(me)
                        me.state = _ALONE
        except GeneratorExit:
            # Cut short while waiting: out of the queue, and a lead handed to
            # this commit goes on to the next (a commit already taken is the
            # lead's: it may still land, as a request sent may).
            with self._lock:
                if me.state == _QUEUED:
                    queue.queue.remove(me)
                elif me.state == _TAKEN:
                    # Never back in line: handed the lead, nobody would run it, and every
                    # later commit of this thread would wait WAIT_FOR_LEAD for it.
                    me.state = _GONE
                lead = me.state == _LEAD
            if lead:
                self._hand_on(head, queue, [])
            raise
        if me.state == _ALONE:
            yield from _run(swap, [me])
        elif me.state == _LEAD:
            yield from self._lead(head, queue, me, swap)
        if me.error is not None:
            raise me.error
        return me.result

    def _lead(self, head: str, queue: _Thread, me: _Commit, swap: Swap) -> Op[None]:
        with self._lock:
            taken = queue.queue[: BATCH_MAX - 1]
            del queue.queue[: len(taken)]
            for c in taken:
                c.state = _TAKEN
        try:
            yield from _run(swap, [me, *taken])
        finally:
            self._hand_on(head, queue, taken)

    def _hand_on(self, head: str, queue: _Thread, taken: list[_Commit]) -> None:
        """After a lead: answer the commits it took, and make the next in line
        lead (those it did not answer, cut short, go back first in line), or
        free the thread: nothing ever waits for a lead that is gone."""
        with self._lock:
            queue.turns += 1
            back = [c for c in taken if c.state not in (_DONE, _GONE)]
            for c in back:
                c.state = _QUEUED
            queue.queue[:0] = back
            wake = [c for c in taken if c.state == _DONE]
            if queue.queue:
                nxt = queue.queue.pop(0)
                nxt.state = _LEAD
                wake.append(nxt)
            else:
                queue.busy = False
                if self._threads.get(head) is queue:
                    del self._threads[head]
        for c in wake:
            c.signal.set()


class BatchRefused(Exception):
    """No swap for a batch with a refused commit: the others held already (or
    were refused too). Raised to ``ManifestIndex._update`` so that refusals
    decided on a cached head are decided again on a head read now; each
    commit's own answer is in the batch."""


def _run(swap: Swap, batch: list[_Commit]) -> Op[None]:
    """The swap of ``batch``: each commit's answer in its ``error`` or ``result``."""
    try:
        answers = yield from swap([c.job for c in batch])
    except Exception as exc:  # the swap itself failed: every commit in it did
        answers = [exc] * len(batch)
    for c, answer in zip(batch, answers, strict=True):
        if isinstance(answer, BaseException):
            c.error = answer
        else:
            c.result = answer
        c.state = _DONE


def _swap(update: Update, batch: list[tuple[Change, Check]]) -> Op[list[Any]]:
    """One compare-and-swap of a thread's head for every commit of ``batch``: each
    one's answer is its refusal, or None (committed, or held already)."""
    refused: dict[int, BaseException] = {}

    def check(head: Head) -> Op[None]:
        # Decided on each head anew: the answers are those of the head swapped
        # (a swap that lands proves it current) or, without a swap, of a head
        # read now (``BatchRefused``): never of a cached head alone.
        refused.clear()
        for i, (_, commit_check) in enumerate(batch):
            try:
                yield from commit_check(head)
            except Exception as exc:  # this commit's answer; the others go on
                refused[i] = exc

    def change(head: Head) -> Head | None:
        new, changed = head, False
        for i, (commit_change, _) in enumerate(batch):
            if i not in refused:
                out = commit_change(new)
                if out is not None:
                    new, changed = out, True
        if refused and not changed:
            raise BatchRefused()
        return new if changed else None

    try:
        yield from update(change, check)
    except BatchRefused:
        pass  # refused on a head read now: the answers are in ``refused``
    except Exception as exc:  # the swap itself failed: every commit in it did
        for i in range(len(batch)):
            refused.setdefault(i, exc)
    return [refused.get(i) for i in range(len(batch))]
