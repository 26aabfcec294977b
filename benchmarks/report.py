"""Text tables and the issue's targets, from the runner's JSON document."""

from __future__ import annotations

import re
from typing import Any

from benchmarks import (
    costs,
    crossregion,
    longconv_report,
    peers,
    scale_report,
    tables,
    yearcost,
)
from benchmarks.tables import MEMORY, S3, S3_MANIFEST
from benchmarks.tables import short as _short
from benchmarks.tables import table as _table
from benchmarks.workload import PHASES

PEER = "peer"
PEER_GZIP = "peer-gzip"


def _kb(n: float) -> str:
    return f"{n / 1024:.1f}"


def _label(doc: dict[str, Any], key: str) -> str:
    return next((s["label"] for s in doc["savers"] if s["key"] == key), key)


def peer_keys(doc: dict[str, Any]) -> list[str]:
    """The published peers this run measured, in the runner's order."""
    return [s["key"] for s in doc["savers"] if s["available"] and peers.is_peer(s["key"])]


def _modes(doc: dict[str, Any]) -> list[str]:
    return [m for m in doc["settings"]["modes"].split(",") if m]


def totals(run: dict[str, Any]) -> dict[str, float]:
    keys = ("requests", "s3_requests", "ddb_requests", "round_trips", "bytes_up", "bytes_down", "read_units",
            "write_units", "cost")
    out = {k: sum(run["phases"][p][k] for p in PHASES) for k in keys}
    out["wall"] = sum(run["phases"][p]["wall"] or 0 for p in PHASES)
    return out


def storage_cost(stored: dict[str, Any]) -> float:
    gb = 1024**3
    return (stored.get("s3_bytes", 0) * costs.S3_STORAGE_PER_GB_MONTH
            + stored.get("ddb_bytes", 0) * costs.DDB_STORAGE_PER_GB_MONTH) / gb


def per_1000_steps(run: dict[str, Any]) -> float | None:
    steps = run.get("steps") or 0
    return run["phases"]["write"]["cost"] / steps * 1000 if steps else None


def per_1000_steps_with_year(run: dict[str, Any]) -> float | None:
    """Write-phase requests plus a year of keeping what they stored (as it is,
    right before the delete phase), per 1,000 steps: what a step costs a team
    that keeps its threads."""
    k = per_1000_steps(run)
    if k is None:
        return None
    return k + storage_cost(run["stored"].get("before_delete", {})) * 12 / run["steps"] * 1000


def _check(run: dict[str, Any], phase: str | None = None) -> str:
    failed = run.get("workload_error")
    if failed:  # the saver raised: the phases before it are checked, the rest did not run
        if phase is None:
            return f"FAILED in {run.get('failed_phase')}: {failed[:160]}"
        if phase == run.get("failed_phase"):
            return "FAILED"
        if phase not in (run.get("results") or {}):
            return "not run"
    ver = run.get("verification")
    if ver is None:
        return "ref" if run.get("is_reference") else "?"
    if phase is None:
        bad = [p for p, d in ver.items() if d]
        return "ok" if not bad else "MISMATCH: " + ", ".join(bad)
    return "ok" if not ver[phase] else "MISMATCH"


def _errors(run: dict[str, Any], phase: str) -> str:
    ph = run["phases"][phase]
    parts = []
    if ph["errors"]:
        parts.append(f"{len(ph['errors'])} call errors")
    if ph["http_errors"]:
        parts.append(f"{ph['http_errors']} HTTP 4xx/5xx")
    return "; ".join(parts)


def _split_per_1000(run: dict[str, Any]) -> str:
    steps = run.get("steps") or 0
    if not steps:
        return ""
    w = run["phases"]["write"]
    return f"{w.get('s3_cost', 0) / steps * 1000:.4f}/{w.get('ddb_cost', 0) / steps * 1000:.4f}"


_LEN = re.compile(r"^len=(\d+) (.+)$")
# The thread-length table's rows: scaling labels after "len=N ", in this order.
THREAD_LENGTH_CALLS = [
    ("put", "put"),
    ("put_writes", "put_writes (2 writes)"),
    ("get_tuple(latest)", "get_tuple(latest), saver new to the thread"),
    ("get_tuple(latest, after put)", "get_tuple(latest) after put + put_writes"),
    ("get_tuple(by id)", "get_tuple(by id), middle of the thread"),
    ("list(limit=5)", "list(limit=5)"),
]


