"""How long ``migrate()`` takes, and what it sends: SQLite -> S3Saver -> SQLite.

``python -m benchmarks.migrate_sqlite [--turns 50] [--threads 1] [--workers 1] [--latency-ms 0] [--no-verify]``

Builds the benchmark's conversation (``workload.py``: its graph and turns, one
turn in five interrupted and resumed) on a SqliteSaver over a file, ``--threads``
times (threads ``bench-thread-1``...), then migrates it into an S3Saver on a moto
server this script starts (its own process, 127.0.0.1), in both index modes, and
from each back into a new SQLite file, ``--workers`` threads at once. Prints
checkpoints, pending writes, serialized bytes, the S3Saver's requests
(``saver.stats``: round trips are summed over the workers) and the wall time of
each migration.

No latency is added unless ``--latency-ms`` is given: the S3Saver then talks to
moto through ``benchmarks.proxy.LatencyProxy``, which holds every request that
long (as a network to S3 and DynamoDB would).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks import _guard

_guard.install()  # before anything can open a connection: loopback only, dummy credentials

from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.types import Command  # noqa: E402

from benchmarks.proxy import LatencyProxy  # noqa: E402
from benchmarks.run import start_moto  # noqa: E402
from benchmarks.workload import build_graph, turn_input  # noqa: E402
from s3_saver import MigrationReport, S3Saver, migrate  # noqa: E402

BUCKET = "migrate-bench"
TABLE = "migrate-bench-index"
THREAD = "bench-thread"


def build_conversation(path: Path, turns: int, threads: int = 1) -> tuple[SqliteSaver, float]:
    """The workload's write phase on a SqliteSaver over ``path``, once per thread; returns it and the seconds taken."""
    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    graph = build_graph(saver)
    started = time.perf_counter()
    for n in range(1, threads + 1):
        config = {"configurable": {"thread_id": THREAD if threads == 1 else f"{THREAD}-{n}"}}
        for turn in range(1, turns + 1):
            out = graph.invoke(turn_input(turn), config)
            while out.get("__interrupt__"):
                out = graph.invoke(Command(resume=f"approved-{turn}"), config)
    return saver, time.perf_counter() - started


def requests_text(counts: Counter[tuple[str, str]]) -> str:
    by_op = ", ".join(f"{op} {n}" for (_, op), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{sum(counts.values())} ({by_op})" if counts else "0"


def row(label: str, report: MigrationReport, s3: S3Saver, round_trips: int) -> str:
    return (
        f"{label:<34} {report.checkpoints:>11} {report.writes:>7} {report.bytes:>11,} {report.verified:>9} "
        f"{report.seconds:>8.2f}  {round_trips:>6}  {requests_text(s3.stats.requests)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50, help="conversation turns (default 50)")
    parser.add_argument("--threads", type=int, default=1, help="threads of --turns turns each (default 1)")
    parser.add_argument("--workers", type=int, default=1, help="threads migrated at once (default 1)")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="latency added to every S3 and DynamoDB request by a proxy (default 0: none)")
    parser.add_argument("--no-verify", action="store_true", help="migrate with verify=False")
    args = parser.parse_args(argv)
    verify, workers = not args.no_verify, args.workers

    moto, endpoint = start_moto()
    try:
        if args.latency_ms > 0:
            proxy = LatencyProxy(int(endpoint.rsplit(":", 1)[1]), args.latency_ms / 1000).start()
            endpoint, where = proxy.url, f"through a proxy adding {args.latency_ms:g} ms per request"
        else:
            where = "no added latency"
        with tempfile.TemporaryDirectory(prefix="migrate-bench-") as tmp:
            source, built = build_conversation(Path(tmp) / "source.db", args.turns, args.threads)
            stored = list(source.list(None))
            size = (Path(tmp) / "source.db").stat().st_size
            print(f"SQLite source: {args.threads} thread(s) x {args.turns} turns, {len(stored)} checkpoints, "
                  f"{sum(len(t.pending_writes) for t in stored)} pending writes, {size:,} bytes on disk "
                  f"(built in {built:.2f} s)")
            print(f"moto at {endpoint} ({where}); verify={verify}, workers={workers}\n")
            print(f"{'migration':<34} {'checkpoints':>11} {'writes':>7} {'bytes':>11} {'verified':>9} "
                  f"{'seconds':>8}  {'trips':>6}  requests (S3Saver)")
            for mode in ("dynamodb", "manifest"):
                s3 = S3Saver(BUCKET, table=TABLE if mode == "dynamodb" else None, prefix=f"{mode}/",
                             endpoint_url=endpoint, region_name="us-east-1")
                s3.setup()
                s3.stats.reset()
                report = migrate(source, s3, verify=verify, workers=workers)
                print(row(f"SQLite -> S3Saver ({mode})", report, s3, s3.stats.round_trips))
                back = SqliteSaver(sqlite3.connect(Path(tmp) / f"back-{mode}.db", check_same_thread=False))
                s3.stats.reset()
                report = migrate(s3, back, verify=verify, workers=workers)
                print(row(f"S3Saver ({mode}) -> SQLite", report, s3, s3.stats.round_trips))
                s3.stats.reset()
                report = migrate(source, s3, verify=verify, workers=workers)
                print(row(f"  again, all skipped ({mode})", report, s3, s3.stats.round_trips)
                      + f"  [skipped {report.skipped}]")
                back.conn.close()
                s3.close()
            source.conn.close()
    finally:
        if moto.stdin:
            moto.stdin.close()
        try:
            moto.wait(timeout=10)
        except Exception:
            moto.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
