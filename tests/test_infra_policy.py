"""The managed policy in infra/ allows exactly what the saver does.

Nothing here lists the saver's operations. A saver runs real LangGraph graphs on
``invoke`` and ``ainvoke`` and then every public method it offers (found by
introspection, called with arguments chosen by parameter name), while botocore's
``before-parameter-build`` hook records each API call on its sync clients and on
its aioboto3 session. Each call is mapped to the IAM actions and resource ARNs
that authorize it (plus the KMS actions S3 performs for SSE-KMS), and the
template's policy, evaluated for the same bucket, table and prefix, must allow
every one of them and grant nothing that none of them used. An operation the
saver starts calling later is caught by the same test.

``setup()``/``asetup()`` are left out: an operator runs them with broader rights.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import itertools
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import boto3
import pytest
from helpers import grow_thread
from infra_support import (
    ACCOUNT,
    BIG_VALUE_BYTES,
    REGION,
    CallRecorder,
    Request,
    Stack,
    allowed_by,
    authorizations,
    fill_thread_async,
    fill_thread_sync,
    grants,
    load_template,
    narrowed,
    report_graph,
    run_report_async,
    run_report_sync,
)

import s3_saver

if not hasattr(s3_saver, "S3Saver"):
    pytest.skip("s3_saver.S3Saver does not exist yet", allow_module_level=True)

BUCKET = "policy-checkpoints"
TABLE = "policy-index"
PREFIX = "tenant-a/"
KEY_ARN = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/0f0f0f0f-1111-2222-3333-444444444444"
LONG_THREAD = 60  # checkpoints: the manifest seals a segment past 48 (manifest_seal.SEAL_AT)

# Admin calls an operator runs with broader rights: rebuild_index, audit and
# collect_garbage list the bucket, verify lists both regions' buckets,
# setup_replica creates the replica's bucket and table, check (the command line's
# first call) sends HeadBucket, which needs s3:ListBucket.
OPERATOR_ONLY = {
    "check",
    "setup",
    "asetup",
    "rebuild_index",
    "arebuild_index",
    "audit",
    "aaudit",
    "collect_garbage",
    "acollect_garbage",
    "verify",
    "averify",
    "setup_replica",
    "asetup_replica",
    # Key rotation (encryption=): lists the key store; KeyRotationPolicy, see its test.
    "rewrap",
    "arewrap",
    # Turning encryption on (an encrypting saver only; deletes what it migrated): an operator's run.
    "encrypt_thread",
    "aencrypt_thread",
    "encrypt_existing",
    "aencrypt_existing",
}
# Need the opt-in EraseThreadsPolicy beside the saver's: test_erase_policy_covers_what_erase_adds.
ERASE = {"erase_thread", "aerase_thread"}
# Swaps the regions: called on its own by the replica test (a saver without a replica refuses it).
PROMOTE = {"promote", "apromote"}
# Public attributes that are not operations on stored data.
NOT_OPERATIONS = {
    "with_allowlist",
    "get_next_version",
    "close",
    "aclose",
    "config_specs",
    "serde",
    "stats",
    "replica_stats",
    "last_read",
    "deadline",
}


# -- exercising every public method ---------------------------------------------------------
class Exerciser:
    """Calls each public method of a saver with arguments chosen by parameter name.

    Each method gets a thread of its own, filled by a real graph run, so deleting
    or pruning never disturbs another method's data.
    """

    def __init__(self, saver: Any, graph: Any) -> None:
        self.saver = saver
        self.graph = graph
        self.counter = itertools.count()
        self.called: list[str] = []
        self.not_offered: list[str] = []

    def methods(self, *, asynchronous: bool) -> list[tuple[str, Callable[..., Any]]]:
        out = []
        for name, member in inspect.getmembers(type(self.saver)):
            if name.startswith("_") or name in OPERATOR_ONLY | PROMOTE | NOT_OPERATIONS | ERASE:
                continue
            if not callable(member):
                continue
            is_async = inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member)
            if is_async == asynchronous:
                out.append((name, getattr(self.saver, name)))
        return out

    def new_thread(self) -> str:
        return f"exercise-{next(self.counter)}"

    def latest_tuple(self, thread: str, read: Any) -> Any:
        """The tuple the arguments are made from (the saver's latest of ``thread``)."""
        return read

    def arguments(self, method: Callable[..., Any], thread: str, older: dict, target: str) -> list[dict[str, Any]]:
        """Keyword sets to call ``method`` with: required parameters only, then with
        every optional one this test knows a value for."""
        latest = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        tup = self.latest_tuple(thread, self.saver.get_tuple(latest))
        known: dict[str, Any] = {
            # By id: put and put_writes need one; the graph runs read "latest" plenty.
            "config": tup.config if tup else latest,
            "thread_id": thread,
            "thread_ids": [thread],
            "source_thread_id": thread,
            "target_thread_id": target,
            "channels": ["log", "doc", "verdict"],
            "filter": {"source": "loop"},
            "before": older,
            "limit": 2,
        }
        # Archival: archive_idle takes every idle thread; the restore of a Deep
        # Archive archive sends RestoreObject, then (moto restores at once) brings it back.
        known.update(older_than=timedelta(0), storage_class="GLACIER_IR", days=1, tier="Bulk")
        name = method.__name__
        if name in ("restore_thread", "arestore_thread"):
            self.saver.archive_thread(thread, storage_class="DEEP_ARCHIVE")
        if name in ("import_thread", "aimport_thread"):
            # Imported under its own id (the source makes room), then under another.
            known["data"] = self.saver.export_thread(thread)
            known["thread_id"] = target
            self.saver.delete_thread(thread)
        if tup is not None:
            known["run_ids"] = [tup.metadata.get("run_id", "no-run-id")]
            known["checkpoint"] = {**tup.checkpoint, "id": _next_id(tup.checkpoint["id"])}
            known["metadata"] = {"source": "update", "step": 99}
            known["new_versions"] = {}
            known["writes"] = [("log", ["by-exerciser"])]
            known["task_id"] = "exerciser-task"
            known["task_path"] = ""
        required: dict[str, Any] = {}
        optional: dict[str, Any] = {}
        for p in inspect.signature(method).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.default is p.empty:
                if p.name not in known:
                    pytest.fail(
                        f"S3Saver.{method.__name__} has a parameter {p.name!r} this test cannot fill: "
                        "teach Exerciser.arguments() a value for it (or list the method in OPERATOR_ONLY)"
                    )
                required[p.name] = known[p.name]
            elif p.name in known:
                optional[p.name] = known[p.name]
        variants = [required]
        if optional:
            variants.append({**required, **optional})
        # A parameter that may be None often means "everything" (list(None) scans every thread).
        for p in inspect.signature(method).parameters.values():
            if p.name in required and _accepts_none(p):
                variants += [{**v, p.name: None} for v in list(variants)]
        return variants

    def prepare_sync(self) -> tuple[str, dict, str]:
        thread = self.new_thread()
        fill_thread_sync(self.graph, thread)
        return thread, self._older(thread), self.new_thread()

    async def prepare_async(self) -> tuple[str, dict, str]:
        thread = self.new_thread()
        await fill_thread_async(self.graph, thread)
        return thread, self._older(thread), self.new_thread()

    def _older(self, thread: str) -> dict:
        history = list(self.saver.list({"configurable": {"thread_id": thread}}))
        return history[len(history) // 2].config

    def run_sync(self) -> None:
        for name, method in self.methods(asynchronous=False):
            thread, older, target = self.prepare_sync()
            for kwargs in self.arguments(method, thread, older, target):
                try:
                    result = method(**kwargs)
                    if inspect.isgenerator(result) or hasattr(result, "__next__"):
                        list(result)
                except NotImplementedError:
                    self.not_offered.append(name)
                    break
                self.called.append(name)

    async def run_async(self) -> None:
        for name, method in self.methods(asynchronous=True):
            thread, older, target = await self.prepare_async()
            for kwargs in self.arguments(method, thread, older, target):
                try:
                    result = method(**kwargs)
                    if inspect.isasyncgen(result):
                        [x async for x in result]
                    else:
                        await result
                except NotImplementedError:
                    self.not_offered.append(name)
                    break
                self.called.append(name)


def _accepts_none(parameter: inspect.Parameter) -> bool:
    text = str(parameter.annotation)  # a string under `from __future__ import annotations`
    return "None" in text or "Optional" in text


def _next_id(checkpoint_id: str) -> str:
    from langgraph.checkpoint.base.id import uuid6

    new = str(uuid6(clock_seq=-1))
    assert new > checkpoint_id
    return new


def exercise_node_cache_sync(cache: Any) -> None:
    """S3Cache's get, set and clear (sync), each checked to have done its work: the
    first get before any generations document, a hit, a cleared namespace, a clear of all."""
    ns, other = ("graph", "node"), ("graph", "other")
    assert cache.get([(ns, "k")]) == {}
    cache.set({(ns, "k"): ("v", 600), (other, "k"): ("w", None)})
    assert cache.get([(ns, "k"), (other, "k")]) == {(ns, "k"): "v", (other, "k"): "w"}
    cache.clear([ns])
    assert cache.get([(ns, "k"), (other, "k")]) == {(other, "k"): "w"}
    cache.clear()
    assert cache.get([(other, "k")]) == {}


async def exercise_node_cache_async(cache: Any) -> None:
    """The same with aget, aset and aclear."""
    ns, other = ("agraph", "node"), ("agraph", "other")
    assert await cache.aget([(ns, "k")]) == {}
    await cache.aset({(ns, "k"): ("v", 600), (other, "k"): ("w", None)})
    assert await cache.aget([(ns, "k"), (other, "k")]) == {(ns, "k"): "v", (other, "k"): "w"}
    await cache.aclear([ns])
    assert await cache.aget([(ns, "k"), (other, "k")]) == {(other, "k"): "w"}
    await cache.aclear()
    assert await cache.aget([(other, "k")]) == {}


# Over the store's inline limit once packed (values are compressed: random text, so it
# stays large): an object of its own under memory/, in both index modes.
BIG = base64.b64encode(random.Random(7).randbytes(100 * 1024)).decode()


def exercise_memory_sync(store: Any) -> None:
    """S3Store's calls (sync), each checked: a first put into a new namespace (the
    registry), a large value (its own object) replaced by a small one (the old object
    deleted), get, a filtered search, a prefix search, list_namespaces, delete."""
    ns = ("users", "ann")
    store.put(ns, "diet", {"text": "tea", "n": 1})
    store.put(ns, "notes", {"text": BIG})
    assert store.get(ns, "notes").value == {"text": BIG}
    store.put(ns, "notes", {"text": "short"})
    assert [i.key for i in store.search(ns, filter={"n": {"$gte": 1}})] == ["diet"]
    store.put(("users", "bob"), "diet", {"text": "none"})
    assert [i.key for i in store.search(("users",))] == ["diet", "notes", "diet"]
    assert store.list_namespaces(prefix=("users",)) == [("users", "ann"), ("users", "bob")]
    store.delete(ns, "diet")
    assert store.get(ns, "diet") is None


async def exercise_memory_async(store: Any) -> None:
    """The same with the a* forms, on namespaces of their own."""
    ns = ("ausers", "ann")
    await store.aput(ns, "notes", {"text": BIG})
    await store.aput(ns, "notes", {"text": "short"})
    assert (await store.aget(ns, "notes")).value == {"text": "short"}
    assert [i.key for i in await store.asearch(("ausers",))] == ["notes"]
    assert await store.alist_namespaces(prefix=("ausers",)) == [ns]
    await store.adelete(ns, "notes")


# -- the test ----------------------------------------------------------------------------------
def saver_policy(index_mode: str) -> dict[str, Any]:
    """infra/template.yaml's SaverPolicy for the stack deployed with ``IndexMode=index_mode``."""
    table = {"TableName": TABLE} if index_mode == "dynamodb" else {}
    stack = Stack(
        load_template(),
        {"BucketName": BUCKET, "KeyPrefix": PREFIX, "IndexMode": index_mode, **table},
        physical={
            "Bucket": {"Ref": BUCKET, "Arn": f"arn:aws:s3:::{BUCKET}"},
            "Table": {"Ref": TABLE, "Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{TABLE}"},
            "Key": {"Arn": KEY_ARN},
        },
    )
    assert ("Table" in stack.resources) == (index_mode == "dynamodb")
    return stack.properties("SaverPolicy")["PolicyDocument"]


def _recorded_saver(endpoint: str, index_mode: str, s3: Any, dynamodb: Any, session: Any) -> s3_saver.S3Saver:
    """The saver of the mode (its table= as the stack's IndexMode), on the recording clients."""
    return s3_saver.S3Saver(
        BUCKET,
        table=TABLE if index_mode == "dynamodb" else None,
        prefix=PREFIX,
        endpoint_url=endpoint,
        region_name=REGION,
        s3_client=s3,
        dynamodb_client=dynamodb,
        aioboto3_session=session,
    )


@pytest.mark.slow  # make test-all and CI (make test-slow), with the infra linters
def test_managed_policy_allows_exactly_what_the_saver_does(endpoint: str, index_mode: str) -> None:
    """In each index mode (conftest's ``index_mode``: the stack's IndexMode and the
    saver's table= agree), the mode's policy against the mode's request log."""
    s3, dynamodb, session, sync_calls, async_calls = _recorded_clients(endpoint_url=endpoint, region_name=REGION)

    saver = _recorded_saver(endpoint, index_mode, s3, dynamodb, session)
    saver.setup()  # operator's step: not recorded
    saver.stats.reset()
    sync_calls.active = async_calls.active = True

    graph = report_graph(saver)
    exerciser = Exerciser(saver, graph)
    run_report_sync(graph, "sync-user")
    # A long conversation: the manifest seals segments, read by a full history and
    # deleted with the thread (the report graph's threads are too short to seal).
    grow_thread(saver, "long-user", LONG_THREAD)
    assert len(list(saver.list({"configurable": {"thread_id": "long-user"}}))) == LONG_THREAD
    saver.delete_thread("long-user")
    exerciser.run_sync()
    # The node cache on the saver's bucket and prefix (SaverPolicy's NodeCache).
    cache = s3_saver.S3Cache.from_saver(saver)
    exercise_node_cache_sync(cache)
    # The long-term memory on the saver's bucket, prefix and index (SaverPolicy's Memory).
    store = s3_saver.S3Store.from_saver(saver)
    exercise_memory_sync(store)

    async def async_part() -> None:
        await run_report_async(graph, "async-user")
        await exerciser.run_async()
        await exercise_node_cache_async(cache)
        await exercise_memory_async(store)
        await saver.aclose()

    asyncio.run(async_part())
    saver.close()

    # The hooks saw every call the saver counted, from both drivers.
    calls = sync_calls.calls + async_calls.calls
    recorded = {(c.service, c.boto3_name) for c in calls}
    assert set(saver.stats.requests) <= recorded, set(saver.stats.requests) - recorded
    assert sync_calls.calls and async_calls.calls
    assert {"list", "alist", "delete_thread", "adelete_thread", "get_tuple", "aget_tuple"} <= set(exerciser.called)
    assert {"archive_thread", "restore_thread", "arestore_thread", "import_thread", "archive_idle"} <= set(exerciser.called)
    # The scenario reads a value from its own object, so kms:Decrypt is really needed.
    assert ("s3", "GetObject") in sync_calls.operations() and ("s3", "GetObject") in async_calls.operations()

    # Each mode calls only its own index's service.
    assert {c.service for c in calls} == ({"s3", "dynamodb"} if index_mode == "dynamodb" else {"s3"})
    policy = saver_policy(index_mode)
    needed: dict[Request, set[str]] = {}
    for call in calls:
        for request in authorizations(call, kms_key_arn=KEY_ARN):
            needed.setdefault(request, set()).add(call.operation)
    # Shown by pytest when the test fails: what was called, and what that needs.
    print("methods called:", sorted(set(exerciser.called)), "not offered:", sorted(set(exerciser.not_offered)))
    _show(f"{index_mode} mode", calls, needed)
    denied = sorted(
        f"{r.action} on {r.resource} (for {', '.join(sorted(ops))})"
        for r, ops in needed.items()
        if not allowed_by(policy, r)
    )
    assert denied == [], "the managed policy in infra/template.yaml is missing:\n" + "\n".join(denied)

    # Nothing beyond: every action each statement grants, on every resource it names,
    # was needed by at least one call.
    unused = sorted(
        (policy["Statement"][i].get("Sid", str(i)), action, pattern)
        for i, action, pattern in grants(policy)
        if not any(allowed_by(narrowed(policy, i, action, pattern), r) for r in needed)
    )
    assert unused == [], f"the managed policy grants what the saver never used: {unused}"
    assert {r.action for r in needed} == {a for _, a, _ in grants(policy)}


def test_node_cache_is_allowed_by_the_saver_policy(endpoint: str, index_mode: str) -> None:
    """S3Cache beside the saver, in each index mode: every call of its get, set and
    clear (sync and async) is allowed by the mode's SaverPolicy, through its NodeCache
    statement (and the bucket's key). A cheap part of the test above, which checks
    that nothing is granted beyond what the saver and the cache use."""
    s3, dynamodb, session, sync_calls, async_calls = _recorded_clients(endpoint_url=endpoint, region_name=REGION)
    saver = _recorded_saver(endpoint, index_mode, s3, dynamodb, session)
    saver.setup()  # operator's step: not recorded
    cache = s3_saver.S3Cache.from_saver(saver)
    sync_calls.active = async_calls.active = True
    exercise_node_cache_sync(cache)

    async def async_part() -> None:
        await exercise_node_cache_async(cache)
        await saver.aclose()

    asyncio.run(async_part())
    saver.close()

    calls = sync_calls.calls + async_calls.calls
    assert sync_calls.calls and async_calls.calls
    assert {(c.service, c.operation) for c in calls} == {("s3", "GetObject"), ("s3", "PutObject")}
    needed: dict[Request, set[str]] = {}
    for call in calls:
        for request in authorizations(call, kms_key_arn=KEY_ARN):
            needed.setdefault(request, set()).add(call.operation)
    policy = saver_policy(index_mode)
    denied = _denied(policy, needed)
    assert denied == [], "the managed policy in infra/template.yaml is missing, for the node cache:\n" + "\n".join(denied)
    # Its objects are the NodeCache statement's alone (no thread's grant covers them).
    (node_cache,) = [st for st in policy["Statement"] if st.get("Sid") == "NodeCache"]
    objects = {r for r in needed if r.action.startswith("s3:")}
    assert objects and all(r.resource.startswith(f"arn:aws:s3:::{BUCKET}/{PREFIX}node-cache/") for r in objects)
    others = {"Version": "2012-10-17", "Statement": [st for st in policy["Statement"] if st is not node_cache]}
    assert all(not allowed_by(others, r) for r in objects)


def test_memory_is_allowed_by_the_saver_policy(endpoint: str, index_mode: str) -> None:
    """S3Store beside the saver, in each index mode: every call of its put, get, search,
    list_namespaces and delete (sync and async) is allowed by the mode's SaverPolicy. Its
    objects are the Memory statement's alone; in DynamoDB mode its items are the index
    table's (CheckpointIndex). A cheap part of the exact-policy test above."""
    s3, dynamodb, session, sync_calls, async_calls = _recorded_clients(endpoint_url=endpoint, region_name=REGION)
    saver = _recorded_saver(endpoint, index_mode, s3, dynamodb, session)
    saver.setup()  # operator's step: not recorded
    store = s3_saver.S3Store.from_saver(saver)
    sync_calls.active = async_calls.active = True
    exercise_memory_sync(store)

    async def async_part() -> None:
        await exercise_memory_async(store)
        await saver.aclose()

    asyncio.run(async_part())
    saver.close()

    calls = sync_calls.calls + async_calls.calls
    assert sync_calls.calls and async_calls.calls
    # The large value's object is written, read and deleted (DeleteObjects), in both modes.
    assert {("s3", "GetObject"), ("s3", "PutObject"), ("s3", "DeleteObjects")} <= {(c.service, c.operation) for c in calls}
    needed: dict[Request, set[str]] = {}
    for call in calls:
        for request in authorizations(call, kms_key_arn=KEY_ARN):
            needed.setdefault(request, set()).add(call.operation)
    policy = saver_policy(index_mode)
    denied = _denied(policy, needed)
    assert denied == [], "the managed policy in infra/template.yaml is missing, for the memory store:\n" + "\n".join(denied)
    (memory,) = [st for st in policy["Statement"] if st.get("Sid") == "Memory"]
    objects = {r for r in needed if r.action.startswith("s3:Get") or r.action.startswith("s3:Put") or r.action.startswith("s3:Delete")}
    assert objects and all(r.resource.startswith(f"arn:aws:s3:::{BUCKET}/{PREFIX}memory/") for r in objects)
    others = {"Version": "2012-10-17", "Statement": [st for st in policy["Statement"] if st is not memory]}
    assert all(not allowed_by(others, r) for r in objects)


def erase_policy(index_mode: str) -> dict[str, Any]:
    """infra/template.yaml's EraseThreadsPolicy (``ErasePolicy=Enabled``) for the same stack."""
    table = {"TableName": TABLE} if index_mode == "dynamodb" else {}
    stack = Stack(
        load_template(),
        {"BucketName": BUCKET, "KeyPrefix": PREFIX, "IndexMode": index_mode, "ErasePolicy": "Enabled", **table},
        physical={
            "Bucket": {"Ref": BUCKET, "Arn": f"arn:aws:s3:::{BUCKET}"},
            "Table": {"Ref": TABLE, "Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{TABLE}"},
            "Key": {"Arn": KEY_ARN},
        },
    )
    return stack.properties("EraseThreadsPolicy")["PolicyDocument"]


@pytest.mark.slow  # with the other policy tests
def test_erase_policy_covers_what_erase_adds(endpoint: str, index_mode: str) -> None:
    """erase_thread and aerase_thread on an Object Lock bucket (a version held, so
    its lock is read), and the memory store's erase_namespace and aerase_namespace
    (a replaced large value: versions to delete one by one): SaverPolicy and
    EraseThreadsPolicy together allow every call, and each action the erase policy
    grants was needed by one."""
    s3, dynamodb, session, sync_calls, async_calls = _recorded_clients(endpoint_url=endpoint, region_name=REGION)
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)  # versioned
    saver = _recorded_saver(endpoint, index_mode, s3, dynamodb, session)
    saver.setup()
    graph = report_graph(saver)
    run_report_sync(graph, "erase-sync")
    held = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}live/erase-sync/")["Contents"][0]["Key"]
    s3.put_object_legal_hold(Bucket=BUCKET, Key=held, LegalHold={"Status": "ON"})
    store = s3_saver.S3Store.from_saver(saver)
    for ns in (("erase", "sync"), ("erase", "async")):
        store.put(ns, "big", {"text": "x" * 100_000})
        store.put(ns, "big", {"text": "y" * 100_000})
    sync_calls.active = async_calls.active = True
    assert [r.key for r in saver.erase_thread("erase-sync").remaining] == [held]
    assert store.erase_namespace(("erase", "sync")).complete

    async def async_part() -> None:
        await run_report_async(graph, "erase-async")
        assert (await saver.aerase_thread("erase-async")).complete
        assert (await store.aerase_namespace(("erase", "async"))).complete
        await saver.aclose()

    asyncio.run(async_part())
    saver.close()
    calls = sync_calls.calls + async_calls.calls
    needed: dict[Request, set[str]] = {}
    for call in calls:
        for request in authorizations(call, kms_key_arn=KEY_ARN):
            needed.setdefault(request, set()).add(call.operation)
        if call.operation == "HeadObject" and "VersionId" in call.params:
            # Its answer carries the version's lock only with these rights.
            arn = f"arn:aws:s3:::{call.params['Bucket']}/{call.params['Key']}"
            for action in ("s3:GetObjectRetention", "s3:GetObjectLegalHold"):
                needed.setdefault(Request(action, arn), set()).add(call.operation)
    _show(f"{index_mode} mode, erase", calls, needed)
    extra = erase_policy(index_mode)
    both = {"Statement": saver_policy(index_mode)["Statement"] + extra["Statement"]}
    denied = sorted(f"{r.action} on {r.resource} (for {', '.join(sorted(ops))})" for r, ops in needed.items() if not allowed_by(both, r))
    assert denied == [], "SaverPolicy and EraseThreadsPolicy are missing:\n" + "\n".join(denied)
    granted = {a for _, a, _ in grants(extra)}
    used = {r.action for r in needed if allowed_by(extra, r)}
    # s3:DeleteObject: the plain deletes of an unversioned bucket (and of set-aside/, which SaverPolicy lacks).
    assert granted - used <= {"s3:DeleteObject"}, granted - used