def thread_length_table(doc: dict[str, Any]) -> list[str]:
    """Per call, S3Saver's two index modes side by side on a short and a long thread."""
    runs = doc["runs"]
    cols: list[tuple[str, int, dict[str, Any]]] = []
    for sk, name in ((S3, "DynamoDB"), (S3_MANIFEST, "manifest")):
        r = runs.get(f"{sk}/scaling")
        if not (r and r.get("ok")):
            continue
        lengths = sorted({int(m.group(1)) for lab in r["scaling"] if (m := _LEN.match(lab))})
        cols += [(name, n, r) for n in lengths]
    if not cols:
        return []
    rows = []
    for call, text in THREAD_LENGTH_CALLS:
        row: list[Any] = [text]
        for _, n, r in cols:
            c = r["scaling"].get(f"len={n} {call}")
            row.append(f"{c['requests']} / {c['round_trips']} / {_kb(c['bytes_up'])} / {_kb(c['bytes_down'])}"
                       + (" ERR" if c.get("error") else "") if c else "-")
        rows.append(row)
    out = ["", "== Thread length: S3Saver per call, DynamoDB index vs manifest index "
               "(requests / round trips / KB up / KB down) =="]
    out.append(_table(["call"] + [f"{name} len={n:,}" for name, n, _ in cols], rows, "l" + "r" * len(cols)))
    grown = []
    for name, n, r in cols:
        sec = (r.get("grow_seconds") or {}).get(f"len={n}")
        if sec is not None and n >= 1000:
            grown.append(f"{name} {n:,} in {sec:.0f} s")
    out.append("Each thread: checkpoints of 5 channels of 1 KB, one changed per checkpoint, grown with direct "
               "saver.put calls straight at moto (latency 0, not counted" + (f": {', '.join(grown)}" if grown else "")
               + "). Then measured through the proxy, in this order, by a saver that had not seen the thread: "
               "get_tuple(latest), get_tuple(by id), list(limit=5), put, put_writes on the new checkpoint, "
               "get_tuple(latest).")
    return out


def _usd(x: float | None) -> str:
    return "-" if x is None else f"{x:.6f}"


# The archive mode's steps, in the order it runs them, as the tables name them.
ARCHIVAL_STEPS = [
    ("archive GLACIER_IR", "archive_thread -> GLACIER_IR"),
    ("read GLACIER_IR", "cold read of the archive: get_state + get_state_history"),
    ("restore GLACIER_IR", "restore_thread"),
    ("archive DEEP_ARCHIVE", "archive_thread -> DEEP_ARCHIVE (the restored thread)"),
    ("read DEEP_ARCHIVE", "cold read: refused (ThreadArchivedError)"),
    ("restore DEEP_ARCHIVE", "restore_thread: RestoreObject, then again once restored"),
]
CLASS_NOTES = {
    "STANDARD": "no minimums; the archive is still one zstd object",
    "INTELLIGENT_TIERING": "objects under 128 KB are never tiered nor monitored: Frequent (= STANDARD) price",
    "STANDARD_IA": "128 KB minimum per object, 30 days minimum; GET $0.001/1k + $0.01/GB",
    "GLACIER_IR": "128 KB minimum per object, 90 days minimum; GET $0.01/1k + $0.03/GB; reads work from the archive",
    "GLACIER": "+40 KB per object (32 KB here, 8 KB at STANDARD), 90 days minimum; restore_thread first (hours)",
    "DEEP_ARCHIVE": "+40 KB per object, 180 days minimum; restore_thread first (up to 12 h Standard, 48 h Bulk)",
}


def archival_problems(run: dict[str, Any]) -> list[str]:
    """An archive run's reads or restores that differ from the live thread, and errors
    other than a cold class refusing a read."""
    if "archive" not in run:
        return []
    a = run["archive"]
    out = [f"{phase}: differs from the live thread's history" for phase, ok in a["checks"].items() if not ok]
    for phase, error in a["errors"].items():
        step, _, cls = phase.partition(" ")
        if not (step == "read" and cls in costs.CLASSES and not costs.CLASSES[cls].instant):
            out.append(f"{phase}: {error}")
    return out


