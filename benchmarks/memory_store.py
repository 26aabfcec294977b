"""Long-term memory: S3Store (both index modes) beside langgraph-checkpoint-aws's DynamoDBStore.

    python -m benchmarks.memory_store [--variants plain,ttl] [--head-sizes 10,100,1000,5000]

The workload (``plan``, deterministic, no network): 1,000 items over 50 user
namespaces (``("memories", "user-NN")``; ``user-00`` holds 100 of them, the others
18-19 each), values of 0.2-4 KB of prose-like text with a ``kind`` and an
``importance``, embedded by ``HashEmbeddings`` (a fixed bag-of-words hash, 256
dimensions: no model, no network) on the ``text`` field. The 1,000 puts (``load``),
then 1,000 calls mixed as an agent makes them (``mix``): 35% ``get``, 25% ``put``
(7 in 10 overwrite a memory, 3 in 10 add one), 15% ``search`` with an equality
filter, 5% plain ``search``, 15% semantic ``search(query=...)`` (a third of them
filtered too), 5% ``list_namespaces`` pages; then one of each call on the 100-item
namespace (``targets``: the issue's per-call targets). Every call is one
``BaseStore`` method call, one at a time, from one process (a server's, warm after
the first call: every store makes one unmeasured ``get`` first).

Two variants: ``plain`` (no TTL) and ``ttl`` (``TTLConfig(default_ttl=30 days,
refresh_on_read=True)``, what a memory that forgets unused items is configured with).

Each store runs in a child process of its own (``child``), the peer in its own
virtualenv (benchmarks/.venv-peer), against moto behind the counting proxy
(``benchmarks/proxy.py``): requests, round trips, bytes and DynamoDB units per call,
priced by ``benchmarks/costs.py`` (the checkpointer bench's price table); then what
the store keeps, read straight at moto, priced for a year. Each call's answer is
compared with InMemoryStore's on the same calls (``check``).

DynamoDBStore's semantic search is DynamoDB's ``SearchVectors``, which moto does not
have: the peer runs every call but those (its puts still embed and store the vectors),
and the tables show every total with and without the semantic searches.

``heads`` (manifest mode's per-namespace head, and the DynamoDB index beside it):
one namespace grown to 10, 100, 1,000 and 5,000 items (the workload's items, straight
at moto), and at each size a new process's get, the same process's get, put
(overwrite and new key) and searches (plain, filtered, semantic), each through the
proxy: requests, round trips, bytes and milliseconds per call, and the head's size.

The runner half (``main``) prints the tables and writes
``benchmarks/results/memory-latest.{json,txt,md}``. The child half imports only what
every venv has (the standard library, langgraph, boto3).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import sys
import time
import traceback
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

from benchmarks import _guard

_guard.install()

from benchmarks import costs  # noqa: E402

SEED = 43
DIMS = 256
NAMESPACES = 50
ITEMS = 1_000
BIG_NAMESPACE = 100  # items of user-00: the "namespace of 100 small items"
MIX = 1_000
KINDS = ("fact", "preference", "episode", "instruction")
LIMIT = 10  # search(limit=...): BaseStore's default
PAGE = 20  # list_namespaces(limit=PAGE)
TTL_MINUTES = 30 * 24 * 60
VARIANTS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "ttl": {"default_ttl": TTL_MINUTES, "refresh_on_read": True},
}
STORES = {
    "memory": "InMemoryStore (reference, no I/O)",
    "s3": "S3Store (DynamoDB index)",
    "s3-manifest": "S3Store (manifest index)",
    "peer": "DynamoDBStore (langgraph-checkpoint-aws)",
}
SEMANTIC = "search (query)"
KIND_ORDER = ("put (new namespace)", "put", "get", "search", "search (filter)", SEMANTIC, "list_namespaces")
HEAD_SIZES = (10, 100, 1_000, 5_000)
HEAD_CALLS = ("get (new process)", "get", "put (overwrite)", "put (new key)", "search", "search (filter)", SEMANTIC)
HEAD_GROW_BATCH = 250  # puts per batch while a namespace grows (one head swap each in manifest mode)


# -- the workload (pure) -----------------------------------------------------------------------
def _embeddings_base() -> type:
    from langchain_core.embeddings import Embeddings

    return Embeddings


class HashEmbeddings(_embeddings_base()):  # type: ignore[misc]
    """A fixed fake embedding: each word hashed (SHA-256) to one of ``dims`` buckets with a
    sign, plus a dense pseudo-random part seeded by the text, normalised. Texts that share
    words score higher, as with a model; every component is a full-precision float, so the
    vectors compress as little as a model's do (a bag of words alone is mostly zeros and a
    few distinct values, which zlib would shrink ten times over); the same in every process
    and venv. A LangChain ``Embeddings`` (what ``ensure_embeddings`` and DynamoDBStore take)."""

    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims

    def _one(self, text: str) -> list[float]:
        noise = random.Random(hashlib.sha256(text.encode()).digest())
        v = [noise.gauss(0.0, 0.05) for _ in range(self.dims)]
        words = re.findall(r"[a-z]+", text.lower())
        for word in words:
            h = hashlib.sha256(word.encode()).digest()
            v[int.from_bytes(h[:4], "little") % self.dims] += (1.0 if h[4] & 1 else -1.0) / math.sqrt(len(words))
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return self.embed_query(text)


def index_config() -> dict[str, Any]:
    return {"dims": DIMS, "embed": HashEmbeddings(DIMS), "fields": ["text"]}


def make_value(seed: str, rng: random.Random) -> dict[str, Any]:
    """A memory of 0.2-4 KB (its JSON), mostly text."""
    from benchmarks.workload import make_text

    size = rng.randint(200, 4_000)
    return {"text": make_text(seed, max(40, size - 70)), "kind": rng.choice(KINDS), "importance": rng.randint(1, 5)}


def user(i: int) -> tuple[str, str]:
    return ("memories", f"user-{i:02d}")


def plan(seed: int = SEED, items: int = ITEMS, mix: int = MIX) -> list[dict[str, Any]]:
    """The calls, in order: ``{"phase", "kind", "ns", ...}`` (JSON-able, the same in every venv)."""
    rng = random.Random(seed)
    rest = items - BIG_NAMESPACE
    counts = [BIG_NAMESPACE] + [rest // (NAMESPACES - 1) + (1 if i < rest % (NAMESPACES - 1) else 0)
                                for i in range(NAMESPACES - 1)]
    order = [n for n, c in enumerate(counts) for _ in range(c)]
    rng.shuffle(order)  # users active at once
    keys: dict[int, int] = defaultdict(int)  # next key number per namespace: creation order = key order
    versions: Counter[str] = Counter()
    ops: list[dict[str, Any]] = []

    def new_key(n: int) -> str:
        keys[n] += 1
        return f"mem-{keys[n] - 1:04d}"

    def put(phase: str, n: int, key: str) -> dict[str, Any]:
        versions[f"{n}/{key}"] += 1
        value = make_value(f"{n}/{key}/{versions[f'{n}/{key}']}", rng)
        return {"phase": phase, "kind": "put", "ns": user(n), "key": key, "value": value}

    seen: set[int] = set()
    for n in order:
        op = put("load", n, new_key(n))
        if n not in seen:
            op["kind"] = "put (new namespace)"
            seen.add(n)
        ops.append(op)

    def query() -> str:
        from benchmarks.workload import make_text

        return make_text(f"q{rng.random()}", 60)

    weights = (("get", 35), ("put", 25), ("search (filter)", 15), ("search", 5), (SEMANTIC, 15), ("list_namespaces", 5))
    kinds = [k for k, _ in weights]
    cum = list(_accumulate(w for _, w in weights))
    for _ in range(mix):
        kind = rng.choices(kinds, cum_weights=cum)[0]
        n = rng.randrange(NAMESPACES)
        ops.append(_mix_op(kind, n, rng, keys, put, new_key, query))
    # The per-call targets, on the namespace of 100 items (and more, by now): a get,
    # an overwrite and a new key, a search plain, filtered, semantic, semantic and filtered,
    # and a list_namespaces page.
    big, ns = 0, user(0)
    targets = [{"kind": "get", "ns": ns, "key": "mem-0002"}, put("targets", big, "mem-0001"),
               put("targets", big, new_key(big)), {"kind": "search", "ns": ns},
               {"kind": "search (filter)", "ns": ns, "filter": {"kind": "preference"}},
               {"kind": SEMANTIC, "ns": ns, "query": query()},
               {"kind": SEMANTIC, "ns": ns, "query": query(), "filter": {"kind": "preference"}},
               {"kind": "list_namespaces", "offset": 0}]
    ops += [{**op, "phase": "targets"} for op in targets]
    return ops


def _accumulate(values: Any) -> Any:
    total = 0
    for v in values:
        total += v
        yield total


def _mix_op(kind: str, n: int, rng: random.Random, keys: dict[int, int], put: Any, new_key: Any,
            query: Any) -> dict[str, Any]:
    if kind == "get":
        # One in ten asks for a memory that is not there.
        key = f"mem-{rng.randrange(keys[n]):04d}" if rng.random() < 0.9 else f"absent-{rng.randrange(1000)}"
        return {"phase": "mix", "kind": kind, "ns": user(n), "key": key}
    if kind == "put":
        op = put("mix", n, f"mem-{rng.randrange(keys[n]):04d}" if rng.random() < 0.7 else new_key(n))
        return op
    if kind == "search":
        return {"phase": "mix", "kind": kind, "ns": user(n)}
    if kind == "search (filter)":
        return {"phase": "mix", "kind": kind, "ns": user(n), "filter": {"kind": rng.choice(KINDS)}}
    if kind == SEMANTIC:
        op = {"phase": "mix", "kind": kind, "ns": user(n), "query": query()}
        if rng.random() < 1 / 3:
            op["filter"] = {"kind": rng.choice(KINDS)}
        return op
    return {"phase": "mix", "kind": "list_namespaces", "offset": rng.choice((0, PAGE, 2 * PAGE))}


# -- the child: one store, one variant, one process -------------------------------------------
def _plain(value: Any) -> Any:
    """JSON-able, as the reference's: DynamoDB's numbers come back as Decimal."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def fingerprint(kind: str, result: Any) -> Any:
    """An answer without timestamps (S3Store keeps created_at on overwrite, InMemoryStore does not)."""
    if kind.startswith("put"):
        return None
    if kind == "get":
        return None if result is None else [result.key, _plain(result.value)]
    if kind == "list_namespaces":
        return [list(ns) for ns in result]
    return [[list(r.namespace), r.key, _plain(r.value), None if r.score is None else round(r.score, 6)] for r in result]