# -- the replica region's policies ---------------------------------------------------------------
# infra/replica.yaml's ReplicaReaderPolicy and ReplicaPromotePolicy, checked the same way:
# the primary (behind tests/regions.py's proxy) fills threads that are replicated whole,
# then goes down. Every public method is called: the reads the replica serves (the rest
# raise PrimaryUnavailableError) must need exactly the reader policy. Then promote()
# and every public method in the promoted region: together they must need exactly the
# reader and promote policies, and the promote policy must grant nothing the reader's
# calls alone would not... that the reader already grants (no overlap: test_infra_replica).
REPLICA_KEY_ARN = f"arn:aws:kms:eu-west-1:{ACCOUNT}:key/6f6f6f6f-7777-8888-9999-000000000000"
REPLICA_MODES = ["dynamodb", "global-table", "manifest"]
# The reads a replica must serve during an outage (the README's promise); more may.
REPLICA_READS = {
    "get_tuple",
    "aget_tuple",
    "list",
    "alist",
    "get",
    "aget",
    "list_threads",
    "alist_threads",
    "get_delta_channel_history",
    "aget_delta_channel_history",
}


OUTAGE_MEMORY = ("outage", "ann")


async def exercise_memory_outage(store: Any) -> None:
    """An S3Store's reads while the primary is down (sync and async), served by the
    replica: a get (a value in an object of its own among them), searches, the
    namespaces; its writes are refused there, sending nothing."""
    for get in (store.get, store.aget):
        found = get(OUTAGE_MEMORY, "notes")
        found = await found if inspect.isawaitable(found) else found
        assert found.value == {"text": BIG, "n": 2}
    assert store.last_read.site == "replica", store.last_read
    assert [(i.namespace, i.key) for i in store.search(("outage",), filter={"n": {"$gte": 2}})] == [
        (OUTAGE_MEMORY, "notes"),
        (("outage", "bob"), "diet"),
    ]
    assert [i.key for i in await store.asearch(OUTAGE_MEMORY)] == ["diet", "notes"]
    assert store.list_namespaces(prefix=("outage",)) == [OUTAGE_MEMORY, ("outage", "bob")]
    assert await store.alist_namespaces() == [OUTAGE_MEMORY, ("outage", "bob")]
    assert store.get(("outage", "nobody"), "k") is None  # a namespace never written: nothing there
    with pytest.raises(s3_saver.PrimaryUnavailableError):
        store.put(OUTAGE_MEMORY, "diet", {"text": "coffee"})
    with pytest.raises(s3_saver.PrimaryUnavailableError):
        await store.adelete(OUTAGE_MEMORY, "diet")