def archival_tables(doc: dict[str, Any]) -> list[str]:
    """The archive mode: bytes live / archived / restored, each step's requests, and the year cost."""
    runs = doc["runs"]
    modes = [(k, _short(doc, k)) for k in (S3, S3_MANIFEST) if runs.get(f"{k}/archive", {}).get("ok")]
    out: list[str] = []
    for k in (S3, S3_MANIFEST):
        r = runs.get(f"{k}/archive")
        if r and not r.get("ok"):
            out.append(f"  {_short(doc, k)} archive run FAILED: {r.get('error')}")
    if not modes:
        return out
    yc = doc.get("year_cost") or yearcost.model(doc)  # an earlier run's JSON (--render) may lack it
    rows, grew = [], []
    for k, name in modes:
        a = runs[f"{k}/archive"]["archive"]
        st = a["stored"]
        live, arch, back = st["live"], st["archived GLACIER_IR"], st["restored GLACIER_IR"]

        def total(x: dict[str, Any]) -> int:
            return sum(p["bytes"] for p in x["s3"].values()) + x["ddb_bytes"]

        def index(x: dict[str, Any]) -> int:
            return sum(p["bytes"] for n, p in x["s3"].items() if n not in ("live/", "archive/")) + x["ddb_bytes"]

        lv = live["s3"].get("live/", {"objects": 0, "bytes": 0, "sizes": []})
        size = arch["s3"].get("archive/", {}).get("bytes", 0)
        if total(back) != total(live):
            grew.append(f"{name}: the restored thread holds {_kb(total(back) - total(live))} KB more than before "
                        f"its archive (index {_kb(index(live))} -> {_kb(index(back))} KB).")
        rows.append([name, a.get("history_length"), f"{lv['objects']} / {_kb(lv['bytes'])}",
                     _kb(max((z for z, _ in lv["sizes"]), default=0)), _kb(index(live)),
                     _kb(total(live)), _kb(size), f"{size / lv['bytes']:.1%}" if lv["bytes"] else "",
                     f"{size / total(live):.1%}" if total(live) else "", _kb(index(arch)), _kb(total(back)),
                     _kb(index(back))])
    out.append("")
    out.append("== Archival: the workload's thread, live vs archived (S3Saver, KB) ==")
    out.append(_table(["saver", "checkpoints", "live/ objects / KB", "largest KB", "index KB", "live total KB",
                       "archive KB",
                       "archive / live/", "archive / live total", "index left archived KB", "restored total KB",
                       "restored index KB"], rows))
    out.append("live total = the thread's live/ objects + its index (DynamoDB items, or manifests and listings) right "
               "where the sync run measures what is stored (before its delete phase); the archive is one object "
               "(GLACIER_IR); index left = the markers that send readers to it.")
    out += [f"  {g}" for g in grew]

    rows = []
    for k, name in modes:
        r = runs[f"{k}/archive"]
        checks, errors = r["archive"]["checks"], r["archive"]["errors"]
        for phase, text in ARCHIVAL_STEPS:
            ph = r["archival"].get(phase)
            if ph is None:
                continue
            ok = checks.get(phase)
            check = "" if ok is None else "ok" if ok else "MISMATCH"
            if phase in errors:
                check = (check + " " if check else "") + errors[phase].split(":", 1)[0]
            rows.append([name if phase == ARCHIVAL_STEPS[0][0] else "", text, len(ph["calls"]), ph["requests"],
                         ph["round_trips"], _kb(ph["bytes_up"]), _kb(ph["bytes_down"]), f"{ph['cost'] * 1e6:.2f}",
                         f"{ph['wall'] * 1000:.0f}",
                         ", ".join(f"{op.split(':')[1]} {n}" for op, n in ph["operations"].items()), check])
    out.append("")
    out.append("== Archival: requests per step, each by a saver new to the thread ==")
    out.append(_table(["saver", "step", "calls", "requests", "RT", "up KB", "down KB", "micro$", "wall ms",
                       "requests by operation", "check"], rows, "llrrrrrrrll"))
    out.append("micro$ at list price for the object's class: the archive PUT at the class's PUT price, its GET at the "
               "class's GET price plus retrieval per GB, RestoreObject at the Standard tier; check = the read or "
               "the restored thread equals the live thread's history. moto restores a cold archive at once; "
               "on AWS the second restore_thread call comes hours later.")

    if yc.get("rows"):
        rows = [[r["label"], r["scenario"], _usd(r["hot"]), _usd(r["rest"]), _usd(r["requests"]), _usd(r["total"]),
                 _usd(r["lifecycle_glacier_ir"])] for r in yc["rows"]]
        out.append("")
        out.append("== Year cost of one thread ($, us-east-1 list prices, from the measured bytes) ==")
        out.append(_table(["saver", "kept how", "days 1-30", "days 31-365", "one-off requests", "$/thread-year",
                           "instead: lifecycle moves each live/ object to GLACIER_IR"], rows, "llrrrrr"))
        out.append(f"Hot {yc['hot_days']} days (read and written; billed at the thread's final size), then idle. "
                   "Archived: one object for the rest of the year plus the index's markers; one-off = the measured "
                   "archive_thread call. Kept live: live/ objects in that class, the index as it is. Lifecycle column: "
                   "each live/ object billed at least 128 KB, plus a $0.02/1k transition each, the index unmoved. "
                   "The peers: their sync run's stored bytes (before its delete phase), kept as they are.")
        for k, name in modes:
            sizes = yc["threads"].get(k, {}).get("live_objects", [])
            big = sum(1 for z in sizes if z >= costs.IT_MIN_MONITORED_BYTES)
            out.append(f"  {name}: {big} of {len(sizes)} live/ objects reach 128 KB (largest "
                       f"{_kb(max(sizes, default=0))} KB), the least INTELLIGENT_TIERING monitors and tiers; "
                       "smaller ones stay at the Frequent (STANDARD) price.")
    if yc.get("classes"):
        keys = [k for k, _ in modes]
        rows = []
        for c in yc["classes"]:
            rows.append([c["class"]] + [_usd(c["archive"].get(k)) for k in keys]
                        + [_usd(c["lifecycle"].get(k)) for k in keys] + [CLASS_NOTES.get(c["class"], "")])
        out.append("")
        out.append("== What a thread costs per year in each storage class ($/thread-year) ==")
        out.append(_table(["class"] + [f"archive_thread, {_short(doc, k)}" for k in keys]
                          + [f"lifecycle per object, {_short(doc, k)}" for k in keys] + ["notes"], rows,
                          "l" + "r" * (2 * len(keys)) + "l"))
        out.append("archive_thread: hot 30 days, then one archive object in the class for 335 days (+ the archive call); "
                   "lifecycle per object: hot 30 days, then each live/ object moved into the class by a lifecycle rule "
                   "(its minimums per object, one transition each; STANDARD = kept live). AWS's default lifecycle "
                   "moves no object under 128 KB to these classes but GLACIER and DEEP_ARCHIVE; the column assumes "
                   "a rule with ObjectSizeGreaterThan set lower.")
    return out