def call(store: Any, op: dict[str, Any]) -> Any:
    ns = tuple(op["ns"]) if "ns" in op else None
    kind = op["kind"]
    if kind.startswith("put"):
        return store.put(ns, op["key"], op["value"])
    if kind == "get":
        return store.get(ns, op["key"])
    if kind == "list_namespaces":
        return store.list_namespaces(prefix=("memories",), limit=PAGE, offset=op["offset"])
    return store.search(ns, filter=op.get("filter"), query=op.get("query"), limit=LIMIT)


class Target:
    """How to build one store against an endpoint, and what it keeps (read straight at moto)."""

    def __init__(self, kind: str, name: str, moto: str, ttl: dict[str, Any] | None) -> None:
        self.kind, self.moto, self.ttl = kind, moto, ttl
        self.bucket = f"bench-mem-{name}".lower()[:63]
        self.table = f"bench-mem-{name}"

    def build(self, endpoint: str, cache_bytes: int | None = None) -> Any:
        if self.kind == "memory":
            from langgraph.store.memory import InMemoryStore

            # No TTL: nothing expires within a run, so its answers stand for both variants.
            return InMemoryStore(index=index_config())  # type: ignore[arg-type]
        if self.kind == "peer":
            from langgraph_checkpoint_aws.store import DynamoDBStore

            return DynamoDBStore(self.table, region_name="us-east-1", endpoint_url=endpoint, ttl=self.ttl,
                                 index=index_config())
        from botocore.config import Config

        from s3_saver import S3Store

        # moto serves one DynamoDB request at a time and a 5,000-item head takes a while:
        # a retry after a read timeout would be counted. Nothing here measures time but ms.
        return S3Store(self.bucket, table=self.table if self.kind == "s3" else None, endpoint_url=endpoint,
                       region_name="us-east-1", index=index_config(), ttl=self.ttl,  # type: ignore[arg-type]
                       cache_bytes=cache_bytes, client_config=Config(read_timeout=120, connect_timeout=30))

    def setup(self) -> None:
        """The storage, straight at moto: S3Store's setup(); DynamoDBStore's own setup() (its
        table, TTL) from a store without the vector index (creating one waits for an index moto
        never builds)."""
        if self.kind == "memory":
            return
        if self.kind == "peer":
            from langgraph_checkpoint_aws.store import DynamoDBStore

            DynamoDBStore(self.table, region_name="us-east-1", endpoint_url=self.moto, ttl=self.ttl).setup()
            return
        with self.build(self.moto) as store:
            store.setup()

    def stored(self) -> dict[str, Any]:
        if self.kind == "memory":
            return {"s3_bytes": 0, "s3_objects": 0, "ddb_bytes": 0, "ddb_items": 0}
        import boto3

        s3_bytes = s3_objects = 0
        if self.kind != "peer":
            s3 = boto3.client("s3", endpoint_url=self.moto, region_name="us-east-1")
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                for obj in page.get("Contents", []):
                    s3_bytes += obj["Size"]
                    s3_objects += 1
        ddb_bytes = ddb_items = 0
        if self.kind != "s3-manifest":
            ddb = boto3.client("dynamodb", endpoint_url=self.moto, region_name="us-east-1")
            for page in ddb.get_paginator("scan").paginate(TableName=self.table):
                for item in page.get("Items", []):
                    ddb_bytes += costs.item_size(item)
                    ddb_items += 1
        return {"s3_bytes": s3_bytes, "s3_objects": s3_objects, "ddb_bytes": ddb_bytes, "ddb_items": ddb_items}


