"""The benchmark runner: ``python -m benchmarks [--turns N] [--latency-ms MS] ...``.

Starts moto (its own process, 127.0.0.1) and the counting proxy (this
process), runs every saver in every mode in a fresh child process, matches the
proxy's requests to the saver calls the child recorded, checks each saver's
results against InMemorySaver's, then prints the tables and writes JSON under
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from bisect import bisect_right
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import (
    _guard,
    costs,
    crossregion,
    longconv,
    longconv_report,
    peers,
    report,
    scale,
    scale_report,
    yearcost,
)
from benchmarks.proxy import LatencyProxy, Request
from benchmarks.workload import PHASES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_PEER_PYTHON = ROOT / "benchmarks" / ".venv-peer" / "bin" / "python"
DEFAULT_PEER_AIO_PYTHON = ROOT / "benchmarks" / ".venv-peer-aio" / "bin" / "python"


@dataclass
class Saver:
    key: str  # child --saver
    label: str
    python: str
    available: bool = True
    note: str = ""


@dataclass
class CallStats:
    phase: str
    method: str
    wall: float
    requests: list[Request] = field(default_factory=list)
    error: str | None = None

    @property
    def round_trips(self) -> int:
        return waves(self.requests)


def waves(requests: list[Request]) -> int:
    """Round trips: maximal groups of time-overlapping requests (sent together, awaited together)."""
    count, end = 0, float("-inf")
    for r in sorted(requests, key=lambda r: r.t_start):
        if r.t_start > end:
            count += 1
            end = r.t_end
        else:
            end = max(end, r.t_end)
    return count


def attribute(calls: list[dict[str, Any]], records: list[Request]) -> tuple[list[CallStats], list[Request]]:
    """Give each request to the (one, serialized) saver call whose interval contains it."""
    calls = sorted(calls, key=lambda c: c["t_start"])
    starts = [c["t_start"] for c in calls]
    stats = [CallStats(c["phase"], c["method"], c["t_end"] - c["t_start"], error=c.get("error")) for c in calls]
    orphans = []
    for r in records:
        i = bisect_right(starts, r.t_start) - 1
        if i >= 0 and r.t_end <= calls[i]["t_end"] + 1e-4:
            stats[i].requests.append(r)
        else:
            orphans.append(r)
    return stats, orphans


def summarize(calls: list[CallStats]) -> dict[str, Any]:
    reqs = [r for c in calls for r in c.requests]
    ops = Counter(f"{r.service}:{r.operation}" for r in reqs)
    return {
        "calls": len(calls),
        "requests": len(reqs),
        "s3_requests": sum(1 for r in reqs if r.service == "s3"),
        "ddb_requests": sum(1 for r in reqs if r.service == "dynamodb"),
        "round_trips": sum(c.round_trips for c in calls),
        "bytes_up": sum(r.bytes_up for r in reqs),
        "bytes_down": sum(r.bytes_down for r in reqs),
        "read_units": sum(r.read_units for r in reqs),
        "write_units": sum(r.write_units for r in reqs),
        "cost": sum(r.cost for r in reqs),
        # The same cost split by service: a manifest-mode run must have no DynamoDB part.
        "s3_cost": sum(r.cost for r in reqs if r.service == "s3"),
        "ddb_cost": sum(r.cost for r in reqs if r.service == "dynamodb"),
        "s3_tier1_requests": sum(1 for r in reqs if r.service == "s3" and costs.s3_tier(r.method, r.operation) == 1),
        "s3_tier2_requests": sum(1 for r in reqs if r.service == "s3" and costs.s3_tier(r.method, r.operation) == 2),
        # What replication would copy to a second region (benchmarks/crossregion.py):
        # objects S3 stored (one replica PUT each) and DynamoDB items changed.
        "s3_objects_written": sum(r.s3_objects_written for r in reqs),
        "s3_object_bytes": sum(r.object_bytes for r in reqs),
        "s3_deletes": sum(1 for r in reqs if r.service == "s3" and r.operation in ("DeleteObject", "DeleteObjects")),
        "ddb_replicated_writes": sum(r.replicated_writes for r in reqs),
        "ddb_replicated_units": sum(r.replicated_units for r in reqs),
        "ddb_replicated_bytes": sum(r.replicated_bytes for r in reqs),
        # Objects a read fetched (the long conversation's latest read): S3 GETs answered, DynamoDB items.
        "s3_objects_read": sum(1 for r in reqs if r.operation == "GetObject" and r.status == 200),
        "ddb_items_read": sum(getattr(r, "items_read", 0) for r in reqs),
        "errors": [c.error for c in calls if c.error],
        "http_errors": sum(1 for r in reqs if r.status >= 400),
        "operations": dict(sorted(ops.items())),
        "bytes_up_by_operation": _by_op(reqs, "bytes_up"),
        "bytes_down_by_operation": _by_op(reqs, "bytes_down"),
        "units_by_operation": {k: [round(v[0], 2), round(v[1], 2)] for k, v in _units(reqs).items()},
    }


def _by_op(reqs: list[Request], attr: str) -> dict[str, int]:
    out: Counter[str] = Counter()
    for r in reqs:
        out[f"{r.service}:{r.operation}"] += getattr(r, attr)
    return dict(sorted(out.items()))


def _units(reqs: list[Request]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in reqs:
        if r.service == "dynamodb":
            out[r.operation][0] += r.read_units
            out[r.operation][1] += r.write_units
    return dict(sorted(out.items()))


def archival(calls: list[CallStats]) -> dict[str, Any]:
    """The archive mode's phases ("archive GLACIER_IR", "read ...", "restore ..."), in order:
    totals, each call, and the archive object's own PUT apart (its price depends on the
    class: the year cost reprices it for the classes not measured)."""
    out: dict[str, Any] = {}
    for phase in dict.fromkeys(c.phase for c in calls):
        cs = [c for c in calls if c.phase == phase]
        reqs = [r for c in cs for r in c.requests]
        class_puts = [r for r in reqs if r.storage_class and r.method == "PUT"]
        out[phase] = {"requests": len(reqs), "round_trips": sum(c.round_trips for c in cs),
                      "bytes_up": sum(r.bytes_up for r in reqs), "bytes_down": sum(r.bytes_down for r in reqs),
                      "cost": sum(r.cost for r in reqs), "s3_cost": sum(r.cost for r in reqs if r.service == "s3"),
                      "ddb_cost": sum(r.cost for r in reqs if r.service == "dynamodb"),
                      "archive_puts": len(class_puts), "archive_put_cost": sum(r.cost for r in class_puts),
                      "wall": sum(c.wall for c in cs),
                      "operations": dict(sorted(Counter(f"{r.service}:{r.operation}" for r in reqs).items())),
                      "calls": [{**call_detail(c), "cost": sum(r.cost for r in c.requests)} for c in cs]}
    return out


def failover(calls: list[CallStats]) -> dict[str, Any]:
    """The failover drill's steps ("<configuration>: <step>"), in order: requests to
    the primary region (us-east-1, through the gate while it was up) and to the
    replica's (costs.REPLICA_REGION), round trips, wall time, operations."""
    out: dict[str, Any] = {}
    for phase in dict.fromkeys(c.phase for c in calls):
        cs = [c for c in calls if c.phase == phase]
        reqs = [r for c in cs for r in c.requests]
        out[phase] = {"calls": len(cs), "requests": len(reqs),
                      "primary_requests": sum(1 for r in reqs if r.region != costs.REPLICA_REGION),
                      "replica_requests": sum(1 for r in reqs if r.region == costs.REPLICA_REGION),
                      "round_trips": sum(c.round_trips for c in cs), "wall": sum(c.wall for c in cs),
                      "cost": sum(r.cost for r in reqs), "http_errors": sum(1 for r in reqs if r.status >= 400),
                      "operations": dict(sorted(Counter(
                          f"{'replica ' if r.region == costs.REPLICA_REGION else ''}{r.service}:{r.operation}"
                          for r in reqs).items()))}
    return out