def replica_policies(mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from infra_support import REPLICA_TEMPLATE
    from regions import REPLICA_BUCKET, REPLICA_REGION, TABLE_NAME

    stack = Stack(
        load_template(REPLICA_TEMPLATE),
        {"BucketName": REPLICA_BUCKET, "TableName": TABLE_NAME, "KeyPrefix": PREFIX, "IndexMode": mode},
        physical={
            "Bucket": {"Ref": REPLICA_BUCKET, "Arn": f"arn:aws:s3:::{REPLICA_BUCKET}"},
            "Table": {"Ref": TABLE_NAME, "Arn": f"arn:aws:dynamodb:{REPLICA_REGION}:{ACCOUNT}:table/{TABLE_NAME}"},
            "Key": {"Arn": REPLICA_KEY_ARN},
        },
        region=REPLICA_REGION,
    )
    return (
        stack.properties("ReplicaReaderPolicy")["PolicyDocument"],
        stack.properties("ReplicaPromotePolicy")["PolicyDocument"],
    )


class OutageExerciser(Exerciser):
    """Every public method on a thread filled before the outage. Nothing can be
    written, so all methods share the threads; a write (or a method whose argument
    preparation writes) raises PrimaryUnavailableError and counts as a write."""

    def __init__(self, saver: Any, graph: Any, threads: list[str]) -> None:
        super().__init__(saver, graph)
        self.threads = threads
        self.served: list[str] = []
        self.refused: list[str] = []
        # Read on the primary before the outage: arguments for the writes when the
        # replica has no index yet (DynamoDB mode before promote() rebuilt it).
        self.before = {t: saver.get_tuple({"configurable": {"thread_id": t, "checkpoint_ns": ""}}) for t in threads}
        self.before_older = {t: Exerciser._older(self, t) for t in threads}
        self.failed: list[tuple[str, str]] = []  # (method, error) other than PrimaryUnavailableError

    def latest_tuple(self, thread: str, read: Any) -> Any:
        return read if read is not None else self.before[thread]

    def _older(self, thread: str) -> dict:
        history = list(self.saver.list({"configurable": {"thread_id": thread}}))
        return history[len(history) // 2].config if history else self.before_older[thread]

    def run_sync(self) -> None:
        for name, method in self.methods(asynchronous=False):
            for thread in self.threads:
                self._call(name, lambda kwargs, m=method: _drain_sync(m(**kwargs)), thread, method)

    async def run_async(self) -> None:
        for name, method in self.methods(asynchronous=True):
            for thread in self.threads:
                await self._acall(name, method, thread)

    def _variants(self, method: Callable[..., Any], thread: str) -> list[dict[str, Any]] | None:
        try:
            return self.arguments(method, thread, self._older(thread), "outage-target")
        except s3_saver.PrimaryUnavailableError:
            return None

    def _stopped(self, name: str, exc: Exception) -> None:
        """A method that did not complete: a refused write, one not offered, or a failure."""
        if isinstance(exc, s3_saver.PrimaryUnavailableError):
            self.refused.append(name)
        elif isinstance(exc, NotImplementedError):
            self.not_offered.append(name)
        else:
            self.failed.append((name, f"{type(exc).__name__}: {exc}"[:300]))

    def _call(self, name: str, run: Callable[[dict], Any], thread: str, method: Callable[..., Any]) -> None:
        variants = self._variants(method, thread)
        if variants is None:
            self.refused.append(name)
            return
        for kwargs in variants:
            try:
                run(kwargs)
            except (s3_saver.S3SaverError, NotImplementedError) as exc:
                self._stopped(name, exc)
                return
            self.served.append(name)

    async def _acall(self, name: str, method: Callable[..., Any], thread: str) -> None:
        variants = self._variants(method, thread)
        if variants is None:
            self.refused.append(name)
            return
        for kwargs in variants:
            try:
                result = method(**kwargs)
                if inspect.isasyncgen(result):
                    [x async for x in result]
                else:
                    await result
            except (s3_saver.S3SaverError, NotImplementedError) as exc:
                self._stopped(name, exc)
                return
            self.served.append(name)


def _recorded_clients(**client_args: Any) -> tuple[Any, Any, Any, CallRecorder, CallRecorder]:
    """boto3 S3 and DynamoDB clients and an aioboto3 session, each call they send
    recorded (sync and async apart; recording starts when a recorder is made active)."""
    import aioboto3

    s3, dynamodb = boto3.client("s3", **client_args), boto3.client("dynamodb", **client_args)
    session = aioboto3.Session(region_name=client_args["region_name"])
    sync_calls, async_calls = CallRecorder(active=False), CallRecorder(active=False)
    sync_calls.attach(s3.meta.events)
    sync_calls.attach(dynamodb.meta.events)
    async_calls.attach(session.events)
    return s3, dynamodb, session, sync_calls, async_calls


def _drain_sync(result: Any) -> None:
    if inspect.isgenerator(result) or hasattr(result, "__next__"):
        list(result)


def _needed(calls: list[Any]) -> dict[Request, set[str]]:
    from regions import REPLICA_REGION

    needed: dict[Request, set[str]] = {}
    for call in calls:
        for request in authorizations(call, kms_key_arn=REPLICA_KEY_ARN, region=REPLICA_REGION):
            needed.setdefault(request, set()).add(call.operation)
    return needed


def _denied(policy: dict[str, Any], needed: dict[Request, set[str]]) -> list[str]:
    return sorted(
        f"{r.action} on {r.resource} (for {', '.join(sorted(ops))})" for r, ops in needed.items() if not allowed_by(policy, r)
    )


def _unused(policy: dict[str, Any], needed: dict[Request, set[str]]) -> list[tuple[str, str, str]]:
    return sorted(
        (policy["Statement"][i].get("Sid", str(i)), action, pattern)
        for i, action, pattern in grants(policy)
        if not any(allowed_by(narrowed(policy, i, action, pattern), r) for r in needed)
    )


def _show(title: str, calls: list[Any], needed: dict[Request, set[str]]) -> None:
    print(f"-- {title}")
    for service, operation in sorted({(c.service, c.operation) for c in calls}):
        actions = sorted({r.action for r, ops in needed.items() if operation in ops})
        statuses = sorted({c.status for c in calls if c.operation == operation}, key=str)
        print(f"{service}.{operation} {statuses} -> {', '.join(actions)}")
    # Which sub-prefix each S3 action touched (<bucket>/<prefix><sub>/...).
    where: dict[str, set[str]] = {}
    for r in needed:
        if r.action.startswith("s3:") and "/" in r.resource.split(":::", 1)[1]:
            sub = r.resource.split(":::", 1)[1].split("/")[2]
            where.setdefault(r.action, set()).add(sub)
    print("   s3 actions by sub-prefix:", {a: sorted(s) for a, s in sorted(where.items())})
    # s3:ListBucket with no s3:prefix: a GET or HEAD answered 404 (see authorizations()).
    listed = {dict(r.context).get("s3:prefix", "(none: a 404)") for r in needed if r.action == "s3:ListBucket"}
    print("   s3:ListBucket s3:prefix values:", sorted(listed))
    missing = {"/".join(c.params["Key"].split("/")[:2]) for c in calls if c.status == 404 and "Key" in c.params}
    print("   keys answered 404 under:", sorted(missing))


@pytest.mark.slow  # make test-all and CI (make test-slow): every public method in both regions, three times
@pytest.mark.parametrize("mode", REPLICA_MODES)
def test_replica_policies_allow_exactly_what_the_saver_does(regions: Any, mode: str) -> None:
    from botocore.config import Config
    from regions import REPLICA_REGION, Replicator

    index_mode = "manifest" if mode == "manifest" else "dynamodb"
    # The replica region's clients, recorded (the primary's are the saver's own, via the proxy).
    config = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 2})
    s3, dynamodb, session, sync_calls, async_calls = _recorded_clients(
        endpoint_url=regions.moto, region_name=REPLICA_REGION, config=config
    )
    saver = regions.make_saver(
        index_mode,
        prefix=PREFIX,
        global_table=mode == "global-table",
        recheck_after=3600,  # once fallen over, reads stay on the replica
        replica_kw={"s3_client": s3, "dynamodb_client": dynamodb, "aioboto3_session": session},
    )
    # What replica.yaml creates (operator's step: not recorded), and replication: the
    # bucket's objects, and the table's items only for a global table.
    saver.setup_replica()
    replicator = Replicator.between(regions.primary, regions.replica, tables=mode == "global-table")
    if mode == "global-table":
        assert regions.replica.dynamodb.describe_table(TableName=regions.replica.table)

    graph = report_graph(saver)

    async def scenario() -> tuple[list[Any], list[Any], OutageExerciser, Exerciser]:
        # 1. Threads written on the primary: one archived, one long enough for the
        #    manifest to seal segments; all of it replicates. Then one more
        #    checkpoint, whose value's object never arrives (replication lag).
        fill_thread_sync(graph, "sync-user")
        await fill_thread_async(graph, "async-user")
        fill_thread_sync(graph, "archived-user")
        saver.archive_thread("archived-user")
        grow_thread(saver, "long-user", LONG_THREAD)
        fill_thread_sync(graph, "lagging-user")
        # The long-term memory beside the threads, where this region can answer for it
        # (from_saver refuses a table that promote() rebuilds: none of its items would be there).
        store = None
        if mode == "dynamodb":
            with pytest.raises(s3_saver.ConfigurationError, match="global_table=True"):
                s3_saver.S3Store.from_saver(saver)
        else:
            store = s3_saver.S3Store.from_saver(saver)
            store.put(OUTAGE_MEMORY, "diet", {"text": "tea", "n": 1})
            store.put(OUTAGE_MEMORY, "notes", {"text": BIG, "n": 2})  # an object of its own
            store.put(("outage", "bob"), "diet", {"text": "none", "n": 3})
        replicator.run()
        assert replicator.pending == []
        lagging = {"configurable": {"thread_id": "lagging-user"}}
        graph.update_state(lagging, {"doc": "e" * BIG_VALUE_BYTES})
        replicator.capture()
        late = replicator.drop_pending(lambda e: e.kind == "object" and "/blobs/" in e.key)
        assert late
        replicator.deliver()

        # 2. Outage: every public method; the replica serves the reads.
        outage = OutageExerciser(saver, graph, ["sync-user", "async-user", "archived-user", "long-user"])
        regions.proxy.refuse()
        sync_calls.active = async_calls.active = True
        outage.run_sync()
        await outage.run_async()
        nowhere = {"configurable": {"thread_id": "never-written", "checkpoint_ns": ""}}
        if mode != "dynamodb":
            assert saver.get_tuple(nowhere) is None and await saver.aget_tuple(nowhere) is None
            assert list(saver.list(nowhere)) == [] and [c async for c in saver.alist(nowhere)] == []
        if store is not None:
            await exercise_memory_outage(store)
        if mode == "dynamodb":
            # No index in the replica region before promote() rebuilds it: reads are refused.
            with pytest.raises(s3_saver.PrimaryUnavailableError, match=r"promote\(\)"):
                saver.get_tuple(lagging)
        else:
            # The lagging checkpoint is passed over: its parent, and the read says so.
            saver.get_tuple(lagging)
            assert saver.last_read.site == "replica" and saver.last_read.skipped, saver.last_read
        sync_calls.active = async_calls.active = False
        read_calls = sync_calls.calls + async_calls.calls
        sync_calls.calls, async_calls.calls = [], []
        # The late object arrives (else list(None) there would name the gap forever).
        replicator.pending.extend(late)
        replicator.deliver()

        # 3. Failover: promote, then the saver's whole life in the promoted region.
        sync_calls.active = async_calls.active = True
        promotion = saver.promote() if mode != "global-table" else await saver.apromote()
        assert promotion.checked is False  # the primary is down
        assert (promotion.rebuilt is not None) == (mode == "dynamodb")
        promoted = Exerciser(saver, graph)
        run_report_sync(graph, "promoted-sync-user")
        grow_thread(saver, "promoted-long-user", LONG_THREAD)  # sealed segments, then deleted
        saver.delete_thread("promoted-long-user")
        promoted.run_sync()
        await run_report_async(graph, "promoted-async-user")
        await promoted.run_async()
        if store is not None:
            # The memory store moved with the saver: its whole life in the promoted region.
            exercise_memory_sync(store)
            await exercise_memory_async(store)
        await saver.aclose()
        sync_calls.active = async_calls.active = False
        return read_calls, sync_calls.calls + async_calls.calls, outage, promoted

    read_calls, promote_calls, outage, promoted = asyncio.run(scenario())
    saver.close()

    served, refused = set(outage.served), set(outage.refused)
    print("served by the replica:", sorted(served))
    print("refused (writes):", sorted(refused - served))
    print("failed otherwise:", outage.failed)
    if mode == "dynamodb":
        # DynamoDB mode without a global table has no index there before promote():
        # every read is refused, naming promote(), and the replica is not read.
        assert not served & REPLICA_READS, served & REPLICA_READS
    else:
        # A read either answers or names replication lag, nothing else.
        assert [f for f in outage.failed if not f[1].startswith("ReplicationLagError")] == []
        assert REPLICA_READS <= served, REPLICA_READS - served
    assert {"put", "aput", "put_writes", "aput_writes", "delete_thread", "adelete_thread"} <= refused - served
    assert {"list", "alist", "delete_thread", "adelete_thread", "archive_thread", "restore_thread"} <= set(promoted.called)
    assert promote_calls and (read_calls or mode == "dynamodb")
    assert {c.status for c in read_calls} <= {200, 206, 404}, "every replica call answered"

    reader, promote = replica_policies(mode)
    read_needed = _needed(read_calls)
    _show("reads during the outage", read_calls, read_needed)
    assert _denied(reader, read_needed) == [], "ReplicaReaderPolicy is missing what the outage reads need"
    if mode != "dynamodb":
        # Exactly the outage's reads. (Without a replicated index nothing is read
        # there before promote(): the promoted saver uses the whole policy.)
        assert _unused(reader, read_needed) == [], "ReplicaReaderPolicy grants what no outage read used"

    both = {"Version": "2012-10-17", "Statement": [*reader["Statement"], *promote["Statement"]]}
    all_needed = _needed(read_calls + promote_calls)
    promote_needed = _needed(promote_calls)
    _show("promote() and the promoted saver", promote_calls, promote_needed)
    assert _denied(both, all_needed) == [], "ReplicaReaderPolicy + ReplicaPromotePolicy miss what promote() needs"
    assert _unused(promote, promote_needed) == [], "ReplicaPromotePolicy grants what no call after promote() used"
    assert _unused(both, all_needed) == [], "the replica policies grant what the saver never used"
    assert {r.action for r in all_needed} == {a for _, a, _ in grants(both)}


