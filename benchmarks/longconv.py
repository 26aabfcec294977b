"""The long-conversation workload (issue 24): one chat thread of many turns.

A plain chat graph, ``StateGraph`` with ``messages`` (add_messages) alone,
START -> agent -> END: each turn is one ``invoke`` of a 1 KB human message, to
which the agent adds one 1 KB AI message, so a turn writes 3 checkpoints (the
input, the step that starts the agent, the agent's). The text is base64 of
seeded random bytes: deterministic and incompressible, so neither a saver that
compresses nor one that deduplicates repeated prose is flattered; only what a
saver stores of the growing list (every version whole, or its changes) shows.

Two child modes (``child.py --mode``), each its own process:

* ``longconv``: the turns through the proxy (metered, one phase per stretch of
  turns), and at each point of ``points(turns)`` (25, 50, 100, 200 by default)
  what the saver stores right then, read straight from moto: the bucket's
  objects split by first key segment (``live/`` values; ``manifests/``,
  ``listing/``: the manifest index), DynamoDB items and their billed sizes; and
  the final state's size, ``JsonPlusSerializer().dumps_typed`` of the latest
  checkpoint's ``channel_values`` read back straight from the store.
* ``longconv-versioned`` (S3Saver): ``longconv`` on a bucket with versioning
  enabled before ``setup()``; each point also has the bytes and count of the
  noncurrent versions (``ListObjectVersions``): every object the saver replaced.
* ``longconv-read``: a fresh process and saver read the thread's latest
  checkpoint (``get_tuple``), then once more warm; checked against the
  messages the turns sent.

The runner's half (the fit, the year cost, the tables) is ``longconv_report``.
Imports only what every venv has (the peers run this too).
"""

from __future__ import annotations

import base64
import hashlib
import random
import time
import traceback
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

MODES = ("longconv", "longconv-read")
# S3Saver's write again on a versioned bucket (replication and Object Lock need
# one): each point also counts the noncurrent versions the bucket keeps.
VERSIONED = "longconv-versioned"
ALL_MODES = (*MODES, VERSIONED)
THREAD = "bench-longconv"
TEXT_CHARS = 1000
DEFAULT_TURNS = 200
# Points where the stored bytes are measured, as fractions of the turns: 25, 50,
# 100, 200 of 200, so a least-squares fit over them gives the growth exponent.
POINT_DIVISORS = (8, 4, 2, 1)


def points(turns: int) -> list[int]:
    return sorted({max(1, round(turns / d)) for d in POINT_DIVISORS})