def call_detail(c: CallStats) -> dict[str, Any]:
    """One saver call: its requests in order, grouped into waves."""
    waves_out: list[list[str]] = []
    end = float("-inf")
    for r in sorted(c.requests, key=lambda r: r.t_start):
        if r.t_start > end:
            waves_out.append([])
            end = r.t_end
        else:
            end = max(end, r.t_end)
        waves_out[-1].append(f"{r.service}:{r.operation}")
    return {"phase": c.phase, "method": c.method, "ms": round(c.wall * 1000, 1), "requests": len(c.requests),
            "round_trips": len(waves_out), "waves": waves_out,
            "bytes_up": sum(r.bytes_up for r in c.requests), "bytes_down": sum(r.bytes_down for r in c.requests),
            "read_units": sum(r.read_units for r in c.requests),
            "write_units": sum(r.write_units for r in c.requests), "error": c.error,
            "http_errors": [f"{r.service}:{r.operation} {r.status}" for r in c.requests if r.status >= 400]}


def per_method(calls: list[CallStats]) -> dict[str, Any]:
    groups: dict[str, list[CallStats]] = defaultdict(list)
    for c in calls:
        groups[c.method].append(c)
    out = {}
    for method, cs in sorted(groups.items()):
        s = summarize(cs)
        s["requests_per_call"] = s["requests"] / len(cs)
        s["round_trips_per_call"] = s["round_trips"] / len(cs)
        s["max_round_trips"] = max(c.round_trips for c in cs)
        s["max_requests"] = max(len(c.requests) for c in cs)
        s["wall_per_call"] = sum(c.wall for c in cs) / len(cs)
        out[method] = s
    return out


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return f"{path or '.'}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: missing on one side"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)} (InMemorySaver)"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r} (InMemorySaver)"


