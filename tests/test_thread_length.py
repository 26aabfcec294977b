"""Cost per call on a 10- and a 10,000-checkpoint thread, in both index modes: the same
requests and round trips, and bytes within a small constant.

Growing 10,000 checkpoints through put() takes minutes on moto, so the long thread is
20 real checkpoints on top of 9,980 older entries restored straight into the index
(Index.restore, as rebuild_index writes them), all pointing at real objects: the index
then has the shape a long thread gives it (DynamoDB: one partition of 10,000 items;
manifest: a head and ~200 sealed segments).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import make_saver
from helpers import checkpoint, config, grow_thread

LONG = 10_000
# What the manifest's head carries for a long thread beyond a short one's: the refs of
# its sealed segments (about 60 bytes per 48 checkpoints).
MANIFEST_HEAD_GROWTH = 16 * 1024


def _meter(saver) -> dict[str, list[int]]:
    """Bytes each client sends and receives (bodies), counted by botocore's events."""
    counts = {"up": [0], "down": [0]}

    def sent(request, **_) -> None:
        body = request.body or b""
        counts["up"][0] += body.getbuffer().nbytes if hasattr(body, "getbuffer") else len(body)

    for service in ("s3", "dynamodb") if saver.table else ("s3",):
        events = saver._sync._client(service).meta.events
        events.register("before-send", sent)
        events.register(
            "after-call",
            lambda http_response, **_: counts["down"].__setitem__(
                0, counts["down"][0] + int(http_response.headers.get("content-length", 0))
            ),
        )
    return counts


def _costs(saver, thread_id: str, last: dict[str, Any]) -> dict[str, tuple[int, dict, int, int]]:
    counts = _meter(saver)
    out = {}

    def measure(name: str, call) -> None:
        saver.stats.reset()
        counts["up"][0] = counts["down"][0] = 0
        call()
        snap = saver.stats.snapshot()
        out[name] = (snap.round_trips, dict(snap.requests), counts["up"][0], counts["down"][0])

    top = saver.get_tuple(last)
    version = saver.get_next_version(top.checkpoint["channel_versions"]["counter"], None)
    cp = checkpoint({"counter": -1, "doc": "a document"}, {"counter": version, "doc": "1"})
    measure("put", lambda: saver.put(last, cp, {"step": -1}, {"counter": version}))
    newest = config(thread_id, checkpoint_id=cp["id"])
    measure("put_writes", lambda: saver.put_writes(newest, [("counter", 1)], "task-1", "path"))
    measure("get_tuple latest", lambda: saver.get_tuple(config(thread_id)))
    measure("get_tuple by id", lambda: saver.get_tuple(newest))
    measure("list limit=5", lambda: list(saver.list(config(thread_id), limit=5)))
    return out


def _lengthen(saver, thread_id: str, total: int) -> None:
    """Restore old entries below the thread's real ones, up to ``total`` checkpoints."""
    real = [t for t in saver.list(config(thread_id))]
    oldest_id = real[-1].config["configurable"]["checkpoint_id"]
    oldest = saver._sync.run(saver._ctx.index.get(thread_id, "", oldest_id))
    # The entries carry the checkpoint object (as DynamoDB items and sealed segments do),
    # so the restored checkpoints, which have no objects of their own, read back.
    key = saver._ctx.layout.checkpoint_key(thread_id, "", oldest_id)
    body = saver._sync._client("s3").get_object(Bucket=saver.bucket, Key=key)["Body"].read()
    oldest = replace(oldest, body=body)
    fake = []
    parent = None
    for i in range(total - len(real)):
        cid = f"0{i:035d}"  # below LangGraph's uuid6 ids: older
        fake.append(replace(oldest, checkpoint_id=cid, parent_id=parent, writes=[]))
        parent = cid
    real_entries = [saver._sync.run(saver._ctx.index.get(thread_id, "", t.config["configurable"]["checkpoint_id"])) for t in real]
    writes = [w for e in real_entries for w in e.writes]
    saver._sync.run(saver._ctx.index.restore(thread_id, fake + list(reversed(real_entries)), writes, 0))
    saver._ctx.locs.forget_thread(thread_id)


@pytest.mark.slow  # make test-all and CI (make test-slow): a cost invariant over long threads
def test_costs_do_not_grow_with_thread_length(endpoint, index_mode) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    grow_thread(saver, "short", 10)
    last = grow_thread(saver, "long", 20)
    _lengthen(saver, "long", LONG)
    assert sum(1 for _ in saver.list(config("long"))) == LONG
    long = _costs(make_saver(endpoint, index_mode), "long", last)  # a fresh process, as a Lambda
    fresh_short = _costs(make_saver(endpoint, index_mode), "short", saver.get_tuple(config("short")).config)
    print({mode: costs for mode, costs in (("10", fresh_short), (str(LONG), long))})  # shown with -s
    for call in long:
        rt, requests, up, down = long[call]
        assert rt <= 2, (call, long[call])
        if index_mode == "manifest" and call.startswith(("get_tuple", "list")):
            # The head carries each namespace's newest checkpoint whole; the others
            # (and values carried from them) are GETs in one more wave: one more or
            # one fewer as the checkpoints holding values fall in or out of the head.
            extra = {k: v - fresh_short[call][1].get(k, 0) for k, v in requests.items()}
            assert set(extra) == {("s3", "get_object")} and abs(extra[("s3", "get_object")]) <= 1, (
                call, fresh_short[call], long[call]
            )
        else:
            assert (rt, requests) == fresh_short[call][:2], (call, fresh_short[call], long[call])
        if call.startswith("list"):
            continue  # its bytes are bounded by the limit: a thread of 10 does not fill the page
        slack = MANIFEST_HEAD_GROWTH if index_mode == "manifest" else 2048
        assert up <= fresh_short[call][2] + slack and down <= fresh_short[call][3] + slack, (call, fresh_short[call], long[call])
    saver.close()
