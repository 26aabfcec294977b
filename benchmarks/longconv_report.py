"""The long conversation's numbers and tables, from the runner's JSON document.

Per saver (``<key>/longconv`` and ``<key>/longconv-read`` runs, see
``benchmarks/longconv.py``): the bytes stored at each point, their ratio to the
final state's serialized size, the growth exponent (least-squares slope of
log(bytes) against log(turns) over the points: 1 = linear, 2 = every version
of the list stored whole), what writing the turns cost in requests, the cold
and warm latest read, and a year of keeping the thread as it is
(``yearcost.peer``: S3 Standard + DynamoDB storage, us-east-1 list prices).
Pure standard library, like ``yearcost``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks import yearcost
from benchmarks.tables import short as _short
from benchmarks.tables import table as _table

READS = ("latest read, cold", "latest read, warm")


def exponent(turns: list[int], sizes: list[int]) -> float | None:
    """Slope of log(size) vs log(turns); None with fewer than two points or a zero size."""
    pts = [(t, s) for t, s in zip(turns, sizes) if t > 0 and s > 0]
    if len(pts) < 2 or len(pts) < len(turns):
        return None
    return statistics.linear_regression([math.log(t) for t, _ in pts], [math.log(s) for _, s in pts]).slope


def _sum(phases: dict[str, Any], names: list[str], field: str) -> float:
    return sum(phases.get(n, {}).get(field, 0) for n in names)


def _read(run: dict[str, Any] | None) -> dict[str, Any]:
    if not run:
        return {}
    if not run.get("ok"):
        return {"error": run.get("error")}
    lc = run["longconv"]
    out: dict[str, Any] = {}
    for phase in READS:
        ph = run["phases"].get(phase, {})
        out[phase] = {k: ph.get(k, 0) for k in ("requests", "round_trips", "s3_requests", "ddb_requests",
                                                 "s3_objects_read", "ddb_items_read", "bytes_up", "bytes_down",
                                                 "cost", "http_errors")}
        out[phase]["operations"] = ph.get("operations", {})
        out[phase]["objects"] = out[phase]["s3_objects_read"] + out[phase]["ddb_items_read"]
        out[phase]["check"] = lc["checks"].get(phase)
        out[phase]["error"] = lc["errors"].get(phase)
    return out


def model(doc: dict[str, Any]) -> dict[str, Any]:
    """One row per saver that ran the long conversation; {} when none did."""
    rows = []
    for s in doc["savers"]:
        key = s["key"]
        run = doc["runs"].get(f"{key}/longconv")
        if run is None:
            continue
        row: dict[str, Any] = {"saver": key, "label": s["label"]}
        rows.append(row)
        if not run.get("ok"):
            row["error"] = run.get("error")
            continue
        lc = run["longconv"]
        pts = [dict(p) for p in lc["points"]]
        for p in pts:
            p["total_bytes"] = p["s3_bytes"] + p["ddb_bytes"]
            p["ratio"] = p["total_bytes"] / p["state_bytes"] if p["state_bytes"] else None
        row.update(turns=lc["turns"], points=pts, error=lc.get("error"), failed_turn=lc.get("failed_turn"),
                   at_failure=None, seconds=lc.get("seconds"))
        turns = [p["turns"] for p in pts]
        row["exponent_total"] = exponent(turns, [p["total_bytes"] for p in pts])
        row["exponent_s3"] = exponent(turns, [p["s3_bytes"] for p in pts])
        row["exponent_ddb"] = exponent(turns, [p["ddb_bytes"] for p in pts])
        # The write: every stretch of turns; the last stretch per turn shows the cost at length.
        names = [n for n in lc["phases"] if n in run["phases"]]
        row["write"] = {f: _sum(run["phases"], names, f)
                        for f in ("requests", "round_trips", "bytes_up", "bytes_down", "cost")}
        if names and len(pts) >= 2 and not lc.get("error"):
            last, span = run["phases"][names[-1]], pts[-1]["turns"] - pts[-2]["turns"]
            row["write_last_stretch"] = {"turns": span, "requests_per_turn": last["requests"] / span,
                                         "bytes_up_per_turn": last["bytes_up"] / span}
        if lc.get("at_failure"):  # what the saver held when it failed: a row, not a point of the fit
            fail = dict(lc["at_failure"])
            fail["total_bytes"] = fail["s3_bytes"] + fail["ddb_bytes"]
            fail["ratio"] = fail["total_bytes"] / fail["state_bytes"] if fail["state_bytes"] else None
            row["at_failure"] = fail
        # The year: the largest thread the saver held (the last point, or where it failed).
        final = row["at_failure"] or (pts[-1] if pts else None)
        if final:
            year = yearcost.peer({"s3_bytes": final["s3_bytes"], "ddb_bytes": final["ddb_bytes"]})
            row["year"] = {**year, "total": year["hot"] + year["rest"] + year["requests"], "turns": final["turns"]}
        row["read"] = _read(doc["runs"].get(f"{key}/longconv-read"))
        row["read_turns"] = final["turns"] if final else None
        row["versioned"] = versioned(doc["runs"].get(f"{key}/longconv-versioned"), pts)
    return {"turns": doc["settings"].get("longconv_turns"), "rows": rows} if rows else {}


# Days a noncurrent version is kept under infra/'s rules: S3 counts from the day it
# became noncurrent and acts at the next midnight UTC, so a rule of N days keeps it
# up to N + 1 (the whole chat is written within one day here).
RULE_DAYS = {"manifest rule, 1 day": 2, "bucket rule, 7 days": 8}


def versioned(run: dict[str, Any] | None, unversioned: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The same write on a versioned bucket: per point the current and noncurrent
    bytes (measured, ListObjectVersions), their ratio, the unversioned run's bytes
    beside; the write; a year kept with no rule (every noncurrent byte stays) and
    with infra/'s rules (each noncurrent version kept ``RULE_DAYS``). None: not run."""
    if not run:
        return None
    if not run.get("ok") or run["longconv"].get("error"):
        return {"error": run.get("error") or run["longconv"].get("error")}
    lc = run["longconv"]
    plain = {p["turns"]: p["s3_bytes"] + p["ddb_bytes"] for p in unversioned}
    pts = [{"turns": p["turns"], "current": p["s3_bytes"] + p["ddb_bytes"], "noncurrent": p["noncurrent_bytes"],
            "noncurrent_versions": p["noncurrent_versions"], "unversioned": plain.get(p["turns"]),
            "check": p.get("check")} for p in lc["points"]]
    for p in pts:
        p["ratio"] = p["noncurrent"] / p["current"] if p["current"] else None
    names = [n for n in lc["phases"] if n in run["phases"]]
    write = {f: _sum(run["phases"], names, f) for f in ("requests", "round_trips", "bytes_up", "cost")}
    out: dict[str, Any] = {"points": pts, "write": write}
    if pts:
        final = lc["points"][-1]
        kept = yearcost.peer({"s3_bytes": final["s3_bytes"], "ddb_bytes": final["ddb_bytes"]})
        base = kept["hot"] + kept["rest"]
        out["year"] = {"no rule": base + yearcost.standard(final["noncurrent_bytes"], yearcost.YEAR_DAYS),
                       **{name: base + yearcost.standard(final["noncurrent_bytes"], days)
                          for name, days in RULE_DAYS.items()}}
    return out


