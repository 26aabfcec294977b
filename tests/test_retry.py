"""The transient-failure policy of the operation core, driven with scripted answers."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from s3_saver import ConfigurationError, RetryPolicy, StoreUnavailableError
from s3_saver._transport.protocol import Call, Sleep, request
from s3_saver._transport.retry import deadline, resilient
from s3_saver._transport.s3 import S3Calls, put_immutable


def _error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


def _drive(op, answers: dict[str, list[Any]], clock=None):
    """Run ``op`` under the policy; each call's answers come from ``answers`` by key, in turn."""
    sent: list[str] = []
    slept: list[float] = []
    reply = None
    while True:
        try:
            step = op.send(reply)
        except StopIteration as stop:
            return stop.value, sent, slept
        if isinstance(step, Sleep):
            slept.append(step.seconds)
            if clock is not None:
                clock["now"] += step.seconds
            reply = None
            continue
        reply = []
        for call in step:
            key = call.params["Key"]
            sent.append(key)
            queue = answers[key]
            reply.append(queue.pop(0) if len(queue) > 1 else queue[0])


def _two_reads() -> Any:
    s3 = S3Calls("b")
    results = yield from request(s3.get("a"), s3.get("b"))
    return [r["Body"] for r in results]


@pytest.mark.parametrize(
    "failure",
    [
        _error("SlowDown", 503),
        _error("InternalError", 500),
        _error("ThrottlingException", 400),
        _error("ProvisionedThroughputExceededException", 400),
        ConnectionClosedError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    ],
    ids=["503 SlowDown", "500", "throttling", "throughput", "reset", "read timeout"],
)
def test_transient_failures_are_sent_again_alone(failure: BaseException) -> None:
    answers = {"a": [failure, failure, {"Body": b"A"}], "b": [{"Body": b"B"}]}
    result, sent, slept = _drive(resilient(_two_reads(), RetryPolicy(attempts=4)), answers)
    assert result == [b"A", b"B"]
    assert sent == ["a", "b", "a", "a"]  # only the failed call goes again
    assert len(slept) == 2 and all(0 <= s <= 0.2 for s in slept)


def test_what_still_fails_is_a_store_unavailable_error_naming_the_call() -> None:
    answers = {"a": [_error("SlowDown", 503)], "b": [{"Body": b"B"}]}
    with pytest.raises(StoreUnavailableError, match=r"s3\.get_object\(a\)"):
        _drive(resilient(_two_reads(), RetryPolicy(attempts=3)), answers)


def test_answers_with_a_meaning_are_not_retried() -> None:
    """412 on an immutable write means "exists: compare bytes" (put_immutable's job)."""
    s3 = S3Calls("b")
    answers = {"k": [_error("PreconditionFailed", 412), {"Body": b"same"}]}
    _, sent, slept = _drive(resilient(put_immutable(s3, {"k": b"same"}), RetryPolicy()), answers)
    assert sent == ["k", "k"] and slept == []  # the PUT, then the GET that compares


def test_the_budget_and_the_deadline_stop_retrying() -> None:
    clock = {"now": 0.0}
    answers = {"a": [_error("SlowDown", 503)], "b": [{"Body": b"B"}]}
    policy = RetryPolicy(attempts=100, base=1.0, cap=1.0, budget=5.0)
    with pytest.raises(StoreUnavailableError):
        _drive(resilient(_two_reads(), policy, clock=lambda: clock["now"]), answers, clock)
    assert clock["now"] <= 5.0
    answers = {"a": [_error("SlowDown", 503)] * 5 + [{"Body": b"A"}], "b": [{"Body": b"B"}]}
    with deadline(0.0):  # a Lambda with no time left: no retry at all
        with pytest.raises(StoreUnavailableError):
            _drive(resilient(_two_reads(), RetryPolicy(attempts=5)), answers)
    assert len(answers["a"]) == 5  # sent once