def cross_region_table(doc: dict[str, Any]) -> list[str]:
    """Requests and $ per 1,000 steps with a replica region, beside the single-region rows."""
    cr = doc.get("cross_region") or crossregion.model(doc)  # an earlier run's JSON (--render) may lack it
    if not cr.get("rows"):
        return []
    p = cr["prices"]
    rows = []
    for r in cr["rows"]:
        single = r["config"] == crossregion.SINGLE
        rows.append([r["mode"], _short(doc, r["saver"]), r["config"], f"{r['primary_requests']:.0f}",
                     "" if single else f"{r['replica_s3_puts']:.0f}",
                     "" if single else f"{r['replica_ddb_writes']:.0f} / {r['replica_rwru']:.0f}",
                     f"{r['requests']:.0f}", "" if single else f"{r['s3_mb']:.2f} / {r['ddb_mb']:.2f}",
                     f"{r['primary_usd']:.5f}", "" if single else f"{r['replica_put_usd']:.5f}",
                     "" if single else f"{r['rwru_usd']:.5f}", "" if single else f"{r['transfer_usd']:.5f}",
                     f"{r['usd']:.4f}",
                     f"{r['primary_storage_month'] * 1e6:.0f}" + ("" if single else
                                                                  f" + {r['replica_storage_month'] * 1e6:.0f}")])
    out = ["", f"== Cross-region: per 1,000 steps with a replica in {cr['replica_region']} "
               f"(primary {cr['primary_region']}), replication included =="]
    out.append(_table(["mode", "saver", "replication", "primary req", "+ replica S3 PUTs",
                       "+ replica DDB item writes / rWRU", "= requests", "replicated MB S3 / DDB", "$ primary",
                       "$ replica PUTs", "$ rWRU", "$ transfer", "$ per 1k steps",
                       "storage micro$/month primary + replica"], rows, "lll" + "r" * 11))
    out.append(f"All per 1,000 steps of the write phase (what replication copies; reads are not replicated). primary = "
               f"the saver's own requests, priced as in the whole-workload table. Replica-side writes are made by AWS, "
               f"not the saver: S3 replication writes each object the primary stored as one PUT in the replica, billed "
               f"at its class's PUT price (${p['s3_replication_put_per_1k']:g}/1k, STANDARD), plus "
               f"${p['s3_inter_region_per_gb']:g}/GB inter-region transfer on the object's bytes; a DynamoDB global "
               f"table writes each changed item in the replica, billed in replicated write units (1 rWRU per KB of the "
               f"item, ${p['ddb_rwru_per_million']:g}/million, no request fee; the primary's own writes become rWRUs "
               f"at its WRU price, so $ primary is unchanged) plus ${p['ddb_inter_region_per_gb']:g}/GB transfer on "
               f"the item bytes. Storage (not in $ per 1k steps): what the run kept, right before its delete phase, "
               f"once more in the replica (${p['s3_replica_storage_gb_month']:g}/GB-month S3, "
               f"${p['ddb_replica_storage_gb_month']:g} DynamoDB). Not included: S3 Replication Time Control, KMS, "
               f"noncurrent versions (kept NoncurrentVersionDays in both buckets), the rebuild at promote.")
    deletes = sorted({f"{r['mode']} {_short(doc, r['saver'])}" for r in cr["rows"] if r.get("s3_deletes")})
    if deletes:
        out.append(f"  write phase deleted S3 objects ({', '.join(deletes)}): their replicated delete markers are "
                   "not priced above.")
    return out


