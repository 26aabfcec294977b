"""The sans-I/O contract between operations and drivers.

An operation is a generator. It yields one of:

* a tuple of `Call` -- one round trip: the driver sends the calls
  together and sends back a list with, per call, the response dict or the
  exception the call raised (not raised: the operation decides);
* `Emit` -- a result for the caller of an iterating method (``list``);
* `Sleep` -- wait before the next step (table creation polling);
* `Wait` -- wait until another operation of this process sets a
  `Signal` (or a time passes): a commit waiting for the head swap that
  carries it (the manifest index's group commit).

Its return value is the method's result. Operations never import boto.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from s3_saver._transport.failures import translate
from s3_saver.errors import Where

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One AWS API call: ``service`` is ``"s3"``, ``"dynamodb"`` or ``"kms"``, ``operation`` the
    boto3 method name (``put_object``), ``params`` its keyword arguments; ``where``
    (bucket, table, region, endpoint) is named in the errors of the call."""

    service: str
    operation: str
    params: dict[str, Any]
    where: Where | None = field(default=None, compare=False, repr=False)
    # What the call is about, in the user's words, where its key is a hash (the memory
    # store's namespace and key): named in its errors before the key.
    subject: str | None = field(default=None, compare=False, repr=False)
    # False: sending it again after a failure that may have been applied (a lost answer)
    # is not the same as sending it once (a write whose answer names what it replaced, or
    # that names an object another writer may release meanwhile). ``resilient`` then
    # sends it again only after a failure that proves it was not applied (throttling, a
    # connect timeout) and hands any other back to the operation, which judges whether it
    # landed. Every call of the saver is True.
    idempotent: bool = field(default=True, compare=False, repr=False)

    def describe(self) -> str:
        """The operation and the key it touches, e.g. ``s3.get_object(live/t/...)``
        (with a ``subject``: ``s3.get_object(namespace ('a',), key 'k': memory/n/...)``)."""
        name = f"{self.service}.{self.operation}"
        named = [part for part in (self.subject, self._target()) if part]
        return f"{name}({': '.join(named)})" if named else name

    def _target(self) -> str | None:
        params = self.params
        if self.service == "kms":
            # The key-encryption key (a Decrypt names it too: the record's own).
            return params.get("KeyId") or params.get("DestinationKeyId")
        if self.service == "dynamodb":
            # The partition key names the thread (index keys are "pk"/"sk").
            item = params.get("Key") or params.get("Item") or {}
            pk = item.get("pk") or params.get("ExpressionAttributeValues", {}).get(":pk") or {}
            target = f"pk={pk['S']}" if "S" in pk else None
        else:
            target = params.get("Key")
            if "CopySource" in params:
                target = f"{params['CopySource']['Key']} -> {target}"
        return target


def about(call: Call, subject: str) -> Call:
    """``call`` with a subject named in its errors (see ``Call.subject``)."""
    return replace(call, subject=subject)


PRIMARY = "primary"


def site_of(call: Call) -> str:
    """The region (as configured: "primary" or "replica") whose clients send ``call``."""
    return call.where.site if call.where is not None else PRIMARY


def client_key(service: str, site: str) -> str:
    return service if site == PRIMARY else f"{site}:{service}"


@dataclass(frozen=True, slots=True)
class Emit:
    value: Any


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Backoff(Sleep):
    """A pause before an operation's own attempt again (a transaction that conflicted,
    items left unprocessed, a head swapped meanwhile). The retry layer answers False,
    without sleeping, when the pause would end past the budget of that loop (counted
    from its first Backoff, ``attempt`` 1) or past ``deadline()``: the operation then
    gives up at once, as a retried request would. None (a driver or runner without that
    layer) and True mean: go on."""

    attempt: int = 1