def test_policy_and_deadline_refuse_bad_values() -> None:
    with pytest.raises(ConfigurationError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(ConfigurationError, match="budget"):
        RetryPolicy(budget=-1)
    for bad in ("1", float("nan"), None, True):
        with pytest.raises(ConfigurationError, match="deadline"):
            with deadline(bad):  # type: ignore[arg-type]
                pass


def test_a_deadline_already_past_sends_each_request_once() -> None:
    """A Lambda handler passes its remaining time less a margin: with less than the margin
    left that is below zero. The step still runs, with no time for any retry."""
    answers = {"a": [{"Body": b"A"}], "b": [{"Body": b"B"}]}
    with deadline(-0.6):
        assert _drive(resilient(_two_reads(), RetryPolicy(attempts=5)), answers)[1] == ["a", "b"]
    answers = {"a": [_error("SlowDown", 503)] * 5 + [{"Body": b"A"}], "b": [{"Body": b"B"}]}
    with deadline(-0.6), pytest.raises(StoreUnavailableError):
        _drive(resilient(_two_reads(), RetryPolicy(attempts=5)), answers)
    assert len(answers["a"]) == 5  # sent once


def test_a_call_without_key_is_described() -> None:
    assert Call("dynamodb", "query", {"TableName": "t"}).describe().startswith("dynamodb.query")


def test_a_closed_operation_closes_the_one_it_wraps() -> None:
    """The drivers close an operation cut short (``iterate``'s ``finally``): the
    operation inside the retry wrapper must be closed then too, not when collected.
    Here something else still holds it, as a reference cycle would."""
    closed: list[str] = []

    def inner():
        try:
            yield Sleep(0)
            yield Sleep(0)
        finally:
            closed.append("inner")

    op = inner()
    held = [op]  # a reference the garbage collector would have to break
    wrapped = resilient(op, RetryPolicy())
    assert isinstance(next(wrapped), Sleep)
    wrapped.close()
    assert closed == ["inner"] and held


def test_a_group_commit_lead_cut_short_hands_on_at_once() -> None:
    """Three commits of one process to one head: b and c queue behind a; a's swap
    done, b leads and takes c. b is cut mid-swap (its driver closes it): c must lead
    now, not wait for a lead that is gone (a put hung for good in a cut-short graph run)."""
    import threading

    from s3_saver._index.manifest.group import GroupCommit
    from s3_saver._transport.protocol import Wait

    group = GroupCommit(threading.Lock())

    def update(change, check):
        yield Sleep(0)  # the swap's round trip

    held = []  # each commit's operation, held elsewhere as a reference cycle would

    def commit():
        held.append(group.commit("t", lambda head: head, lambda head: iter(()), update))
        return resilient(held[-1], RetryPolicy())

    a, b, c = commit(), commit(), commit()
    assert isinstance(next(a), Sleep)  # a leads, swapping
    b_waits, c_waits = next(b), next(c)
    assert isinstance(b_waits, Wait) and isinstance(c_waits, Wait)  # queued behind a
    with pytest.raises(StopIteration):
        a.send(None)  # a's swap done: b leads
    assert b_waits.signal.is_set()
    assert isinstance(b.send(None), Sleep)  # b swapping, c taken
    assert not c_waits.signal.is_set()
    b.close()  # cut short
    assert c_waits.signal.is_set()  # handed on: c leads
    assert isinstance(c.send(None), Sleep)


def test_a_taken_commit_cut_short_is_never_handed_the_lead() -> None:
    """b leads and takes c; c is cut while it waits, then b is cut mid-swap: nothing
    is left in line, and the next commit leads at once (c handed the lead would hold
    the thread: every later commit would wait for it)."""
    import threading

    from s3_saver._index.manifest.group import GroupCommit
    from s3_saver._transport.protocol import Wait

    group = GroupCommit(threading.Lock())

    def update(change, check):
        yield Sleep(0)

    def commit():
        return resilient(group.commit("t", lambda head: head, lambda head: iter(()), update), RetryPolicy())

    a, b, c = commit(), commit(), commit()
    next(a)
    next(b), next(c)
    with pytest.raises(StopIteration):
        a.send(None)
    assert isinstance(b.send(None), Sleep)  # b swapping, c taken
    c.close()
    b.close()
    assert isinstance(next(commit()), Sleep)  # leads at once, no Wait


# -- throttling: ridden out by time; a failing store keeps its few attempts --------------------
SLOWDOWN = _error("SlowDown", 503)
THROTTLED = [
    SLOWDOWN,
    _error("503", 503),  # S3's throttle of a HEAD: no body, the status alone
    _error("ThrottlingException", 400),
    _error("ProvisionedThroughputExceededException", 400),
    _error("RequestLimitExceeded", 400),
    _error("TooManyRequestsException", 429),
    _error("SomethingNew", 429),
]
THROTTLED_IDS = ["SlowDown", "bare 503", "throttling", "throughput", "request limit", "too many", "429"]


def _one_read() -> Any:
    (result,) = yield from request(S3Calls("b").get("a"))
    return result["Body"]


class _Store:
    """Answers ``failure`` until ``seconds`` of the fake clock have passed, then the body."""

    def __init__(self, failure: BaseException, seconds: float, rtt: float = 0.02) -> None:
        self.failure, self.seconds, self.rtt = failure, seconds, rtt
        self.now = 1000.0
        self.start = self.now
        self.sent: list[float] = []

    def clock(self) -> float:
        return self.now

    def drive(self, op: Any) -> Any:
        reply = None
        while True:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                return stop.value
            if isinstance(step, Sleep):
                self.now += step.seconds
                reply = None
                continue
            self.sent.append(self.now - self.start)
            self.now += self.rtt
            reply = self.answer(step)

    def answer(self, step: Any) -> list[Any]:
        ok = self.now - self.start > self.seconds
        return [{"Body": b"A"} if ok else self.failure for _ in step]


@pytest.mark.parametrize("failure", THROTTLED, ids=THROTTLED_IDS)
def test_throttling_for_seconds_is_ridden_out_with_the_defaults(failure: BaseException) -> None:
    """Bounded by time, not by count: however small the pauses full jitter draws,
    the call is sent again until the throttling ends (here 6 s: the default
    policy rides out any throttling shorter than throttle_budget - cap = 8 s)."""
    for _ in range(200):
        store = _Store(failure, seconds=6.0)
        assert store.drive(resilient(_one_read(), RetryPolicy(), clock=store.clock)) == b"A"
        assert len(store.sent) > RetryPolicy().attempts


def test_throttling_that_never_ends_gives_up_between_8_and_10_s() -> None:
    for _ in range(200):
        store = _Store(SLOWDOWN, seconds=float("inf"))
        with pytest.raises(StoreUnavailableError, match="SlowDown"):
            store.drive(resilient(_one_read(), RetryPolicy(), clock=store.clock))
        # The last attempt is sent within cap (2 s) of the 10 s budget, never past it.
        assert 8.0 - store.rtt < store.sent[-1] <= 10.0
        gaps = [b - a for a, b in zip(store.sent, store.sent[1:])]
        assert max(gaps) <= 2.0 + store.rtt


@pytest.mark.parametrize(
    "failure",
    [
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        _error("InternalError", 500),
        _error("ServiceUnavailable", 503),
    ],
    ids=["read timeout", "500", "503 ServiceUnavailable"],
)
def test_a_failing_store_keeps_its_attempts_and_its_budget(failure: BaseException) -> None:
    """A store that fails without throttling gets 4 attempts, as before; each
    attempt that waits 5 s (the read timeout) for nothing stops it at 10 s.
    Under the same policy, a throttling store is sent more (it is up)."""
    store = _Store(SLOWDOWN, seconds=float("inf"))
    with pytest.raises(StoreUnavailableError):
        store.drive(resilient(_one_read(), RetryPolicy(), clock=store.clock))
    assert len(store.sent) > 4
    store = _Store(failure, seconds=float("inf"))
    with pytest.raises(StoreUnavailableError):
        store.drive(resilient(_one_read(), RetryPolicy(), clock=store.clock))
    assert len(store.sent) == 4
    store = _Store(failure, seconds=float("inf"), rtt=5.0)
    with pytest.raises(StoreUnavailableError):
        store.drive(resilient(_one_read(), RetryPolicy(), clock=store.clock))
    assert len(store.sent) == 2 and store.now - store.start <= 10.0 + 5.0


def test_throttling_stays_within_the_budget_and_the_deadline() -> None:
    for _ in range(100):
        store = _Store(SLOWDOWN, seconds=float("inf"))
        with pytest.raises(StoreUnavailableError):
            store.drive(resilient(_one_read(), RetryPolicy(budget=3.0), clock=store.clock))
        assert store.sent[-1] <= 3.0 and len(store.sent) > 1
        store = _Store(SLOWDOWN, seconds=float("inf"))
        store.now = store.start = time.monotonic()  # deadline() counts on the monotonic clock
        with deadline(2.0):
            with pytest.raises(StoreUnavailableError):
                store.drive(resilient(_one_read(), RetryPolicy(), clock=store.clock))
        assert store.sent[-1] <= 2.0 + 0.01 and len(store.sent) > 1
        # A throttle budget of 0: throttling counts against attempts, as other failures.
        store = _Store(SLOWDOWN, seconds=float("inf"))
        with pytest.raises(StoreUnavailableError):
            store.drive(resilient(_one_read(), RetryPolicy(throttle_budget=0), clock=store.clock))
        assert len(store.sent) == 4


def test_a_throttled_call_beside_a_failing_one_rides_on_alone() -> None:
    """In one round trip, the failing call stops after its attempts; the throttled
    one goes on until its throttling ends."""
    store = _Store(SLOWDOWN, seconds=5.0)
    answers = {"a": [SLOWDOWN], "b": [_error("InternalError", 500)]}
    sent: list[str] = []

    def reply(step: Any) -> list[Any]:
        out = []
        for call in step:
            sent.append(call.params["Key"])
            late = store.now - store.start > store.seconds
            out.append({"Body": b"A"} if call.params["Key"] == "a" and late else answers[call.params["Key"]][0])
        store.now += store.rtt
        return out

    op = resilient(_two_reads(), RetryPolicy(), clock=store.clock)
    with pytest.raises(StoreUnavailableError, match=r"get_object\(b\)"):
        r = None
        while True:
            step = op.send(r)
            if isinstance(step, Sleep):
                store.now += step.seconds
                r = None
            else:
                r = reply(step)
    assert sent.count("b") == 4 and sent.count("a") > 4
    assert store.now - store.start > 5.0  # b's failure waited for a's last answer


def test_a_throttling_primary_is_not_left_for_the_replica_at_failover_after() -> None:
    """With a replica, a failing primary is left after failover_after (3 s); a
    throttling one is up and holds the newest state: it is ridden out."""
    from s3_saver import Replica, S3Saver

    saver = S3Saver("pri", table="tbl", region_name="us-east-1", replica=Replica("rep", region_name="us-west-2"))
    fast = saver._route.fast
    assert fast.outage_budget == 3.0 and fast.budget == RetryPolicy().budget
    for _ in range(100):
        store = _Store(SLOWDOWN, seconds=5.0)
        assert store.drive(resilient(_one_read(), fast, clock=store.clock)) == b"A"
    store = _Store(ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), seconds=float("inf"), rtt=2.0)
    with pytest.raises(StoreUnavailableError):
        store.drive(resilient(_one_read(), fast, clock=store.clock))
    assert len(store.sent) == 2 and store.sent[-1] <= 3.0