def failover_table(doc: dict[str, Any]) -> list[str]:
    """The failover drill (child.run_failover): each step's requests by region, attempts
    the down primary refused, wall time, and whether the result is the expected one."""
    runs = doc["runs"]
    out: list[str] = []
    rows = []
    for k in (S3, S3_MANIFEST):
        r = runs.get(f"{k}/failover")
        if not r:
            continue
        if not r.get("ok"):
            out.append(f"  {_short(doc, k)} failover drill FAILED: {r.get('error')}")
            continue
        first = True
        for config, rec in r["failover"].items():
            for step_name in rec["wall"]:
                st = r["failover_steps"].get(f"{config}: {step_name}", {})
                ok = rec["checks"].get(step_name)
                err = rec["errors"].get(step_name, "")
                result = ("" if ok is None else ok if isinstance(ok, str) else "ok" if ok else "UNEXPECTED")
                if err:
                    result += f" ({err.split(':', 1)[0]})"
                rows.append([_short(doc, k) if first else "", config, step_name, rec["refused"].get(step_name, 0),
                             st.get("primary_requests", 0), st.get("replica_requests", 0), st.get("round_trips", 0),
                             f"{rec['wall'][step_name] * 1000:.0f}", rec["served_by"].get(step_name, ""),
                             ", ".join(f"{re.sub(r'(dynamodb|s3):', '', op)} {n}"
                                       for op, n in st.get("operations", {}).items()), result])
                first = False
    if rows:
        any_rec = next(rec for k in (S3, S3_MANIFEST) for rec in (runs.get(f"{k}/failover") or {}).get("failover", {}).values())
        out.insert(0, "")
        out.insert(1, "== Failover drill: primary taken down, reads from the replica, promote, resume there ==")
        out.insert(2, _table(["saver", "replica", "step", "attempts refused", "primary req", "replica req", "RT",
                              "wall ms", "served by", "requests by operation", "result"], rows, "lllrrrrrlll"))
        out.append(f"One saver with a Replica ({costs.REPLICA_REGION}), primary us-east-1 behind a gate to the proxy; "
                   f"a thread of {any_rec['history_length']} checkpoints whose last turn waits on an interrupt, "
                   "replicated whole before the outage (straight at moto, not counted). From 'read, primary down' on, "
                   "the gate resets every connection: attempts refused = the client's tries at the primary "
                   "(retries included), requests = what reached the proxy, by the region signed for. result: the "
                   "state and history equal the primary's before the outage; the resume is refused "
                   "(PrimaryUnavailableError) until promote; after it the interrupt resumes in the replica region. "
                   "Without a global table the replica region has no index until promote rebuilds it (its requests "
                   "are the promote row): until then a read is refused (PrimaryUnavailableError naming promote()).")
    return out


def render(doc: dict[str, Any], markdown: bool = False) -> str:
    tables.MARKDOWN = markdown
    try:
        return _render(doc)
    finally:
        tables.MARKDOWN = False