# -- thread encryption (ThreadEncryption) ------------------------------------------------------
KEY_BUCKET = f"{BUCKET}-keys"


def encryption_policies(index_mode: str, thread_key_arn: str | None, **extra: str) -> dict[str, dict[str, Any]]:
    """SaverPolicy, EraseThreadsPolicy and KeyRotationPolicy (when made) of the stack with
    ``ThreadEncryption=KmsKey`` (None: ``Disabled``), ``ErasePolicy=Enabled``."""
    table = {"TableName": TABLE} if index_mode == "dynamodb" else {}
    encryption = {"ThreadEncryption": "KmsKey", "ThreadKmsKeyArn": thread_key_arn} if thread_key_arn else {}
    stack = Stack(
        load_template(),
        {"BucketName": BUCKET, "KeyPrefix": PREFIX, "IndexMode": index_mode, "ErasePolicy": "Enabled", **table, **encryption, **extra},
        physical={
            "Bucket": {"Ref": BUCKET, "Arn": f"arn:aws:s3:::{BUCKET}"},
            "KeyBucket": {"Ref": KEY_BUCKET, "Arn": f"arn:aws:s3:::{KEY_BUCKET}"},
            "Table": {"Ref": TABLE, "Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{TABLE}"},
            "Key": {"Arn": KEY_ARN},
        },
    )
    assert ("KeyBucket" in stack.resources) == bool(thread_key_arn)
    names = ("SaverPolicy", "EraseThreadsPolicy", "KeyRotationPolicy")
    return {n: stack.properties(n)["PolicyDocument"] for n in names if n in stack.resources}