def test_new_policy_fields_refuse_bad_values() -> None:
    with pytest.raises(ConfigurationError, match="throttle_budget"):
        RetryPolicy(throttle_budget=-1)
    with pytest.raises(ConfigurationError, match="outage_budget"):
        RetryPolicy(outage_budget="soon")


def test_a_transaction_cancelled_by_throttling_is_ridden_out_as_throttling() -> None:
    """DynamoDB cancels a TransactWriteItems (a checkpoint's commit) whose table
    throttles one of its items: a ThrottlingError among its reasons. It gets the
    throttling schedule (7.5 s ridden out, every time), not the transaction's own
    10 conflict retries of at most 9 s in all (4.6 s on average)."""
    from s3_saver._format.keys import KeyLayout
    from s3_saver._index.dynamodb.backend import DynamoIndex
    from s3_saver.errors import Where

    index = DynamoIndex("t", KeyLayout(""), Where("b", "t"))
    cancelled = ClientError(
        {
            "Error": {"Code": "TransactionCanceledException"},
            "CancellationReasons": [{"Code": "None"}, {"Code": "ThrottlingError"}],
            "ResponseMetadata": {"HTTPStatusCode": 400},
        },
        "TransactWriteItems",
    )
    for _ in range(50):
        store = _Store(cancelled, seconds=7.5)
        assert store.drive(resilient(index.transact([{"Put": {}}], "a commit"), RetryPolicy(), clock=store.clock)) == []
    store = _Store(cancelled, seconds=float("inf"))
    with pytest.raises(StoreUnavailableError, match="TransactionCanceled"):
        store.drive(resilient(index.transact([{"Put": {}}], "a commit"), RetryPolicy(), clock=store.clock))
    assert store.sent[-1] <= 10.0  # within the budget: not retried again by the transaction's loop