def _render(doc: dict[str, Any]) -> str:
    out: list[str] = []
    st = doc["settings"]
    what = (f"the long conversation alone, {st.get('longconv_turns')} turns" if st.get("longconv_only")
            else f"the scale workload alone, {', '.join(f'{n:,}' for n in st.get('scale_threads', []))} threads"
            if st.get("scale_only") else f"{st['turns']} turns on one thread")
    out.append(f"s3_saver benchmark: {what}, {st['latency_ms']:g} ms injected per "
               f"request, moto on 127.0.0.1, Python {st['python']}")
    for s in doc["savers"]:
        if not s["available"]:
            out.append(f"  not in the table: {s['label']}: {s['note']}")
    runs = doc["runs"]
    for key, run in runs.items():
        if not run.get("ok"):
            out.append(f"  FAILED {key}: {run.get('error')}")
    for key, run in runs.items():
        if run.get("workload_error"):
            out.append(f"  SAVER FAILED {key} in {run.get('failed_phase')}: {run['workload_error'][:300]}")
        elif run.get("verification") and any(run["verification"].values()):
            first = next(d for d in run["verification"].values() if d)
            out.append(f"  RESULTS DIFFER FROM InMemorySaver {key}: {first[:300]}")
    for key, run in runs.items():
        if run.get("cost_check"):
            out.append(f"  COST MODEL CHECK FAILED {key}: {run['cost_check']}")
    for key, run in runs.items():
        for problem in archival_problems(run):
            out.append(f"  ARCHIVAL CHECK FAILED {key}: {problem}")
        for problem in longconv_report.problems(run):
            out.append(f"  LONG CONVERSATION FAILED {key}: {problem}")
    savers = [s["key"] for s in doc["savers"] if s["available"]]
    if st.get("longconv_only"):  # python -m benchmarks --longconv-only: its tables alone
        return _headings(out + longconv_report.tables(doc))
    if st.get("scale_only"):  # python -m benchmarks --scale-only: its table alone
        return _headings(out + scale_report.tables(doc))

    for mode in _modes(doc):
        rows = []
        for phase in PHASES:
            for sk in savers:
                run = runs.get(f"{sk}/{mode}")
                if not run or not run.get("ok"):
                    continue
                ph = run["phases"][phase]
                check = _check(run, phase) if sk != MEMORY else "ref"
                err = _errors(run, phase)
                rows.append([phase if sk == savers[0] else "", _short(doc, sk), ph["calls"], ph["requests"],
                             ph["s3_requests"], ph["ddb_requests"], ph["round_trips"], _kb(ph["bytes_up"]),
                             _kb(ph["bytes_down"]), f"{ph['read_units']:g}", f"{ph['write_units']:g}",
                             f"{ph['cost'] * 1e6:.2f}", f"{(ph['wall'] or 0) * 1000:.0f}",
                             check + (f" ({err})" if err else "")])
        out.append("")
        out.append(f"== Per phase, {mode} ({'invoke' if mode == 'sync' else 'ainvoke'}) ==")
        out.append(_table(["phase", "saver", "calls", "requests", "S3", "DDB", "RT", "up KB", "down KB", "RCU",
                           "WCU", "micro$", "wall ms", "check"], rows, "llrrrrrrrrrrrl"))
    out.append("RT = round trips (waves of concurrent requests); wall ms includes moto's ~5 ms of CPU per request,"
               " served one at a time (benchmarks/README.md).")

    rows = []
    # The cheapest published peer (in whichever driver mode it ran) among those whose
    # results equal InMemorySaver's in every phase, for the ratio column.
    best_key, best = None, None
    for mode in _modes(doc):
        for p in peer_keys(doc):
            run = runs.get(f"{p}/{mode}")
            v = per_1000_steps_with_year(run) if peers.correct(run) else None
            if v and (best is None or v < best):
                best_key, best = f"{_short(doc, p)} {mode}", v
    for mode in _modes(doc):
        for sk in savers:
            run = runs.get(f"{sk}/{mode}")
            if not run or not run.get("ok"):
                continue
            t = totals(run)
            year = per_1000_steps_with_year(run) if sk != MEMORY else None
            sb = run["stored"].get("before_delete", {})
            sa = run["stored"].get("after_delete", {})
            stored = sb.get("s3_bytes", 0) + sb.get("ddb_bytes", 0) + sb.get("memory_bytes", 0)
            left = (sa.get("s3_objects", 0), sa.get("ddb_items", 0))
            k = per_1000_steps(run)
            rows.append([mode, _short(doc, sk), run.get("steps"), t["requests"], t["round_trips"],
                         _kb(t["bytes_up"]), _kb(t["bytes_down"]),
                         f"{_kb(sb.get('s3_bytes', 0))}/{_kb(sb.get('ddb_bytes', 0))}"
                         if sk != MEMORY else f"({_kb(stored)})",
                         f"{storage_cost(sb) * 1e6:.0f}" if sk != MEMORY else "",
                         f"{left[0]}/{left[1]}", f"{(k or 0):.4f}", _split_per_1000(run),
                         f"{year:.4f}" if year is not None else "",
                         f"{year / best:.2f}x" if year is not None and best else "",
                         f"{run['phases']['write']['wall'] or 0:.2f}",
                         f"{t['wall']:.2f}", _check(run) if sk != MEMORY else "ref"])
    out.append("")
    out.append("== Whole workload ==")
    out.append(_table(["mode", "saver", "steps", "requests", "RT", "up KB", "down KB", "stored S3/DDB KB",
                       "storage micro$/month", "left after delete obj/items", "$ per 1k steps",
                       "of which S3/DDB", "+ a year kept", "vs best peer", "write s", "total s", "check"], rows,
                      "llrrrrrrrrrrrrrrl"))
    out.append("steps = checkpoints written in the write phase (LangGraph super-steps); $ per 1k steps = write-phase"
               " request cost / steps x 1000; stored = right before the delete phase (storage at $0.023/GB-month"
               " S3 Standard, $0.25/GB-month DynamoDB). S3Saver(manifest) has no table: S3 requests only"
               " (PUT $0.005/1k, GET $0.0004/1k). + a year kept = $ per 1k steps plus 12 months of the stored bytes"
               " per 1k steps (kept live as they are; archive_thread makes it cheaper: year table); vs best peer ="
               " that over the cheapest published peer's whose check is ok"
               + (f" ({best_key}: {best:.4f})" if best_key else " (none passed)")
               + ". A saver that FAILED: its numbers up to the failure (stored = where it stopped).")

    out += cross_region_table(doc)

    # Per call, per method: where the requests go.
    for mode in _modes(doc):
        for sk in savers:
            run = runs.get(f"{sk}/{mode}")
            if not run or not run.get("ok") or sk == MEMORY:
                continue
            rows = []
            for phase in PHASES:
                for method, m in run["methods"][phase].items():
                    rows.append([phase, method, m["calls"], f"{m['requests_per_call']:.2f}", m["max_requests"],
                                 f"{m['round_trips_per_call']:.2f}", m["max_round_trips"],
                                 f"{m['bytes_up'] / m['calls'] / 1024:.1f}",
                                 f"{m['bytes_down'] / m['calls'] / 1024:.1f}",
                                 f"{m['wall_per_call'] * 1000:.0f}",
                                 ", ".join(f"{k.split(':')[1]} {v}" for k, v in m["operations"].items())])
            out.append("")
            out.append(f"== Per call: {_label(doc, sk)}, {mode} ==")
            out.append(_table(["phase", "method", "calls", "req/call", "max req", "RT/call", "max RT",
                               "up KB/call", "down KB/call", "ms/call", "requests by operation (whole phase)"],
                              rows, "llrrrrrrrrl"))
            un = run.get("unattributed_requests") or {}
            if un:
                out.append(f"requests outside any saver call: {dict(un)}")

    # Scaling.
    scal = {sk: runs.get(f"{sk}/scaling") for sk in savers}
    labels: list[str] = []
    for r in scal.values():
        if r and r.get("ok"):
            labels += [x for x in r["scaling"] if x not in labels]
    if labels:
        rows = []
        for lab in labels:
            row: list[Any] = [lab]
            for sk in savers:
                r = scal.get(sk)
                c = r["scaling"].get(lab) if r and r.get("ok") else None
                row.append(f"{c['requests']} / {c['round_trips']} / {_kb(c['bytes_up'])} / {_kb(c['bytes_down'])}"
                           + (" ERR" if c.get("error") else "") if c else "-")
            rows.append(row)
        out.append("")
        out.append("== Scaling: direct saver calls (requests / round trips / KB up / KB down) ==")
        out.append(_table(["call"] + [_short(doc, sk) for sk in savers], rows, "l" + "r" * len(savers)))
        out.append("len=N: a thread of N checkpoints, 5 channels of 1 KB, one changed per checkpoint; "
                   "channels=N: the latest checkpoint's N channels were written by N different checkpoints; "
                   "- = not run at that length (the peer's long thread is shorter, to keep the run short).")
        for sk in savers:
            r = scal.get(sk)
            if r and r.get("ok") and sk != MEMORY and r.get("checks_match_memory") is False:
                out.append(f"  {_short(doc, sk)} scaling results differ from InMemorySaver's (saver, reference): "
                           f"{r.get('checks_differ') or r['checks']}")
            if r and not r.get("ok"):
                out.append(f"  {_short(doc, sk)} scaling FAILED: {r.get('error')}")

    out += thread_length_table(doc)

    cold = doc.get("cold_start") or {}
    if cold:
        rows = []
        for key, c in cold.items():
            if "error" in c:
                rows.append([c["label"], "error", "", "", "", c["error"]])
                continue
            rows.append([c["label"], f"{c['import'] * 1000:.0f}",
                         f"{c['construct'] * 1000:.1f}" if "construct" in c else "",
                         f"{c['first_put'] * 1000:.0f}" if "first_put" in c else "",
                         f"{c.get('put_requests', 0):g} / {c.get('put_round_trips', 0):g}" if "first_put" in c else "",
                         f"{c['process_wall'] * 1000:.0f}"])
        out.append("")
        out.append("== Cold start: fresh process, import + construct + first checkpoint (median of runs) ==")
        out.append(_table(["what", "import ms", "construct ms", "first put ms", "put req / RT", "process ms"],
                          rows))

    tg = doc.get("targets") or []
    if tg:
        rows = [[t["mode"], _short(doc, t.get("saver", S3)), t["target"], t["s3"], t["peer"], t["ratio"], t["limit"],
                 "" if t["met"] is None else "met" if t["met"] else "MISSED"] for t in tg]
        out.append("")
        out.append("== Targets (S3Saver, each index mode, vs each published peer whose check is ok, same run) ==")
        out.append(_table(["mode", "saver", "target", "value", "peer", "ratio", "limit", ""], rows, "lllrrrrl"))
        left = sorted({f"{_short(doc, p)} {m}" for m in _modes(doc) for p in peer_keys(doc)
                       if runs.get(f"{p}/{m}") and not peers.correct(runs[f"{p}/{m}"])})
        if left:
            out.append(f"Not compared (failed, or results differ from InMemorySaver's): {', '.join(left)}.")
    out += archival_tables(doc)
    out += failover_table(doc)
    out += longconv_report.tables(doc)
    out += scale_report.tables(doc)
    return _headings(out)