def _joined(*policies: dict[str, Any]) -> dict[str, Any]:
    return {"Statement": [s for p in policies for s in p["Statement"]]}


@pytest.mark.slow  # with the other policy tests that run graphs
def test_thread_encryption_grants_allow_what_an_encrypting_saver_does(endpoint: str, index_mode: str) -> None:
    """A saver with ``encryption=KmsKey`` runs a graph on invoke and ainvoke and erases
    each thread (a new thread's key made, a cold process's unwrapped, the key destroyed):
    SaverPolicy and EraseThreadsPolicy of the stack with ``ThreadEncryption=KmsKey`` allow
    every call (the KMS calls the saver sends itself included), each grant the encryption
    adds was needed, and the stack without it refuses the key store and the KMS key."""
    s3, dynamodb, session, sync_calls, async_calls = _recorded_clients(endpoint_url=endpoint, region_name=REGION)
    kms_session = boto3.Session(region_name=REGION)  # the saver's own KMS client, recorded
    sync_calls.attach(kms_session.events)
    kms = boto3.client("kms", endpoint_url=endpoint, region_name=REGION)
    key_arn = kms.create_key(Description="thread keys")["KeyMetadata"]["Arn"]
    s3.create_bucket(Bucket=BUCKET)

    def saver_of() -> s3_saver.S3Saver:
        return s3_saver.S3Saver(
            BUCKET,
            table=TABLE if index_mode == "dynamodb" else None,
            prefix=PREFIX,
            endpoint_url=endpoint,
            region_name=REGION,
            s3_client=s3,
            dynamodb_client=dynamodb,
            aioboto3_session=session,
            boto3_session=kms_session,
            encryption=s3_saver.KmsKey(key_arn),
        )

    saver_of().setup()
    sync_calls.active = async_calls.active = True
    writer = saver_of()
    run_report_sync(report_graph(writer), "enc-sync")
    cold = saver_of()  # a process that has not seen the thread: GET the record, Decrypt
    assert cold.get_tuple({"configurable": {"thread_id": "enc-sync", "checkpoint_ns": ""}}) is not None
    assert cold.erase_thread("enc-sync").key_destroyed_at is not None

    async def async_part() -> None:
        graph = report_graph(writer)
        await run_report_async(graph, "enc-async")
        assert (await writer.aerase_thread("enc-async")).key_destroyed_at is not None
        await writer.aclose()

    asyncio.run(async_part())
    # The memory store and node cache of the encrypting saver: a namespace's key made,
    # a cold process's unwrapped, the store-wide key of the cache, an erase of a namespace.
    exercise_memory_sync(s3_saver.S3Store.from_saver(writer))
    assert s3_saver.S3Store.from_saver(cold).get(("users", "ann"), "notes").value == {"text": "short"}
    s3_saver.S3Cache.from_saver(writer).set({(("node", "n"), "c"): ({"text": "cached"}, None)})
    assert s3_saver.S3Store.from_saver(cold).erase_namespace(("users",)).complete
    for s in (writer, cold):
        s.close()
    calls = sync_calls.calls + async_calls.calls
    needed: dict[Request, set[str]] = {}
    for call in calls:
        for request in authorizations(call, kms_key_arn=KEY_ARN):
            needed.setdefault(request, set()).add(call.operation)
    _show(f"{index_mode} mode, encrypted", calls, needed)
    assert {c.operation for c in calls if c.service == "kms"} == {"GenerateDataKey", "Decrypt"}

    policies = encryption_policies(index_mode, key_arn)
    both = _joined(policies["SaverPolicy"], policies["EraseThreadsPolicy"])
    assert _denied(both, needed) == [], "SaverPolicy and EraseThreadsPolicy are missing"
    added = {"ThreadKeyRecords", "ThreadKeyRecordsMissing", "ThreadKeyRecordsEncryption", "ThreadKeys", "MemoryKeys"}
    assert added <= {s.get("Sid") for s in policies["SaverPolicy"]["Statement"]}
    assert [u for u in _unused(policies["SaverPolicy"], needed) if u[0] in added] == []
    # Without ThreadEncryption: the key store's records and the threads' KMS key are refused.
    plain = encryption_policies(index_mode, None)
    refused = _denied(_joined(plain["SaverPolicy"], plain["EraseThreadsPolicy"]), needed)
    # (and the key bucket's SSE-KMS through S3, under the bucket's key)
    assert refused and all(KEY_BUCKET in line or key_arn in line or KEY_ARN in line for line in refused), refused
    assert any(line.startswith(f"kms:GenerateDataKey on {key_arn}") for line in refused)
    assert any(line.startswith(f"kms:Decrypt on {key_arn}") for line in refused)
    assert any(line.startswith(f"s3:PutObject on arn:aws:s3:::{KEY_BUCKET}/{PREFIX}t/") for line in refused)


