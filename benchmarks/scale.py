"""The scale workload (issue 35): many threads, then what scheduled and paged work costs.

Two child modes (``child.py --mode``), each its own process, per index mode and
thread count N:

* ``scale``: grows N threads straight at moto (latency 0, nothing counted) with
  the saver itself, ``WORKERS`` threads at once: one checkpoint of one ~2 KB
  channel per thread. The first half is grown with the process clock set back
  ``IDLE_DAYS`` (``time.time`` and ``time.time_ns``: the checkpoint's ``ts``,
  its id and whatever the saver stamps), so it is idle for ``archive_idle``;
  the oldest fifth of those is then archived (``archive_thread``, GLACIER_IR),
  as a product that has run archival for a while has (a fifth, not a half:
  archiving through the saver took 0.15 s a thread with the DynamoDB index and
  0.5 s with the manifest on a loaded 2-core machine; the archived threads are
  there so a run that reads them shows it). Then a fresh saver
  makes each measured call through the proxy: a ``list_threads`` page (the
  first, and one deep in the listing), ``archive_idle(limit=1)`` and
  ``(limit=10)``, and ``audit``/``collect_garbage`` on a sample of threads.
* ``scale-read``: a fresh process and saver read the latest checkpoint of all
  N threads (straight at moto: memory does not depend on latency), under
  tracemalloc: its peak, what stays held once done, the process's peak RSS,
  and the saver's own count of cached bytes where it has one.

The runner's half (the per-call sums, the table) is ``scale_report``.
"""

from __future__ import annotations

import gc
import resource
import sys
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

MODES = ("scale", "scale-read")
DEFAULT_THREADS = (1_000, 10_000)
IDLE_DAYS = 40  # the idle half's age: past archive_idle's OLDER_THAN
OLDER_THAN = timedelta(days=30)
ARCHIVED = 5  # 1/ARCHIVED of the idle threads are archived before the measured calls
SAMPLE = 20  # threads audited / collected by the per-thread calls
PAGE = 100  # list_threads(limit=PAGE): one page of the saver's listing
WORKERS = 4  # threads grown, archived or read at once
# moto serves one DynamoDB request at a time: on a loaded machine an answer can take
# longer than the saver's 5 s read timeout, and a retry would be counted. Nothing here
# measures time, so the scale savers wait.
READ_TIMEOUT = 120
STATE_CHARS = 2_000

# The measured calls, in order (the JSON's phases; scale_report's rows).
PHASES = ("list_threads first page", "list_threads later page", "archive_idle(limit=1)",
          "archive_idle(limit=10)", f"audit({SAMPLE} threads)", f"collect_garbage({SAMPLE} threads)")
PER_THREAD = {PHASES[4]: SAMPLE, PHASES[5]: SAMPLE}  # divided by this in the table


def build(target: Any, endpoint: str) -> Any:
    """The run's S3Saver (as ``Target.build``), patient with a slow moto."""
    from botocore.config import Config

    from s3_saver import S3Saver

    table = target.table if target.kind == "s3" else None
    return S3Saver(target.bucket, table=table, endpoint_url=endpoint, region_name="us-east-1",
                   client_config=Config(read_timeout=READ_TIMEOUT, connect_timeout=30))


def thread_ids(n: int) -> list[str]:
    return [f"scale-{i:06d}" for i in range(n)]


@contextmanager
def shifted_clock(seconds: float) -> Iterator[None]:
    """The process clock moved by ``seconds`` (wall clock only: monotonic timers and
    the request signatures, which botocore dates with ``datetime``, are untouched)."""
    real, real_ns = time.time, time.time_ns
    time.time = lambda: real() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_ns() + int(seconds * 1e9)  # type: ignore[assignment]
    try:
        yield
    finally:
        time.time, time.time_ns = real, real_ns  # type: ignore[assignment]