def test_an_operations_own_retry_loops_keep_to_the_deadline() -> None:
    """A transaction that keeps conflicting, and items DynamoDB keeps leaving unprocessed,
    are retried by the operation itself (10 attempts, up to ~9 s of pauses): within
    deadline() it gives up before the deadline, as a retried request does."""
    from s3_saver._format.keys import KeyLayout
    from s3_saver._index.dynamodb.backend import DynamoIndex
    from s3_saver.errors import S3SaverError, Where

    index = DynamoIndex("t", KeyLayout(""), Where("b", "t"))
    conflict = ClientError(
        {
            "Error": {"Code": "TransactionCanceledException"},
            "CancellationReasons": [{"Code": "TransactionConflict"}],
            "ResponseMetadata": {"HTTPStatusCode": 400},
        },
        "TransactWriteItems",
    )

    class Unprocessed(_Store):
        def answer(self, step: Any) -> list[Any]:  # every BatchWriteItem leaves its items unprocessed
            return [{"UnprocessedItems": {"t": call.params["RequestItems"]["t"]}} for call in step]

    for _ in range(20):
        for store, op in (
            (_Store(conflict, seconds=float("inf")), lambda: index.transact([{"Put": {}}], "a commit")),
            (Unprocessed(conflict, seconds=float("inf")), lambda: index.write_batches([{"PutRequest": {"Item": {}}}] * 3, "items")),
        ):
            store.now = store.start = time.monotonic()  # deadline() counts on the monotonic clock
            with deadline(0.5), pytest.raises(S3SaverError, match="deadline"):
                store.drive(resilient(op(), RetryPolicy(), clock=store.clock))
            assert store.sent[-1] <= 0.5
    # Without a deadline the loops keep their attempts.
    store = _Store(conflict, seconds=float("inf"))
    with pytest.raises(S3SaverError, match="at most 10"):
        store.drive(resilient(index.transact([{"Put": {}}], "a commit"), RetryPolicy(), clock=store.clock))
    assert len(store.sent) == 10