def test_key_rotation_policy_allows_exactly_what_rewrap_adds(endpoint: str) -> None:
    """rewrap from the threads' KMS key to RotationTargetKmsKeyArn (KMS to KMS) needs
    SaverPolicy and KeyRotationPolicy together; KeyRotationPolicy grants nothing it did not
    use, and SaverPolicy alone refuses the ReEncrypt (the application's role cannot rotate)."""
    s3, dynamodb, session, sync_calls, async_calls = _recorded_clients(endpoint_url=endpoint, region_name=REGION)
    kms_session = boto3.Session(region_name=REGION)
    sync_calls.attach(kms_session.events)
    kms = boto3.client("kms", endpoint_url=endpoint, region_name=REGION)
    old, new = (kms.create_key(Description=d)["KeyMetadata"]["Arn"] for d in ("old", "new"))
    s3.create_bucket(Bucket=BUCKET)
    saver = s3_saver.S3Saver(
        BUCKET, prefix=PREFIX, endpoint_url=endpoint, region_name=REGION, s3_client=s3, dynamodb_client=dynamodb,
        aioboto3_session=session, boto3_session=kms_session, encryption=s3_saver.KmsKey(old),
    )
    saver.setup()
    run_report_sync(report_graph(saver), "rotated")
    s3_saver.S3Store.from_saver(saver).put(("users", "ann"), "diet", {"text": "tea"})  # a namespace's key too
    rotator = s3_saver.S3Saver(
        BUCKET, prefix=PREFIX, endpoint_url=endpoint, region_name=REGION, s3_client=s3, dynamodb_client=dynamodb,
        aioboto3_session=session, boto3_session=kms_session, encryption=s3_saver.KmsKey(old),
    )
    rotator.check()
    sync_calls.active = True
    assert rotator.rewrap(s3_saver.KmsKey(new)).rewrapped == 2  # the thread's key and the namespace's
    saver.close()
    rotator.close()
    needed: dict[Request, set[str]] = {}
    for call in sync_calls.calls:
        for request in authorizations(call, kms_key_arn=KEY_ARN):
            needed.setdefault(request, set()).add(call.operation)
    _show("rewrap", sync_calls.calls, needed)
    policies = encryption_policies("manifest", old, RotationTargetKmsKeyArn=new)
    assert _denied(_joined(policies["SaverPolicy"], policies["KeyRotationPolicy"]), needed) == []
    assert _unused(policies["KeyRotationPolicy"], needed) == []
    alone = _denied(policies["SaverPolicy"], needed)
    assert alone and all("kms:ReEncrypt" in line or "kms:DescribeKey" in line for line in alone), alone
    assert "KeyRotationPolicy" not in encryption_policies("manifest", old)


