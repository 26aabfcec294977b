"""The one transient-failure policy, applied in the operation core for both drivers.

Every call the saver sends is safe to send again: reads, immutable object
writes (``IfNoneMatch``: a retry that meets its own object compares bytes),
the manifest head's compare-and-swap (a retry that meets its own swap finds it
on the re-read), index items written whole or conditionally with a token that
recognises the writer's own commit, batch writes and deletes of fixed keys.
(A call marked ``idempotent=False`` -- the memory store's overwrites, and the
conditional deletes of its erase and TTL sweep, in DynamoDB mode -- is sent
again only after a failure that proves it was not
applied; any other is handed back to its operation, which judges it.)
So the saver retries them itself, the same way under boto3 and aioboto3:
connection failures, timeouts, 5xx answers, answers that are not the store's
(``_transport/answers``: a 200 that confirms nothing, as good as no answer) and throttling are sent again after
a jittered (full jitter), capped, exponential backoff, within a time budget that
a Lambda handler can tie to its remaining time ([deadline()][s3_saver.S3Saver.deadline]). Two kinds are
told apart. A store that fails (no answer, a timeout, a 5xx) gets a few attempts:
it may be down, and the caller (or a replica) should hear it soon. A store that
throttles (``SlowDown``, ``ThrottlingException``...) is up and asks for fewer
requests, for seconds: those calls are sent again until a time limit, not a
count, so the small pauses full jitter draws cannot spend them early. What still
fails reaches the operation, which raises a ``StoreUnavailableError`` naming the
call, the bucket or table and the key.
botocore's own retries are off in the clients the saver makes (one attempt):
retrying twice, at two levels, would multiply the attempts and drain
botocore's retry quota with the saver's own idempotent retries.
"""

from __future__ import annotations

import contextvars
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from s3_saver._transport.failures import UNAVAILABLE, classify, throttled, unapplied
from s3_saver._transport.protocol import Backoff, Call, Op, Resend, Sleep, T
from s3_saver.errors import ConfigurationError

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("s3_saver_deadline", default=None)
# Jitter from the OS's generator: the random module's shared state is the user's
# (a test may seed it; the saver must not draw from it, see keys.new_token).
_JITTER = random.SystemRandom()


