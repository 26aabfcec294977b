"""What one thread costs to keep for a year, from the bytes the benchmark measured.

The thread is the workload's (``child.run_archive`` measures it live, archived
and restored; the peers' is their sync run's, right before its delete phase).
The year: the thread is written and read during its first 30 days ("hot"),
then never read again; it is counted at its final size from day 0 (an upper
bound for the hot month). Each scenario bills:

* hot: the live objects and the index (S3 Standard, DynamoDB storage);
* the other 335 days, by scenario: the archive object in its class (one object:
  the class's minimum size and duration apply once) plus what the index keeps
  of an archived thread; or the live thread kept as it is, in S3 Standard or in
  Intelligent-Tiering; or (the lifecycle column) every live object moved into a
  class by a lifecycle rule on ``live/``, each billed at the class's minimum
  size, plus one transition request each, the index staying where it is;
* one-off requests: the measured ``archive_thread`` call, its archive PUT priced
  in the class (a lifecycle column: the transitions).

Prices and minimums: ``costs.CLASSES`` (us-east-1 list prices). Pure standard
library, like ``costs``.
"""

from __future__ import annotations

from typing import Any

from benchmarks import costs, peers

HOT_DAYS = 30
YEAR_DAYS = 365
# Classes of the "per storage class" table, cheapest access first.
TABLE_CLASSES = ("STANDARD", "INTELLIGENT_TIERING", "STANDARD_IA", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE")
# The archive of the thread as written (child.ARCHIVE_CLASSES[0]; the next class archives
# the restored thread): its call and bytes stand for every class, the archive PUT repriced.
MEASURED_CLASS = "GLACIER_IR"
MODES = (("s3", "S3Saver (DynamoDB index)"), ("s3-manifest", "S3Saver (manifest index)"))
PEERS = (("peer", "peer (langgraph-checkpoint-aws)"), ("peer-gzip", "peer, enable_checkpoint_compression"))


def gb_months(nbytes: float, days: float) -> float:
    return nbytes / costs.GB * days / costs.DAYS_PER_MONTH


def standard(nbytes: float, days: float) -> float:
    return gb_months(nbytes, days) * costs.CLASSES["STANDARD"].storage_gb_month


def dynamodb(nbytes: float, days: float) -> float:
    return gb_months(nbytes, days) * costs.DDB_STORAGE_PER_GB_MONTH


def object_storage(cls: str, size: int, start: int, end: int = YEAR_DAYS, last_read: int = HOT_DAYS) -> float:
    """One object of ``size`` bytes in class ``cls`` from day ``start`` to ``end``, last read on ``last_read``.

    Minimum size and duration as the class bills them (an object deleted
    earlier pays the rest); Intelligent-Tiering moves an object of 128 KB or
    more down its tiers 30 and 90 days after its last read, for a monitoring fee;
    a smaller one stays at the Frequent price with no fee.
    """
    c = costs.CLASSES[cls]
    if cls == "INTELLIGENT_TIERING" and size >= costs.IT_MIN_MONITORED_BYTES:
        ia = last_read + costs.IT_TO_INFREQUENT_DAYS
        aia = last_read + costs.IT_TO_ARCHIVE_INSTANT_DAYS

        def days_in(a: int, b: int) -> int:
            return max(0, min(b, end) - max(a, start))

        return (gb_months(size, days_in(start, ia)) * c.storage_gb_month
                + gb_months(size, days_in(ia, aia)) * costs.IT_INFREQUENT_GB_MONTH
                + gb_months(size, days_in(aia, end)) * costs.IT_ARCHIVE_INSTANT_GB_MONTH
                + (end - start) / costs.DAYS_PER_MONTH * costs.IT_MONITORING_PER_1K_OBJECTS_MONTH / 1000)
    days = max(end - start, c.min_days)
    return (gb_months(max(size, c.min_bytes) + c.overhead_class_bytes, days) * c.storage_gb_month
            + standard(c.overhead_standard_bytes, days))


# -- what was measured ------------------------------------------------------------------------
def _sizes(stored: dict[str, Any], prefix: str) -> list[int]:
    return [size for size, _ in stored["s3"].get(prefix, {}).get("sizes", [])]


def _index_s3(stored: dict[str, Any]) -> int:
    """Bytes of the thread's S3 objects other than values and archives: manifests, listings."""
    return sum(p["bytes"] for name, p in stored["s3"].items() if name not in ("live/", "archive/"))


def thread_bytes(run: dict[str, Any]) -> dict[str, Any]:
    """The archive run's thread: live, then archived in each measured class."""
    a = run["archive"]["stored"]
    live = a["live"]
    out: dict[str, Any] = {
        "live_objects": _sizes(live, "live/"), "index_s3_bytes": _index_s3(live),
        "index_s3_objects": sum(p["objects"] for n, p in live["s3"].items() if n not in ("live/", "archive/")),
        "ddb_bytes": live["ddb_bytes"], "ddb_items": live["ddb_items"], "archived": {},
    }
    for key, stored in a.items():
        if key.startswith("archived "):
            out["archived"][key.split(" ", 1)[1]] = {
                "archive_objects": _sizes(stored, "archive/"), "left_live_objects": _sizes(stored, "live/"),
                "index_s3_bytes": _index_s3(stored), "ddb_bytes": stored["ddb_bytes"], "ddb_items": stored["ddb_items"]}
    out["live_bytes"] = sum(out["live_objects"]) + out["index_s3_bytes"] + out["ddb_bytes"]
    return out


def archive_call_cost(run: dict[str, Any], cls: str) -> float:
    """$ of one ``archive_thread`` call into ``cls``: the measured GLACIER_IR call with its
    archive PUT priced in ``cls`` (every other request is the same in any class)."""
    measured = run["archival"][f"archive {MEASURED_CLASS}"]
    base = measured["cost"] - measured["archive_put_cost"]
    return base + measured["archive_puts"] * costs.CLASSES[cls].put_per_1k / 1000


# -- scenarios -----------------------------------------------------------------------------------
def hot(t: dict[str, Any]) -> float:
    return standard(sum(t["live_objects"]) + t["index_s3_bytes"], HOT_DAYS) + dynamodb(t["ddb_bytes"], HOT_DAYS)


def archived(t: dict[str, Any], run: dict[str, Any], cls: str) -> dict[str, float]:
    """Hot 30 days, then archive_thread into ``cls`` for the rest of the year."""
    after = t["archived"][MEASURED_CLASS]  # the same bytes in any class
    rest = (sum(object_storage(cls, s, HOT_DAYS) for s in after["archive_objects"])
            + sum(standard(s, YEAR_DAYS - HOT_DAYS) for s in after["left_live_objects"])
            + standard(after["index_s3_bytes"], YEAR_DAYS - HOT_DAYS)
            + dynamodb(after["ddb_bytes"], YEAR_DAYS - HOT_DAYS))
    return {"hot": hot(t), "rest": rest, "requests": archive_call_cost(run, cls)}


def kept_live(t: dict[str, Any], cls: str) -> dict[str, float]:
    """Live all year, the live objects written in ``cls`` (the saver's ``storage_class``);
    the index stays where it is (manifests and listings in S3 Standard)."""
    objects = sum(object_storage(cls, s, 0) for s in t["live_objects"])
    index = standard(t["index_s3_bytes"], YEAR_DAYS) + dynamodb(t["ddb_bytes"], YEAR_DAYS)
    share = HOT_DAYS / YEAR_DAYS  # split at day 30 for the table's columns
    return {"hot": (objects + index) * share, "rest": (objects + index) * (1 - share), "requests": 0.0}


def lifecycle(t: dict[str, Any], cls: str) -> dict[str, float]:
    """Hot 30 days, then a lifecycle rule moves every live object into ``cls``, one by one;
    the index cannot move (DynamoDB items, manifests)."""
    if cls == "STANDARD":
        return kept_live(t, cls)
    rest_days = YEAR_DAYS - HOT_DAYS
    rest = (sum(object_storage(cls, s, HOT_DAYS) for s in t["live_objects"])
            + standard(t["index_s3_bytes"], rest_days) + dynamodb(t["ddb_bytes"], rest_days))
    transitions = len(t["live_objects"]) * costs.CLASSES[cls].transition_per_1k / 1000
    return {"hot": hot(t), "rest": rest, "requests": transitions}


def peer(stored: dict[str, Any]) -> dict[str, float]:
    """A peer's thread kept as it is a year (S3 Standard + DynamoDB)."""
    total = standard(stored.get("s3_bytes", 0), YEAR_DAYS) + dynamodb(stored.get("ddb_bytes", 0), YEAR_DAYS)
    share = HOT_DAYS / YEAR_DAYS
    return {"hot": total * share, "rest": total * (1 - share), "requests": 0.0}


def _total(c: dict[str, float]) -> dict[str, float]:
    return {**c, "total": c["hot"] + c["rest"] + c["requests"]}


def model(doc: dict[str, Any]) -> dict[str, Any]:
    """The year-cost rows and the per-class table; {} when no archive run succeeded."""
    runs = doc["runs"]
    threads: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for key, label in MODES:
        run = runs.get(f"{key}/archive")
        if not (run and run.get("ok") and f"archive {MEASURED_CLASS}" in run.get("archival", {})):
            continue
        t = threads[key] = thread_bytes(run)
        alt = _total(lifecycle(t, "GLACIER_IR"))["total"]
        for scenario, c in (("hot 30 d, then archive_thread -> GLACIER_IR", archived(t, run, "GLACIER_IR")),
                            ("hot 30 d, then archive_thread -> DEEP_ARCHIVE", archived(t, run, "DEEP_ARCHIVE")),
                            ("kept live, STANDARD", kept_live(t, "STANDARD")),
                            ("kept live, INTELLIGENT_TIERING", kept_live(t, "INTELLIGENT_TIERING"))):
            rows.append({"saver": key, "label": label, "scenario": scenario, **_total(c), "lifecycle_glacier_ir": alt})
    if not threads:
        return {}
    # Every peer whose sync run passed its check (the first two under their old labels).
    labels = dict(PEERS)
    for key in [s["key"] for s in doc["savers"] if peers.is_peer(s["key"])]:
        run = runs.get(f"{key}/sync")
        label = labels.get(key) or f"{peers.PEERS[key].short} ({peers.PEERS[key].package})"
        if peers.correct(run):
            stored = run["stored"]["before_delete"]
            threads[key] = {"s3_bytes": stored.get("s3_bytes", 0), "ddb_bytes": stored.get("ddb_bytes", 0),
                            "live_bytes": stored.get("s3_bytes", 0) + stored.get("ddb_bytes", 0)}
            rows.append({"saver": key, "label": label, "scenario": "kept as it is (S3 Standard + DynamoDB)",
                         **_total(peer(stored)), "lifecycle_glacier_ir": None})
    classes = []
    for cls in TABLE_CLASSES:
        row: dict[str, Any] = {"class": cls, "archive": {}, "lifecycle": {}}
        for key, _ in MODES:
            if key in threads:
                run = runs[f"{key}/archive"]
                row["archive"][key] = _total(archived(threads[key], run, cls))["total"]
                row["lifecycle"][key] = _total(lifecycle(threads[key], cls))["total"]
        classes.append(row)
    return {"hot_days": HOT_DAYS, "year_days": YEAR_DAYS, "threads": threads, "rows": rows, "classes": classes}
