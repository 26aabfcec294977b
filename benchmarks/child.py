"""One benchmark run in a fresh process: one saver, one mode.

    python -m benchmarks.child --saver s3 --mode sync --proxy URL --moto URL --out FILE

Modes: ``sync`` and ``async`` run the workload; ``scaling`` makes direct saver
calls on long threads and wide checkpoints; ``grow`` grows the long threads
ahead of ``scaling`` (the runner grows every saver's at once); ``archive``
(S3Saver only) archives the workload's thread, reads it cold and restores it;
``failover`` (S3Saver with a replica region) takes the primary down, reads from
the replica, promotes it and resumes the thread there; ``longconv`` and
``longconv-read`` write and read the long conversation (``benchmarks/longconv.py``);
``scale`` and ``scale-read`` grow many threads and measure the calls whose cost
may grow with them (``benchmarks/scale.py``).
Data a run needs but does not measure (tables, buckets, the long threads) goes
straight to moto, not through the proxy. Writes JSON: the call intervals, phase wall times,
fingerprints and stored bytes; the parent matches the proxy's requests to the
calls.

Runs in the main venv (S3Saver, InMemorySaver) and in the peers' venvs
(benchmarks/peers.py), so it imports only what every venv has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import traceback
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from benchmarks import _guard

_guard.install()

from benchmarks import costs  # noqa: E402
from benchmarks.metered import MeteredSaver, Recorder  # noqa: E402
from benchmarks.peers import PEERS  # noqa: E402


# -- savers --------------------------------------------------------------------------
class Target:
    """How to build a saver against an endpoint, and how to measure what it stores."""

    def __init__(self, kind: str, name: str, moto: str, proxy: str) -> None:
        self.kind, self.name, self.moto, self.proxy = kind, name, moto, proxy
        self.bucket = f"bench-{name}".lower().replace("_", "-")[:63]
        self.table = f"bench-{name}"
        self.replica_bucket = f"{self.bucket[:55]}-replica"  # the failover drill's (child.run_failover)

    # Kinds whose async saver must be constructed inside the running event loop
    # (run_workload builds them there in async mode; build(..., in_loop=True)).
    ASYNC_IN_LOOP = ("peer-s3", "peer-objstore")

    @property
    def has_bucket(self) -> bool:
        return self.kind not in ("memory", "peer-ddb", "peer-ddb-amazon")

    @property
    def tables(self) -> list[str]:
        """The DynamoDB tables this kind writes (scanned for stored bytes)."""
        if self.kind in ("s3", "peer", "peer-gzip", "peer-ddb-amazon"):
            return [self.table]
        if self.kind == "peer-ddb":
            return [self.table, f"{self.table}-writes"]
        return []

    def build(self, endpoint: str, in_loop: bool = False) -> Any:
        if self.kind == "memory":
            from langgraph.checkpoint.memory import InMemorySaver

            return InMemorySaver()
        if self.kind in ("s3", "s3-manifest"):
            from s3_saver import S3Saver

            # Manifest mode: no table, the index lives in the bucket (its own
            # bucket, bench-s3-manifest-<mode>, so nothing mixes with the DynamoDB row's).
            table = self.table if self.kind == "s3" else None
            return S3Saver(self.bucket, table=table, endpoint_url=endpoint, region_name="us-east-1")
        if self.kind in ("peer", "peer-gzip"):
            from langgraph_checkpoint_aws import DynamoDBSaver

            return DynamoDBSaver(
                table_name=self.table,
                region_name="us-east-1",
                endpoint_url=endpoint,
                s3_offload_config={"bucket_name": self.bucket, "endpoint_url": endpoint},
                enable_checkpoint_compression=self.kind == "peer-gzip",
            )
        if self.kind == "peer-s3":
            # langgraph-checkpoint-s3: a boto3 client it is given (sync); in async mode
            # AsyncS3CheckpointSaver, which opens an aioboto3 client per call from the
            # session it is given (here one that adds the endpoint) and must be built
            # inside the running loop (it keeps asyncio.get_running_loop()).
            if in_loop:
                import aioboto3
                from langgraph_checkpoint_s3 import AsyncS3CheckpointSaver

                class Session(aioboto3.Session):  # type: ignore[misc]
                    def client(self, *args: Any, **kwargs: Any) -> Any:
                        kwargs.setdefault("endpoint_url", endpoint)
                        return super().client(*args, **kwargs)

                return AsyncS3CheckpointSaver(self.bucket, session=Session(region_name="us-east-1"))
            import boto3
            from langgraph_checkpoint_s3 import S3CheckpointSaver

            return S3CheckpointSaver(self.bucket, s3_client=boto3.client("s3", endpoint_url=endpoint,
                                                                        region_name="us-east-1"))
        if self.kind == "peer-ddb-amazon":
            # langgraph-checkpoint-amazon-dynamodb: one table (PK/SK); its constructor
            # checks the table exists (DescribeTable), setup() creates it (deploy=True).
            from langgraph_checkpoint_dynamodb import (
                DynamoDBConfig,
                DynamoDBSaver,
                DynamoDBTableConfig,
            )

            return DynamoDBSaver(DynamoDBConfig(table_config=DynamoDBTableConfig(table_name=self.table),
                                                region_name="us-east-1", endpoint_url=endpoint))
        if self.kind == "peer-objstore":
            # langgraph-checkpoint-objectstorage[s3]: an s3fs filesystem from the URI, its
            # storage options naming the endpoint; in async mode an asynchronous s3fs
            # built inside the running loop (s3fs's way for async code).
            from langgraph_checkpoint_objectstorage import ObjectStorageSaver

            opts: dict[str, Any] = {"asynchronous": True} if in_loop else {}
            return ObjectStorageSaver.from_conn_string(f"s3://{self.bucket}/checkpoints", endpoint_url=endpoint,
                                                       client_kwargs={"region_name": "us-east-1"}, **opts)
        if self.kind == "peer-ddb":
            # langgraph-checkpoint-dynamodb: a checkpoints table and a writes table
            # (created by setup() with the keys its README gives).
            from langgraph_checkpoint_dynamodb.saver import (
                DynamoDBSaver,  # its __init__ exports nothing
            )

            return DynamoDBSaver(client_config={"endpoint_url": endpoint, "region_name": "us-east-1"},
                                 checkpoints_table_name=self.tables[0], writes_table_name=self.tables[1])
        raise ValueError(self.kind)

    def setup(self) -> Any:
        """Create the storage (straight at moto) and return a saver that also talks straight to moto."""
        if self.kind == "peer-ddb-amazon":
            # The package's own table creation (its deploy=True path).
            from langgraph_checkpoint_dynamodb import (
                DynamoDBConfig,
                DynamoDBSaver,
                DynamoDBTableConfig,
            )

            return DynamoDBSaver(DynamoDBConfig(table_config=DynamoDBTableConfig(table_name=self.table),
                                                region_name="us-east-1", endpoint_url=self.moto), deploy=True)
        if self.kind in ("peer", "peer-gzip", "peer-ddb"):
            self._create_tables()
        if self.kind in ("peer", "peer-gzip", "peer-s3", "peer-objstore"):
            import boto3

            s3 = boto3.client("s3", endpoint_url=self.moto, region_name="us-east-1")
            try:
                s3.create_bucket(Bucket=self.bucket)
            except s3.exceptions.BucketAlreadyOwnedByYou:
                pass
        direct = self.build(self.moto)
        if self.kind in ("s3", "s3-manifest"):
            direct.setup()
        return direct

    def _create_tables(self) -> None:
        import boto3

        # (table, partition key, sort key): langgraph-checkpoint-aws's PK/SK table;
        # langgraph-checkpoint-dynamodb's two tables as its README's Terraform has them.
        if self.kind == "peer-ddb":
            schema = [(self.tables[0], "thread_id", "checkpoint_id"),
                      (self.tables[1], "thread_id_checkpoint_id_checkpoint_ns", "task_id_idx")]
        else:
            schema = [(self.table, "PK", "SK")]
        ddb = boto3.client("dynamodb", endpoint_url=self.moto, region_name="us-east-1")
        for table, pk, sk in schema:
            try:
                ddb.create_table(
                    TableName=table,
                    KeySchema=[{"AttributeName": pk, "KeyType": "HASH"}, {"AttributeName": sk, "KeyType": "RANGE"}],
                    AttributeDefinitions=[{"AttributeName": pk, "AttributeType": "S"},
                                          {"AttributeName": sk, "AttributeType": "S"}],
                    BillingMode="PAY_PER_REQUEST",
                )
            except ddb.exceptions.ResourceInUseException:
                pass

    def stored(self, inner: Any) -> dict[str, Any]:
        """Bytes and objects/items held right now (read straight from moto)."""
        if self.kind == "memory":
            return {"s3_bytes": 0, "s3_objects": 0, "ddb_bytes": 0, "ddb_items": 0,
                    "memory_bytes": _nested_bytes([inner.storage, inner.writes, inner.blobs])}
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.moto, region_name="us-east-1")
        s3_bytes = s3_objects = 0
        some_keys = []  # in the JSON: what a delete leaves behind
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket) if self.has_bucket else []:
            for obj in page.get("Contents", []):
                s3_bytes += obj["Size"]
                s3_objects += 1
                if len(some_keys) < 10:
                    some_keys.append(f"{obj['Key']} ({obj['Size']} B)")
        ddb_bytes = ddb_items = 0
        ddb = boto3.client("dynamodb", endpoint_url=self.moto, region_name="us-east-1")
        for table in self.tables:
            for page in ddb.get_paginator("scan").paginate(TableName=table):
                for item in page.get("Items", []):
                    ddb_bytes += costs.item_size(item)
                    ddb_items += 1
        return {"s3_bytes": s3_bytes, "s3_objects": s3_objects, "ddb_bytes": ddb_bytes, "ddb_items": ddb_items,
                "s3_some_keys": some_keys}

    def thread_stored(self, thread_id: str) -> dict[str, Any]:
        """What one thread holds right now (read straight from moto), by where it is.

        S3 objects by first key segment (``live/``, ``manifests/``, ``listing/``,
        ``archive/``) with each object's size and class (the year cost bills some
        classes per object), and the DynamoDB items of its partition and listings.
        An object or item is the thread's when the id is a whole segment of its key
        (so ``<thread>-warm-up``, the workload's warm-up thread, is not).
        """
        import boto3

        mine = re.compile(rf"(^|[/!|.]){re.escape(thread_id)}($|[/!|.])")
        s3 = boto3.client("s3", endpoint_url=self.moto, region_name="us-east-1")
        by_prefix: dict[str, dict[str, Any]] = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for obj in page.get("Contents", []):
                if not mine.search(obj["Key"]):
                    continue
                p = by_prefix.setdefault(obj["Key"].split("/", 1)[0] + "/", {"objects": 0, "bytes": 0, "sizes": []})
                p["objects"] += 1
                p["bytes"] += obj["Size"]
                p["sizes"].append([obj["Size"], obj.get("StorageClass") or "STANDARD"])
        ddb_bytes = ddb_items = 0
        if self.kind == "s3":
            ddb = boto3.client("dynamodb", endpoint_url=self.moto, region_name="us-east-1")
            keys = [k["AttributeName"] for k in ddb.describe_table(TableName=self.table)["Table"]["KeySchema"]]
            for page in ddb.get_paginator("scan").paginate(TableName=self.table):
                for item in page.get("Items", []):
                    if mine.search("|".join(str(next(iter(item[k].values()))) for k in keys)):
                        ddb_bytes += costs.item_size(item)
                        ddb_items += 1
        return {"s3": by_prefix, "ddb_bytes": ddb_bytes, "ddb_items": ddb_items}


def _nested_bytes(obj: Any) -> int:
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, str):
        return 0
    if isinstance(obj, dict):
        return sum(_nested_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nested_bytes(v) for v in obj)
    return 0


async def _aclose(saver: Any) -> None:
    close = getattr(saver, "aclose", None)
    if close is not None:
        await close()


def _close(saver: Any) -> None:
    close = getattr(saver, "close", None)
    if close is not None and callable(close):
        try:
            close()
        except Exception:
            pass


# -- workload modes ------------------------------------------------------------------------
def run_workload(target: Target, mode: str, turns: int) -> dict[str, Any]:
    from benchmarks.workload import Workload, build_graph

    recorder = Recorder()
    direct = target.setup()
    stored: dict[str, Any] = {}
    made: dict[str, Any] = {}

    def make(in_loop: bool = False) -> Workload:
        inner = made["inner"] = target.build(target.proxy, in_loop=in_loop)
        saver = MeteredSaver(inner, recorder)
        wl = made["wl"] = Workload(build_graph(saver), saver, recorder, f"bench-{mode}", turns)
        wl.before_delete = lambda: stored.update(before_delete=target.stored(inner))
        return wl

    # A saver that fails (an exception out of the graph or a saver call) ends the run
    # there: the calls, timings and results so far are kept, with the error and the
    # phase it happened in; the runner reports it (and the phases not reached) in the
    # check column instead of dropping the saver.
    failure: dict[str, Any] = {}
    try:
        if mode == "sync":
            results = make().run_sync()
        else:
            async def go() -> dict[str, Any]:
                wl = make(in_loop=target.kind in Target.ASYNC_IN_LOOP)
                try:
                    return await wl.run_async()
                finally:
                    await _aclose(made["inner"])

            results = asyncio.run(go())
    except Exception as exc:
        failure = {"workload_error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}", "failed_phase": recorder.phase,
                   "workload_traceback": traceback.format_exc()}
        results = made["wl"].results if "wl" in made else {}
        if "before_delete" not in stored:  # what the thread holds where it stopped
            stored["before_delete"] = target.stored(made.get("inner"))
            failure["stored_at_failure"] = True
    stored["after_delete"] = target.stored(made.get("inner"))
    _close(made.get("inner"))
    _close(direct)
    timings = made["wl"].timings if "wl" in made else {}
    return {"calls": recorder.to_json(), "timings": timings, "results": results, "stored": stored, **failure}


# -- archival (S3Saver) -------------------------------------------------------------------------
ARCHIVE_CLASSES = ("GLACIER_IR", "DEEP_ARCHIVE")  # an instant class, then a cold one
ARCHIVE_THREAD = "bench-archive"


def run_archive(target: Target, turns: int) -> dict[str, Any]:
    """Archive the workload's thread, read it cold, restore it; in each class of ARCHIVE_CLASSES.

    The thread is the workload's, run straight at moto (latency 0, nothing
    counted) up to where the sync run measures what is stored (before_delete):
    the sync run's own thread must reach its delete phase as it was, and a
    restore rebuilds the index (in manifest mode not byte for byte), so it is
    not archived there. Every measured call goes through the proxy from a
    saver new to the thread, as a scheduled archiver, a reader and an
    operator's restore each are in practice: ``archive_thread``; ``get_state``
    and ``get_state_history`` (a GET of the archive, or ThreadArchivedError for
    a cold class); ``restore_thread``, called again once S3 has restored a cold
    archive (moto restores at once; AWS takes hours). The thread's bytes are
    measured live, archived and restored; both reads and the restored thread
    are checked against the live thread's history.
    """
    from benchmarks.workload import Workload, build_graph, snapshot_fp

    recorder = Recorder()
    direct = target.setup()
    cfg = {"configurable": {"thread_id": ARCHIVE_THREAD}}
    out: dict[str, Any] = {"thread_id": ARCHIVE_THREAD, "stored": {}, "status": {}, "checks": {}, "errors": {}}

    def history(saver: Any) -> list[Any]:
        return [snapshot_fp(s) for s in build_graph(saver).get_state_history(cfg)]

    made: list[Any] = []

    def build(endpoint: str) -> Any:
        made.append(target.build(endpoint))
        return made[-1]

    def fresh() -> MeteredSaver:
        return MeteredSaver(build(target.proxy), recorder)

    def measured(phase: str, fn: Any) -> Any:
        recorder.phase = phase
        try:
            return fn()
        except Exception as exc:  # a cold archive refuses reads: recorded, not a failure
            out["errors"][phase] = f"{type(exc).__name__}: {str(exc)[:200]}"
            return None
        finally:
            recorder.phase = "idle"

    def archival() -> None:
        expected = history(build(target.moto))
        out["history_length"] = len(expected)
        out["stored"]["live"] = target.thread_stored(ARCHIVE_THREAD)
        for cls in ARCHIVE_CLASSES:
            saver = fresh()
            st = measured(f"archive {cls}", lambda: saver.archive_thread(ARCHIVE_THREAD, storage_class=cls))
            out["status"][f"archive {cls}"] = _status(st)
            out["stored"][f"archived {cls}"] = target.thread_stored(ARCHIVE_THREAD)
            reader = build_graph(fresh())

            def read() -> None:
                latest = reader.get_state(cfg)  # raises ThreadArchivedError in a cold class
                snapshots = [latest, *reader.get_state_history(cfg)]
                out["checks"][f"read {cls}"] = [snapshot_fp(x) for x in snapshots] == expected[:1] + expected

            measured(f"read {cls}", read)
            for _ in range(2):  # a cold class: the first call asks S3 for a restore
                restorer = fresh()
                st = measured(f"restore {cls}", lambda: restorer.restore_thread(ARCHIVE_THREAD))
                out["status"].setdefault(f"restore {cls}", []).append(_status(st))
                if st is None or st.state == "live":
                    break
            out["stored"][f"restored {cls}"] = target.thread_stored(ARCHIVE_THREAD)
            out["checks"][f"restore {cls}"] = history(build(target.moto)) == expected

    # The workload's Recorder is a throwaway: nothing of the run up to the hook is measured.
    wl = Workload(build_graph(direct), direct, Recorder(), ARCHIVE_THREAD, turns)
    wl.before_delete = archival
    wl.run_sync()
    for saver in [*made, direct]:
        _close(saver)
    return {"calls": recorder.to_json(), "archive": out}


def _status(st: Any) -> dict[str, Any] | None:
    return None if st is None else asdict(st)


# -- failover drill (S3Saver with a Replica) ----------------------------------------------------
FAILOVER_THREAD = "bench-failover"
FAILOVER_TURNS = 8  # turn 8 interrupts (workload.INTERRUPT_EVERY): left pending, resumed after promote
REPLICA_REGION = costs.REPLICA_REGION
# Per index mode, the replica configurations drilled: (name, global table).
FAILOVER_CONFIGS = {"s3": (("global table", True), ("index rebuilt at promote", False)),
                    "s3-manifest": (("S3 replication", False),)}
FAILOVER_STEPS = ("read, primary up", "read, primary down", "history, primary down",
                  "resume, primary down", "promote", "resume after promote")


def replicate_all(target: Target, global_table: bool) -> dict[str, int]:
    """Replication caught up: every object of the primary bucket copied to the replica
    bucket, and (a global table) every item of the primary table written to the table
    of the same name in the replica region. Straight at moto, nothing counted."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=target.moto, region_name="us-east-1")
    objects = items = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=target.bucket):
        for obj in page.get("Contents", []):
            s3.copy_object(CopySource={"Bucket": target.bucket, "Key": obj["Key"]}, Bucket=target.replica_bucket,
                           Key=obj["Key"])
            objects += 1
    if target.kind == "s3" and global_table:
        src = boto3.client("dynamodb", endpoint_url=target.moto, region_name="us-east-1")
        dst = boto3.client("dynamodb", endpoint_url=target.moto, region_name=REPLICA_REGION)
        for page in src.get_paginator("scan").paginate(TableName=target.table):
            for item in page.get("Items", []):
                dst.put_item(TableName=target.table, Item=item)
                items += 1
    return {"objects": objects, "items": items}