@dataclass(frozen=True)
class RetryPolicy:
    """How the saver retries a call that failed transiently.

    Each backoff is drawn at random between 0 and ``base`` doubled at each
    retry of the round trip, at most ``cap`` (full jitter). Every limit below
    counts from the call's first attempt, and no backoff is started that would
    end past one (nor past [deadline()][s3_saver.S3Saver.deadline]).

    With the defaults, a store that fails gets 4 attempts within 10 s (backoffs
    up to 0.1, 0.2, 0.4 s): it gives up at once after the 4th quick failure, or
    after about 10 s when each attempt waits for a timeout. A throttling store
    is retried until 10 s: as no backoff is longer than ``cap``, throttling that
    ends within 8 s (``throttle_budget - cap``) is always ridden out, and the
    call gives up between 8 and 10 s (about 14 attempts).

    Attributes:
        attempts: Tries per call that fails without throttling (no answer, a
            timeout, a 5xx other than a throttle), the first included.
        base: Seconds of the first backoff; each retry doubles it (full jitter).
        cap: The longest single backoff, in seconds.
        budget: Seconds a call may spend being retried, from its first attempt
            (None: no limit); a backoff that would end past it is not taken.
            It bounds every kind of failure, throttling included.
        throttle_budget: Seconds a throttled call (S3 ``SlowDown``, DynamoDB
            ``ThrottlingException``, ``ProvisionedThroughputExceededException``,
            a 429...) is sent again, from its first attempt, within ``budget``;
            throttled answers do not count against ``attempts``. 0: throttling
            counts as any other failure.
        outage_budget: Seconds a call that fails without throttling may spend
            being retried, from its first attempt, within ``budget`` (None: only
            ``budget``). A saver with a [Replica][s3_saver.Replica] sets it to
            ``failover_after`` on the primary: a failing primary is left then,
            a throttling one is not.
    """

    attempts: int = 4
    base: float = 0.1
    cap: float = 2.0
    budget: float | None = 10.0
    throttle_budget: float = 10.0
    outage_budget: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigurationError(f"RetryPolicy.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("base", "cap", "throttle_budget"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) < 0:
                raise ConfigurationError(f"RetryPolicy.{name} must be a number >= 0, got {getattr(self, name)!r}")
        for name in ("budget", "outage_budget"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ConfigurationError(f"RetryPolicy.{name} must be a number >= 0 or None, got {value!r}")

    def _limits(self, started: float, end: float | None) -> tuple[float, float]:
        """When a round trip started at ``started`` stops retrying (``end``: the
        deadline, if any): (for throttled calls, for calls that failed otherwise)."""
        common = min(_after(started, self.budget), math.inf if end is None else end)
        return min(common, started + self.throttle_budget), min(common, _after(started, self.outage_budget))


def _after(started: float, seconds: float | None) -> float:
    return math.inf if seconds is None else started + seconds


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Within this block, no saver call starts a retry that would end more than
    ``seconds`` from now (sync code, threads and asyncio tasks alike). Zero or less: the
    deadline has passed, each request is sent once and none is retried."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds):
        raise ConfigurationError(f"deadline needs a number of seconds, got {seconds!r}")
    # Negative is a time already past, not a mistake: a Lambda handler passes its remaining
    # time less a margin, and with less than the margin left that is below zero. Refusing it
    # failed the step with a ConfigurationError that a retry-free step would not have met.
    token = _DEADLINE.set(time.monotonic() + max(seconds, 0.0))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def transient(call: Call, result: Any) -> bool:
    """A failure worth sending again: no answer (an unreadable one included), a 5xx, or throttling."""
    return isinstance(result, BaseException) and classify(result, call.operation) == UNAVAILABLE


def resilient(op: Op[T], policy: RetryPolicy, clock: Callable[[], float] = time.monotonic) -> Op[T]:
    """``op``, with the calls of each round trip that failed transiently sent again."""
    end = _DEADLINE.get()
    by_time = policy.throttle_budget > 0
    loop_started: float | None = None  # of the operation's own retry loop (Backoff)
    reply: Any = None
    try:
        while True:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                return stop.value
            if isinstance(step, Backoff):
                # The operation's own retry loop (a transaction that conflicted, items
                # left unprocessed): bounded like throttling, from the loop's first
                # pause, and never past deadline(). Refused, it gives up now.
                if step.attempt <= 1 or loop_started is None:
                    loop_started = clock()
                limit, _ = policy._limits(loop_started, end)
                reply = clock() + step.seconds <= limit
                if reply:
                    yield Sleep(step.seconds)
                continue
            if not isinstance(step, tuple):
                reply = yield step
                continue
            throttle_limit, outage_limit = policy._limits(clock(), end)
            results = list((yield step))
            # Failures of each call that count against ``attempts``.
            failures = [0] * len(step)
            retry = 0
            while True:
                retry += 1
                # The exponent stops growing long after any cap is reached (a float's range).
                pause = _JITTER.uniform(0, min(policy.cap, policy.base * 2 ** min(retry - 1, 64)))
                resume = clock() + pause
                again = []
                for i, (call, result) in enumerate(zip(step, results)):
                    if not transient(call, result):
                        continue
                    if not call.idempotent and not unapplied(result):
                        # It may have landed: sent again as is, it could return its own
                        # write as the old one, or name again an object another writer
                        # released meanwhile. Its operation judges it (Call.idempotent).
                        continue
                    if by_time and throttled(result):
                        # Bounded by time, not by count: full jitter's short
                        # pauses cannot spend the ride-out, and as no pause is
                        # longer than ``cap``, the last attempt is sent less than
                        # ``cap`` (plus a round trip) before the limit.
                        if resume <= throttle_limit:
                            again.append(i)
                        continue
                    failures[i] += 1
                    if failures[i] < policy.attempts and resume <= outage_limit:
                        again.append(i)
                if not again:
                    break
                yield Sleep(pause)
                answers = yield Resend(step[i] for i in again)
                for i, result in zip(again, answers):
                    results[i] = result
            reply = results
    finally:
        # Closed early (a cut, a cancelled task, an exception in the driver): close ``op``
        # now. Its ``finally`` blocks hand on what other operations of this process wait
        # for (a group commit's lead: tests/test_retry.py). Left to the garbage collector,
        # a reference cycle (an exception it keeps) holds it while the process is idle,
        # and the commits its lead took wait for it forever.
        op.close()
