"""How long ``migrate()`` takes, and what it sends: SQLite -> S3Saver -> SQLite.

``python -m benchmarks.migrate_sqlite [--turns 50] [--no-verify]``

Builds the benchmark's conversation (``workload.py``: its graph and turns, one
turn in five interrupted and resumed) on a SqliteSaver over a file, then
migrates it into an S3Saver on a moto server this script starts (its own
process, 127.0.0.1, no latency added), in both index modes, and from each back
into a new SQLite file. Prints checkpoints, pending writes, serialized bytes,
the S3Saver's requests (``saver.stats``) and the wall time of each migration.
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

from benchmarks.run import start_moto  # noqa: E402
from benchmarks.workload import build_graph, turn_input  # noqa: E402
from s3_saver import S3Saver  # noqa: E402
from s3_saver._migrate import MigrationReport, migrate  # noqa: E402

BUCKET = "migrate-bench"
TABLE = "migrate-bench-index"
THREAD = "bench-thread"


def build_conversation(path: Path, turns: int) -> tuple[SqliteSaver, float]:
    """The workload's write phase on a SqliteSaver over ``path``; returns it and the seconds taken."""
    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    graph = build_graph(saver)
    config = {"configurable": {"thread_id": THREAD}}
    started = time.perf_counter()
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
    parser.add_argument("--no-verify", action="store_true", help="migrate with verify=False")
    args = parser.parse_args(argv)
    verify = not args.no_verify

    moto, endpoint = start_moto()
    try:
        with tempfile.TemporaryDirectory(prefix="migrate-bench-") as tmp:
            source, built = build_conversation(Path(tmp) / "source.db", args.turns)
            stored = list(source.list(None))
            size = (Path(tmp) / "source.db").stat().st_size
            print(f"SQLite source: {args.turns} turns, {len(stored)} checkpoints, "
                  f"{sum(len(t.pending_writes) for t in stored)} pending writes, {size:,} bytes on disk "
                  f"(built in {built:.2f} s)")
            print(f"moto at {endpoint} (no added latency); verify={verify}\n")
            print(f"{'migration':<34} {'checkpoints':>11} {'writes':>7} {'bytes':>11} {'verified':>9} "
                  f"{'seconds':>8}  {'trips':>6}  requests (S3Saver)")
            for mode in ("dynamodb", "manifest"):
                s3 = S3Saver(BUCKET, table=TABLE if mode == "dynamodb" else None, prefix=f"{mode}/",
                             endpoint_url=endpoint, region_name="us-east-1")
                s3.setup()
                s3.stats.reset()
                report = migrate(source, s3, verify=verify)
                print(row(f"SQLite -> S3Saver ({mode})", report, s3, s3.stats.round_trips))
                back = SqliteSaver(sqlite3.connect(Path(tmp) / f"back-{mode}.db", check_same_thread=False))
                s3.stats.reset()
                report = migrate(s3, back, verify=verify)
                print(row(f"S3Saver ({mode}) -> SQLite", report, s3, s3.stats.round_trips))
                s3.stats.reset()
                report = migrate(source, s3, verify=verify)
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