def text(seed: str) -> str:
    """1,000 characters of base64 of seeded random bytes: the same on every run, incompressible."""
    return base64.b64encode(random.Random(seed).randbytes(TEXT_CHARS * 3 // 4 + 3)).decode()[:TEXT_CHARS]


def turn_input(n: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(id=f"t{n}-human", content=text(f"t{n}-human"))]}


class ChatState(TypedDict):
    messages: Annotated[list, add_messages]


def agent(state: ChatState) -> dict[str, Any]:
    n = state["messages"][-1].id.split("-")[0][1:]  # "t<n>-human": the turn this answers
    return {"messages": [AIMessage(id=f"t{n}-ai", content=text(f"t{n}-ai"))]}


def build_graph(checkpointer: Any) -> Any:
    builder = StateGraph(ChatState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=checkpointer)


def fingerprint(messages: list[Any]) -> dict[str, Any]:
    """What a read must give back: the messages' count, last id and a digest of ids and texts."""
    h = hashlib.sha256()
    for m in messages:
        h.update(f"{m.id}\0{m.type}\0{m.content}\n".encode())
    return {"messages": len(messages), "last": messages[-1].id if messages else None, "sha256": h.hexdigest()}


def expected(n: int) -> dict[str, Any]:
    """The fingerprint of the thread after ``n`` turns, from the texts alone (no saver)."""
    h = hashlib.sha256()
    for t in range(1, n + 1):
        for role, kind in (("human", "human"), ("ai", "ai")):
            h.update(f"t{t}-{role}\0{kind}\0{text(f't{t}-{role}')}\n".encode())
    return {"messages": 2 * n, "last": f"t{n}-ai" if n else None, "sha256": h.hexdigest()}


def _config() -> dict[str, Any]:
    return {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    cause = exc.__cause__  # a saver's own error wrapping the service's answer names only itself
    return f"{text} (from {_error(cause)})" if cause is not None else text


def _close(saver: Any) -> None:
    # As child._close; not imported from there: child.py runs as __main__, and importing
    # benchmarks.child would load it a second time.
    close = getattr(saver, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


# -- measuring what is stored (straight at moto, nothing counted) ------------------------------
def _by_prefix(target: Any) -> dict[str, dict[str, int]]:
    """The bucket's objects by first key segment (the run's bucket holds this thread alone)."""
    import boto3

    out: dict[str, dict[str, int]] = {}
    if not target.has_bucket:
        return out
    s3 = boto3.client("s3", endpoint_url=target.moto, region_name="us-east-1")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=target.bucket):
        for obj in page.get("Contents", []):
            p = out.setdefault(obj["Key"].split("/", 1)[0] + "/", {"objects": 0, "bytes": 0})
            p["objects"] += 1
            p["bytes"] += obj["Size"]
    return out


def final_state(target: Any, n: int) -> dict[str, Any]:
    """The latest checkpoint, read straight from the store by a new saver: its channel_values'
    and its messages' serialized sizes (JsonPlusSerializer.dumps_typed), and whether they are
    the messages the turns sent. A new saver each time: one kept from an earlier point may
    answer from what it saw then (one kept for the s3fs peer found no checkpoint). A saver
    that cannot read it back: its error, and the sizes of the same messages built here (what
    it should have returned)."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()
    out: dict[str, Any] = {}
    reader = None
    try:
        reader = target.build(target.moto)
        values = reader.get_tuple(_config()).checkpoint["channel_values"]
        out["check"] = fingerprint(values.get("messages", [])) == expected(n)
        out["channels"] = sorted(values)
    except Exception as exc:  # noqa: BLE001 - reported, the sizes come from the rebuilt list
        out["read_error"] = _error(exc)
        values = {"messages": [cls(id=f"t{t}-{r}", content=text(f"t{t}-{r}"))
                               for t in range(1, n + 1) for r, cls in (("human", HumanMessage), ("ai", AIMessage))]}
        out["rebuilt"] = True
    finally:
        _close(reader)
    out["state_bytes"] = len(serde.dumps_typed(values)[1])
    out["messages_bytes"] = len(serde.dumps_typed(values.get("messages", []))[1])
    return out


def _versions(target: Any) -> dict[str, int]:
    """The bucket's noncurrent versions (a versioned bucket keeps every object replaced)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=target.moto, region_name="us-east-1")
    out = {"noncurrent_bytes": 0, "noncurrent_versions": 0, "delete_markers": 0}
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=target.bucket):
        for v in page.get("Versions", []):
            if not v["IsLatest"]:
                out["noncurrent_bytes"] += v["Size"]
                out["noncurrent_versions"] += 1
        out["delete_markers"] += len(page.get("DeleteMarkers", []))
    return out


def measure(target: Any, inner: Any, recorder: Any, n: int, versioned: bool = False) -> dict[str, Any]:
    stored = target.stored(inner)
    prefixes = _by_prefix(target)
    live = prefixes.get("live/", {"objects": 0, "bytes": 0})
    s3_saver = target.kind in ("s3", "s3-manifest")
    return {"turns": n, "checkpoints": sum(1 for c in recorder.calls if c.method == "put" and not c.error),
            "s3_bytes": stored["s3_bytes"], "s3_objects": stored["s3_objects"],
            # S3Saver: what is not a value object (live/) is its index (manifests/, listing/).
            "s3_index_bytes": stored["s3_bytes"] - live["bytes"] if s3_saver else 0,
            "s3_index_objects": stored["s3_objects"] - live["objects"] if s3_saver else 0,
            "ddb_bytes": stored["ddb_bytes"], "ddb_items": stored["ddb_items"], "prefixes": prefixes,
            **(_versions(target) if versioned else {}), **final_state(target, n)}


# -- the two child modes ------------------------------------------------------------------------
def run(target: Any, mode: str, turns: int) -> dict[str, Any]:
    if mode == "longconv-read":
        return run_read(target, turns)
    return run_write(target, turns, versioned=mode == VERSIONED)


def run_write(target: Any, turns: int, versioned: bool = False) -> dict[str, Any]:
    """The turns through the proxy, one metered phase per stretch between two points.

    A saver that raises ends the run there: the points measured so far are kept, with
    the error, the turn it happened in and what is stored at that moment."""
    from benchmarks.metered import MeteredSaver, Recorder

    recorder = Recorder()
    if versioned:  # before setup(): the saver reads the bucket's versioning there
        import boto3

        s3 = boto3.client("s3", endpoint_url=target.moto, region_name="us-east-1")
        s3.create_bucket(Bucket=target.bucket)
        s3.put_bucket_versioning(Bucket=target.bucket, VersioningConfiguration={"Status": "Enabled"})
    direct = target.setup()
    inner = target.build(target.proxy)
    metered = MeteredSaver(inner, recorder)
    if versioned:  # this process learns the bucket's versioning in setup(): metered, not a write phase
        metered._run("setup", inner.setup)
    graph = build_graph(metered)
    out: dict[str, Any] = {"turns": turns, "points": [], "phases": [], "seconds": {}}
    marks, n, prev = points(turns), 0, 0
    t0 = time.monotonic()
    try:
        for n in range(1, turns + 1):
            if n == prev + 1:
                recorder.phase = f"turns {prev + 1}-{next(m for m in marks if m >= n)}"
                out["phases"].append(recorder.phase)
            graph.invoke(turn_input(n), {"configurable": {"thread_id": THREAD}})
            if n in marks:
                recorder.phase = "idle"
                out["seconds"][str(n)] = time.monotonic() - t0
                out["points"].append(measure(target, inner, recorder, n, versioned))
                prev = n
    except Exception as exc:  # noqa: BLE001 - a peer that fails keeps its row, saying what failed
        recorder.phase = "idle"
        out.update(error=_error(exc), failed_turn=n, traceback=traceback.format_exc())
        try:
            if n > 1:  # what it held after its last whole turn (a failed first turn: nothing to size)
                out["at_failure"] = measure(target, inner, recorder, n - 1, versioned)
        except Exception as exc2:  # noqa: BLE001
            out["at_failure_error"] = _error(exc2)
    for saver in (inner, direct):
        _close(saver)
    return {"calls": recorder.to_json(), "longconv": out}


def run_read(target: Any, turns: int) -> dict[str, Any]:
    """The latest checkpoint read by a fresh process's first saver (cold), then again (warm)."""
    from benchmarks.metered import MeteredSaver, Recorder

    recorder = Recorder()
    inner = target.build(target.proxy)
    saver = MeteredSaver(inner, recorder)
    want = expected(turns)
    out: dict[str, Any] = {"checks": {}, "errors": {}}
    for phase in ("latest read, cold", "latest read, warm"):
        recorder.phase = phase
        try:
            t = saver.get_tuple(_config())
            got = fingerprint(t.checkpoint["channel_values"].get("messages", [])) if t else None
            out["checks"][phase] = got == want
            if got != want:
                out["errors"][phase] = (f"MISMATCH: {got['messages']} messages up to {got['last']}" if got
                                        else "MISMATCH: no checkpoint")
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out["errors"][phase] = _error(exc)
            out["checks"][phase] = False
        finally:
            recorder.phase = "idle"
    _close(inner)
    return {"calls": recorder.to_json(), "longconv": out}