# -- thread encryption in the replica region ---------------------------------------------------
def replica_encryption_policies(mode: str, thread_key_arn: str) -> dict[str, dict[str, Any]]:
    """The replica stack's two policies with ``ThreadEncryption=KmsKey`` (the key's replica
    given by ARN), and the primary stack's EraseThreadsPolicy (it covers the replica bucket)."""
    from infra_support import REPLICA_TEMPLATE
    from regions import PRIMARY_BUCKET, REPLICA_BUCKET, REPLICA_REGION, TABLE_NAME

    keys = f"{REPLICA_BUCKET}-keys"
    replica = Stack(
        load_template(REPLICA_TEMPLATE),
        {
            "BucketName": REPLICA_BUCKET,
            "TableName": TABLE_NAME,
            "KeyPrefix": PREFIX,
            "IndexMode": mode,
            "ThreadEncryption": "KmsKey",
            "ThreadKmsKeyArn": thread_key_arn,
        },
        physical={
            "Bucket": {"Ref": REPLICA_BUCKET, "Arn": f"arn:aws:s3:::{REPLICA_BUCKET}"},
            "KeyBucket": {"Ref": keys, "Arn": f"arn:aws:s3:::{keys}"},
            "Table": {"Ref": TABLE_NAME, "Arn": f"arn:aws:dynamodb:{REPLICA_REGION}:{ACCOUNT}:table/{TABLE_NAME}"},
            "Key": {"Arn": REPLICA_KEY_ARN},
        },
        region=REPLICA_REGION,
    )
    primary = Stack(
        load_template(),
        {
            "BucketName": PRIMARY_BUCKET,
            "KeyPrefix": PREFIX,
            "IndexMode": "manifest" if mode == "manifest" else "dynamodb",
            "ErasePolicy": "Enabled",
            "ReplicaRegion": REPLICA_REGION,
            "ReplicaBucketName": REPLICA_BUCKET,
            "ReplicaKmsKeyArn": REPLICA_KEY_ARN,
        },
        physical={"Bucket": {"Ref": PRIMARY_BUCKET, "Arn": f"arn:aws:s3:::{PRIMARY_BUCKET}"}},
    )
    return {
        "reader": replica.properties("ReplicaReaderPolicy")["PolicyDocument"],
        "promote": replica.properties("ReplicaPromotePolicy")["PolicyDocument"],
        "erase": primary.properties("EraseThreadsPolicy")["PolicyDocument"],
    }


