"""Every answer is checked: a 200 the saver cannot read is a named error, never a raw
exception, and never a "saved" that is not stored.

A :class:`faults.FaultProxy` in front of the moto server answers the requests of one
boto3 method with a 200 the saver cannot read (``faults.GARBAGE_KINDS``: a captive
portal's sign-in page, an empty answer, a store's answer cut in half, an answer whose
body was replaced), either always (a portal, a proxy that mangles everything) or once
(a hiccup). For each S3 and DynamoDB method the saver sends, in each index mode where
it sends it, a public call that sends it runs through the proxy, step by step. Each
step either raises an ``S3SaverError`` subclass, or returns: then a saver straight to
the store reads back what the step reported (its checkpoint, copy, delete, archive...).
Anything else (a ``KeyError``, a botocore error) fails the test.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from langgraph.checkpoint.memory import InMemorySaver

from conftest import BUCKET, TABLE, make_saver, make_versioned
from fault_graph import INTERRUPT, build, plain, resume_input, step_input
from faults import GARBAGE_KINDS, FaultProxy, calls
from s3_saver import (
    BucketNotFoundError,
    ConfigurationError,
    Replica,
    S3Saver,
    S3SaverError,
    ThreadArchivedError,
    ThreadDeletedError,
    UnreadableAnswerError,
)
from s3_saver._transport.answers import ANSWERS

TIMEOUTS = Config(read_timeout=2, connect_timeout=1)
T = "t1"
DR_BUCKET = "checkpoints-dr"


def cfg(thread_id: str, **metadata: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if metadata:
        config["metadata"] = metadata
    return config


def state(saver: S3Saver, thread_id: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    snapshot = build(saver).get_state(cfg(thread_id))
    return snapshot.values, tuple(snapshot.next)


def turns(saver: S3Saver, thread_id: str, count: int, **metadata: Any) -> None:
    """``count`` turns of the fault graph (every second one interrupted, then resumed)."""
    graph = build(saver)
    for turn in range(count):
        if graph.invoke(step_input(turn), cfg(thread_id, **metadata)).get(INTERRUPT):
            graph.invoke(resume_input(turn), cfg(thread_id, **metadata))


class Stop(Exception):
    """A step raised an S3SaverError: the scenario ends there."""


@dataclass
class Run:
    """One scenario: ``through`` talks to the store through the proxy, ``direct`` straight."""

    endpoint: str
    proxy: FaultProxy
    mode: str
    driver: str
    method: str
    direct: S3Saver
    through: S3Saver | None = None
    armed: Callable[[], None] = lambda: None
    errors: list[S3SaverError] = field(default_factory=list)

    @property
    def confirmable(self) -> bool:
        """The faulted method's answer can confirm what the call did (see ``Expect.unconfirmed``)."""
        service = "dynamodb" if self.method in DYNAMODB_METHODS else "s3"
        return not ANSWERS[(service, self.method)].unconfirmed

    def saver(self, **kwargs: Any) -> S3Saver:
        self.through = make_saver(self.proxy.url, self.mode, client_config=TIMEOUTS, **kwargs)
        return self.through

    def step(self, label: str, act: Callable[[], Any], verify: Callable[[Any], None] | None = None) -> Any:
        """Run ``act`` through the proxy with the fault armed; a step that returns is
        verified with the direct saver (faults off meanwhile)."""
        self.armed()
        try:
            result = act()
        except S3SaverError as exc:
            self.errors.append(exc)
            raise Stop(label) from exc
        finally:
            self.proxy.configure(enabled=False)
        if verify is not None:
            verify(result)
        return result

    def invoke(self, graph: Any, value: Any, config: dict[str, Any]) -> Any:
        if self.driver == "async":
            return asyncio.run(graph.ainvoke(value, config))
        return graph.invoke(value, config)


