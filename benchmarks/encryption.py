"""Encryption beside plaintext: requests, round trips, CPU and dollars, both index modes.

    python -m benchmarks.encryption [--calls N] [--cpu-repeats N] [--latency-ms MS] [--out DIR]

Part of ``make bench`` (alone: ``make bench-encryption``). S3Saver in each index mode, three
ways: without encryption, with ``LocalKey`` and with ``KmsKey`` (moto's KMS). Every request goes
through the counting proxy (``benchmarks/proxy.py``, which prices KMS requests at $0.03 per
10,000), on one moto server started for the run.

* Steady state: a process that wrote and read the thread already: ``put``, ``put_writes``,
  ``get_tuple`` and ``list(limit=5)``, ``--calls`` of each; requests (counted at the proxy,
  checked against the saver's own count), round trips (the saver's drivers count the waves
  they send: exact, where the proxy's overlap of times may split a wave under load; the JSON
  has both), $ per 1,000 calls.
* A cold process: its first call on an existing thread (``get_tuple``, or a ``put_writes``),
  and a new thread's first turn (LangGraph's ``get_tuple`` that finds nothing, then the first
  ``put``); then "a Lambda turn": a cold process's ``get_tuple``, ``put`` and ``put_writes`` on
  an existing thread, $ per 1,000 turns.
* CPU: ``time.process_time`` of a ``put`` of a checkpoint carrying a new 1 MiB value, and of a
  ``get_tuple`` that reads it (a process that holds the thread's key already), median of
  ``--cpu-repeats``, encrypted minus plaintext, per MiB; beside it AES-256-GCM alone (the
  ``cryptography`` package) on 1 MiB. Reported, not asserted: the machine's load moves it.

Output: the tables on stdout and in ``results/encryption-latest.{txt,md}``, every number in
``results/encryption-latest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import _guard

_guard.install()  # dummy credentials, nothing but 127.0.0.1

import boto3
from langgraph.checkpoint.base.id import uuid6

from benchmarks import costs
from benchmarks.proxy import LatencyProxy, Request
from benchmarks.run import RESULTS, start_moto, waves
from s3_saver import KmsKey, LocalKey, S3Saver

BUCKET = "bench-encryption"
TABLE = "bench-encryption-index"
MODES = ("dynamodb", "manifest")
VARIANTS = ("plaintext", "LocalKey", "KmsKey")
MIB = 1 << 20
STEADY = ("put", "put_writes", "get_tuple", "list(limit=5)")


# -- the workload ------------------------------------------------------------------------------
class Thread:
    """One thread's checkpoints, built as LangGraph builds them (a growing message list)."""

    def __init__(self, saver: S3Saver, thread_id: str) -> None:
        self.saver, self.thread_id = saver, thread_id
        self.versions: dict[str, Any] = {}
        self.messages: list[str] = []
        self.last: dict[str, Any] | None = None

    def config(self, checkpoint_id: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        if checkpoint_id:
            c["checkpoint_id"] = checkpoint_id
        return {"configurable": c}

    def put(self, saver: S3Saver | None = None, extra: dict[str, Any] | None = None, parent: dict | None = None) -> dict:
        saver = saver or self.saver
        self.messages.append(f"turn {len(self.messages)}: " + "a message of a conversation " * 8)
        values = {"messages": list(self.messages), "step": len(self.messages), **(extra or {})}
        changed = {}
        for channel in values:
            self.versions[channel] = saver.get_next_version(self.versions.get(channel), None)
            changed[channel] = self.versions[channel]
        cid = str(uuid6())
        checkpoint = {
            "v": 4, "id": cid, "ts": datetime.now(UTC).isoformat(),
            "channel_values": values, "channel_versions": dict(self.versions),
            "versions_seen": {"agent": dict(changed)}, "updated_channels": sorted(changed),
        }
        base = parent or self.last or self.config()
        stored = saver.put(base, checkpoint, {"source": "loop", "step": len(self.messages), "run_id": "run-1"}, changed)
        if parent is None:
            self.last = stored
        return stored

    def put_writes(self, saver: S3Saver | None = None) -> None:
        assert self.last is not None
        (saver or self.saver).put_writes(self.last, [("messages", ["a reply " * 20])], f"task-{uuid6()}", "path")


def _encryption(variant: str, endpoint: str, kms_key: str, local: bytes) -> Any:
    if variant == "LocalKey":
        return LocalKey(local)
    if variant == "KmsKey":
        return KmsKey(kms_key, endpoint_url=endpoint, region_name="us-east-1")
    return None


class Bench:
    def __init__(self, endpoint: str, proxy: LatencyProxy, kms_key: str) -> None:
        self.endpoint, self.proxy, self.kms_key = endpoint, proxy, kms_key
        self.local = os.urandom(32)

    def saver(self, mode: str, variant: str) -> S3Saver:
        """A new saver (a new process: nothing cached) of the variant's prefix."""
        return S3Saver(
            BUCKET, table=TABLE if mode == "dynamodb" else None, prefix=f"{mode}-{variant}/",
            endpoint_url=self.endpoint, region_name="us-east-1",
            encryption=_encryption(variant, self.endpoint, self.kms_key, self.local),
        )

    def measure(self, saver: S3Saver, call: Callable[[], Any]) -> dict[str, Any]:
        """What one call sent (the proxy's records), checked against the saver's own count."""
        self.proxy.take()
        saver.stats.reset()
        call()
        sent = saver.stats.snapshot()
        # The proxy records a request after its answer is sent: the call may return first.
        records: list[Request] = self.proxy.take()
        deadline = time.monotonic() + 2.0
        while len(records) < sent.total_requests and time.monotonic() < deadline:
            time.sleep(0.005)
            records += self.proxy.take()
        if len(records) != sent.total_requests:
            raise RuntimeError(f"the proxy saw {len(records)} requests, the saver counted {sent.total_requests}")
        by_service: dict[str, int] = {}
        for r in records:
            by_service[r.service] = by_service.get(r.service, 0) + 1
        return {"requests": len(records), "round_trips": waves(records), "saver_round_trips": sent.round_trips,
                "by_service": by_service, "cost": sum(r.cost for r in records)}


def _mean(rows: list[dict[str, Any]]) -> dict[str, Any]:
    services = sorted({s for r in rows for s in r["by_service"]})
    return {
        "requests": statistics.mean(r["requests"] for r in rows),
        "round_trips": statistics.mean(r["round_trips"] for r in rows),
        "saver_round_trips": statistics.mean(r["saver_round_trips"] for r in rows),
        "by_service": {s: statistics.mean(r["by_service"].get(s, 0) for r in rows) for s in services},
        "usd_per_1k": statistics.mean(r["cost"] for r in rows) * 1000,
    }


def run_variant(bench: Bench, mode: str, variant: str, calls: int, cpu_repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    writer = bench.saver(mode, variant)
    writer.setup()
    # The steady state: a thread this process wrote and read.
    t = Thread(writer, "steady")
    writer.get_tuple(t.config())
    for _ in range(3):
        t.put()
        t.put_writes()
    writer.get_tuple(t.config())
    steady: dict[str, list[dict[str, Any]]] = {name: [] for name in STEADY}
    for _ in range(calls):
        steady["put"].append(bench.measure(writer, t.put))
        steady["put_writes"].append(bench.measure(writer, t.put_writes))
        steady["get_tuple"].append(bench.measure(writer, lambda: writer.get_tuple(t.config())))
        steady["list(limit=5)"].append(bench.measure(writer, lambda: list(writer.list(t.config(), limit=5))))
    out["steady"] = {name: _mean(rows) for name, rows in steady.items()}

    # Cold processes on the existing thread.
    cold = bench.saver(mode, variant)
    out["cold get_tuple"] = _mean([bench.measure(cold, lambda: cold.get_tuple(t.config()))])
    cold.close()
    cold = bench.saver(mode, variant)
    out["cold put_writes"] = _mean([bench.measure(cold, lambda: t.put_writes(cold))])
    cold.close()
    # A new thread's first turn, in a new process: LangGraph reads it first, then puts.
    fresh = bench.saver(mode, variant)
    n = Thread(fresh, "new")
    first = [bench.measure(fresh, lambda: fresh.get_tuple(n.config())), bench.measure(fresh, n.put)]
    out["new thread get_tuple"], out["new thread first put"] = _mean(first[:1]), _mean(first[1:])
    fresh.close()
    # A Lambda turn: a cold process reads the thread, writes a step and its writes.
    turns = []
    for _ in range(max(1, calls // 2)):
        lam = bench.saver(mode, variant)
        turns.append(bench.measure(lam, lambda lam=lam: (lam.get_tuple(t.config()), t.put(lam), t.put_writes(lam))))
        lam.close()
    out["cold turn"] = _mean(turns)

    # CPU per MiB: a put carrying a new 1 MiB value (forks of one small checkpoint), and a
    # get_tuple reading it in a process that holds the key (read the small one first).
    c = Thread(writer, "cpu")
    base = c.put()
    put_cpu, read_cpu = [], []
    stored = []
    for _ in range(cpu_repeats):
        value = os.urandom(MIB)
        began = time.process_time()
        stored.append(c.put(extra={"blob": value}, parent=base))
        put_cpu.append(time.process_time() - began)
    for cfg in stored:
        reader = bench.saver(mode, variant)
        reader.get_tuple(base)
        began = time.process_time()
        found = reader.get_tuple(cfg)
        read_cpu.append(time.process_time() - began)
        assert found is not None and len(found.checkpoint["channel_values"]["blob"]) == MIB
        reader.close()
    out["cpu_ms_put_1mib"] = statistics.median(put_cpu) * 1000
    out["cpu_ms_read_1mib"] = statistics.median(read_cpu) * 1000
    writer.close()
    return out


def aes_gcm_ms_per_mib(repeats: int = 20) -> tuple[float, float]:
    """AES-256-GCM alone on 1 MiB (seal, open): the floor of what encryption adds."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead, data = AESGCM(os.urandom(32)), os.urandom(MIB)
    seal, open_ = [], []
    for _ in range(repeats):
        nonce = os.urandom(12)
        t = time.process_time()
        sealed = aead.encrypt(nonce, data, b"aad")
        seal.append(time.process_time() - t)
        t = time.process_time()
        aead.decrypt(nonce, sealed, b"aad")
        open_.append(time.process_time() - t)
    return statistics.median(seal) * 1000, statistics.median(open_) * 1000


# -- the tables -----------------------------------------------------------------------------------
def render(results: dict[str, Any]) -> tuple[str, str]:
    text: list[str] = []
    md: list[str] = []

    def table(title: str, header: list[str], rows: list[list[str]]) -> None:
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        text.append(title)
        text.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        text.extend("  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in rows)
        text.append("")
        md.append(f"**{title}**\n")
        md.append("| " + " | ".join(header) + " |")
        md.append("|" + "---|" * len(header))
        md.extend("| " + " | ".join(str(x) for x in row) + " |" for row in rows)
        md.append("")

    def cell(m: dict[str, Any]) -> str:
        return f"{m['requests']:g} / {m['saver_round_trips']:g}"

    by = results["results"]
    header = ["call", *(f"{mode} {v}" for mode in MODES for v in VARIANTS)]
    rows = [[name, *(cell(by[mode][v]["steady"][name]) for mode in MODES for v in VARIANTS)] for name in STEADY]
    table("Encryption: steady state, requests / round trips per call (mean)", header, rows)
    rows = [[name, *(f"${by[mode][v]['steady'][name]['usd_per_1k']:.5f}" for mode in MODES for v in VARIANTS)]
            for name in STEADY]
    table("Encryption: steady state, $ per 1,000 calls", header, rows)
    cold = ("cold get_tuple", "cold put_writes", "new thread get_tuple", "new thread first put", "cold turn")
    rows = []
    for name in cold:
        row = [name]
        for mode in MODES:
            plain = by[mode]["plaintext"][name]
            for v in VARIANTS:
                m = by[mode][v][name]
                extra = "" if v == "plaintext" else f" (+{m['saver_round_trips'] - plain['saver_round_trips']:g})"
                row.append(cell(m) + extra)
        rows.append(row)
    table("Encryption: a cold process, requests / round trips (+ round trips beyond plaintext)", header, rows)
    rows = []
    for name in ("cold get_tuple", "new thread first put", "cold turn"):
        rows.append([name, *(f"${by[mode][v][name]['usd_per_1k']:.5f}" for mode in MODES for v in VARIANTS)])
    table("Encryption: a cold process, $ per 1,000 (KMS $0.03 per 10,000 requests)", header, rows)
    seal, open_ = results["aes_gcm_ms_per_mib"]
    rows = []
    for mode in MODES:
        plain = by[mode]["plaintext"]
        for v in VARIANTS[1:]:
            m = by[mode][v]
            rows.append([f"{mode} {v}", f"{m['cpu_ms_put_1mib'] - plain['cpu_ms_put_1mib']:.2f}",
                         f"{m['cpu_ms_read_1mib'] - plain['cpu_ms_read_1mib']:.2f}",
                         f"{plain['cpu_ms_put_1mib']:.1f} / {plain['cpu_ms_read_1mib']:.1f}"])
    rows.append(["AES-256-GCM alone", f"{seal:.2f}", f"{open_:.2f}", "-"])
    table("Encryption: CPU ms per MiB (time.process_time, median; encrypted minus plaintext)",
          ["saver", "put (seal)", "get_tuple (open)", "plaintext put / get_tuple"], rows)
    return "\n".join(text), "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10, help="steady-state calls of each kind (default 10)")
    ap.add_argument("--cpu-repeats", type=int, default=9, help="1 MiB puts and reads per saver (default 9)")
    ap.add_argument("--latency-ms", type=float, default=5.0, help="injected per-request latency (default 5)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--render", metavar="JSON", help="only print the tables of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.render:
        print(render(json.loads(Path(args.render).read_text()))[0])
        return 0
    moto, endpoint = start_moto()
    proxy = LatencyProxy(int(endpoint.rsplit(":", 1)[1]), latency=args.latency_ms / 1000).start()
    try:
        kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
        key_id = kms.create_key(Description="bench")["KeyMetadata"]["KeyId"]
        bench = Bench(proxy.url, proxy, key_id)
        results: dict[str, Any] = {"calls": args.calls, "cpu_repeats": args.cpu_repeats,
                                   "latency_ms": args.latency_ms, "kms_usd_per_request": costs.KMS_PER_REQUEST,
                                   "results": {}}
        for mode in MODES:
            results["results"][mode] = {}
            for variant in VARIANTS:
                results["results"][mode][variant] = run_variant(bench, mode, variant, args.calls, args.cpu_repeats)
        results["aes_gcm_ms_per_mib"] = aes_gcm_ms_per_mib()
    finally:
        proxy.stop()
        assert moto.stdin is not None
        moto.stdin.close()
        moto.wait(timeout=30)
    text, md = render(results)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "encryption-latest.json").write_text(json.dumps(results, indent=1))
    (out / "encryption-latest.txt").write_text(text)
    (out / "encryption-latest.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