def run_workload(target: Target, proxy: str) -> dict[str, Any]:
    target.setup()
    store = target.build(proxy)
    calls: list[dict[str, Any]] = []
    answers: list[Any] = []
    skipped: Counter[str] = Counter()
    store.get(("warm", "up"), "k")  # a process's first call: clients, the prefix's checks (unmeasured)
    peak_cache = 0
    for i, op in enumerate(plan()):
        if target.kind == "peer" and op["kind"] == SEMANTIC:
            # DynamoDB's SearchVectors: not in moto (nor in any local DynamoDB).
            skipped[op["kind"]] += 1
            answers.append("skipped")
            continue
        t0 = time.monotonic()
        error = None
        try:
            result = call(store, op)
        except Exception as exc:
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            result = None
        t1 = time.monotonic()
        calls.append({"i": i, "phase": op["phase"], "kind": op["kind"], "t_start": t0, "t_end": t1, "error": error})
        answers.append(fingerprint(op["kind"], result) if error is None else f"error: {error}")
        if hasattr(store, "cache_stats"):
            peak_cache = max(peak_cache, store.cache_stats().used)
    out: dict[str, Any] = {"calls": calls, "answers": answers, "skipped": dict(skipped), "stored": target.stored()}
    if hasattr(store, "cache_stats"):
        stats = store.cache_stats()
        out["cache"] = {"used": stats.used, "peak": peak_cache, "budget": stats.budget}
    close = getattr(store, "close", None)
    if close:
        close()
    return out