def problems(run: dict[str, Any]) -> list[str]:
    """What went wrong in one longconv or longconv-read run: the saver raised, or the store
    (or the read) gave back other messages than the turns sent. [] for other runs."""
    lc = run.get("longconv") or {}
    out = [f"failed at turn {lc.get('failed_turn')}: {lc['error'][:200]}"] if lc.get("error") else []
    out += [f"after {p['turns']} turns the store holds other messages" for p in lc.get("points", [])
            if p.get("check") is False]
    return out + [f"{phase}: {error[:200]}" for phase, error in (lc.get("errors") or {}).items()]


# -- tables -----------------------------------------------------------------------------------------
def _kb(n: float) -> str:
    return f"{n / 1024:,.1f}"


def _exp(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _status(row: dict[str, Any]) -> str:
    if row.get("error") and not row.get("points"):
        return f"FAILED: {row['error'][:200]}"
    if row.get("error"):
        return f"FAILED at turn {row.get('failed_turn')}: {row['error'][:200]}"
    bad = [str(p["turns"]) for p in row["points"] if p.get("check") is False]
    unread = [str(p["turns"]) for p in row["points"] if p.get("read_error")]
    parts = ["ok" if not bad else f"MISMATCH at {', '.join(bad)} turns"]
    if unread:  # the sizes are then of the messages rebuilt (longconv.final_state)
        why = row["points"][-1].get("read_error") or ""
        parts.append(f"state not read back at {', '.join(unread)} turns: {why[:120]}")
    return "; ".join(parts)


def _read_cell(rd: dict[str, Any] | None) -> str:
    if not rd:
        return "-"
    cell = (f"{rd['requests']} / {rd['round_trips']} / {rd['s3_objects_read']}+{rd['ddb_items_read']} / "
            f"{_kb(rd['bytes_down'])}")
    return cell if rd["check"] else f"{cell} {(rd['error'] or 'MISMATCH')[:100]}"


def tables(doc: dict[str, Any]) -> list[str]:
    lc = doc.get("longconv") or model(doc)  # an earlier run's JSON (--render) may lack it
    if not lc:
        return []
    rows = []
    for r in lc["rows"]:
        name = _short(doc, r["saver"])
        pts = r.get("points") or []
        if not pts:
            rows.append([name, "", "", "", "", "", "", "", "", "", "", _status(r)])
        shown = pts + ([r["at_failure"]] if r.get("at_failure") else [])
        for i, p in enumerate(shown):
            turns = f"{p['turns']} (failed after)" if i >= len(pts) else p["turns"]
            rows.append([name if i == 0 else "", turns, p["checkpoints"], p["s3_objects"], _kb(p["s3_bytes"]),
                         _kb(p["s3_index_bytes"]) if p["s3_index_bytes"] else "", p["ddb_items"], _kb(p["ddb_bytes"]),
                         _kb(p["total_bytes"]), _kb(p["state_bytes"]),
                         f"{p['ratio']:.1f}x" if p.get("ratio") else "", _status(r) if i == len(shown) - 1 else ""])
    out = ["", f"== Long conversation: {lc['turns']} turns of 1 KB in + 1 KB out on one thread, what is stored "
               "(KB) =="]
    out.append(_table(["saver", "turns", "checkpoints", "S3 objects", "S3 KB", "of which index KB", "DDB items",
                       "DDB KB", "total KB", "final state KB", "total / final", "check"], rows, "l" + "r" * 10 + "l"))
    out.append("A chat graph (messages only, START -> agent -> END), sync invoke, 3 checkpoints a turn; each message "
               "1,000 characters of base64 of seeded random bytes (incompressible). Stored = the run's bucket and "
               "table(s), which hold this thread alone, read straight from moto after the turn; of which index = "
               "S3Saver's objects outside live/ (the manifest index: manifests/, listing/); DDB KB as DynamoDB bills "
               "item sizes. final state = JsonPlusSerializer().dumps_typed(the latest checkpoint's channel_values, "
               "here {'messages': [...]}) as read back from the store.")

    rows = []
    for r in lc["rows"]:
        if not r.get("points"):
            continue
        w, last, year = r["write"], r.get("write_last_stretch"), r.get("year") or {}
        cells = [_short(doc, r["saver"]), _exp(r["exponent_total"]), _exp(r["exponent_s3"]),
                 f"{w['requests']:,.0f} / {w['round_trips']:,.0f}", f"{w['bytes_up'] / 1024 ** 2:,.1f}",
                 f"{last['requests_per_turn']:.1f} / {_kb(last['bytes_up_per_turn'])}" if last else "-"]
        short = "" if r.get("read_turns") == r["turns"] else f" ({r.get('read_turns')} turns)"
        cold, warm = ((r.get("read") or {}).get(p) for p in READS)
        cells.append(_read_cell(cold) + short)
        cells.append("the same" if warm and cold and _read_cell(warm) == _read_cell(cold) else _read_cell(warm))
        cells += [f"{w['cost']:.5f}", f"{year.get('total', 0):.6f}" + short]
        rows.append(cells)
    if rows:
        out.append("")
        out.append("== Long conversation: growth, writing, the latest read, a year kept ==")
        out.append(_table(["saver", "exponent total", "exponent S3", "write req / RT", "write MB up",
                           "last stretch req / KB up per turn", "latest read cold: req / RT / GETs+items / KB down",
                           "warm", "$ writing", "$ a year kept"], rows, "lrrrrrllrr"))
        out.append("exponent = least-squares slope of log(stored bytes) vs log(turns) over the measured points (1: "
                   "grows with the turns; 2: every checkpoint stores the whole list); S3 = the bucket's part alone. "
                   "write = every turn's saver calls through the proxy; last stretch = the turns between the last two "
                   "points. Latest read: get_tuple of the thread by a fresh process's first saver (cold), then the "
                   "same saver again (warm); GETs+items = S3 objects fetched + DynamoDB items read; checked against "
                   "the messages sent; (N turns) = a saver that failed: its thread as it was then. $ a year kept = "
                   "the final bytes a year in S3 Standard ($0.023/GB-month) and DynamoDB ($0.25), yearcost.peer; "
                   "$ writing = the write's requests at list price. The writes ran at once, each saver through a "
                   "proxy of its own: no wall times here.")
    out += _versioned_table(doc, lc)
    return out


def _versioned_table(doc: dict[str, Any], lc: dict[str, Any]) -> list[str]:
    rows = []
    for r in lc["rows"]:
        v = r.get("versioned")
        if not v:
            continue
        name = _short(doc, r["saver"])
        if v.get("error"):
            rows.append([name, "", "", "", "", "", "", "", f"FAILED: {v['error'][:200]}"])
            continue
        year, w = v.get("year") or {}, v["write"]
        for i, p in enumerate(v["points"]):
            last = i == len(v["points"]) - 1
            rows.append([name if i == 0 else "", p["turns"], _kb(p["unversioned"]) if p["unversioned"] else "-",
                         _kb(p["current"]), f"{_kb(p['noncurrent'])} ({p['noncurrent_versions']:,})",
                         f"{p['ratio']:.2f}x" if p["ratio"] is not None else "-",
                         f"{w['requests']:,.0f} / {w['bytes_up'] / 1024 ** 2:,.1f}" if last else "",
                         " / ".join(f"{year[k]:.6f}" for k in ("no rule", *RULE_DAYS)) if last and year else "",
                         "ok" if p.get("check") is not False else "MISMATCH"])
    if not rows:
        return []
    return ["", "== Long conversation on a versioned bucket (replication, Object Lock): noncurrent versions ==",
            _table(["saver", "turns", "unversioned KB", "versioned: current KB", "noncurrent KB (versions)",
                    "noncurrent / current", "write req / MB up", "$ a year: no rule / 1-day manifest rule / 7-day "
                    "bucket rule", "check"], rows, "lrrrrrrrl"),
            "The same write on a bucket with versioning enabled before setup() (the saver reads it there), measured "
            "with ListObjectVersions after the turn: current = what a read sees, noncurrent = every object version "
            "the saver replaced (the manifest's head at each write; the DynamoDB index replaces no object). "
            "unversioned KB = the unversioned run's bytes at that point. A year kept: the final current bytes a "
            "year, plus the noncurrent bytes a year (no rule) or for as long as infra/'s rules keep them: the "
            "manifest prefix's 1-day rule, the bucket's 7-day NoncurrentVersionDays (S3 acts at the midnight "
            "after the days have passed: 2 and 8 days). A replica keeps the same again."]