REPLICA_ENCRYPTION_GRANTS = {
    "ThreadKeyRecords",
    "ThreadKeyRecordsMissing",
    "ThreadKeyRecordsEncryption",
    "ThreadKeys",
    "PromotedThreadKeyRecords",
    "PromotedThreadKeyRecordsEncryption",
    "PromotedThreadKeys",
}


@pytest.mark.slow  # with the other policy tests that run graphs
@pytest.mark.parametrize("mode", ["dynamodb", "manifest"])
def test_replica_policies_with_thread_encryption_allow_a_promoted_encrypting_saver(regions: Any, mode: str) -> None:
    """replica.yaml with ``ThreadEncryption=KmsKey``: a thread written on the primary, read in
    the replica region by a process that never saw it (manifest mode: during the outage;
    DynamoDB mode: promote()'s rebuild reads its key), then after promote() a new thread
    written there (its key made in that region's store under that region's replica of the
    KMS key), read back, and erased (its key destroyed there). Every call
    sent to the replica region is allowed by ReplicaReaderPolicy + ReplicaPromotePolicy (and
    the primary stack's EraseThreadsPolicy for the erase's version deletes); each
    encryption grant of the two was used; without ThreadEncryption they refuse the key store
    and the threads' key."""
    from botocore.config import Config
    from regions import REPLICA_BUCKET, REPLICA_REGION
    from test_crypto_replica import _multi_region_key

    config = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 2})
    s3, dynamodb, session, sync_calls, async_calls = _recorded_clients(
        endpoint_url=regions.moto, region_name=REPLICA_REGION, config=config
    )
    kms_session = boto3.Session(region_name=REPLICA_REGION)  # the replica region's KMS client, recorded
    sync_calls.attach(kms_session.events)
    _multi_region_key(regions.moto)
    primary_kms = boto3.client("kms", endpoint_url=regions.moto, region_name="us-east-1")
    key_arn = primary_kms.describe_key(KeyId="alias/checkpoints")["KeyMetadata"]["Arn"]
    replica_key_arn = key_arn.replace(":us-east-1:", f":{REPLICA_REGION}:")
    replica_kw = {"s3_client": s3, "dynamodb_client": dynamodb, "aioboto3_session": session, "boto3_session": kms_session}

    def saver_of(setup: bool = False) -> s3_saver.S3Saver:
        return regions.make_saver(
            mode, prefix=PREFIX, recheck_after=3600, encryption=s3_saver.KmsKey(key_arn), replica_kw=replica_kw, setup=setup
        )

    writer = saver_of(setup=True)
    writer.setup_replica()  # the replica stack's step (not recorded)
    fill_thread_sync(report_graph(writer), "before")
    regions.replicator.run()
    before = {"configurable": {"thread_id": "before", "checkpoint_ns": ""}}

    regions.proxy.refuse()
    sync_calls.active = async_calls.active = True
    if mode == "manifest":
        # 1. The outage: a process that never saw the thread reads it from the replica.
        cold = saver_of()
        assert cold.get_tuple(before) is not None and cold.last_read.site == "replica"
    # 2. promote(), then a new thread's life in the promoted region.
    promotion = writer.promote()
    assert (promotion.rebuilt is not None) == (mode == "dynamodb")
    run_report_sync(report_graph(writer), "promoted")
    promoted = {"configurable": {"thread_id": "promoted", "checkpoint_ns": ""}}
    assert writer.get_tuple(promoted) is not None and writer.get_tuple(before) is not None
    # An erase destroys the key in both regions' stores (it refuses to go on while one
    # does not answer): the old primary's region is back, still not the writer.
    regions.proxy.up()
    report = writer.erase_thread("promoted")
    assert report.key_destroyed_at is not None
    assert writer.get_tuple(promoted) is None
    sync_calls.active = async_calls.active = False
    calls = sync_calls.calls + async_calls.calls

    needed = _needed(calls)
    _show(f"{mode} mode, encrypted, replica region", calls, needed)
    kms_calls = {(c.operation, c.params["KeyId"]) for c in calls if c.service == "kms"}
    assert kms_calls == {("GenerateDataKey", replica_key_arn), ("Decrypt", replica_key_arn)}, kms_calls
    assert any(c.params.get("Bucket") == f"{REPLICA_BUCKET}-keys" and c.operation == "PutObject" for c in calls)

    policies = replica_encryption_policies(mode, replica_key_arn)
    allowed = _joined(policies["reader"], policies["promote"], policies["erase"])
    assert _denied(allowed, needed) == [], "the replica policies (and EraseThreadsPolicy) are missing"
    # (The memory store's records, m/, are the memory tests'; no store runs here.)
    unused = [
        u
        for u in _unused(_joined(policies["reader"], policies["promote"]), needed)
        if u[0] in REPLICA_ENCRYPTION_GRANTS and not u[2].endswith("/m/*")
    ]
    assert unused == [], "an encryption grant of the replica policies was not needed"
    # Without ThreadEncryption, the replica policies refuse the key store and the threads' key.
    reader, promote = replica_policies(mode)
    refused = _denied(_joined(reader, promote, policies["erase"]), needed)
    # (and the key store's SSE-KMS through S3, under the replica stack's key)
    assert refused and all(
        f"{REPLICA_BUCKET}-keys" in line or replica_key_arn in line or REPLICA_KEY_ARN in line for line in refused
    ), refused
    assert any(line.startswith(f"kms:GenerateDataKey on {replica_key_arn}") for line in refused)
    assert any(line.startswith(f"kms:Decrypt on {replica_key_arn}") for line in refused)