class Signal:
    """Set once, by one operation; awaited by others, in threads (the sync
    driver) or on event loops (the async one), whichever the waiter runs on."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._wakers: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._lock:
            self._event.set()
            wakers, self._wakers = self._wakers, []
        for wake in wakers:
            try:
                wake()
            except RuntimeError:
                pass  # its event loop closed: nobody waits there any more

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> None:
        self._event.wait(timeout)

    def subscribe(self, wake: Callable[[], None]) -> bool:
        """Call ``wake`` (from any thread) when set; False, and no call: set already."""
        with self._lock:
            if self._event.is_set():
                return False
            self._wakers.append(wake)
            return True


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait until ``signal`` is set, or ``timeout`` seconds passed; the reply is None."""

    signal: Signal
    timeout: float


class Resend(tuple):
    """A round trip of calls sent again after a transient failure (``retry.resilient``).

    A tuple like any other wave to the drivers; ``RequestStats`` counts it apart as well,
    so that the requests an operation asks for can be told from the network's toll."""

    __slots__ = ()


Instruction = tuple[Call, ...] | Emit | Sleep | Wait
Op = Generator[Instruction, Any, T]


@dataclass
class RequestStats:
    """Counts of what the saver sent, kept by its drivers.

    Attributes:
        round_trips: Waves of requests sent together (one wave waits for all its requests).
        requests: Requests per ``(service, operation)``, e.g. ``("s3", "put_object")``.
        resent_round_trips: Of ``round_trips``, the waves that sent again calls which had
            failed transiently (a timeout, a 5xx, throttling).
        resent: Of ``requests``, those sent again, per ``(service, operation)``.
    """

    round_trips: int = 0
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    resent_round_trips: int = 0
    resent: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Sync callers may share one saver across threads.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # The counts of the calls sent to one region only (see ``S3Saver.replica_stats``).
    _sites: dict[str, RequestStats] = field(default_factory=dict, repr=False, compare=False)

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def record(self, calls: tuple[Call, ...]) -> None:
        with self._lock:
            self.round_trips += 1
            self.requests.update((c.service, c.operation) for c in calls)
            if isinstance(calls, Resend):
                self.resent_round_trips += 1
                self.resent.update((c.service, c.operation) for c in calls)
        for site in {site_of(c) for c in calls}:
            if site in self._sites:
                kept = tuple(c for c in calls if site_of(c) == site)
                self._sites[site].record(Resend(kept) if isinstance(calls, Resend) else kept)

    def site(self, site: str) -> RequestStats:
        """The counts of the calls sent to one region (kept from now on)."""
        with self._lock:
            return self._sites.setdefault(site, RequestStats())

    def reset(self) -> None:
        with self._lock:
            self.round_trips = self.resent_round_trips = 0
            self.requests.clear()
            self.resent.clear()
            sites = list(self._sites.values())
        for stats in sites:
            stats.reset()

    def snapshot(self) -> RequestStats:
        with self._lock:
            return RequestStats(self.round_trips, Counter(self.requests), self.resent_round_trips, Counter(self.resent))

    def first_sends(self) -> RequestStats:
        """These counts without the resends: what the operations asked for, whatever the
        network did (what request-count tests compare)."""
        with self._lock:
            return RequestStats(self.round_trips - self.resent_round_trips, self.requests - self.resent)


def request(*calls: Call) -> Generator[Instruction, Any, list[Any]]:
    """Send calls as one round trip; raise the first failure (translated)."""
    results = yield tuple(calls)
    for call, result in zip(calls, results):
        if isinstance(result, BaseException):
            raise_failure(call, result)
    return results


def request_one(call: Call) -> Generator[Instruction, Any, Any]:
    results = yield from request(call)
    return results[0]


def backoff(attempt: int) -> float:
    """Seconds to wait before re-sending what a batch call left unprocessed."""
    return min(0.05 * 2 ** (attempt - 1), 2.0)


def failure(call: Call, result: BaseException) -> BaseException:
    """The exception to raise for a failed call (translated when it has a meaning)."""
    return translate(
        result, what=call.describe(), service=call.service, operation=call.operation, where=call.where
    )