def stored(run: Run, thread_id: str) -> Callable[[Any], None]:
    """The invoke's answer is what a saver straight to the store reads."""

    def verify(result: Any) -> None:
        values = {k: v for k, v in plain(result).items() if k != INTERRUPT}
        assert state(run.direct, thread_id)[0] == values

    return verify


def unchanged(run: Run, thread_id: str) -> Callable[[Any], None]:
    before = state(run.direct, thread_id)
    assert before[0], "the scenario's thread holds nothing"
    return lambda _: _assert_equal(state(run.direct, thread_id), before)


def _assert_equal(got: Any, want: Any) -> None:
    assert got == want


# -- scenarios: each sends a set of calls through the proxy -------------------------------
def invoke(run: Run) -> None:
    """Two turns of a graph (an interrupt, then its resume): put, put_writes, get_tuple.
    Each answer is InMemorySaver's for the same steps (a read that lost the thread's
    history would start it afresh), and is what the store holds."""
    graph, ref = build(run.saver()), build(InMemorySaver())

    def same(value: Any) -> Callable[[Any], None]:
        want = plain(ref.invoke(value, cfg(T)))
        held = stored(run, T)

        def verify(result: Any) -> None:
            assert plain(result) == want
            held(result)

        return verify

    for turn in range(2):
        value = step_input(turn)
        result = run.step(f"invoke {turn}", lambda v=value: run.invoke(graph, v, cfg(T)), same(value))
        if result.get(INTERRUPT):
            value = resume_input(turn)
            run.step(f"resume {turn}", lambda v=value: run.invoke(graph, v, cfg(T)), same(value))


def read(run: Run) -> None:
    """get_state (the latest, its pending writes) and the history of a thread."""
    turns(run.direct, T, 2)
    graph = build(run.saver())
    want = state(run.direct, T)
    run.step("get_state", lambda: graph.get_state(cfg(T)), lambda s: _assert_equal((s.values, tuple(s.next)), want))
    history = [s.values for s in build(run.direct).get_state_history(cfg(T))]
    run.step(
        "history", lambda: [s.values for s in graph.get_state_history(cfg(T))], lambda h: _assert_equal(h, history)
    )


def list_all(run: Run) -> None:
    """list(None): every checkpoint of every thread."""
    turns(run.direct, T, 1)
    turns(run.direct, "t2", 1)
    want = sorted(c.checkpoint["id"] for c in run.direct.list(None))
    through = run.saver()
    run.step(
        "list(None)", lambda: sorted(c.checkpoint["id"] for c in through.list(None)), lambda got: _assert_equal(got, want)
    )


def copy(run: Run) -> None:
    turns(run.direct, T, 2)
    through = run.saver()
    run.step(
        "copy_thread",
        lambda: through.copy_thread(T, "t2"),
        lambda _: _assert_equal(state(run.direct, "t2"), state(run.direct, T)),
    )


def threads(run: Run) -> None:
    turns(run.direct, T, 1)
    turns(run.direct, "t2", 1)
    want = sorted(t.thread_id for t in run.direct.list_threads())
    through = run.saver()
    run.step(
        "list_threads", lambda: sorted(t.thread_id for t in through.list_threads()), lambda got: _assert_equal(got, want)
    )


def prune(run: Run) -> None:
    turns(run.direct, T, 2)
    keep = unchanged(run, T)
    through = run.saver()

    def verify(result: Any) -> None:
        keep(result)
        assert len(list(run.direct.list(cfg(T)))) == 1

    run.step("prune", lambda: through.prune([T]), verify)


def delete(run: Run) -> None:
    turns(run.direct, T, 2)
    through = run.saver()
    run.step(
        "delete_thread", lambda: through.delete_thread(T), lambda _: _assert_equal(run.direct.get_tuple(cfg(T)), None)
    )