def run_failover(target: Target) -> dict[str, Any]:
    """The failover drill, per replica configuration of the index mode (FAILOVER_CONFIGS).

    A thread of FAILOVER_TURNS turns, its last one interrupted, is written straight at
    moto (latency 0, nothing counted) and replicated whole (``replicate_all``). Then one
    saver, a long-lived process configured with the replica, whose primary is reached
    through a ``Gate`` to the proxy and whose replica (``costs.REPLICA_REGION``) through
    the proxy itself, makes each call of FAILOVER_STEPS, measured: a read with the primary
    up; the gate taken down (every connection to it reset: each attempt counted); a read
    and the history (checked against the primary's before the outage); resuming the
    interrupt (refused); ``promote()``; resuming it again, now written in the replica region.
    """
    from langgraph.types import Command

    from benchmarks.gate import Gate
    from benchmarks.workload import build_graph, snapshot_fp, turn_input
    from s3_saver import PrimaryUnavailableError, Replica, S3Saver

    recorder = Recorder()
    out: dict[str, Any] = {}
    cfg = {"configurable": {"thread_id": FAILOVER_THREAD}}
    proxy_port = int(target.proxy.rsplit(":", 1)[1])
    for config, global_table in FAILOVER_CONFIGS[target.kind]:
        sub = Target(target.kind, f"{target.name}-{'gt' if global_table else 'rb' if target.kind == 's3' else 'r'}",
                     target.moto, target.proxy)
        replica = lambda endpoint: Replica(sub.replica_bucket, region_name=REPLICA_REGION,  # noqa: E731
                                           endpoint_url=endpoint, global_table=global_table)
        direct = sub.setup()
        table = sub.table if sub.kind == "s3" else None
        admin = S3Saver(sub.bucket, table=table, endpoint_url=sub.moto, region_name="us-east-1",
                        replica=replica(sub.moto))
        admin.setup_replica()
        g = build_graph(direct)
        for turn in range(1, FAILOVER_TURNS + 1):
            res = g.invoke(turn_input(turn), cfg)
            if turn < FAILOVER_TURNS:
                while res.get("__interrupt__"):
                    res = g.invoke(Command(resume=f"approved-{turn}"), cfg)
        expected_state = snapshot_fp(g.get_state(cfg))
        expected_history = [snapshot_fp(x) for x in g.get_state_history(cfg)]
        rec: dict[str, Any] = {"global_table": global_table, "replicated": replicate_all(sub, global_table),
                               "history_length": len(expected_history), "interrupted": bool(res.get("__interrupt__")),
                               "refused": {}, "checks": {}, "errors": {}, "served_by": {}, "wall": {}}
        gate = Gate(proxy_port)
        inner = S3Saver(sub.bucket, table=table, endpoint_url=gate.url, region_name="us-east-1",
                        replica=replica(target.proxy))
        saver = MeteredSaver(inner, recorder)
        graph = build_graph(saver)

        raised: dict[str, Exception] = {}

        def step(name: str, fn: Any) -> Any:
            recorder.phase = f"{config}: {name}"
            refused, t0, before = gate.refused, time.perf_counter(), inner.last_read
            try:
                return fn()
            except Exception as exc:
                rec["errors"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                raised[name] = exc
                return None
            finally:
                rec["wall"][name] = time.perf_counter() - t0
                rec["refused"][name] = gate.refused - refused
                src = inner.last_read  # a read in this step sets a new one
                if src is not None and src is not before:
                    rec["served_by"][name] = f"{src.region}" + (" failover" if src.failover else "") + (
                        " stale" if src.stale else "")
                recorder.phase = "idle"

        # Without a global table the replica region has no index before promote: a read
        # is refused (PrimaryUnavailableError naming promote()), never another state.
        no_index = sub.kind == "s3" and not global_table

        def served(name: str, got: Any, expected: Any) -> bool:
            if got == expected:
                return True
            return no_index and got is None and isinstance(raised.get(name), PrimaryUnavailableError)

        try:
            st = step(FAILOVER_STEPS[0], lambda: graph.get_state(cfg))
            rec["checks"][FAILOVER_STEPS[0]] = st is not None and snapshot_fp(st) == expected_state
            gate.down()
            st = step(FAILOVER_STEPS[1], lambda: graph.get_state(cfg))
            rec["checks"][FAILOVER_STEPS[1]] = served(FAILOVER_STEPS[1], st and snapshot_fp(st), expected_state)
            hist = step(FAILOVER_STEPS[2], lambda: [snapshot_fp(x) for x in graph.get_state_history(cfg)])
            rec["checks"][FAILOVER_STEPS[2]] = served(FAILOVER_STEPS[2], hist, expected_history)
            step(FAILOVER_STEPS[3], lambda: graph.invoke(Command(resume=f"approved-{FAILOVER_TURNS}"), cfg))
            # Refused, naming promote(): PrimaryUnavailableError.
            rec["checks"][FAILOVER_STEPS[3]] = isinstance(raised.get(FAILOVER_STEPS[3]), PrimaryUnavailableError)
            promo = step(FAILOVER_STEPS[4], lambda: saver.promote())
            rec["promotion"] = _status(promo)
            rec["checks"][FAILOVER_STEPS[4]] = promo is not None
            res = step(FAILOVER_STEPS[5], lambda: graph.invoke(Command(resume=f"approved-{FAILOVER_TURNS}"), cfg))
            rec["checks"][FAILOVER_STEPS[5]] = bool(
                res and not res.get("__interrupt__") and res["messages"][-1].id == f"t{FAILOVER_TURNS}-ai-answer")
        finally:
            gate.close()
            for x in (inner, admin, direct):
                _close(x)
        out[config] = rec
    return {"calls": recorder.to_json(), "failover": out}


# -- scaling --------------------------------------------------------------------------------
def _value(channel: str, step: int, size: int = 1000) -> str:
    from benchmarks.workload import make_text

    head = f"{channel}@{step}: "
    return head + make_text(f"{channel}@{step}", size - len(head))


def populate(saver: Any, thread_id: str, steps: int, channels: int) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """``steps`` checkpoints; step 0 writes every channel, each later step one channel (round robin).

    Returns the latest config, the running (values, versions) state and all configs.
    """
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    values: dict[str, Any] = {}
    versions: dict[str, Any] = {}
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    configs = []
    for step in range(steps):
        names = [f"ch{i}" for i in range(channels)] if step == 0 else [f"ch{step % channels}"]
        new_versions = {}
        for name in names:
            versions[name] = saver.get_next_version(versions.get(name), None)
            values[name] = _value(name, step)
            new_versions[name] = versions[name]
        ckpt = empty_checkpoint()
        ckpt.update(id=str(uuid6(clock_seq=step)), ts=datetime.now(timezone.utc).isoformat(),
                    channel_values=dict(values), channel_versions=dict(versions), updated_channels=names)
        config = saver.put(config, ckpt, {"source": "loop", "step": step, "parents": {}}, new_versions)
        configs.append(config)
    return config, {"values": values, "versions": versions, "step": steps}, configs


def _next_put(saver: Any, config: dict[str, Any], state: dict[str, Any], channel: str) -> dict[str, Any]:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    step = state["step"]
    state["versions"][channel] = saver.get_next_version(state["versions"].get(channel), None)
    state["values"][channel] = _value(channel, step)
    ckpt = empty_checkpoint()
    ckpt.update(id=str(uuid6(clock_seq=step)), ts=datetime.now(timezone.utc).isoformat(),
                channel_values=dict(state["values"]), channel_versions=dict(state["versions"]),
                updated_channels=[channel])
    state["step"] += 1
    return saver.put(config, ckpt, {"source": "loop", "step": step, "parents": {}},
                     {channel: state["versions"][channel]})


def run_grow(target: Target, lengths: list[int]) -> dict[str, Any]:
    """Grow the scaling mode's threads ahead, straight at moto (latency 0, nothing counted).

    The runner grows every saver's long threads at once, in parallel processes,
    before any scaling run: 10,000 sequential puts per saver would otherwise take
    minutes each. Returns what the scaling run needs to continue each thread.
    """
    direct = target.setup()
    threads: dict[str, Any] = {}
    for length in lengths:
        t0 = time.monotonic()
        latest, state, configs = populate(direct, f"scale-len-{length}", length, 5)
        threads[str(length)] = {"latest": latest, "state": state, "middle": configs[len(configs) // 2],
                                "seconds": time.monotonic() - t0}
    _close(direct)
    return {"threads": threads}


def run_scaling(target: Target, lengths: list[int], grown: dict[str, Any] | None = None) -> dict[str, Any]:
    recorder = Recorder()
    direct = target.setup()
    inner = target.build(target.proxy)
    if target.kind == "memory":
        direct = inner  # nothing to share otherwise
    saver = MeteredSaver(inner, recorder)
    checks: dict[str, Any] = {}
    grow: dict[str, float] = {}

    def measured(label: str, fn: Any) -> Any:
        recorder.phase = label
        try:
            return fn()
        finally:
            recorder.phase = "idle"

    for length in lengths:
        thread = f"scale-len-{length}"
        # Grown straight at moto (latency 0, not counted) with direct saver.put
        # calls, here or ahead by run_grow; then measured through the proxy by a
        # saver that has not seen the thread.
        if grown and str(length) in grown["threads"]:
            g = grown["threads"][str(length)]
            latest, state, middle = g["latest"], g["state"], g["middle"]
            grow[f"len={length}"] = g["seconds"]
        else:
            t0 = time.monotonic()
            latest, state, configs = populate(direct, thread, length, 5)
            grow[f"len={length}"] = time.monotonic() - t0
            middle = configs[len(configs) // 2]
        t = measured(f"len={length} get_tuple(latest)", lambda: saver.get_tuple(
            {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}))
        checks[f"len={length} latest step"] = t.metadata.get("step") if t else None
        t = measured(f"len={length} get_tuple(by id)", lambda: saver.get_tuple(middle))
        checks[f"len={length} by-id step"] = t.metadata.get("step") if t else None
        got = measured(f"len={length} list(limit=5)", lambda: list(saver.list(
            {"configurable": {"thread_id": thread}}, limit=5)))
        checks[f"len={length} list steps"] = [x.metadata.get("step") for x in got]
        new = measured(f"len={length} put", lambda: _next_put(saver, latest, state, "ch1"))
        measured(f"len={length} put_writes", lambda: saver.put_writes(
            new, [("ch2", _value("ch2", -1)), ("ch3", _value("ch3", -1))], "task-1"))
        t = measured(f"len={length} get_tuple(latest, after put)", lambda: saver.get_tuple(
            {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}))
        checks[f"len={length} after put"] = [t.metadata.get("step"), len(t.pending_writes or [])] if t else None

    for width in (5, 50):
        thread = f"scale-width-{width}"
        # Step 0 writes every channel; steps 1..width each rewrite one, so the
        # latest checkpoint's values come from `width` different checkpoints.
        latest, state, _ = populate(direct, thread, width + 1, width)
        t = measured(f"channels={width} get_tuple(latest)", lambda: saver.get_tuple(
            {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}))
        checks[f"channels={width} latest"] = (
            [t.metadata.get("step"), len(t.checkpoint["channel_values"]),
             all(v == state["values"][k] for k, v in t.checkpoint["channel_values"].items())] if t else None)
        measured(f"channels={width} put", lambda: _next_put(saver, latest, state, "ch1"))
    _close(inner)
    if direct is not inner:
        _close(direct)
    return {"calls": recorder.to_json(), "checks": checks, "grow_seconds": grow}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--saver", required=True, choices=["memory", "s3", "s3-manifest", *PEERS])
    ap.add_argument("--name", required=True)
    ap.add_argument("--mode", required=True, choices=["sync", "async", "scaling", "grow", "archive", "failover",
                                                      "longconv", "longconv-read",
                                                      "longconv-versioned", "scale", "scale-read"])
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--moto", required=True)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--lengths", default="10,1000", help="scaling: thread lengths, comma-separated")
    ap.add_argument("--threads", type=int, default=1000, help="scale: threads to grow (or read)")
    ap.add_argument("--grown", help="scaling: JSON written by --mode grow (threads grown ahead)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    target = Target(args.saver, args.name, args.moto, args.proxy)
    t0 = time.monotonic()
    try:
        lengths = [int(n) for n in args.lengths.split(",")]
        if args.mode == "grow":
            data = run_grow(target, lengths)
        elif args.mode == "archive":
            data = run_archive(target, args.turns)
        elif args.mode == "failover":
            data = run_failover(target)
        elif args.mode.startswith("longconv"):  # the long conversation (benchmarks/longconv.py)
            from benchmarks import longconv

            data = longconv.run(target, args.mode, args.turns)
        elif args.mode in ("scale", "scale-read"):  # many threads (benchmarks/scale.py)
            from benchmarks import scale

            data = scale.run(target, args.threads) if args.mode == "scale" else scale.run_read(target, args.threads)
        elif args.mode == "scaling":
            grown = json.loads(open(args.grown).read()) if args.grown else None
            data = run_scaling(target, lengths, grown)
        else:
            data = run_workload(target, args.mode, args.turns)
        data["ok"] = True
    except BaseException as exc:  # reported in the table, not a crash of the whole benchmark
        data = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    data["elapsed"] = time.monotonic() - t0
    with open(args.out, "w") as f:
        json.dump(data, f, default=str)
    sys.exit(0 if data["ok"] else 1)


if __name__ == "__main__":
    main()
