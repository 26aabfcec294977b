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
import inspect
import itertools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import boto3
import pytest
from infra_support import (
    ACCOUNT,
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

# Admin calls an operator runs with broader rights: rebuild_index lists the bucket.
OPERATOR_ONLY = {"setup", "asetup", "rebuild_index", "arebuild_index"}
# Public attributes that are not operations on stored data.
NOT_OPERATIONS = {"with_allowlist", "get_next_version", "close", "aclose", "config_specs", "serde", "stats", "deadline"}


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
            if name.startswith("_") or name in OPERATOR_ONLY or name in NOT_OPERATIONS:
                continue
            if not callable(member):
                continue
            is_async = inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member)
            if is_async == asynchronous:
                out.append((name, getattr(self.saver, name)))
        return out

    def new_thread(self) -> str:
        return f"exercise-{next(self.counter)}"

    def arguments(self, method: Callable[..., Any], thread: str, older: dict, target: str) -> list[dict[str, Any]]:
        """Keyword sets to call ``method`` with: required parameters only, then with
        every optional one this test knows a value for."""
        latest = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        tup = self.saver.get_tuple(latest)
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


# -- the test ----------------------------------------------------------------------------------
def saver_policy() -> dict[str, Any]:
    stack = Stack(
        load_template(),
        {"BucketName": BUCKET, "TableName": TABLE, "KeyPrefix": PREFIX},
        physical={
            "Bucket": {"Ref": BUCKET, "Arn": f"arn:aws:s3:::{BUCKET}"},
            "Table": {"Ref": TABLE, "Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{TABLE}"},
            "Key": {"Arn": KEY_ARN},
        },
    )
    return stack.properties("SaverPolicy")["PolicyDocument"]


def test_managed_policy_allows_exactly_what_the_saver_does(endpoint: str) -> None:
    import aioboto3

    client_args = {"endpoint_url": endpoint, "region_name": REGION}
    s3 = boto3.client("s3", **client_args)
    dynamodb = boto3.client("dynamodb", **client_args)
    session = aioboto3.Session(region_name=REGION)
    sync_calls, async_calls = CallRecorder(active=False), CallRecorder(active=False)
    sync_calls.attach(s3.meta.events)
    sync_calls.attach(dynamodb.meta.events)
    async_calls.attach(session.events)

    saver = s3_saver.S3Saver(
        BUCKET,
        table=TABLE,
        prefix=PREFIX,
        endpoint_url=endpoint,
        region_name=REGION,
        s3_client=s3,
        dynamodb_client=dynamodb,
        aioboto3_session=session,
    )
    saver.setup()  # operator's step: not recorded
    saver.stats.reset()
    sync_calls.active = async_calls.active = True

    graph = report_graph(saver)
    exerciser = Exerciser(saver, graph)
    run_report_sync(graph, "sync-user")
    exerciser.run_sync()

    async def async_part() -> None:
        await run_report_async(graph, "async-user")
        await exerciser.run_async()
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

    policy = saver_policy()
    needed: dict[Request, set[str]] = {}
    for call in calls:
        for request in authorizations(call, kms_key_arn=KEY_ARN):
            needed.setdefault(request, set()).add(call.operation)
    # Shown by pytest when the test fails: what was called, and what that needs.
    print("methods called:", sorted(set(exerciser.called)), "not offered:", sorted(set(exerciser.not_offered)))
    for service, operation in sorted({(c.service, c.operation) for c in calls}):
        actions = sorted({r.action for r, ops in needed.items() if operation in ops})
        print(f"{service}.{operation} -> {', '.join(actions)}")
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
