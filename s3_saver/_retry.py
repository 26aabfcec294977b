"""The one transient-failure policy, applied in the operation core for both drivers.

Every call the saver sends is safe to send again: reads, immutable object
writes (``IfNoneMatch``: a retry that meets its own object compares bytes),
the manifest head's compare-and-swap (a retry that meets its own swap finds it
on the re-read), index items written whole or conditionally with a token that
recognises the writer's own commit, batch writes and deletes of fixed keys.
So the saver retries them itself, the same way under boto3 and aioboto3:
connection failures, timeouts, 5xx answers and throttling are sent again after
a jittered, capped, exponential backoff, for a bounded number of attempts and
within a time budget that a Lambda handler can tie to its remaining time
(:func:`deadline`). What still fails reaches the operation, which raises a
``StoreUnavailableError`` naming the call, the bucket or table and the key.
botocore's own retries are off in the clients the saver makes (one attempt):
retrying twice, at two levels, would multiply the attempts and drain
botocore's retry quota with the saver's own idempotent retries.
"""

from __future__ import annotations

import contextvars
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from s3_saver._protocol import Call, Op, Sleep, T
from s3_saver.errors import UNAVAILABLE, ConfigurationError, classify

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("s3_saver_deadline", default=None)
# Jitter from the OS's generator: the random module's shared state is the user's
# (a test may seed it; the saver must not draw from it, see _keys.new_token).
_JITTER = random.SystemRandom()


@dataclass(frozen=True)
class RetryPolicy:
    """How the saver retries a call that failed transiently.

    Attributes:
        attempts: Tries per call, the first included.
        base: Seconds of the first backoff; each retry doubles it (full jitter).
        cap: The longest single backoff, in seconds.
        budget: Seconds a call may spend being retried, from its first attempt
            (None: no limit); a backoff that would end past it is not taken.
    """

    attempts: int = 4
    base: float = 0.1
    cap: float = 2.0
    budget: float | None = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigurationError(f"RetryPolicy.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("base", "cap"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) < 0:
                raise ConfigurationError(f"RetryPolicy.{name} must be a number >= 0, got {getattr(self, name)!r}")
        if self.budget is not None and (not isinstance(self.budget, (int, float)) or self.budget < 0):
            raise ConfigurationError(f"RetryPolicy.budget must be a number >= 0 or None, got {self.budget!r}")


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Within this block, no saver call starts a retry that would end more than
    ``seconds`` from now (sync code, threads and asyncio tasks alike)."""
    if not isinstance(seconds, (int, float)) or seconds < 0:
        raise ConfigurationError(f"deadline needs a number of seconds >= 0, got {seconds!r}")
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def transient(call: Call, result: Any) -> bool:
    """A failure worth sending again: no answer, a 5xx, or throttling."""
    return isinstance(result, BaseException) and classify(result, call.operation) == UNAVAILABLE


def resilient(op: Op[T], policy: RetryPolicy, clock: Callable[[], float] = time.monotonic) -> Op[T]:
    """``op``, with the calls of each round trip that failed transiently sent again."""
    end = _DEADLINE.get()
    reply: Any = None
    try:
        while True:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                return stop.value
            if not isinstance(step, tuple):
                reply = yield step
                continue
            started = clock()
            limit = end
            if policy.budget is not None:
                limit = min(end, started + policy.budget) if end is not None else started + policy.budget
            results = list((yield step))
            for attempt in range(1, policy.attempts):
                failed = [i for i, (call, result) in enumerate(zip(step, results)) if transient(call, result)]
                if not failed:
                    break
                pause = _JITTER.uniform(0, min(policy.cap, policy.base * 2 ** (attempt - 1)))
                if limit is not None and clock() + pause > limit:
                    break
                yield Sleep(pause)
                again = yield tuple(step[i] for i in failed)
                for i, result in zip(failed, again):
                    results[i] = result
            reply = results
    finally:
        # Closed early (a cut, a cancelled task, an exception in the driver): close ``op``
        # now. Its ``finally`` blocks hand on what other operations of this process wait
        # for (a group commit's lead: tests/test_retry.py). Left to the garbage collector,
        # a reference cycle (an exception it keeps) holds it while the process is idle,
        # and the commits its lead took wait for it forever.
        op.close()
