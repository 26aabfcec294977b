"""The scale workload's table (issue 35), from the runner's JSON document.

Rows are metrics, columns are index mode x thread count, and per mode the ratio
of the largest count's value to the smallest's: a flat metric shows ~1.0x, one
that reads every thread shows the ratio of the counts. ``audit`` and
``collect_garbage`` run on a sample of threads and are shown per thread (they are
per thread by design). Memory is one fresh process reading every thread's
latest checkpoint (``scale.run_read``).
"""

from __future__ import annotations

from typing import Any

from benchmarks import scale
from benchmarks.tables import table as _table

MODES = (("s3", "DynamoDB"), ("s3-manifest", "manifest"))


def _runs(doc: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """mode -> thread count -> run, for the scale runs of this document."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for key, run in doc.get("runs", {}).items():
        saver, _, mode = key.partition("/")
        if mode.startswith("scale-") and mode[len("scale-"):].isdigit():
            out.setdefault(saver, {})[int(mode[len("scale-"):])] = run
    return out


def _call(run: dict[str, Any], phase: str) -> dict[str, float] | None:
    c = run.get("calls", {}).get(phase)
    if c is None:
        return None
    per = scale.PER_THREAD.get(phase, 1)
    return {"requests": c["requests"] / per, "round_trips": c["round_trips"] / per,
            "cost_per_1k": 1000 * c["cost"] / per, "seconds": c["ms"] / 1000 / per}


def model(doc: dict[str, Any]) -> dict[str, Any]:
    """Per mode and thread count: each measured call (per thread for audit/gc), the
    read of every thread, how long growing took, and the checks."""
    out: dict[str, Any] = {}
    for saver, by_n in _runs(doc).items():
        for n, run in sorted(by_n.items()):
            if not run.get("ok"):
                out[f"{saver}/{n}"] = {"error": run.get("error")}
                continue
            s = run["scale"]
            out[f"{saver}/{n}"] = {"calls": {p: _call(run, p) for p in scale.PHASES}, "read": run.get("read"),
                                   "grow": s["grow"], "check": s["check"], "checks": s["checks"]}
    return out


def problems(run: dict[str, Any]) -> list[str]:
    """What makes a scale run fail: a check that differs, a read that missed threads.
    (Every other run has no ``scale`` key: nothing to say; a child's error is reported
    with the runs.)"""
    s = run.get("scale")
    if not s:
        return []
    out = []
    if not s.get("check"):
        diff = {k: [v, s["expected"].get(k)] for k, v in s["checks"].items() if s["expected"].get(k) != v}
        out.append(f"checks differ (got, expected): {diff}")
    read = run.get("read") or {}
    if read.get("error") or not read.get("check"):
        missed = f"{read.get('read')} of {read.get('threads')} threads read"
        out.append(f"read of every thread: {read.get('error') or missed}")
    return out


def _fmt(v: float | None, digits: int = 1) -> str:
    if v is None:
        return ""
    return f"{v:,.0f}" if v == int(v) and abs(v) >= 1 else f"{v:,.{digits}f}"


def _mb(v: Any) -> float | None:
    return v / 1e6 if isinstance(v, (int, float)) else None


def tables(doc: dict[str, Any]) -> list[str]:
    runs = _runs(doc)
    if not runs:
        return []
    counts = sorted({n for by_n in runs.values() for n in by_n})
    modes = [(k, label) for k, label in MODES if k in runs]
    headers = ["metric"]
    for _, label in modes:
        headers += [f"{label} {n:,}" for n in counts] + ([f"x {counts[-1] // counts[0]:,}"] if len(counts) > 1 else [])

    def row(name: str, get: Any, digits: int = 1) -> list[Any]:
        cells: list[Any] = [name]
        for key, _ in modes:
            vals = []
            for n in counts:
                run = runs[key].get(n)
                v = get(run) if run and run.get("ok") else None
                vals.append(v)
                cells.append(_fmt(v, digits))
            if len(counts) > 1:
                a, b = vals[0], vals[-1]
                cells.append(f"{b / a:.2f}x" if a and b is not None else "")
        return cells

    rows = []
    for phase in scale.PHASES:
        name = phase.replace(f"({scale.SAMPLE} threads)", ", per thread")
        for metric, label, digits in (("requests", "requests", 1), ("round_trips", "round trips", 1),
                                      ("cost_per_1k", "$ per 1,000 calls", 4)):
            rows.append(row(f"{name}: {label}", lambda r, p=phase, m=metric: (_call(r, p) or {}).get(m), digits))
    for field, label in (("tracemalloc_peak", "tracemalloc peak"), ("held_after", "held after the reads"),
                         ("max_rss", "process peak RSS"), ("cache_bytes", "saver's cache bytes")):
        rows.append(row(f"read every thread: {label}, MB", lambda r, f=field: _mb((r.get("read") or {}).get(f))))
    rows.append(row(f"read every thread: seconds ({scale.WORKERS} at once, no proxy)", lambda r: (r.get("read") or {}).get("seconds")))
    rows.append(row("grow: seconds (straight at moto)", lambda r: r["scale"]["grow"]["grow_seconds"]))
    rows.append(row("archive ahead: seconds", lambda r: r["scale"]["grow"]["archive_seconds"]))
    rows.append(row("archive ahead: threads", lambda r: r["scale"]["grow"]["archived"]))
    st = doc.get("settings", {})
    out = ["", "== Scale: calls whose cost may grow with the number of threads (S3Saver) ==",
           _table(headers, rows),
           (f"Each count: its own bucket and table, threads grown straight at moto (one ~{scale.STATE_CHARS // 1000} KB "
           f"checkpoint each; the older half idle {scale.IDLE_DAYS} days, 1/{scale.ARCHIVED} of those archived ahead), "
           f"then each call once, through the proxy ({st.get('latency_ms', 15):g} ms), by a fresh saver. "
           f"list_threads: limit={scale.PAGE}; the later page starts at the first live thread (before=<id>). "
           f"archive_idle: older_than={scale.OLDER_THAN.days} days. audit/gc: {scale.SAMPLE} threads, per thread.")]
    bad = [f"{k}: {p}" for k, by_n in runs.items() for n, r in sorted(by_n.items()) for p in problems(r)]
    bad += [f"{k}/scale-{n}: {r.get('error')}" for k, by_n in runs.items() for n, r in sorted(by_n.items())
            if not r.get("ok")]
    out += [f"SCALE CHECK FAILED {b}" for b in bad]
    return out
