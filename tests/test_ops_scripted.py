"""The operation generators driven with scripted AWS responses (no server): the paths
a real server rarely takes — throttled batches, racing conditional writes."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from botocore.exceptions import ClientError
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from s3_saver._format.keys import KeyLayout, writes_sort_key
from s3_saver._index.dynamodb.backend import DynamoIndex
from s3_saver._ops.context import Context
from s3_saver._ops.delete import delete_thread
from s3_saver._transport.protocol import Call, Emit, Sleep
from s3_saver._transport.s3 import S3Calls, copy_immutable, put_immutable
from s3_saver.errors import ImmutableObjectConflictError


def _ctx() -> Context:
    layout = KeyLayout("p")
    return Context(layout, S3Calls("b"), DynamoIndex("t", layout), JsonPlusSerializer(), 1024, None)


def _drive(op, respond: Callable[[Call], Any]) -> tuple[Any, list[Any]]:
    """Run an operation; return its result and the steps it took."""
    steps: list[Any] = []
    reply = None
    while True:
        try:
            step = op.send(reply)
        except StopIteration as stop:
            return stop.value, steps
        steps.append(step)
        reply = None if isinstance(step, (Sleep, Emit)) else [respond(c) for c in step]


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


def test_throttled_deletes_are_retried_with_backoff() -> None:
    ctx = _ctx()
    item = {"pk": {"S": ctx.index.calls.pk("t")}, "sk": {"S": writes_sort_key("", "c1", "task", "r1")}, "token": {"S": "x"}}
    stored = [item]
    # The delete batch is refused twice.
    refusals = iter([2, 1, 0])

    def respond(call: Call) -> Any:
        if call.operation == "query":
            return {"Items": list(stored)}
        if call.operation in {"delete_objects", "update_item", "get_item"}:
            return {}
        requests = call.params["RequestItems"]["t"]
        if next(refusals):
            return {"UnprocessedItems": {"t": requests}}
        if "DeleteRequest" in requests[0]:
            stored.clear()
        return {"UnprocessedItems": {}}

    _, steps = _drive(delete_thread(ctx, "t"), respond)
    sleeps = [s.seconds for s in steps if isinstance(s, Sleep)]
    assert sleeps == [0.05, 0.1]
    ops = [s[0].operation for s in steps if isinstance(s, tuple)]
    # The thread's record moves to the next generation first (the switch: gone for
    # readers and writers), then objects, then items; a second pass finds nothing left.
    assert ops == [
        "get_item", "update_item", "query", "delete_objects",
        "batch_write_item", "batch_write_item", "batch_write_item", "query",
    ]


def test_racing_conditional_write_is_retried_then_compared() -> None:
    answers = {
        1: _client_error("ConditionalRequestConflict", 409),
        2: _client_error("PreconditionFailed", 412),
    }
    calls = {"n": 0}

    def respond(call: Call) -> Any:
        if call.operation == "get_object":
            return {"Body": b"same"}
        calls["n"] += 1
        return answers.get(calls["n"], {})

    _, steps = _drive(put_immutable(S3Calls("b"), {"k": b"same"}), respond)
    assert [s[0].operation for s in steps] == ["put_object", "put_object", "get_object"]

    calls["n"] = 1
    with pytest.raises(ImmutableObjectConflictError):
        _drive(put_immutable(S3Calls("b"), {"k": b"other"}), respond)


def test_unknown_errors_pass_through_untouched() -> None:
    boom = _client_error("InvalidStorageClass", 400)  # no meaning for the saver (5xx: StoreUnavailableError)
    with pytest.raises(ClientError) as caught:
        _drive(put_immutable(S3Calls("b"), {"k": b"x"}), lambda call: boom)
    assert caught.value is boom


def test_a_copy_names_its_source_in_errors() -> None:
    assert S3Calls("b").copy("live/a/x", "live/b/x").describe() == "s3.copy_object(live/a/x -> live/b/x)"


def test_a_copy_never_overwrites_and_compares_what_it_finds() -> None:
    """CopyObject is conditional like every write; an existing target is compared with
    its source (a copy run again is a success, another object is a conflict)."""
    bodies = {"src": b"same", "dst": b"same"}

    def respond(call: Call) -> Any:
        if call.operation == "copy_object":
            assert call.params["IfNoneMatch"] == "*"
            return _client_error("PreconditionFailed", 412)
        return {"Body": bodies[call.params["Key"]]}

    _, steps = _drive(copy_immutable(S3Calls("b"), {"src": "dst"}), respond)
    assert [[c.operation for c in s] for s in steps] == [["copy_object"], ["get_object", "get_object"]]
    bodies["dst"] = b"other"
    with pytest.raises(ImmutableObjectConflictError, match="s3://b/dst"):
        _drive(copy_immutable(S3Calls("b"), {"src": "dst"}), respond)