def _put_first(saver: Any, thread_id: str) -> None:
    """One checkpoint, as LangGraph's input step writes it, stamped with the process clock."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    from benchmarks.workload import make_text

    version = saver.get_next_version(None, None)
    ckpt = empty_checkpoint()
    ckpt.update(id=str(uuid6()), ts=datetime.fromtimestamp(time.time(), timezone.utc).isoformat(),
                channel_values={"state": make_text(thread_id, STATE_CHARS)},
                channel_versions={"state": version}, updated_channels=["state"])
    saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, ckpt,
              {"source": "input", "step": -1, "parents": {}}, {"state": version})


def _each(fn: Any, items: list[str]) -> None:
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for _ in pool.map(fn, items):
            pass


def grow(direct: Any, n: int) -> dict[str, Any]:
    """N threads straight at moto; the first half idle, the oldest fifth of those archived."""
    ids = thread_ids(n)
    idle = n // 2
    t0 = time.monotonic()
    with shifted_clock(-IDLE_DAYS * 86400):
        _each(lambda t: _put_first(direct, t), ids[:idle])
    _each(lambda t: _put_first(direct, t), ids[idle:])
    grown = time.monotonic() - t0
    t1 = time.monotonic()
    _each(lambda t: direct.archive_thread(t, storage_class="GLACIER_IR"), ids[: idle // ARCHIVED])
    return {"threads": n, "idle": idle, "archived": idle // ARCHIVED, "grow_seconds": grown,
            "archive_seconds": time.monotonic() - t1}


def run(target: Any, n: int) -> dict[str, Any]:
    from benchmarks.metered import MeteredSaver, Recorder

    direct = build(target, target.moto)
    direct.setup()
    out: dict[str, Any] = {"grow": grow(direct, n), "checks": {}, "sample": SAMPLE}
    recorder = Recorder()
    inner = build(target, target.proxy)  # a fresh saver: a scheduled run or a new server process
    metered = MeteredSaver(inner, recorder)
    ids = thread_ids(n)
    # The newest live threads: no archive_idle run here or after issue 35 takes them.
    sample = ids[n - SAMPLE:]

    def measured(phase: str, fn: Any) -> Any:
        recorder.phase = phase
        try:
            return metered._run(phase, fn)
        finally:
            recorder.phase = "idle"

    first = measured(PHASES[0], lambda: list(inner.list_threads(limit=PAGE)))
    # Deep in the listing: the threads created before the first live one (the idle
    # half's newest), named by id as the CLI's --before does (one lookup of its position).
    later = measured(PHASES[1], lambda: list(inner.list_threads(limit=PAGE, before=ids[n // 2])))
    one = measured(PHASES[2], lambda: inner.archive_idle(OLDER_THAN, limit=1))
    ten = measured(PHASES[3], lambda: inner.archive_idle(OLDER_THAN, limit=10))
    audited = measured(PHASES[4], lambda: inner.audit(sample))
    collected = measured(PHASES[5], lambda: inner.collect_garbage(sample))
    live = set(ids[n // 2:])
    # Newest first: the live half, then the idle one. The later page holds the idle
    # threads and any live one created in the same second as ids[n // 2] (ordered
    # after it in the listing), so its length is checked against a range.
    later_n = min(PAGE, n // 2)
    out["checks"] = {
        "first page: threads, live ones": [len(first), sum(t.thread_id in live for t in first)],
        "later page: full, distinct": [later_n <= len(later) <= PAGE, len({t.thread_id for t in later}) == len(later)],
        "archived by limit=1": archived(one), "archived by limit=10": archived(ten),
        "audit threads, problems": [audited.threads, len(audited.problems)],
        "gc threads, deleted": [collected.threads, len(collected.deleted or [])],
    }
    out["expected"] = {"first page: threads, live ones": [min(PAGE, n), min(PAGE, len(live))],
                       "later page: full, distinct": [True, True],
                       "archived by limit=1": 1, "archived by limit=10": 10,
                       "audit threads, problems": [SAMPLE, 0], "gc threads, deleted": [SAMPLE, 0]}
    out["check"] = out["checks"] == out["expected"]
    out["archive_idle_results"] = [_brief(one), _brief(ten)]
    for saver in (inner, direct):
        close = getattr(saver, "close", None)
        if callable(close):
            close()
    return {"calls": recorder.to_json(), "scale": out}


def archived(result: Any) -> int | None:
    """How many threads an archive_idle run archived: its list of statuses, or the
    list a run report holds (issue 35 adds what is left to such a report)."""
    items = result if isinstance(result, list) else getattr(result, "archived", None)
    return len(items) if items is not None else None


def _brief(result: Any) -> str:
    """An archive_idle result for the JSON: a report's repr, a list's length."""
    return f"{len(result)} statuses" if isinstance(result, list) else repr(result)[:500]


def cache_bytes(saver: Any) -> int | None:
    """The bytes the saver's caches hold, by its own count (``cache_stats().used``);
    None for a saver before issue 35's budget, which keeps no count."""
    stats = getattr(saver, "cache_stats", None)
    used = getattr(stats(), "used", None) if callable(stats) else None
    return used if isinstance(used, int) else None


def run_read(target: Any, n: int) -> dict[str, Any]:
    """Every thread's latest checkpoint read by one fresh saver, WORKERS at a time."""
    reader = build(target, target.moto)
    ids = thread_ids(n)
    read: list[int] = []
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.monotonic()

    def one(thread_id: str) -> None:
        t = reader.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
        if t is not None and t.checkpoint["channel_values"].get("state"):
            read.append(1)

    _each(one, ids)
    seconds = time.monotonic() - t0
    peak = tracemalloc.get_traced_memory()[1] - base
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base  # the saver is alive: what it keeps
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    out = {"threads": n, "read": len(read), "check": len(read) == n, "seconds": seconds,
           "tracemalloc_peak": peak, "held_after": held, "max_rss": rss, "cache_bytes": cache_bytes(reader)}
    close = getattr(reader, "close", None)
    if callable(close):
        close()
    return {"calls": [], "scale": out}