def raise_failure(call: Call, result: BaseException) -> None:
    raise failure(call, result)


def drain(op: Op[T]) -> Op[tuple[list[Any], T]]:
    """Run an operation that emits inside another: its emitted values, and its result."""
    values: list[Any] = []
    reply: Any = None
    while True:
        try:
            step = op.send(reply)
        except StopIteration as stop:
            return values, stop.value
        if isinstance(step, Emit):
            values.append(step.value)
            reply = None
        else:
            reply = yield step


def gather(*ops: Op[Any]) -> Op[list[Any]]:
    """Run operations side by side: their calls of each step go out as one round trip.

    This is how an index lookup and the S3 GETs that do not depend on it share a
    wave. A ``Sleep`` of one operation pauses all of them (only throttled retries
    sleep). A ``Wait`` parks its operation while the others go on (their answers
    delivered, their next waves sent); once every operation left waits, the gather
    waits for the first of their signals, or the earliest end of their waits.
    Operations that emit are not supported here. Closed early, it closes them (their
    ``finally`` blocks hand on what others wait for: a group commit's lead).
    """
    results: list[Any] = [None] * len(ops)
    replies: dict[int, Any] = dict.fromkeys(range(len(ops)))
    active = list(range(len(ops)))
    # Invariant: an operation that waits never holds back the others' answers. One
    # waiting for a head swap another operation of this gather leads (a batch of two
    # namespaces), or one of a gather elsewhere whose lead waits on this one, would
    # otherwise wait out its whole time (group commit, ``_index/manifest/group``).
    parked: dict[int, tuple[Wait, float]] = {}  # the Wait, and when it runs out
    skew = 0.0  # what waits that ran out took beyond the clock (a driver that does not sleep)

    def now() -> float:
        return time.monotonic() + skew

    try:
        while active:
            moment = now()
            for i, (wait, until) in list(parked.items()):
                if wait.signal.is_set() or moment >= until:
                    del parked[i]
                    replies[i] = None
            if len(parked) == len(active):
                first = Signal()
                for wait, _ in parked.values():
                    if not wait.signal.subscribe(first.set):
                        first.set()
                timeout = max(0.0, min(until for _, until in parked.values()) - moment)
                yield Wait(first, timeout)
                if not first.is_set():  # it ran out: ``timeout`` passed, however long the driver slept
                    skew += max(0.0, moment + timeout - now())
                continue
            wave: list[Call] = []
            spans: list[tuple[int, int, int]] = []
            sleep = 0.0
            attempt = 0  # > 0: a Backoff among the steps
            for i in list(active):
                if i in parked:
                    continue
                try:
                    step = ops[i].send(replies[i])
                except StopIteration as stop:
                    results[i] = stop.value
                    active.remove(i)
                    continue
                if isinstance(step, Sleep):
                    sleep = max(sleep, step.seconds)
                    if isinstance(step, Backoff):
                        attempt = max(attempt, step.attempt)  # the loop that began first
                    spans.append((i, -2 if isinstance(step, Backoff) else -1, 0))
                elif isinstance(step, Wait):
                    parked[i] = (step, now() + step.timeout)
                elif isinstance(step, Emit):
                    raise TypeError("gather() runs operations that do not emit")
                else:
                    spans.append((i, len(wave), len(step)))
                    wave.extend(step)
            # One pause for the wave; a Backoff among them asks the retry layer for all of them.
            allowed = (yield Backoff(sleep, attempt)) if attempt else (yield Sleep(sleep)) if sleep else None
            answers: list[Any] = (yield tuple(wave)) if wave else []
            for i, start, size in spans:
                replies[i] = allowed if start == -2 else None if start < 0 else answers[start : start + size]
    finally:
        for op in ops:
            op.close()  # a finished one: nothing; one cut short with this gather: its ``finally`` now
    return results
