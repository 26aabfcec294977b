"""The memory of one process that reads the latest state of many threads (issue 35).

    python -m benchmarks.memory --threads 1000 [--modes dynamodb,manifest] [--cache-bytes N]

``grow_threads`` writes the threads with direct ``put`` calls straight at moto
(nothing measured); ``read_latest_memory`` then reads the latest state of
every thread with a fresh saver (one that has seen none of them, as a server
process after a restart) and reports the peak of the saver's own cache
estimate (``cache_stats().used``, sampled after each read) and tracemalloc's
peak over the reads (every Python allocation of the process: the caches, and
what a read holds while it runs). Both are reusable as they are: the scale
workload builds its table at 1,000 and 10,000 threads from them.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from benchmarks import _guard

_guard.install()


def _state(thread_id: str, step: int, state_bytes: int) -> dict[str, Any]:
    from benchmarks.workload import make_text

    # The workload's shape at a small size: a message list that grows, and a
    # document the rest of the bytes go to.
    messages = [make_text(f"{thread_id}/m{i}", 400) for i in range(step + 1)]
    return {"messages": messages, "doc": make_text(f"{thread_id}/{step}", max(0, state_bytes - 400 * (step + 1)))}


def grow_threads(saver: Any, thread_ids: Iterable[str], steps: int = 2, state_bytes: int = 20_000,
                 workers: int = 8) -> float:
    """Put ``steps`` checkpoints of about ``state_bytes`` on each thread (direct
    saver calls, ``workers`` threads at once); returns the seconds it took."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    def grow(thread_id: str) -> None:
        config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        versions: dict[str, Any] = {}
        for step in range(steps):
            values = _state(thread_id, step, state_bytes)
            for name in values:
                versions[name] = saver.get_next_version(versions.get(name), None)
            ckpt = empty_checkpoint()
            ckpt.update(id=str(uuid6(clock_seq=step)), ts=datetime.now(timezone.utc).isoformat(),
                        channel_values=values, channel_versions=dict(versions), updated_channels=list(values))
            config = saver.put(config, ckpt, {"source": "loop", "step": step}, dict(versions))

    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(grow, thread_ids))
    return time.monotonic() - t0


def read_latest_memory(saver: Any, thread_ids: Iterable[str]) -> dict[str, Any]:
    """Read the latest checkpoint of each thread with ``saver`` (one at a time);
    returns what it held: ``peak_cache_bytes`` (the saver's estimate, after
    each read), ``cache_budget``, ``evictions``, ``traced_peak_bytes``
    (tracemalloc's peak during the reads, above what was allocated before
    them), ``reads`` and ``seconds``."""
    ids = list(thread_ids)
    started = tracemalloc.is_tracing()
    if not started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    peak_cache = 0
    missing = 0
    t0 = time.monotonic()
    for thread_id in ids:
        found = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
        missing += found is None
        peak_cache = max(peak_cache, saver.cache_stats().used)
    seconds = time.monotonic() - t0
    traced_peak = tracemalloc.get_traced_memory()[1] - base
    if not started:
        tracemalloc.stop()
    stats = saver.cache_stats()
    return {
        "reads": len(ids),
        "missing": missing,
        "peak_cache_bytes": peak_cache,
        "cache_budget": stats.budget,
        "evictions": sum(c.evictions for c in stats.caches.values()),
        "caches": {k: c.bytes for k, c in stats.caches.items() if c.bytes},
        "traced_peak_bytes": traced_peak,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    from benchmarks.run import start_moto
    from s3_saver import S3Saver

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--state-bytes", type=int, default=20_000)
    ap.add_argument("--modes", default="dynamodb,manifest")
    ap.add_argument("--cache-bytes", type=int, default=None, help="the reader's budget (default: the saver's)")
    args = ap.parse_args(argv)
    proc, moto = start_moto()
    try:
        for mode in args.modes.split(","):
            bucket = f"bench-memory-{mode}"
            table = f"bench-memory-{mode}" if mode == "dynamodb" else None
            writer = S3Saver(bucket, table=table, endpoint_url=moto, region_name="us-east-1")
            writer.setup()
            ids = [f"memory-{i}" for i in range(args.threads)]
            grown = grow_threads(writer, ids, args.steps, args.state_bytes)
            writer.close()
            reader = S3Saver(bucket, table=table, endpoint_url=moto, region_name="us-east-1",
                             cache_bytes=args.cache_bytes)
            out = read_latest_memory(reader, ids)
            reader.close()
            mib = 2**20
            print(f"{mode}: {out['reads']} threads (grown in {grown:.0f} s), read in {out['seconds']:.1f} s, "
                  f"{out['missing']} missing; peak cache {out['peak_cache_bytes'] / mib:.1f} MiB of "
                  f"{out['cache_budget'] / mib:.0f} MiB, {out['evictions']} evictions; tracemalloc peak "
                  f"{out['traced_peak_bytes'] / mib:.1f} MiB; caches {out['caches']}")
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