def deleted_run(run: Run) -> None:
    """A run whose thread is deleted between its objects and its commit: the commit is
    refused, and the run's hint (written beside the commit) is taken back."""
    turns(run.direct, T, 1)
    through = run.saver()
    graph = build(through)
    graph.get_state(cfg(T))  # this process read the thread before the delete
    driver = through._sync
    real, fired = driver._wave, []

    def wave(calls: tuple[Any, ...]) -> list[Any]:
        # The checkpoint's commit, with the run's hint beside it.
        if not fired and {"transact_write_items", "put_item"} <= {c.operation for c in calls}:
            fired.append(True)
            run.direct.delete_thread(T)  # another process, now
        return real(calls)

    driver._wave = wave
    try:
        run.step(
            "invoke",
            lambda: graph.invoke(step_input(1), cfg(T, run_id="r1")),
            lambda _: pytest.fail("a write continuing a deleted thread was reported saved"),
        )
    except Stop:
        if isinstance(run.errors[-1], ThreadDeletedError):
            assert run.direct.threads_of_runs(["r1"]) == {}, "the refused run's hint was left"
        raise


def delete_runs(run: Run) -> None:
    turns(run.direct, T, 1, run_id="r1")
    turns(run.direct, "t2", 1, run_id="r2")
    keep = unchanged(run, "t2")
    through = run.saver()

    def verify(_: Any) -> None:
        assert run.direct.get_tuple(cfg(T)) is None
        keep(None)

    run.step("delete_for_runs", lambda: through.delete_for_runs(["r1"]), verify)


def archive(run: Run) -> None:
    turns(run.direct, T, 2)
    keep = unchanged(run, T)
    through = run.saver()

    def verify(status: Any) -> None:
        assert status.state == "archived"
        keep(None)
        # An archived thread's export is its archive object.
        assert run.direct.export_thread(T) == _object(run.endpoint, status.key)

    run.step("archive_thread", lambda: through.archive_thread(T), verify)


def restore(run: Run) -> None:
    turns(run.direct, T, 2)
    run.direct.archive_thread(T)
    keep = unchanged(run, T)
    through = run.saver()

    def verify(status: Any) -> None:
        assert status.state == "live"
        keep(None)
        assert run.direct.restore_thread(T).state == "live"

    run.step("restore_thread", lambda: through.restore_thread(T), verify)


def restore_cold(run: Run) -> None:
    """A thread archived in a class that is not readable at once: the first restore asks S3."""
    turns(run.direct, T, 1)
    archived = run.direct.archive_thread(T, storage_class="GLACIER")
    through = run.saver()

    def verify(status: Any) -> None:
        assert status.state == "restoring"
        if not run.confirmable:
            # RestoreObject's answer confirms nothing: the next call asks S3 again while
            # the archive shows no restore under way (moto restores at once: live).
            assert run.direct.restore_thread(T).state in ("restoring", "live")
            return
        head = boto3.client("s3", endpoint_url=run.endpoint, region_name="us-east-1").head_object(
            Bucket=BUCKET, Key=archived.key
        )
        assert "Restore" in head, "restore_thread said restoring, S3 was never asked"

    run.step("restore_thread (cold)", lambda: through.restore_thread(T), verify)


def export(run: Run) -> None:
    turns(run.direct, T, 2)
    through = run.saver()

    def verify(data: bytes) -> None:
        run.direct.import_thread(data, thread_id="t9")
        assert state(run.direct, "t9") == state(run.direct, T)

    run.step("export_thread", lambda: through.export_thread(T), verify)


def import_(run: Run) -> None:
    turns(run.direct, T, 2)
    data = run.direct.export_thread(T)
    through = run.saver()
    run.step(
        "import_thread",
        lambda: through.import_thread(data, thread_id="t9"),
        lambda _: _assert_equal(state(run.direct, "t9"), state(run.direct, T)),
    )


def idle(run: Run) -> None:
    turns(run.direct, T, 1)
    keep = unchanged(run, T)
    through = run.saver()

    def verify(report: Any) -> None:
        keep(None)
        assert run.direct.restore_thread(T).state in ("live", "archived")

    run.step("archive_idle", lambda: through.archive_idle(timedelta(0)), verify)