def run_heads(target: Target, proxy: str, sizes: list[int]) -> dict[str, Any]:
    """One namespace grown to each size (straight at moto, nothing counted), and at each the
    calls of HEAD_CALLS through the proxy: a new process's get, then the same process's."""
    from langgraph.store.base import PutOp

    target.setup()
    rng = random.Random(SEED + 1)
    ns = ("memories", "heads")
    grower = target.build(target.moto)
    have = 0
    out: dict[str, Any] = {"sizes": {}}
    for size in sizes:
        t0 = time.monotonic()
        while have < size:
            batch = [PutOp(ns, f"mem-{k:05d}", make_value(f"heads/{k}", rng))
                     for k in range(have, min(size, have + HEAD_GROW_BATCH))]
            grower.batch(batch)
            have += len(batch)
        grow = time.monotonic() - t0
        store = target.build(proxy)
        store.get(("warm", "up"), "k")
        calls = []
        ops = [("get (new process)", {"kind": "get", "ns": ns, "key": "mem-00003"}),
               ("get", {"kind": "get", "ns": ns, "key": f"mem-{size // 2:05d}"}),
               ("put (overwrite)", {"kind": "put", "ns": ns, "key": "mem-00004",
                                    "value": make_value(f"heads/over/{size}", rng)}),
               ("put (new key)", {"kind": "put", "ns": ns, "key": f"new-{size}",
                                  "value": make_value(f"heads/new/{size}", rng)}),
               ("search", {"kind": "search", "ns": ns}),
               ("search (filter)", {"kind": "search", "ns": ns, "filter": {"kind": "preference"}}),
               (SEMANTIC, {"kind": "search", "ns": ns, "query": "what does the user prefer for the report"})]
        for name, op in ops:
            t1 = time.monotonic()
            call(store, op)
            calls.append({"phase": str(size), "kind": name, "t_start": t1, "t_end": time.monotonic()})
        have += 1  # the new key
        out["sizes"][str(size)] = {"calls": calls, "grow_seconds": grow, "items": have,
                                   "stored": target.stored(), "head_bytes": _head_bytes(target)}
        close = getattr(store, "close", None)
        if close:
            close()
    return out


def _head_bytes(target: Target) -> int | None:
    """The grown namespace's head object's size (manifest mode), read straight at moto: the
    largest ``@head`` of the bucket (the only other heads are its ancestor's, a few hundred
    bytes; the bench names no private module to compute the namespace's folder)."""
    if target.kind != "s3-manifest":
        return None
    import boto3

    s3 = boto3.client("s3", endpoint_url=target.moto, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix="memory/n/")
    return max((o["Size"] for p in pages for o in p.get("Contents", []) if o["Key"].endswith("/@head")), default=0)


