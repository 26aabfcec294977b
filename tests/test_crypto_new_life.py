"""A thread's new life after an erase, started by a process that never saw the thread:
LangGraph sends a run's pending writes beside the put of its first checkpoint, and the
writes go into the new generation with it, never refused as writes to the erased history.

With encryption the put loads (makes) the new life's key first, which takes round trips
(the erased record read, a new key made, read again when a write of the same run made it
first). A write of the run that finished its own load first used to reach its generation
check before the put had said the run was starting: it saw generation 1, no checkpoint of
it in the index, and was refused with ``ThreadDeletedError`` (about half the runs of a real
graph). The put now says so before it sends anything. Both index modes, on moto.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
import pytest
from conftest import BUCKET, make_saver
from helpers import checkpoint, config
from test_encryption import _graph, _run

from s3_saver import LocalKey
from s3_saver._crypto.envelope import is_sealed, key_id_of
from s3_saver._crypto.records import decode_record
from s3_saver._format.key_codec import encode
from s3_saver._transport.sync import SyncDriver

KEY_BUCKET = f"{BUCKET}-keys"
_WRITES_REQUESTS = {
    "dynamodb": {("s3", "get_object"): 2, ("dynamodb", "get_item"): 2, ("s3", "put_object"): 2, ("dynamodb", "transact_write_items"): 1},
    "manifest": {("s3", "get_object"): 3, ("s3", "put_object"): 3},
}


def _key_id(endpoint: str, thread: str) -> bytes:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    key = f"t/{encode(thread)}"
    found = s3.get_object(Bucket=KEY_BUCKET, Key=key)
    return decode_record(found["Body"].read(), found["ETag"], key).key_id


def _live_objects(endpoint: str, thread: str) -> dict[str, bytes]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"live/{thread}/").get("Contents", [])]
    return {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def _erased(endpoint: str, index_mode: str, encryption: LocalKey, threads: list[str]) -> dict[str, bytes]:
    """The threads written (generation 0) and erased by a process: their keys destroyed,
    each thread in generation 1. Returns the destroyed keys' ids."""
    a = make_saver(endpoint, index_mode, encryption=encryption)
    a.setup()
    destroyed = {}
    for thread in threads:
        _run(_graph(a, "old-life"), "old-life", thread, "sync", 1)
        destroyed[thread] = _key_id(endpoint, thread)
        assert a.erase_thread(thread).key_destroyed_at is not None
    a.close()
    return destroyed


def test_a_run_s_writes_sent_while_its_first_put_loads_the_new_key_go_into_the_new_life(
    endpoint, index_mode, monkeypatch
) -> None:
    """The sequence, held in place: process B's put of a run's first checkpoint is held
    at its first round trip (the key record's GET); the run's pending writes for that
    checkpoint are sent meanwhile and load the key themselves (the record read: erased; a
    new key made). Their commit goes into the new generation with the run (B is starting
    it), not refused; then the put goes on under the key they made, and both are read."""
    encryption = LocalKey(os.urandom(32))
    destroyed = _erased(endpoint, index_mode, encryption, ["t"])["t"]
    b = make_saver(endpoint, index_mode, encryption=encryption)
    first = checkpoint({"doc": "new-life", "big": "new-life" * 40}, {"doc": "1", "big": "1"})
    held, reached = threading.Event(), threading.Event()
    putter: list[threading.Thread] = []
    real = SyncDriver._wave

    def wave(driver: Any, calls: Any) -> Any:
        if putter and threading.current_thread() is putter[0] and not held.is_set():
            reached.set()
            assert held.wait(30), "the put was never let go"
        return real(driver, calls)

    monkeypatch.setattr(SyncDriver, "_wave", wave)
    stored: list[Any] = []
    failed: list[BaseException] = []

    def put() -> None:
        try:
            stored.append(b.put(config("t"), first, {"source": "input", "step": -1}, {"doc": "1", "big": "1"}))
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            failed.append(exc)

    putter.append(threading.Thread(target=put))
    putter[0].start()
    try:
        assert reached.wait(30), "the put sent nothing"
        b.stats.reset()
        # Sent by LangGraph beside the put: before it (held) loaded a key or wrote anything.
        b.put_writes(config("t", checkpoint_id=first["id"]), [("doc", "new-life-write")], "task-1")
        # 4 round trips: the erased key record's GET (beside this process's first checks:
        # the index-mode marker, the table's owner), the new key's PUT, the object beside
        # the index's prepare (the record says generation 1), the commit. Nothing more is
        # read to judge the generation: the run is starting here.
        writes = b.stats.first_sends()
        assert writes.round_trips == 4 and dict(writes.requests) == _WRITES_REQUESTS[index_mode], writes
    finally:
        held.set()
        putter[0].join(30)
        monkeypatch.undo()
    assert not failed and stored, failed
    c = make_saver(endpoint, index_mode, encryption=encryption)
    found = c.get_tuple(config("t"))
    assert found is not None and found.checkpoint["channel_values"]["doc"] == "new-life"
    assert [w[2] for w in found.pending_writes] == ["new-life-write"]
    live = _key_id(endpoint, "t")
    assert live != destroyed
    for key, body in _live_objects(endpoint, "t").items():
        assert is_sealed(body) and key_id_of(body) == live, key
    for s in (b, c):
        s.close()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_graph_started_afresh_after_an_erase_by_a_process_that_never_saw_the_thread(
    endpoint, index_mode, driver
) -> None:
    """The same through a real graph (LangGraph's own scheduling of the put and the
    writes), on three erased threads: each new life runs, interrupts, resumes and is
    updated like a first life (before, each was refused in about half the runs)."""
    encryption = LocalKey(os.urandom(32))
    threads = ["t", "u", "v"]
    destroyed = _erased(endpoint, index_mode, encryption, threads)
    b = make_saver(endpoint, index_mode, encryption=encryption)
    for thread in threads:
        state, history = _run(_graph(b, f"new-life-{thread}"), f"new-life-{thread}", thread, driver, 1)
        assert state.values["notes"][0] == f"new-life-{thread}-input" and len(history) > 3
        assert _key_id(endpoint, thread) != destroyed[thread]
    b.close()