def garbage(run: Run) -> None:
    """collect_garbage: audit (listing, the index), then deletes what no entry names."""
    turns(run.direct, T, 1)
    s3 = boto3.client("s3", endpoint_url=run.endpoint, region_name="us-east-1")
    live = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="live/")["Contents"]]
    orphan = re.sub(r"/checkpoints/[^/]+$", "/checkpoints/1ef00000-0000-6000-8000-000000000000", next(
        k for k in live if "/checkpoints/" in k
    ))
    s3.put_object(Bucket=BUCKET, Key=orphan, Body=b"left by a write cut short")
    keep = unchanged(run, T)
    through = run.saver()

    def verify(report: Any) -> None:
        keep(None)
        left = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="live/").get("Contents", [])}
        assert not set(report.deleted) & left, "reported deleted, still there"

    run.step("collect_garbage", lambda: through.collect_garbage(older_than=timedelta(0)), verify)


def rebuild(run: Run) -> None:
    turns(run.direct, T, 2)
    keep = unchanged(run, T)
    through = run.saver()
    run.step("rebuild_index", lambda: through.rebuild_index(T), keep)


def erase(run: Run) -> None:
    turns(run.direct, T, 2)
    run.direct.delete_thread(T)  # what it leaves behind: noncurrent versions
    turns(run.direct, T, 1)
    through = run.saver()

    def verify(report: Any) -> None:
        assert run.direct.get_tuple(cfg(T)) is None
        if report.complete:
            # Every version of the thread's objects and archives is gone (its manifest
            # keeps the delete record: a deleted thread stays deleted).
            layout = run.direct._ctx.layout
            s3 = boto3.client("s3", endpoint_url=run.endpoint, region_name="us-east-1")
            for prefix in (layout.thread_dir(T), layout.archive_dir(T)):
                page = s3.list_object_versions(Bucket=BUCKET, Prefix=prefix)
                left = [v["Key"] for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
                assert not left, f"reported erased, versions left: {left[:3]}"

    run.step("erase_thread", lambda: through.erase_thread(T), verify)


def _ready(run: Run, saver: S3Saver) -> None:
    """What setup() reported done: the store takes a graph's turn."""
    try:
        saver.check()
    except BucketNotFoundError:
        # HeadBucket's answer confirms nothing (any 200 says "exists"): the next call
        # on the bucket tells, by its name.
        assert not run.confirmable
        return
    turns(saver, "after-setup", 1)
    assert state(saver, "after-setup")[0]


def setup_bucket(run: Run) -> None:
    """setup() on a bucket made beforehand (by infra/, by hand), nothing else there."""
    boto3.client("s3", endpoint_url=run.endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    through = run.saver(ttl=timedelta(days=1))
    run.step("setup", through.setup, lambda _: _ready(run, run.direct))


def setup_empty(run: Run) -> None:
    """setup() on an empty store: it makes the bucket too."""
    through = run.saver()
    run.step("setup", through.setup, lambda _: _ready(run, run.direct))


def setup_replicated(run: Run) -> None:
    """setup() of a saver with a Replica on an empty store: a versioned bucket."""
    table = TABLE if run.mode == "dynamodb" else None
    run.through = S3Saver(
        BUCKET, table=table, endpoint_url=run.proxy.url, region_name="us-east-1", client_config=TIMEOUTS,
        replica=Replica(DR_BUCKET, region_name="us-east-1", endpoint_url=run.proxy.url),
    )

    def verify(_: Any) -> None:
        s3 = boto3.client("s3", endpoint_url=run.endpoint, region_name="us-east-1")
        if run.confirmable:
            assert s3.get_bucket_versioning(Bucket=BUCKET).get("Status") == "Enabled"
            return
        # PutBucketVersioning's answer confirms nothing: the replica's setup, which
        # needs versioning on both buckets, tells.
        replicated = S3Saver(
            BUCKET, table=table, endpoint_url=run.endpoint, region_name="us-east-1",
            replica=Replica(DR_BUCKET, region_name="us-east-1", endpoint_url=run.endpoint),
        )
        try:
            replicated.setup_replica()
        except ConfigurationError as exc:
            assert "versioning" in str(exc)
        else:
            assert s3.get_bucket_versioning(Bucket=BUCKET).get("Status") == "Enabled"
        finally:
            replicated.close()

    run.step("setup", run.through.setup, verify)


def check(run: Run) -> None:
    through = run.saver()
    run.step("check", through.check)


def _object(endpoint: str, key: str) -> bytes:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


# Where each (mode, boto3 method) is sent: the scenario that sends it. Every method of the
# answers table (s3_saver/_transport/answers.py) appears in at least one mode (checked below).
WHERE: dict[str, dict[str, Callable[[Run], None]]] = {
    "dynamodb": {
        "get_item": invoke,
        "query": invoke,
        "put_object": invoke,
        "transact_write_items": invoke,
        "batch_get_item": read,
        "scan": list_all,
        "copy_object": copy,
        "put_item": deleted_run,
        "batch_write_item": delete,
        "update_item": delete,
        "delete_objects": delete,
        "delete_item": deleted_run,
        "get_object": restore,
        "head_object": restore_cold,
        "restore_object": restore_cold,
        "list_objects_v2": garbage,
        "list_object_versions": erase,
        "get_bucket_versioning": erase,
        "head_bucket": check,
        "describe_table": setup_bucket,
        "create_table": setup_bucket,
        "describe_time_to_live": setup_bucket,
        "update_time_to_live": setup_bucket,
        "create_bucket": setup_empty,
    },
    "manifest": {
        "get_object": invoke,
        "put_object": invoke,
        "copy_object": copy,
        "delete_objects": delete,
        "list_objects_v2": threads,
        "head_object": restore_cold,
        "restore_object": restore_cold,
        "list_object_versions": erase,
        "get_bucket_versioning": garbage,
        "get_bucket_lifecycle_configuration": setup_bucket,
        "head_bucket": setup_bucket,
        "create_bucket": setup_empty,
        "put_bucket_versioning": setup_replicated,
    },
}
# Other scenarios, in the full matrix: every public call, each of the methods it sends.
# Every scenario, and the methods it sends in each mode (with no fault): in the full
# matrix each of them answers garbage once, beside WHERE's cases.
SENDS: dict[str, dict[Callable[[Run], None], tuple[str, ...]]] = {
    "dynamodb": {
        invoke: ("batch_get_item", "get_item", "get_object", "put_object", "query", "transact_write_items"),
        read: ("batch_get_item", "get_item", "get_object", "query"),
        list_all: ("get_item", "get_object", "scan"),
        copy: ("batch_write_item", "copy_object", "get_item", "get_object", "query", "transact_write_items"),
        threads: ("get_item", "get_object", "query"),
        prune: ("delete_objects", "get_item", "get_object", "query", "transact_write_items"),
        delete: ("batch_write_item", "delete_item", "delete_objects", "get_item", "get_object", "query",
                 "transact_write_items", "update_item"),
        deleted_run: ("batch_get_item", "delete_item", "delete_objects", "get_item", "put_item", "put_object", "query",
                      "transact_write_items"),
        delete_runs: ("batch_write_item", "delete_objects", "get_item", "get_object", "query", "transact_write_items",
                      "update_item"),
        archive: ("delete_item", "delete_objects", "get_item", "get_object", "put_object", "query",
                  "transact_write_items", "update_item"),
        restore: ("delete_objects", "get_item", "get_object", "put_object", "query", "transact_write_items",
                  "update_item"),
        restore_cold: ("get_item", "get_object", "head_object", "restore_object"),
        export: ("get_item", "get_object", "query"),
        import_: ("batch_write_item", "get_item", "get_object", "put_object", "query", "transact_write_items"),
        idle: ("delete_item", "delete_objects", "get_item", "get_object", "put_object", "query", "transact_write_items",
               "update_item"),
        garbage: ("delete_objects", "get_item", "get_object", "list_objects_v2", "query"),
        rebuild: ("batch_write_item", "get_item", "get_object", "list_objects_v2", "query", "transact_write_items"),
        erase: ("batch_get_item", "batch_write_item", "delete_item", "delete_objects", "get_bucket_versioning",
                "get_item", "get_object", "list_object_versions", "list_objects_v2", "query", "transact_write_items",
                "update_item"),
        check: ("get_item", "get_object", "head_bucket"),
        setup_bucket: ("create_table", "describe_table", "describe_time_to_live", "get_item", "get_object",
                       "head_bucket", "list_objects_v2", "put_item", "put_object", "query", "update_time_to_live"),
        setup_empty: ("create_bucket", "create_table", "describe_table", "get_item", "get_object", "head_bucket",
                      "list_objects_v2", "put_item", "put_object", "query"),
    },
    "manifest": {
        invoke: ("get_object", "put_object"),
        read: ("get_object",),
        list_all: ("get_object", "list_objects_v2"),
        copy: ("copy_object", "get_object", "put_object"),
        threads: ("get_object", "list_objects_v2"),
        prune: ("delete_objects", "get_object", "put_object"),
        delete: ("delete_objects", "get_object", "put_object"),
        delete_runs: ("delete_objects", "get_object", "list_objects_v2", "put_object"),
        archive: ("delete_objects", "get_object", "put_object"),
        restore: ("delete_objects", "get_object", "put_object"),
        restore_cold: ("get_object", "head_object", "restore_object"),
        export: ("get_object",),
        import_: ("get_object", "put_object"),
        idle: ("delete_objects", "get_object", "list_objects_v2", "put_object"),
        garbage: ("delete_objects", "get_bucket_lifecycle_configuration", "get_bucket_versioning", "get_object",
                  "list_objects_v2"),
        rebuild: ("get_object", "list_objects_v2", "put_object"),
        erase: ("delete_objects", "get_bucket_versioning", "get_object", "list_object_versions", "list_objects_v2",
                "put_object"),
        check: ("get_object", "head_bucket"),
        setup_bucket: ("delete_objects", "get_bucket_lifecycle_configuration", "get_bucket_versioning", "get_object",
                       "head_bucket", "list_objects_v2", "put_object"),
        setup_empty: ("create_bucket", "delete_objects", "get_bucket_lifecycle_configuration", "get_bucket_versioning",
                      "get_object", "head_bucket", "list_objects_v2", "put_object"),
        setup_replicated: ("create_bucket", "delete_objects", "get_bucket_lifecycle_configuration",
                           "get_bucket_versioning", "get_object", "head_bucket", "list_objects_v2",
                           "put_bucket_versioning", "put_object"),
    },
}
# make test: the calls of the reported defects (the manifest head's ETag, DynamoDB writes
# reported saved), reads that would lose a thread's history or a listing, setup, an answer
# cut short that keeps its CRC32 header, and one whose body was empty anyway (a confirmed
# success): each mode, both drivers.
QUICK = {
    ("manifest", "put_object", "ok_empty", "always", "sync"),
    ("manifest", "get_object", "ok_html", "once", "async"),
    ("manifest", "list_objects_v2", "ok_html", "always", "sync"),
    ("dynamodb", "transact_write_items", "ok_html", "always", "async"),
    ("dynamodb", "put_object", "ok_truncated", "always", "sync"),
    ("dynamodb", "query", "ok_empty", "always", "sync"),
    ("dynamodb", "scan", "ok_truncated", "once", "sync"),
    ("dynamodb", "describe_table", "ok_replaced", "always", "sync"),
}
PERSISTENCE = ("always", "once")
SETUPS = (setup_bucket, setup_empty, setup_replicated)
# What a scenario ends with when nothing goes wrong.
REFUSED: dict[Callable[[Run], None], type[Exception] | tuple[type[Exception], ...]] = {deleted_run: ThreadDeletedError}
DYNAMODB_METHODS = frozenset(boto3.client("dynamodb", region_name="us-east-1").meta.method_to_api_mapping)


def _cases() -> list[Any]:
    out = []
    for mode, where in WHERE.items():
        for method in where:
            for kind in GARBAGE_KINDS:
                for persist in PERSISTENCE:
                    quick = next((q for q in QUICK if q[:4] == (mode, method, kind, persist)), None)
                    driver = quick[4] if quick else "sync"
                    marks = () if quick else (pytest.mark.slow,)
                    # One parameter: make test keeps every quick case (tests/conftest.py marks a
                    # variant slow when each of its parameter values ran before).
                    case = (mode, method, kind, persist, driver)
                    out.append(pytest.param(case, marks=marks, id="-".join(case)))
    return out


@pytest.fixture
def proxy(endpoint: str):
    with FaultProxy(endpoint) as p:
        p.configure(enabled=False)
        yield p


def run_case(endpoint: str, proxy: FaultProxy, mode: str, method: str, kind: str, persist: str, driver: str,
             scenario: Callable[[Run], None], operations: Callable[[Any], bool] | None = None) -> Run:
    if scenario is erase:
        make_versioned(endpoint)
    direct = make_saver(endpoint, mode)
    if scenario not in SETUPS:
        direct.setup()
    run = Run(endpoint, proxy, mode, driver, method, direct)

    proxy.reset_counts()

    def arm() -> None:
        proxy.configure(kinds=[kind], rate=1.0, operations=operations or calls(method), enabled=True,
                        max_faults=1 if persist == "once" else None)

    run.armed = arm
    try:
        try:
            scenario(run)
        except Stop:
            pass
    finally:
        proxy.configure(enabled=False)
        if run.through is not None:
            run.through.close()
    # Whatever the steps said, the store reads whole: every listed checkpoint reads back.
    if scenario not in SETUPS or not run.errors:
        for thread_id in (T, "t2", "t9"):
            try:
                items = list(direct.list(cfg(thread_id)))
            except ThreadArchivedError:
                continue  # archived in a cold class: not readable at once, by design
            for item in items:
                assert direct.get_tuple(item.config) is not None, f"{thread_id}: {item.checkpoint['id']} dangles"
    direct.close()
    return run


def _other_cases() -> list[Any]:
    """Each (scenario, method) pair that WHERE does not run: garbage of one kind (in turn), always."""
    out = []
    for mode, sends in SENDS.items():
        for scenario, methods in sends.items():
            for method in methods:
                if WHERE[mode].get(method) is scenario:
                    continue
                kind = GARBAGE_KINDS[len(out) % len(GARBAGE_KINDS)]
                out.append(pytest.param(mode, scenario.__name__, method, kind, marks=pytest.mark.slow,
                                        id=f"{mode}-{scenario.__name__}-{method}-{kind}"))
    return out


def judge(run: Run, proxy: FaultProxy, scenario: Callable[[Run], None], kind: str, persist: str) -> None:
    method = run.method
    # The proxy answered at least one of the method's requests with garbage: a case whose
    # scenario stopped sending the method would test nothing.
    assert proxy.faults[kind] or run.errors, f"{method} was never sent by {scenario.__name__}"
    for exc in run.errors:
        assert isinstance(exc, S3SaverError)
    refused = REFUSED.get(scenario, ())
    unexpected = [e for e in run.errors if not isinstance(e, refused)]
    if persist == "once" and kind in ("ok_html", "ok_empty"):
        # A hiccup is ridden out: the call is sent again (every call is safe to send again).
        assert not unexpected, f"one unreadable answer was not retried: {unexpected[0]!r}"
    if persist == "always" and kind in ("ok_html", "ok_empty") and unexpected and run.confirmable:
        # A portal that answers every request: the error names the call, the place, what lacked.
        exc = unexpected[0]
        assert isinstance(exc, UnreadableAnswerError), repr(exc)
        assert (exc.operation, exc.bucket) == (method, BUCKET)
        assert exc.table == (TABLE if method in DYNAMODB_METHODS else None)
        assert exc.region == "us-east-1" and exc.missing and method in str(exc)


@pytest.mark.parametrize("case", _cases())
def test_an_unreadable_answer_is_a_named_error_or_a_confirmed_success(endpoint, proxy, case):
    mode, method, kind, persist, driver = case
    scenario = WHERE[mode][method]
    run = run_case(endpoint, proxy, mode, method, kind, persist, driver, scenario)
    judge(run, proxy, scenario, kind, persist)


@pytest.mark.parametrize(("mode", "scenario", "method", "kind"), _other_cases())
def test_every_call_of_every_scenario(endpoint, proxy, mode, scenario, method, kind):
    chosen = next(s for s in SENDS[mode] if s.__name__ == scenario)
    run = run_case(endpoint, proxy, mode, method, kind, "always", "sync", chosen)
    judge(run, proxy, chosen, kind, "always")


def test_every_method_the_saver_sends_has_a_case():
    """Each boto3 method the saver's code names is in the answers table, and a case
    sends it through the proxy."""
    covered = {("dynamodb" if m in DYNAMODB_METHODS else "s3", m) for where in WHERE.values() for m in where}
    # KMS's calls (encryption=KmsKey) are checked in tests/test_crypto_keys.py: a garbage
    # answer to each, and real ones from moto's KMS through both drivers.
    assert covered == {call for call in ANSWERS if call[0] != "kms"}
    for mode, where in WHERE.items():
        for method, scenario in where.items():
            assert method in SENDS[mode][scenario], (mode, method, scenario.__name__)
    package = Path(__file__).parent.parent / "s3_saver"
    s3 = boto3.client("s3", region_name="us-east-1").meta.method_to_api_mapping
    named = {
        ("dynamodb" if m in DYNAMODB_METHODS else "s3", m)
        for path in package.rglob("*.py")
        for m in re.findall(r'"([a-z][a-z0-9_]+)"', path.read_text())
        if m in DYNAMODB_METHODS or m in s3
    }
    assert named == {call for call in ANSWERS if call[0] != "kms"}
    kms = boto3.client("kms", region_name="us-east-1").meta.method_to_api_mapping
    named_kms = {
        ("kms", m)
        for path in (package / "_crypto").rglob("*.py")  # the keyrings send every KMS call
        for m in re.findall(r'"([a-z][a-z0-9_]+)"', path.read_text())
        if m in kms and m not in s3 and m not in DYNAMODB_METHODS
    }
    assert named_kms == {call for call in ANSWERS if call[0] == "kms"}



def _scenario_cases() -> list[Any]:
    return [pytest.param(mode, scenario.__name__, marks=pytest.mark.slow, id=f"{mode}-{scenario.__name__}")
            for mode, sends in SENDS.items() for scenario in sends]


@pytest.mark.parametrize(("mode", "scenario"), _scenario_cases())
def test_sends_names_what_each_scenario_sends(endpoint, proxy, mode, scenario):
    """SENDS is what each scenario sends through the proxy with no fault: a scenario that
    stopped sending a method would leave that method's garbage case testing nothing, and
    one that began sending a method would leave it untested."""
    chosen = next(s for s in SENDS[mode] if s.__name__ == scenario)
    sent: set[str] = set()

    def watch(req: Any) -> bool:
        sent.add(req.call)
        return False  # never answer garbage: only watch

    run = run_case(endpoint, proxy, mode, "get_object", "ok_html", "always", "sync", chosen, operations=watch)
    assert not [e for e in run.errors if not isinstance(e, REFUSED.get(chosen, ()))], run.errors
    assert sent == set(SENDS[mode][chosen]), f"sent but not listed {sorted(sent - set(SENDS[mode][chosen]))}, listed but not sent {sorted(set(SENDS[mode][chosen]) - sent)}"
