"""Issue 21, item 6: a checkpoint whose put returned vanishes (DynamoDB mode, held answers).

The mechanism is moto's, not the saver's. ``DynamoDBBackend.transact_write_items``
deep-copies every table it touches when it starts and, when any condition fails,
puts the copy back (``self.tables[name] = original_table_state[name]``). moto's
ThreadedMotoServer answers each request on a thread of its own and nothing
serialises the DynamoDB backend (``backend_lock`` only guards backend creation,
``DomainDispatcherApplication.lock`` only the choice of app). So every write another
request applies between that copy and that rollback is discarded, though its
answer was 200. DynamoDB's transactions never touch items outside their own.

The saver sends a failing transaction on purpose: the first put of a thread lists
it with ``DynamoCalls.list_thread`` (Update of the thread item with
``attribute_not_exists(created)`` + Put of the listing item). When that request's
answer is held past the read timeout, the retry meets the applied first attempt,
its condition fails (``_listed_first``: fine for the saver), and moto rolls the
whole table back, taking with it e.g. another thread's checkpoint commit
(BatchWriteItem) that landed in the window.

Deterministic here: a hook holds the cancelled transaction inside moto, after its
backup copies and before its rollback, until the concurrent write has been answered.
The ``moto+lock`` cases install the recommended conftest patch (one lock around
moto's DynamoDB handler) and show that nothing is lost; once tests/conftest.py
itself serialises moto's DynamoDB requests, every case expects nothing lost.
"""

from __future__ import annotations

import functools
import threading

import boto3
import pytest
from botocore.config import Config

from conftest import make_saver
from faults import FaultProxy
from helpers import checkpoint, config

_HANDLER_LOCK = threading.RLock()