def verify(results: dict[str, Any], reference: dict[str, Any]) -> dict[str, str]:
    """Per phase: "" when equal to InMemorySaver's results, else where they first differ."""
    out = {}
    for phase in PHASES:
        d = first_difference(results.get(phase), reference.get(phase), phase)
        out[phase] = d or ""
    return out


# -- processes ------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(_guard.FAKE_AWS_ENV)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("VIRTUAL_ENV", None)
    return env


def start_moto() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.moto_proc"], cwd=ROOT, env=child_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


def probe(python: str, code: str) -> tuple[bool, str]:
    try:
        p = subprocess.run([python, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                           timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if p.returncode == 0:
        return True, p.stdout.strip()
    lines = (p.stderr.strip() or p.stdout.strip()).splitlines()
    return False, lines[-1] if lines else f"exit {p.returncode}"


def discover(args: argparse.Namespace) -> list[Saver]:
    wanted = args.savers.split(",")
    savers = []
    if "s3" in wanted:
        ok, msg = probe(sys.executable, "import s3_saver; s3_saver.S3Saver")
        savers.append(Saver("s3", "S3Saver (DynamoDB index)", sys.executable, ok,
                            "" if ok else f"s3_saver not importable: {msg}"))
    if "s3-manifest" in wanted:
        # No table: the index is a manifest in the bucket (the public constructor says so).
        ok, msg = probe(sys.executable, "import s3_saver; s3_saver.S3Saver('probe-bucket')")
        savers.append(Saver("s3-manifest", "S3Saver (manifest index)", sys.executable, ok,
                            "" if ok else f"manifest index mode not available: {msg}"))
    if "memory" in wanted:
        savers.append(Saver("memory", "InMemorySaver (no I/O)", sys.executable))
    # The published peers (benchmarks/peers.py), each in its venv. peer-gzip is the aws
    # package's own compression option (off by default), first mode only to keep
    # `make bench` within its time budget.
    venvs = {"peer": str(args.peer_python), "peer-aio": str(args.peer_aio_python)}
    for key, peer in peers.PEERS.items():
        if key not in wanted:
            continue
        py = venvs[peer.venv]
        ok, msg = probe(py, f"import {peer.module}, importlib.metadata as m; "
                        f"print(m.version('{peer.package}'))") if Path(py).exists() else (
            False, f"{py} missing (make bench creates it)")
        savers.append(Saver(key, peers.label(key, msg if ok else None), py, ok, "" if ok else msg))
    unknown = [w for w in wanted if w and w not in ("s3", "s3-manifest", "memory") and not peers.is_peer(w)]
    if unknown:
        raise SystemExit(f"unknown saver(s): {', '.join(unknown)}")
    return savers


def scaling_lengths(key: str, args: argparse.Namespace) -> list[int]:
    """Thread lengths of the scaling mode: S3Saver (both index modes) up to --long-thread;
    the peer to --peer-long-thread (its 10,000 puts would add minutes); InMemorySaver, the
    reference for the checks, every length."""
    s3, peer = [10, args.long_thread], [10, args.peer_long_thread]
    if key in ("s3", "s3-manifest"):
        return s3
    if peers.is_peer(key):
        return peer
    return sorted(set(s3 + peer))


def child_cmd(saver: Saver, mode: str, args: argparse.Namespace, proxy: LatencyProxy, moto: str,
              out: str, name: str | None = None) -> list[str]:
    # The grow run fills the scaling run's bucket and table (same --name); longconv-read
    # reads the thread longconv wrote.
    name = name or f"{saver.key}-{ {'grow': 'scaling', 'longconv-read': 'longconv'}.get(mode, mode)}"
    turns = args.longconv_turns if mode in longconv.ALL_MODES else args.turns
    return [saver.python, "-m", "benchmarks.child", "--saver", saver.key, "--name", name,
            "--mode", mode, "--proxy", proxy.url, "--moto", moto, "--turns", str(turns), "--out", out,
            "--lengths", ",".join(map(str, scaling_lengths(saver.key, args)))]


def grow_threads(savers: list[Saver], args: argparse.Namespace, proxy: LatencyProxy, moto: str,
                 log: Any) -> dict[str, str]:
    """Grow every saver's scaling threads at once, straight at moto, one process each.

    Nothing is measured meanwhile (the proxy sees no request); run one after
    another, 10,000 puts per S3Saver mode would add minutes to `make bench`.
    Returns saver key -> the grow run's JSON file (for --grown).
    """
    procs = []
    for saver in savers:
        if saver.key == "memory":
            continue  # in-process: nothing to share with the scaling run
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            out = tmp.name
        p = subprocess.Popen(child_cmd(saver, "grow", args, proxy, moto, out), cwd=ROOT, env=child_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append((saver, p, out))
    t0 = time.monotonic()
    files: dict[str, str] = {}
    for saver, p, out in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, args.child_timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            err = f"timed out after {args.child_timeout}s"
        data = json.loads(Path(out).read_text()) if Path(out).stat().st_size else {}
        if data.get("ok"):
            files[saver.key] = out
            took = ", ".join(f"{n}: {g['seconds']:.0f}s" for n, g in data["threads"].items())
            print(f"  {saver.label:<50} grow     {time.monotonic() - t0:6.1f}s  ok ({took})", file=log, flush=True)
        else:
            Path(out).unlink(missing_ok=True)
            print(f"  {saver.label:<50} grow     FAILED: {data.get('error') or err.strip()[-500:]} "
                  "(the scaling run grows its own threads)", file=log, flush=True)
    return files


def longconv_writes(writes: list[tuple[Saver, str]], args: argparse.Namespace, moto: str,
                    log: Any) -> dict[tuple[str, str], tuple[dict[str, Any], list[Request]]]:
    """Every saver's long conversation written at once, each through a proxy of its own.

    One after another, 200 turns through the 15 ms proxy (40-130 s per saver) would add
    about 10 minutes to ``make bench``. Each child gets a LatencyProxy of its own (same
    moto, same latency), so every request is still metered and belongs to one saver; the
    counts and bytes do not depend on the overlap, wall times would (moto serves one
    request at a time), and the tables show none. The reads run after, one at a time.
    """
    port = int(moto.rsplit(":", 1)[1])

    def one(job: tuple[Saver, str]) -> tuple[dict[str, Any], list[Request]]:
        proxy = LatencyProxy(port, args.latency_ms / 1000).start()
        try:
            # All at once, each takes longer than alone (moto serves one request at a time).
            return run_child(job[0], job[1], args, proxy, moto, log, timeout=3 * args.child_timeout)
        finally:
            proxy.stop()

    with ThreadPoolExecutor(max_workers=max(1, len(writes))) as pool:
        return dict(zip([(s.key, m) for s, m in writes], pool.map(one, writes)))


def run_child(saver: Saver, mode: str, args: argparse.Namespace, proxy: LatencyProxy, moto: str, log: Any,
              grown: str | None = None, extra: list[str] | None = None,
              timeout: float | None = None, name: str | None = None) -> tuple[dict[str, Any], list[Request]]:
    proxy.take()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    cmd = child_cmd(saver, mode, args, proxy, moto, out, name) + (["--grown", grown] if grown else []) + (extra or [])
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True,
                           timeout=timeout or args.child_timeout)
        data = json.loads(Path(out).read_text()) if Path(out).stat().st_size else {
            "ok": False, "error": f"exit {p.returncode}: {p.stderr.strip()[-500:]}"}
    except subprocess.TimeoutExpired:
        data = {"ok": False, "error": f"timed out after {timeout or args.child_timeout}s"}
    finally:
        Path(out).unlink(missing_ok=True)
    data["process_wall"] = time.monotonic() - t0
    status = "ok" if data.get("ok") else f"FAILED: {data.get('error')}"
    if data.get("workload_error"):  # the child ran; the saver raised (kept, reported in the tables)
        status = f"the saver FAILED in {data.get('failed_phase')}: {data['workload_error'][:300]}"
    print(f"  {saver.label:<50} {mode:<8} {data['process_wall']:6.1f}s  {status}", file=log, flush=True)
    if not data.get("ok") and data.get("traceback"):
        print(data["traceback"], file=log)
    return data, proxy.take()


def scale_runs(savers: list[Saver], args: argparse.Namespace, moto: str, log: Any) -> dict[str, Any]:
    """The scale workload (benchmarks/scale.py), per thread count: both S3Saver index
    modes at once, each child through a LatencyProxy of its own (as longconv_writes),
    then each mode's read of every thread by a fresh process. Returns runs by
    ``<saver>/scale-<N>``, with the measured calls summed by scale_report."""
    port = int(moto.rsplit(":", 1)[1])
    mine = [s for s in savers if s.available and s.key in ("s3", "s3-manifest")]
    out: dict[str, Any] = {}

    def one(saver: Saver, n: int) -> dict[str, Any]:
        proxy = LatencyProxy(port, args.latency_ms / 1000).start()
        name, extra, timeout = f"{saver.key}-scale-{n}", ["--threads", str(n)], 6 * args.child_timeout
        try:
            data, records = run_child(saver, "scale", args, proxy, moto, log, extra=extra, timeout=timeout, name=name)
            run: dict[str, Any] = {"ok": data.get("ok", False), "error": data.get("error"),
                                   "process_wall": data["process_wall"]}
            if data.get("ok"):
                calls, _ = attribute(data["calls"], records)
                run["scale"] = data["scale"]
                run["calls"] = {c.phase: {**call_detail(c), "cost": sum(r.cost for r in c.requests),
                                          "operations": dict(Counter(f"{r.service}:{r.operation}" for r in c.requests))}
                                for c in calls}
                read, _ = run_child(saver, "scale-read", args, proxy, moto, log, extra=extra, timeout=timeout,
                                    name=name)
                run["read"] = read.get("scale") if read.get("ok") else {"error": read.get("error")}
            return run
        finally:
            proxy.stop()

    for n in args.scale_threads:
        with ThreadPoolExecutor(max_workers=max(1, len(mine))) as pool:
            done = list(pool.map(lambda s: one(s, n), mine))
        out.update({f"{s.key}/scale-{n}": r for s, r in zip(mine, done)})
    return out


def cold_start(savers: list[Saver], proxy: LatencyProxy, repeats: int) -> dict[str, Any]:
    script = str(ROOT / "benchmarks" / "coldstart.py")
    results: dict[str, Any] = {}
    subjects = [("boto3", "import boto3 (alone)", sys.executable)] + [
        (s.key, s.label, s.python) for s in savers if s.available and s.key in ("s3", "s3-manifest", "peer", "memory")]
    # Deployed code has bytecode caches (a Lambda runtime's boto3 does): allow
    # writing them, and do one warm-up run per subject so no run compiles sources.
    env = child_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for key, label, python in subjects:
        runs = []
        for i in range(repeats + 1):
            proxy.take()
            t0 = time.monotonic()
            p = subprocess.run([python, script, key, proxy.url, f"bench-{key}-sync", f"bench-{key}-sync"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            wall = time.monotonic() - t0
            if p.returncode != 0:
                results[key] = {"label": label, "error": p.stderr.strip().splitlines()[-1:]}
                break
            if i == 0:
                continue
            data = json.loads(p.stdout.strip().splitlines()[-1])
            data["process_wall"] = wall
            reqs = proxy.take()
            if "put_interval" in data:
                a, b = data["put_interval"]
                put_reqs = [r for r in reqs if r.t_start >= a and r.t_end <= b + 1e-4]
                data["put_requests"] = len(put_reqs)
                data["put_round_trips"] = waves(put_reqs)
            runs.append(data)
        else:
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "put_interval"}
            results[key] = {"label": label, **med}
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=20, help="agent turns on one thread (default 20)")
    ap.add_argument("--latency-ms", type=float, default=15.0, help="injected per-request latency (default 15)")
    ap.add_argument("--savers", default=",".join(["s3", "s3-manifest", "memory", *peers.PEERS]),
                    help="comma-separated saver keys (default: all; the peers are in benchmarks/peers.py)")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--no-scaling", action="store_true", help="skip the long-thread / wide-checkpoint calls")
    ap.add_argument("--long-thread", type=int, default=10_000,
                    help="scaling: checkpoints in S3Saver's long thread (default 10000)")
    ap.add_argument("--peer-long-thread", type=int, default=1000,
                    help="scaling: checkpoints in the peer's long thread (default 1000)")
    ap.add_argument("--no-archive", action="store_true",
                    help="skip archiving the workload's thread (S3Saver, both index modes)")
    ap.add_argument("--no-failover", action="store_true",
                    help="skip the failover drill (S3Saver with a replica region, both index modes)")
    ap.add_argument("--no-cold-start", action="store_true")
    ap.add_argument("--longconv-turns", type=int, default=longconv.DEFAULT_TURNS,
                    help=f"long conversation: turns of 1 KB in + 1 KB out (default {longconv.DEFAULT_TURNS})")
    ap.add_argument("--no-longconv", action="store_true", help="skip the long conversation")
    ap.add_argument("--longconv-only", action="store_true",
                    help="run the long conversation alone (no workload, scaling, archive, failover, cold start); "
                         "its tables, in longconv-latest.* under --out")
    ap.add_argument("--scale-threads", type=lambda v: [int(x) for x in v.split(",") if x],
                    default=list(scale.DEFAULT_THREADS),
                    help="scale: thread counts, comma-separated (default 1000,10000)")
    ap.add_argument("--no-scale", action="store_true", help="skip the scale workload (many threads)")
    ap.add_argument("--scale-only", action="store_true",
                    help="run the scale workload alone (S3Saver, both index modes); its table, in "
                         "scale-latest.* under --out")
    ap.add_argument("--cold-start-repeats", type=int, default=3)
    ap.add_argument("--peer-python", default=str(DEFAULT_PEER_PYTHON),
                    help="python of the venv with langgraph-checkpoint-aws and langgraph-checkpoint-dynamodb")
    ap.add_argument("--peer-aio-python", default=str(DEFAULT_PEER_AIO_PYTHON),
                    help="python of the venv with the aioboto3-based peers (langgraph-checkpoint-s3, "
                         "-amazon-dynamodb, -objectstorage[s3])")
    ap.add_argument("--child-timeout", type=float, default=420.0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--render", metavar="JSON", help="only print the tables of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.longconv_only or args.scale_only:
        args.no_scaling = args.no_archive = args.no_failover = args.no_cold_start = True
        args.modes = ""
        args.no_longconv = args.no_longconv or args.scale_only
        args.no_scale = args.no_scale or args.longconv_only
    if args.scale_only:
        args.savers = ",".join(k for k in args.savers.split(",") if k in ("s3", "s3-manifest")) or "s3,s3-manifest"
    if args.render:
        doc = json.loads(Path(args.render).read_text())
        print(report.render(doc))
        return 0
    _guard.install()
    started = time.monotonic()
    log = sys.stderr

    savers = discover(args)
    for s in savers:
        if not s.available:
            print(f"  {s.label}: skipped ({s.note})", file=log)
    moto_proc, moto = start_moto()
    proxy = LatencyProxy(int(moto.rsplit(":", 1)[1]), args.latency_ms / 1000).start()
    print(f"moto on {moto}, proxy on {proxy.url} adding {args.latency_ms:g} ms per request", file=log)
    runs: dict[str, dict[str, Any]] = {}
    try:
        modes = [m for m in args.modes.split(",") if m]
        # InMemorySaver first: it is the reference the others are checked against.
        order = sorted((s for s in savers if s.available), key=lambda s: s.key != "memory")
        # Every workload run, then every scaling run, whose long threads are grown
        # ahead all at once (grow_threads) while nothing is being measured.
        jobs = [(s, m) for s in order for m in (peers.run_modes(s.key, modes) if peers.is_peer(s.key) else modes)]
        scaling = [] if args.no_scaling else [s for s in order if s.key != "peer-gzip"]
        # Archival: S3Saver's own feature, each index mode once (benchmarks/yearcost.py prices it).
        jobs += [] if args.no_archive else [(s, "archive") for s in order if s.key in ("s3", "s3-manifest")]
        # The failover drill: S3Saver's replica region (s3_saver.Replica), each index mode
        # once; skipped (and absent from the tables) where the saver has no replica support.
        if not args.no_failover:
            ok, msg = probe(sys.executable, "from s3_saver import Replica, PrimaryUnavailableError, S3Saver; "
                            "S3Saver.promote; S3Saver.setup_replica; S3Saver.last_read")
            if ok:
                jobs += [(s, "failover") for s in order if s.key in ("s3", "s3-manifest")]
            else:
                print(f"  failover drill skipped: no replica support in s3_saver ({msg})", file=log)
        # The long conversation: each saver but the reference writes it, then a fresh
        # process reads its latest checkpoint (benchmarks/longconv.py).
        if not args.no_longconv:
            jobs += [(s, m) for s in order if s.key != "memory" for m in longconv.MODES]
            # S3Saver's write again on a versioned bucket: what it keeps as noncurrent versions.
            jobs += [(s, longconv.VERSIONED) for s in order if s.key in ("s3", "s3-manifest")]
        grown: dict[str, str] | None = None
        written: dict[str, Any] | None = None
        for saver, mode in jobs + [(s, "scaling") for s in scaling]:
            if mode == "scaling" and grown is None:
                grown = grow_threads(scaling, args, proxy, moto, log)
            if mode in (longconv.MODES[0], longconv.VERSIONED) and written is None:
                written = longconv_writes([(s, m) for s, m in jobs if m in (longconv.MODES[0], longconv.VERSIONED)],
                                          args, moto, log)
            extra = None
            if mode == "longconv-read":  # checked against the turns the write got through
                lc = runs.get(f"{saver.key}/longconv", {}).get("longconv", {})
                if not lc.get("points"):
                    continue  # nothing was written to read
                extra = ["--turns", str(lc["failed_turn"] - 1 if lc.get("error") else lc["turns"])]
            if mode in (longconv.MODES[0], longconv.VERSIONED) and written is not None:
                data, records = written.pop((saver.key, mode))
            else:
                data, records = run_child(saver, mode, args, proxy, moto, log,
                                          grown.get(saver.key) if grown and mode == "scaling" else None, extra)
            run: dict[str, Any] = {"ok": data.get("ok", False), "error": data.get("error"),
                                   "process_wall": data["process_wall"]}
            if data.get("ok"):
                calls, orphans = attribute(data["calls"], records)
                run["unattributed_requests"] = Counter(
                    f"{r.service}:{r.operation}" for r in orphans)
                run["call_log"] = [call_detail(c) for c in calls]
                if mode in longconv.ALL_MODES:
                    # Per phase (a stretch of turns, a read); the write's call log is left out (1,000 calls).
                    run["longconv"] = data["longconv"]
                    run["phases"] = {p: summarize([c for c in calls if c.phase == p])
                                     for p in dict.fromkeys(c.phase for c in calls)}
                    if mode != "longconv-read":
                        del run["call_log"]
                elif mode == "archive":
                    run["archival"] = archival(calls)
                    run["archive"] = data["archive"]
                elif mode == "failover":
                    run["failover_steps"] = failover(calls)
                    run["failover"] = data["failover"]
                elif mode == "scaling":
                    run["scaling"] = {c.phase: {**call_detail(c), "cost": sum(r.cost for r in c.requests)}
                                      for c in calls}
                    run["checks"] = data["checks"]
                    run["grow_seconds"] = data.get("grow_seconds", {})
                else:
                    run["phases"] = {p: summarize([c for c in calls if c.phase == p]) for p in PHASES}
                    for p in PHASES:
                        run["phases"][p]["wall"] = data["timings"].get(p)
                    run["methods"] = {p: per_method([c for c in calls if c.phase == p]) for p in PHASES}
                    run["results"] = data["results"]
                    run["stored"] = data["stored"]
                    if data.get("workload_error"):  # the saver failed: kept, reported in the check column
                        for k in ("workload_error", "failed_phase", "stored_at_failure"):
                            run[k] = data.get(k)
                        if data.get("workload_traceback"):
                            print(data["workload_traceback"], file=log)
                    run["steps"] = sum(1 for c in calls if c.phase == "write" and c.method == "put")
            runs[f"{saver.key}/{mode}"] = run
        for f in (grown or {}).values():
            Path(f).unlink(missing_ok=True)
        if not args.no_scale:  # last: its 10,000 threads take the longest
            runs.update(scale_runs(savers, args, moto, log))
        cold = {} if args.no_cold_start else cold_start(savers, proxy, args.cold_start_repeats)
    finally:
        proxy.stop()
        if moto_proc.stdin:
            moto_proc.stdin.close()
        try:
            moto_proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            moto_proc.kill()

    # Check against InMemorySaver, same mode.
    for key, run in runs.items():
        saver_key, mode = key.split("/")
        ref = runs.get(f"memory/{mode}")
        if "results" in run and ref and "results" in ref:
            run["verification"] = verify(run["results"], ref["results"])
    # The cost model: per-request costs add up to the counts priced, and a saver
    # with no table (manifest index) sends DynamoDB nothing.
    for key, run in runs.items():
        if "phases" not in run:
            continue
        problems = []
        for p, ph in run["phases"].items():
            expect = costs.priced(ph["s3_tier1_requests"], ph["s3_tier2_requests"], ph["read_units"],
                                  ph["write_units"])
            if abs(ph["cost"] - expect) > 1e-12 or abs(ph["s3_cost"] + ph["ddb_cost"] - ph["cost"]) > 1e-12:
                problems.append(f"{p}: cost {ph['cost']:.9f} vs {expect:.9f} from the counts")
            if key.startswith("s3-manifest/") and (ph["ddb_requests"] or ph["ddb_cost"]):
                problems.append(f"{p}: {ph['ddb_requests']} DynamoDB requests with no table")
        run["cost_check"] = "; ".join(problems)
    mem_scaling = runs.get("memory/scaling", {}).get("checks")
    for key, run in runs.items():
        if key.endswith("/scaling") and "checks" in run and mem_scaling is not None:
            # The reference ran every length; compare the ones this saver ran.
            differ = {k: [v, mem_scaling.get(k)] for k, v in run["checks"].items() if mem_scaling.get(k) != v}
            run["checks_match_memory"] = not differ
            run["checks_differ"] = differ

    doc = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {"turns": args.turns, "latency_ms": args.latency_ms, "modes": args.modes,
                     "python": sys.version.split()[0], "longconv_turns": args.longconv_turns,
                     "longconv_only": args.longconv_only, "scale_only": args.scale_only,
                     "scale_threads": [] if args.no_scale else args.scale_threads},
        "savers": [{"key": s.key, "label": s.label, "available": s.available, "note": s.note} for s in savers],
        "runs": runs,
        "cold_start": cold,
        "elapsed": time.monotonic() - started,
    }
    doc["targets"] = report.targets(doc)
    doc["year_cost"] = yearcost.model(doc)
    doc["cross_region"] = crossregion.model(doc)
    doc["longconv"] = longconv_report.model(doc)
    doc["scale"] = scale_report.model(doc)
    text = report.render(doc)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # A long-conversation-only or scale-only run is partial: it must not replace the full run's latest.*.
    pre = "longconv-" if args.longconv_only else "scale-" if args.scale_only else ""
    for name in (f"{pre}bench-{stamp}.json", f"{pre}latest.json"):
        (out / name).write_text(json.dumps(doc, indent=1, default=str))
    (out / f"{pre}latest.txt").write_text(text + "\n")
    (out / f"{pre}latest.md").write_text(report.render(doc, markdown=True) + "\n")
    print(f"\nwrote {out / f'{pre}latest.json'}, .txt and .md in {doc['elapsed']:.0f}s", file=log)
    # A published peer that fails is a result (reported in the tables), not a failed benchmark.
    ours = {k: r for k, r in runs.items() if not peers.is_peer(k.split("/")[0])}
    return 0 if all(r.get("ok") and not longconv_report.problems(r) and not scale_report.problems(r)
                    for r in ours.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