def _headings(out: list[str]) -> str:
    text = "\n".join(out)
    if tables.MARKDOWN:
        text = "\n".join(f"#### {line[3:-3]}" if line.startswith("== ") and line.endswith(" ==") else line
                         for line in text.splitlines())
    return text


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target, S3Saver against each correct peer configuration of the same run
    (every published peer whose results equal InMemorySaver's in every phase)."""
    out = []
    runs = doc["runs"]
    for mode, ours in [(m, k) for m in _modes(doc) for k in (S3, S3_MANIFEST)]:
        s3 = runs.get(f"{ours}/{mode}")
        if not (s3 and s3.get("ok")):
            continue
        rl = s3["phases"]["read_latest"]["round_trips"]
        out.append({"mode": mode, "saver": ours, "peer_key": None, "target": "read latest: round trips", "s3": rl,
                    "peer": "", "ratio": "", "limit": "<= 2", "met": rl <= 2})
        for peer_key in peer_keys(doc):
            peer = runs.get(f"{peer_key}/{mode}")
            if not peers.correct(peer):  # failed, or results differ from InMemorySaver's
                continue
            ts, tp = totals(s3), totals(peer)
            who = _short(doc, peer_key)

            def ratio(name: str, a: float, b: float, limit: float, fmt: str = "{:g}") -> None:
                r = a / b if b else float("inf")
                out.append({"mode": mode, "saver": ours, "peer_key": peer_key, "target": f"{name} vs {who}",
                            "s3": fmt.format(a),
                            "peer": fmt.format(b), "ratio": f"{r:.1%}", "limit": f"<= {limit:.0%}",
                            "met": r <= limit})

            ratio("total requests", ts["requests"], tp["requests"], 0.40)
            hs, hp = s3["phases"]["history"], peer["phases"]["history"]
            ratio("full history: requests", hs["requests"], hp["requests"], 0.10)
            ratio("full history: wall time (s)", hs["wall"], hp["wall"], 0.10, "{:.3f}")
            ratio("bytes uploaded (KB)", ts["bytes_up"] / 1024, tp["bytes_up"] / 1024, 0.60, "{:.1f}")
            ratio("$ per 1,000 steps", per_1000_steps(s3) or 0, per_1000_steps(peer) or 0, 0.50, "{:.5f}")
            ratio("write phase wall time (s)", s3["phases"]["write"]["wall"], peer["phases"]["write"]["wall"],
                  0.60, "{:.2f}")
            # Not a target: the latency-only model of the line above (round trips x latency),
            # free of moto's CPU time and of run-to-run noise.
            ws, wp = s3["phases"]["write"]["round_trips"], peer["phases"]["write"]["round_trips"]
            out.append({"mode": mode, "saver": ours, "peer_key": peer_key,
                        "target": f"(write phase round trips vs {who})",
                        "s3": ws, "peer": wp, "ratio": f"{ws / wp:.1%}" if wp else "", "limit": "", "met": None})
    return out