def serialise_moto_dynamodb(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recommended conftest patch: one DynamoDB request at a time in moto's server."""
    from moto.dynamodb.responses import DynamoHandler

    original = DynamoHandler.call_action

    @functools.wraps(original)
    def call_action(self):
        with _HANDLER_LOCK:
            return original(self)

    monkeypatch.setattr(DynamoHandler, "call_action", call_action)


class TransactionGate:
    """Holds one transaction inside moto, between its backup copy and its outcome
    (at its first condition read, after the copies), until ``done`` is set or
    ``wait`` seconds pass (under a lock the concurrent write cannot run meanwhile).

    ``when(transact_items)`` picks the transaction; ``retry_of_seen`` picks the first
    one whose items equal an earlier one's: a retried request meeting its own write."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, when, wait: float = 5.0) -> None:
        from moto.dynamodb.models import DynamoDBBackend

        self.opened = threading.Event()
        self.done = threading.Event()
        local = threading.local()
        transact, get_item = DynamoDBBackend.transact_write_items, DynamoDBBackend.get_item
        gate = self

        def gated_transact(backend, transact_items):
            local.armed = not gate.opened.is_set() and when(transact_items)
            try:
                return transact(backend, transact_items)
            finally:
                local.armed = False

        def gated_get_item(backend, *args, **kwargs):
            if getattr(local, "armed", False):
                local.armed = False
                gate.opened.set()
                gate.done.wait(wait)
            return get_item(backend, *args, **kwargs)

        monkeypatch.setattr(DynamoDBBackend, "transact_write_items", gated_transact)
        monkeypatch.setattr(DynamoDBBackend, "get_item", gated_get_item)
        # The harness applies a transaction sent again with its ClientRequestToken once, as
        # DynamoDB does (tests/moto_fixes.py); this module shows what moto itself does with
        # the retry (applies it again, and rolls back on its failed condition): the raw handler.
        from moto.dynamodb.responses import DynamoHandler

        raw = getattr(DynamoHandler.transact_write_items, "__wrapped__", None)
        if raw is not None:
            monkeypatch.setattr(DynamoHandler, "transact_write_items", raw)


def retry_of_seen():
    seen: list = []

    def when(transact_items) -> bool:
        again = transact_items in seen
        seen.append(transact_items)
        return again

    return when


def protected_by_conftest() -> bool:
    """True once tests/conftest.py serialises moto's DynamoDB handler (the fix)."""
    from moto.dynamodb.responses import DynamoHandler

    return bool(getattr(DynamoHandler, "_s3_saver_atomic", False))


def _ddb(endpoint: str):
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")


def _s(v: str) -> dict:
    return {"S": v}


# -- moto alone -------------------------------------------------------------------------
@pytest.mark.parametrize("fixed", [False, True], ids=["moto", "moto+lock"])
def test_cancelled_transaction_discards_concurrent_put(endpoint, monkeypatch, fixed):
    if fixed:
        serialise_moto_dynamodb(monkeypatch)
    ddb = _ddb(endpoint)
    ddb.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    # The thread item, already listed (what the first attempt of list_thread left).
    ddb.put_item(TableName="t", Item={"pk": _s("thread-x"), "sk": _s("~"), "created": {"N": "1"}})
    protected = fixed or protected_by_conftest()
    gate = TransactionGate(monkeypatch, lambda items: True, wait=0.5 if protected else 5.0)
    outcome: list = []

    def retried_listing():
        try:
            ddb.transact_write_items(TransactItems=[
                {"Update": {"TableName": "t", "Key": {"pk": _s("thread-x"), "sk": _s("~")},
                            "UpdateExpression": "SET #c = :t", "ConditionExpression": "attribute_not_exists(#c)",
                            "ExpressionAttributeNames": {"#c": "created"}, "ExpressionAttributeValues": {":t": {"N": "2"}}}},
                {"Put": {"TableName": "t", "Item": {"pk": _s("listing"), "sk": _s("1#thread-x")}}},
            ])
            outcome.append("ok")
        except ddb.exceptions.TransactionCanceledException:
            outcome.append("cancelled")

    tx = threading.Thread(target=retried_listing)
    tx.start()
    assert gate.opened.wait(10)

    def other_write():
        ddb.put_item(TableName="t", Item={"pk": _s("thread-y"), "sk": _s("c#2")})
        gate.done.set()

    put = threading.Thread(target=other_write)
    put.start()
    put.join(10)
    tx.join(10)
    assert outcome == ["cancelled"]
    found = "Item" in ddb.get_item(TableName="t", Key={"pk": _s("thread-y"), "sk": _s("c#2")}, ConsistentRead=True)
    # Without the lock the PutItem was answered 200 inside the window and is gone.
    assert found is protected


# -- the saver's shape: a thread's first put with a held listing answer -------------------
@pytest.mark.parametrize("fixed", [False, True], ids=["moto", "moto+lock"])
def test_first_put_retry_rolls_back_another_threads_checkpoint(endpoint, monkeypatch, fixed):
    if fixed:
        serialise_moto_dynamodb(monkeypatch)
    setup = make_saver(endpoint)
    setup.setup()
    setup.close()
    direct = make_saver(endpoint)
    # Thread y exists and is listed; its second checkpoint is the one that will vanish.
    y1 = direct.put(config("y"), checkpoint({"n": 1}, {"n": "1"}), {"source": "loop", "step": 0}, {"n": "1"})

    with FaultProxy(endpoint, hold_seconds=1.6) as proxy:
        # The first attempt of x's listing transaction is applied, its answer held past
        # the 1 s read timeout; the saver re-sends it (resilient), the retry is cancelled.
        proxy.configure(kinds=["hold"], rate=1.0, max_faults=1,
                        operations=lambda r: r.operation == "TransactWriteItems")
        through = make_saver(proxy.url, client_config=Config(read_timeout=1, connect_timeout=1))
        protected = fixed or protected_by_conftest()
        gate = TransactionGate(monkeypatch, retry_of_seen(), wait=0.5 if protected else 5.0)
        first_put: list = []
        x = threading.Thread(target=lambda: first_put.append(
            through.put(config("x"), checkpoint({"n": 1}, {"n": "1"}), {"source": "input", "step": -1}, {"n": "1"})))
        x.start()
        assert gate.opened.wait(15), "the listing transaction was not retried"
        y2_cp = checkpoint({"n": 2}, {"n": "2"})
        y2: list = []

        def put_y2():
            y2.append(direct.put(y1, y2_cp, {"source": "loop", "step": 1}, {"n": "2"}))  # BatchWriteItem
            gate.done.set()

        writer = threading.Thread(target=put_y2)
        writer.start()
        writer.join(15)
        x.join(15)
        through.close()
        assert proxy.faults["hold"] == 1
    assert first_put and y2, "both puts returned"

    fresh = make_saver(endpoint)
    try:
        listed = [t.checkpoint["id"] for t in fresh.list(config("y"))]
        back = fresh.get_tuple(y2[0])
        # The next checkpoint of y, whose parent is y2.
        y3 = fresh.put(y2[0], checkpoint({"n": 3}, {"n": "3"}), {"source": "loop", "step": 2}, {"n": "3"})
        parent = fresh.get_tuple(y3).parent_config
        parent_back = fresh.get_tuple(parent)
        assert fresh.get_tuple(first_put[0]) is not None  # x's own checkpoint is there
    finally:
        fresh.close()
        direct.close()
    if protected:
        assert y2_cp["id"] in listed and back is not None and parent_back is not None
    else:
        # put returned, yet: not listed, not readable by id, and the later checkpoint's parent is missing.
        assert y2_cp["id"] not in listed and back is None and parent_back is None