def child(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory_store child")
    ap.add_argument("--store", required=True, choices=list(STORES))
    ap.add_argument("--variant", default="plain", choices=list(VARIANTS))
    ap.add_argument("--mode", default="workload", choices=("workload", "heads"))
    ap.add_argument("--sizes", default=",".join(map(str, HEAD_SIZES)))
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--moto", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    name = f"{args.store}-{args.variant}" + ("-heads" if args.mode == "heads" else "")
    target = Target(args.store, name, args.moto, VARIANTS[args.variant])
    try:
        if args.mode == "heads":
            data = run_heads(target, args.proxy, [int(s) for s in args.sizes.split(",") if s])
        else:
            data = run_workload(target, args.proxy)
        data["ok"] = True
    except Exception as exc:
        data = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    Path(args.out).write_text(json.dumps(data, default=str))
    return 0


# -- the runner ----------------------------------------------------------------------------------
def _attribute(calls: list[dict[str, Any]], records: list[Any]) -> None:
    """Each request to the one call whose interval holds it (calls run one at a time)."""
    from bisect import bisect_right

    calls.sort(key=lambda c: c["t_start"])
    starts = [c["t_start"] for c in calls]
    for c in calls:
        c["requests"] = []
    for r in records:
        i = bisect_right(starts, r.t_start) - 1
        if i >= 0 and r.t_end <= calls[i]["t_end"] + 1e-4:
            calls[i]["requests"].append(r)


def _call_stats(c: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.run import waves

    reqs = c.pop("requests")
    return {**{k: v for k, v in c.items() if k not in ("t_start", "t_end")},
            "ms": round((c["t_end"] - c["t_start"]) * 1000, 1),
            "requests": len(reqs), "round_trips": waves(reqs),
            "bytes_up": sum(r.bytes_up for r in reqs), "bytes_down": sum(r.bytes_down for r in reqs),
            "read_units": sum(r.read_units for r in reqs), "write_units": sum(r.write_units for r in reqs),
            "cost": sum(r.cost for r in reqs),
            "operations": dict(Counter(f"{r.service}:{r.operation}" for r in reqs)),
            "http_errors": [f"{r.service}:{r.operation} {r.status}" for r in reqs if r.status >= 400]}


def _sum(calls: list[dict[str, Any]]) -> dict[str, Any]:
    ops: Counter[str] = Counter()
    for c in calls:
        ops.update(c["operations"])
    n = len(calls)
    return {"calls": n, "requests": sum(c["requests"] for c in calls),
            "round_trips": sum(c["round_trips"] for c in calls),
            "max_requests": max((c["requests"] for c in calls), default=0),
            "max_round_trips": max((c["round_trips"] for c in calls), default=0),
            "bytes_up": sum(c["bytes_up"] for c in calls), "bytes_down": sum(c["bytes_down"] for c in calls),
            "read_units": sum(c["read_units"] for c in calls), "write_units": sum(c["write_units"] for c in calls),
            "cost": sum(c["cost"] for c in calls), "ms": sum(c["ms"] for c in calls),
            "operations": dict(sorted(ops.items()))}


def year_storage(stored: dict[str, Any]) -> float:
    """Twelve months of keeping what the workload left (S3 Standard, DynamoDB Standard table class)."""
    return 12 * (stored.get("s3_bytes", 0) * costs.S3_STORAGE_PER_GB_MONTH
                 + stored.get("ddb_bytes", 0) * costs.DDB_STORAGE_PER_GB_MONTH) / costs.GB


def check(answers: list[Any], reference: list[Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Answers compared with InMemoryStore's, call by call: mismatches by kind, the first one."""
    wrong: Counter[str] = Counter()
    first = ""
    for i, (a, b) in enumerate(zip(answers, reference)):
        if a == "skipped" or a == b:
            continue
        wrong[ops[i]["kind"]] += 1
        if not first:
            first = f"call {i} ({ops[i]['kind']} {tuple(ops[i].get('ns', ()))}): {_difference(a, b)}"
    return {"mismatches": dict(wrong), "first": first}


def _difference(a: Any, b: Any) -> str:
    if isinstance(a, str):
        return a[:200]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{len(a)} results, InMemoryStore {len(b)}"
        keys = [x[1] if isinstance(x, list) and len(x) > 1 else x for x in a]
        ref = [x[1] if isinstance(x, list) and len(x) > 1 else x for x in b]
        if keys != ref:
            return "other items or order"
    return "other values"


def model(doc: dict[str, Any]) -> dict[str, Any]:
    """Per variant and store: per call kind, the whole workload (with and without the semantic
    searches), the targets, the $, and each against the peer."""
    ops = plan()
    out: dict[str, Any] = {}
    for variant, runs in doc["runs"].items():
        ref = runs.get("memory", {}).get("answers") or doc["runs"].get("plain", {}).get("memory", {}).get("answers")
        v: dict[str, Any] = {}
        for key, run in runs.items():
            if key == "memory" or not run.get("ok"):
                continue
            calls = run["calls"]
            kinds = {k: _sum([c for c in calls if c["kind"] == k]) for k in KIND_ORDER}
            year = year_storage(run["stored"])
            whole = {}
            for scope, keep in (("all", lambda c: True), ("no semantic", lambda c: c["kind"] != SEMANTIC)):
                cs = [c for c in calls if keep(c)]
                s = _sum(cs)
                n_ops = len(cs) + (run.get("skipped", {}).get(SEMANTIC, 0) if scope == "all" else 0)
                s["ops"] = n_ops
                s["per_1k_ops"] = s["cost"] / n_ops * 1000 if n_ops else None
                s["year_per_1k_ops"] = year / n_ops * 1000 if n_ops else None
                s["with_year"] = s["per_1k_ops"] + s["year_per_1k_ops"] if n_ops else None
                s["complete"] = not (scope == "all" and run.get("skipped"))
                whole[scope] = s
            targets = [c for c in calls if c["phase"] == "targets"]
            v[key] = {"label": STORES[key], "kinds": kinds, "whole": whole, "year_storage": year,
                      "stored": run["stored"], "targets": targets, "cache": run.get("cache"),
                      "skipped": run.get("skipped", {}),
                      "errors": [c["error"] for c in calls if c.get("error")],
                      "check": check(run["answers"], ref, ops) if ref else None}
        peer = v.get("peer", {}).get("whole", {}).get("no semantic")
        for key, s in v.items():
            mine = s["whole"]["no semantic"]
            s["vs_peer"] = None if not peer or key == "peer" else {
                "requests": mine["requests"] / peer["requests"],
                "dollars": mine["per_1k_ops"] / peer["per_1k_ops"],
                "dollars_with_year": mine["with_year"] / peer["with_year"]}
        out[variant] = v
    return out


def target_rows(v: dict[str, Any], key: str) -> list[tuple[str, int, int, str]]:
    """(target, worst requests, worst round trips, verdict) for one store of one variant."""
    s = v[key]
    kinds = s["kinds"]
    big = {c["kind"].replace(" (filter)", "") + (" +filter" if _op_has_filter(c["i"]) else ""): c
           for c in s["targets"] if not c["kind"].startswith(("put", "get", "list"))}
    rows = []

    def row(name: str, reqs: int, rts: int, limit: int) -> None:
        rows.append((name, reqs, rts, "met" if reqs <= limit else f"NOT MET (limit {limit})"))

    row("get: 1 request", kinds["get"]["max_requests"], kinds["get"]["max_round_trips"], 1)
    row("put: at most 2 (every put but a namespace's first)", kinds["put"]["max_requests"],
        kinds["put"]["max_round_trips"], 2)
    first = kinds["put (new namespace)"]
    rows.append(("  a namespace's first put (once per namespace)", first["max_requests"], first["max_round_trips"],
                 "reported"))
    for name in ("search", "search +filter", SEMANTIC, SEMANTIC + " +filter"):
        c = big.get(name)
        if c is None:
            if key == "peer" and name.startswith(SEMANTIC):
                rows.append((f"{name} of the 100-item namespace: at most 3", None, None, "not runnable on moto"))
            continue
        row(f"{name} of the 100-item namespace: at most 3", c["requests"], c["round_trips"], 3)
    lst = kinds["list_namespaces"]
    row("list_namespaces page: at most 2", lst["max_requests"], lst["max_round_trips"], 2)
    return rows


_PLAN: list[dict[str, Any]] | None = None


def _op_has_filter(i: int) -> bool:
    global _PLAN
    if _PLAN is None:
        _PLAN = plan()
    return "filter" in _PLAN[i]


def render(doc: dict[str, Any], markdown: bool = False) -> str:
    from benchmarks import tables

    tables.MARKDOWN = markdown
    m = doc.get("model") or model(doc)
    out: list[str] = []
    s = doc["settings"]
    out.append(f"Long-term memory: {ITEMS:,} items over {NAMESPACES} namespaces, then {MIX:,} mixed calls and the "
               f"per-call targets; {s['latency_ms']:g} ms per request; {DIMS}-dimension fake embedding. "
               "DynamoDBStore's semantic search cannot run on moto (no SearchVectors): its totals leave those "
               "calls out, and every 'vs peer' compares the totals without them.")
    for variant, v in m.items():
        cfg = VARIANTS[variant]
        out.append("")
        out.append(f"== Whole workload, {variant} ({'no TTL' if cfg is None else 'TTLConfig(default_ttl=30 days, refresh_on_read=True)'}) ==")
        rows = []
        for key in ("s3", "s3-manifest", "peer"):
            if key not in v:
                continue
            x = v[key]
            for scope in ("all", "no semantic"):
                w = x["whole"][scope]
                if key == "peer" and scope == "all":
                    continue
                vs = x["vs_peer"] if scope == "no semantic" else None
                chk = x["check"] or {}
                rows.append([f"{x['label']}{'' if scope == 'all' else ', no semantic search'}", f"{w['ops']:,}",
                             f"{w['requests']:,}", f"{w['round_trips']:,}",
                             f"{w['bytes_up'] / 1e6:.2f} / {w['bytes_down'] / 1e6:.2f}",
                             f"{w['per_1k_ops']:.5f}", f"{x['year_storage'] * 1000:.4f}",
                             f"{w['with_year']:.5f}",
                             f"{vs['requests']:.2f}x" if vs else "", f"{vs['dollars_with_year']:.2f}x" if vs else "",
                             _check_text(chk) if scope == "all" or key == "peer" else ""])
        out.append(tables.table(["store", "calls", "requests", "round trips", "MB up / down", "$ per 1k calls",
                                 "m$ a year kept", "+ a year", "requests vs peer", "$+year vs peer", "check"], rows,
                                "lrrrrrrrrrl"))
        out.append("$ per 1k calls: the requests at list price (costs.py); m$ a year kept: 12 months of what the "
                   "workload left, in thousandths of a dollar; + a year: $ per 1k calls plus that year spread over "
                   "the calls; vs peer: the totals without semantic searches against DynamoDBStore's.")
        out.append("")
        out.append(f"== Per call, {variant}: requests mean (worst) / round trips mean / KB up / KB down / $ per 1k calls ==")
        rows = []
        for kind in KIND_ORDER:
            row = [kind]
            for key in ("s3", "s3-manifest", "peer"):
                if key not in v:
                    continue
                k = v[key]["kinds"][kind]
                if not k["calls"]:
                    row.append("not runnable on moto" if key == "peer" and kind == SEMANTIC else "")
                    continue
                n = k["calls"]
                row.append(f"{k['requests'] / n:.2f} ({k['max_requests']}) / {k['round_trips'] / n:.2f} / "
                           f"{k['bytes_up'] / n / 1024:.1f} / {k['bytes_down'] / n / 1024:.1f} / "
                           f"{k['cost'] / n * 1000:.5f}")
            rows.append(row)
        keys = [key for key in ("s3", "s3-manifest", "peer") if key in v]
        out.append(tables.table(["call", *[v[k]["label"] for k in keys]], rows, "l" + "l" * len(keys)))
        out.append("")
        out.append(f"== Targets, {variant}: worst requests / round trips of a call ==")
        rows = []
        for key in keys:
            for name, reqs, rts, verdict in target_rows(v, key):
                rows.append([v[key]["label"], name, "" if reqs is None else reqs, "" if rts is None else rts,
                             verdict])
        out.append(tables.table(["store", "target", "requests", "round trips", "verdict"], rows, "llrrl"))
        total = [f"{v[k]['label']}: requests {v[k]['vs_peer']['requests']:.2f}x "
                 f"({'met' if v[k]['vs_peer']['requests'] <= 0.5 else 'NOT MET'}), $ per 1k calls + a year "
                 f"{v[k]['vs_peer']['dollars_with_year']:.2f}x "
                 f"({'met' if v[k]['vs_peer']['dollars_with_year'] <= 0.5 else 'NOT MET'})"
                 for k in keys if v[k].get("vs_peer")]
        out.append("Against DynamoDBStore (target at most 0.5x): " + "; ".join(total))
        caches = [f"{v[k]['label']}: peak {v[k]['cache']['peak'] / 1024 / 1024:.1f} MiB of "
                  f"{v[k]['cache']['budget'] / 1024 / 1024:.0f} MiB" for k in keys if v[k].get("cache")]
        if caches:
            out.append("Cache (the store's budget): " + "; ".join(caches))
    heads = doc.get("heads") or {}
    if heads:
        out.append("")
        out.append("== One namespace as it grows: requests / round trips / KB up / KB down / ms per call ==")
        rows = []
        for key, h in heads.items():
            if not h.get("ok"):
                rows.append([STORES[key], "FAILED", h.get("error", "")])
                continue
            for size, at in h["sizes"].items():
                by = {c["kind"]: c for c in at["calls"]}
                head = at.get("head_bytes")
                row = [STORES[key], f"{int(size):,}", f"{head / 1024:.0f}" if head else ""]
                for name in HEAD_CALLS:
                    c = by[name]
                    row.append(f"{c['requests']} / {c['round_trips']} / {c['bytes_up'] / 1024:.0f} / "
                               f"{c['bytes_down'] / 1024:.0f} / {c['ms']:.0f}")
                rows.append(row)
        out.append(tables.table(["store", "items", "head KiB", *HEAD_CALLS], rows, "lrr" + "l" * len(HEAD_CALLS)))
    tables.MARKDOWN = False
    return "\n".join(out)


def _check_text(chk: dict[str, Any]) -> str:
    if not chk:
        return ""
    if not chk["mismatches"]:
        return "ok"
    counts = ", ".join(f"{n} {k}" for k, n in chk["mismatches"].items())
    return f"differs: {counts}; first: {chk['first']}"


def main(argv: list[str] | None = None) -> int:
    import subprocess
    import tempfile

    from benchmarks.proxy import LatencyProxy
    from benchmarks.run import DEFAULT_PEER_PYTHON, RESULTS, ROOT, child_env, probe, start_moto

    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory_store", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--stores", default=",".join(STORES), help="memory is the reference the answers are checked against")
    ap.add_argument("--latency-ms", type=float, default=15.0)
    ap.add_argument("--head-sizes", default=",".join(map(str, HEAD_SIZES)), help="'' skips the growing namespace")
    ap.add_argument("--peer-python", default=str(DEFAULT_PEER_PYTHON))
    ap.add_argument("--child-timeout", type=float, default=900.0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--render", metavar="JSON", help="only print the tables of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return 0
    started = time.monotonic()
    log = sys.stderr
    stores = [s for s in args.stores.split(",") if s]
    pythons = {k: sys.executable for k in STORES}
    pythons["peer"] = args.peer_python
    notes = {}
    if "peer" in stores:
        ok, msg = probe(args.peer_python, "from langgraph_checkpoint_aws.store import DynamoDBStore; "
                        "import importlib.metadata as m; print(m.version('langgraph-checkpoint-aws'))") \
            if Path(args.peer_python).exists() else (False, f"{args.peer_python} missing (make bench creates it)")
        notes["peer"] = f"langgraph-checkpoint-aws {msg}" if ok else f"skipped: {msg}"
        if not ok:
            print(f"  DynamoDBStore: skipped ({msg})", file=log)
            stores.remove("peer")
    moto_proc, moto = start_moto()
    proxy = LatencyProxy(int(moto.rsplit(":", 1)[1]), args.latency_ms / 1000).start()
    print(f"moto on {moto}, proxy on {proxy.url} adding {args.latency_ms:g} ms per request", file=log)

    def run_child(store: str, extra: list[str]) -> tuple[dict[str, Any], list[Any]]:
        proxy.take()
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            out = tmp.name
        cmd = [pythons[store], "-m", "benchmarks.memory_store", "child", "--store", store, "--proxy", proxy.url,
               "--moto", moto, "--out", out, *extra]
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True,
                               timeout=args.child_timeout)
            data = json.loads(Path(out).read_text()) if Path(out).stat().st_size else {
                "ok": False, "error": f"exit {p.returncode}: {p.stderr.strip()[-500:]}"}
        except subprocess.TimeoutExpired:
            data = {"ok": False, "error": f"timed out after {args.child_timeout}s"}
        finally:
            Path(out).unlink(missing_ok=True)
        status = "ok" if data.get("ok") else f"FAILED: {data.get('error')}"
        print(f"  {STORES[store]:<45} {' '.join(extra):<30} {time.monotonic() - t0:6.1f}s  {status}", file=log,
              flush=True)
        if not data.get("ok") and data.get("traceback"):
            print(data["traceback"], file=log)
        return data, proxy.take()

    runs: dict[str, dict[str, Any]] = {}
    heads: dict[str, Any] = {}
    try:
        for variant in [v for v in args.variants.split(",") if v]:
            runs[variant] = {}
            for store in sorted(stores, key=lambda s: s != "memory"):
                if store == "memory" and variant != "plain" and "plain" in runs and "memory" in runs["plain"]:
                    continue  # nothing expires within the run: the plain reference stands for both
                data, records = run_child(store, ["--variant", variant])
                if data.get("ok"):
                    _attribute(data["calls"], records)
                    data["calls"] = sorted((_call_stats(c) for c in data["calls"]), key=lambda c: c["i"])
                runs[variant][store] = data
        sizes = [s for s in args.head_sizes.split(",") if s]
        for store in [s for s in ("s3-manifest", "s3") if s in stores] if sizes else []:
            data, records = run_child(store, ["--mode", "heads", "--sizes", ",".join(sizes)])
            if data.get("ok"):
                for at in data["sizes"].values():
                    _attribute(at["calls"], records)
                    at["calls"] = [_call_stats(c) for c in at["calls"]]
            heads[store] = data
    finally:
        proxy.stop()
        if moto_proc.stdin:
            moto_proc.stdin.close()
        try:
            moto_proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            moto_proc.kill()
    doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "settings": {"latency_ms": args.latency_ms, "items": ITEMS, "namespaces": NAMESPACES, "mix": MIX,
                        "dims": DIMS, "variants": list(runs), "head_sizes": sizes, "seed": SEED,
                        "python": sys.version.split()[0]},
           "notes": notes, "runs": runs, "heads": heads}
    doc["model"] = model(doc)
    doc["elapsed"] = time.monotonic() - started
    # The answers are in the model's checks; the JSON keeps each call's counts.
    for variant in runs.values():
        for run in variant.values():
            run.pop("answers", None)
    text = render(doc)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (f"memory-{stamp}.json", "memory-latest.json"):
        (out / name).write_text(json.dumps(doc, indent=1, default=str))
    (out / "memory-latest.txt").write_text(text + "\n")
    (out / "memory-latest.md").write_text(render(doc, markdown=True) + "\n")
    print(f"\nwrote {out / 'memory-latest.json'}, .txt and .md in {doc['elapsed']:.0f}s", file=log)
    ours = [r for v in runs.values() for k, r in v.items() if k != "peer"] + list(heads.values())
    return 0 if all(r.get("ok") for r in ours) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        sys.exit(child(sys.argv[2:]))
    sys.exit(main())