def _judged_write_and_read() -> Any:
    """A write its operation judges after a failure that may have landed (the memory
    store's item writes, ``Call.idempotent=False``), beside an ordinary read."""
    s3 = S3Calls("b")
    write = replace(s3.get("w"), idempotent=False)
    results = yield (write, s3.get("r"))
    return results


@pytest.mark.parametrize(
    ("failure", "resent"),
    [
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), False),
        (ConnectionClosedError(endpoint_url="http://127.0.0.1:1"), False),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), False),  # aiobotocore: also a reset while sending
        (_error("InternalServerError", 500), False),
        (_error("ServiceUnavailable", 503), False),
        (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), True),
        (_error("ProvisionedThroughputExceededException", 400), True),
        (_error("ThrottlingException", 400), True),
    ],
    ids=["read timeout", "reset", "connection", "500", "503", "connect timeout", "throughput", "throttling"],
)
def test_a_write_judged_by_its_operation_is_sent_again_only_when_it_cannot_have_landed(failure: BaseException, resent: bool) -> None:
    """A failure that may have been applied is handed back at once (no attempt, no
    pause): sent again as is, such a write could return itself as the item it replaced,
    or name an object another writer deleted meanwhile. One that proves it was not
    applied is sent again as any call is. Other calls of the round trip are retried
    as before."""
    answers = {"w": [failure, {"Body": b"W"}], "r": [ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), {"Body": b"R"}]}
    result, sent, _ = _drive(resilient(_judged_write_and_read(), RetryPolicy(attempts=4)), answers)
    if resent:
        assert result == [{"Body": b"W"}, {"Body": b"R"}] and sent == ["w", "r", "w", "r"]
    else:
        assert result[0] is failure and result[1] == {"Body": b"R"} and sent == ["w", "r", "r"]
