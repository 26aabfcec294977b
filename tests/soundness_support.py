"""Helpers of the tests/test_soundness_*.py files (issue 21): black-box tools to cut
the saver between two requests, to interleave another process's write at a given
round trip, and to look at what a thread left in the bucket and the table.

Only the public API of S3Saver, boto3, and ``SyncDriver._wave`` (the one place every
round trip of the sync API goes through) are used: nothing of the index layouts."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, config
from langgraph.checkpoint.base import WRITES_IDX_MAP

from s3_saver._transport.sync import SyncDriver

RESUME = next(ch for ch, idx in WRITES_IDX_MAP.items() if idx == -4)

_CLIENTS: dict[str, dict[str, Any]] = {}


def fresh(endpoint: str, mode: str, **kwargs: Any):
    """A new saver, as in another process: none of the caches of the others (its boto3
    clients, which hold no state of the saver's, are shared to save their creation)."""
    clients = _CLIENTS.get(endpoint)
    if clients is None:
        from botocore.config import Config

        cfg = Config(max_pool_connections=32)
        clients = _CLIENTS[endpoint] = {
            f"{service}_client": boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", config=cfg)
            for service in ("s3", "dynamodb")
        }
    return make_saver(endpoint, mode, **clients, **kwargs)


def reset(endpoint: str, mode: str) -> None:
    """Empty the moto server (it slows down as it fills up) and set the store up again."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(request).close()
    s = make_saver(endpoint, mode)
    s.setup()
    s.close()


# -- storage, as boto3 sees it ------------------------------------------------------------
def s3(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def objects(endpoint: str, prefix: str = "") -> dict[str, int]:
    """Key -> size of every object under ``prefix``."""
    pages = s3(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def wipe(endpoint: str, prefix: str) -> int:
    """Delete every object under ``prefix`` (a lifecycle rule, by hand): how many."""
    keys = list(objects(endpoint, prefix))
    client = s3(endpoint)
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]})
    return len(keys)


def table_items(endpoint: str) -> list[dict[str, Any]]:
    """Every item of the DynamoDB table (raw), or [] when there is no table."""
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    if TABLE not in client.list_tables()["TableNames"]:
        return []
    return [i for page in client.get_paginator("scan").paginate(TableName=TABLE) for i in page.get("Items", [])]


def item_size(item: dict[str, Any]) -> int:
    """Roughly the bytes of a raw DynamoDB item (names and values)."""

    def size(v: Any) -> int:
        if isinstance(v, dict):
            return sum(len(str(k)) + size(x) for k, x in v.items())
        if isinstance(v, list):
            return sum(size(x) for x in v)
        return len(v) if isinstance(v, (bytes, str)) else len(str(v))

    return size(item)


def mentions(thread_id: str, text: Any) -> bool:
    """Whether a key (object key, or an item's key attribute values) names the thread."""
    from urllib.parse import quote

    return any(form in str(text) for form in {thread_id, quote(thread_id, safe="")})


def leftovers(endpoint: str, thread_id: str) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """What the bucket and the table hold that names ``thread_id`` in its key: the
    objects (key -> size) and the items (their key attributes, size)."""
    found = {k: size for k, size in objects(endpoint).items() if mentions(thread_id, k)}
    items = []
    for item in table_items(endpoint):
        keys = {k: v for k, v in item.items() if k in ("pk", "sk")} or item
        if any(mentions(thread_id, v) for v in keys.values()):
            items.append((repr(keys), item_size(item)))
    return found, items


# -- cutting and interleaving ----------------------------------------------------------------
class Cut:
    """Every round trip of every SyncDriver fails once ``waves`` were sent: the
    process died between two requests."""

    def __init__(self, monkeypatch, waves: int) -> None:
        self.left = waves
        self.fired = False
        lock = threading.Lock()
        real = SyncDriver._wave

        def wave(driver, calls):
            with lock:
                if self.left == 0:
                    self.fired = True
                    raise ConnectionError("the Lambda timed out")
                self.left -= 1
            return real(driver, calls)

        monkeypatch.setattr(SyncDriver, "_wave", wave)


def count_waves(call: Callable[[], Any], monkeypatch) -> int:
    """The round trips ``call`` takes (all savers together)."""
    n = [0]
    real = SyncDriver._wave

    def wave(driver, calls):
        n[0] += 1
        return real(driver, calls)

    with monkeypatch.context() as patch:
        patch.setattr(SyncDriver, "_wave", wave)
        call()
    return n[0]


class Race:
    """Right before the round trip number ``at`` (0-based) of the call under way,
    ``racer()`` runs (another process writes); the racer's own round trips are not
    counted. Deterministic: the call runs on this thread, the racer inside it."""

    def __init__(self, monkeypatch, at: int, racer: Callable[[], Any]) -> None:
        self.at = at
        self.seen = 0
        self.fired = False
        self.raised: BaseException | None = None
        self.result: Any = None
        self.calls: list[tuple[str, ...]] = []  # operations of each counted round trip
        busy = [False]
        real = SyncDriver._wave

        def wave(driver, calls):
            if busy[0]:
                return real(driver, calls)
            if self.seen == self.at and not self.fired:
                self.fired = True
                busy[0] = True
                try:
                    self.result = racer()
                except Exception as exc:  # noqa: BLE001 - the racer's outcome is checked by the test
                    self.raised = exc
                finally:
                    busy[0] = False
            self.seen += 1
            self.calls.append(tuple(c.operation for c in calls))
            return real(driver, calls)

        monkeypatch.setattr(SyncDriver, "_wave", wave)


@contextmanager
def shifted_clock(monkeypatch) -> Iterator[list[float]]:
    """``time.time`` runs ahead by ``offset[0]`` seconds (the saver's clock, and
    everyone's) while the block runs: time passes without sleeping."""
    real = time.time
    offset = [0.0]
    with monkeypatch.context() as patch:
        patch.setattr(time, "time", lambda: real() + offset[0])
        yield offset


# -- threads ------------------------------------------------------------------------------------
def chain(
    saver,
    thread_id: str,
    steps: list[dict[str, Any]],
    ns: str = "",
    run_id: str | None = None,
    parent: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Put one checkpoint per step; a step is {channel: value} of the channels that
    change (new versions), the others are carried from the previous step. Returns
    the configs of the checkpoints put."""
    cfg = parent or config(thread_id, ns)
    state: dict[str, Any] = {}
    versions: dict[str, Any] = {}
    if parent is not None:
        found = saver.get_tuple(parent)
        state = dict(found.checkpoint["channel_values"])
        versions = dict(found.checkpoint["channel_versions"])
    out = []
    for step in steps:
        new = {}
        for ch, value in step.items():
            versions[ch] = new[ch] = saver.get_next_version(versions.get(ch))
            state[ch] = value
        meta = dict(metadata or {})
        if run_id is not None:
            meta["run_id"] = run_id
        cfg = saver.put(cfg, checkpoint(dict(state), dict(versions)), meta, new)
        out.append(cfg)
    return out


def read_all(saver, thread_id: str, ns: str | None = None) -> list[tuple[str, str, dict, list]]:
    """Every checkpoint of the thread (every namespace when ``ns`` is None), read
    whole: (ns, id, values, pending writes), newest first per ``list``."""
    cfg: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if ns is not None:
        cfg["configurable"]["checkpoint_ns"] = ns
    return [
        (
            t.config["configurable"]["checkpoint_ns"],
            t.config["configurable"]["checkpoint_id"],
            t.checkpoint["channel_values"],
            sorted((w[0], w[1], repr(w[2])) for w in t.pending_writes or ()),
        )
        for t in saver.list(cfg)
    ]
