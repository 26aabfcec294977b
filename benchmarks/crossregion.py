"""What a replica region adds per 1,000 steps, from what the write phase measured.

The single-region rows are the "Whole workload" table's: write-phase requests and
their cost per 1,000 steps (checkpoints written). A cross-region row adds what AWS
bills for copying those writes to a second region (primary us-east-1, replica
``costs.REPLICA_REGION``), from the proxy's per-request measurements
(``benchmarks/proxy.py``), nothing estimated:

* S3 replication (Cross-Region Replication of the bucket): every object an S3
  write stored (``PutObject``, ``CopyObject``, ... answered 200; a conditional
  PUT refused with 412 stores nothing) is copied once: one replication PUT in the
  replica at the destination class's PUT price, and its bytes (the stored object's
  size) as inter-region data transfer out;
* a DynamoDB global table (one replica): every item a write changed is written in
  the replica as a plain write: 1 rWRU per KB of the item (max of old and new
  size, as the write itself is billed; a transaction's items count once each, a
  ``ConditionCheck`` or a delete of a missing item not at all), and its bytes (the
  new item; a delete, its key) as inter-region data transfer out. The primary's
  own writes are billed as rWRUs too, at the WRU price: its cost is unchanged;
* replica storage: the bytes the run stored (right before its delete phase)
  once more, at the replica region's price, per month: apart, like the
  single-region rows' storage, never in the $ per 1,000 steps.

Reads never replicate; only the write phase (the per-1,000-steps basis) is priced.
Configurations: the manifest index with S3 replication (the bucket is the whole
state); the DynamoDB index with S3 replication and a global table; the DynamoDB
index with S3 replication only (the replica's index is rebuilt from the bucket at
``promote``, a one-off cost not in the per-step figure); the peer with a global
table (and S3 replication of its offload bucket, which this workload never writes).

Pure standard library, like ``costs``.
"""

from __future__ import annotations

from typing import Any

from benchmarks import costs

# (saver key, configuration label, replicate the bucket, global table)
CONFIGS: dict[str, list[tuple[str, bool, bool]]] = {
    "s3": [("S3 replication + DynamoDB global table", True, True),
           ("S3 replication only; index rebuilt at promote", True, False)],
    "s3-manifest": [("S3 replication (the manifest is in the bucket)", True, False)],
    "peer": [("DynamoDB global table (+ S3 replication of the offload bucket)", True, True)],
    "peer-gzip": [("DynamoDB global table (+ S3 replication of the offload bucket)", True, True)],
    "peer-s3": [("S3 replication", True, False)],
    "peer-objstore": [("S3 replication", True, False)],
    "peer-ddb-amazon": [("DynamoDB global table", False, True)],
    "peer-ddb": [("DynamoDB global tables (both)", False, True)],
}
SINGLE = "single region"


def _modes(doc: dict[str, Any]) -> list[str]:
    return [m for m in doc["settings"]["modes"].split(",") if m]


def storage_month(s3_bytes: float, ddb_bytes: float, replica: bool = False) -> float:
    """$ per month of S3 Standard and DynamoDB bytes, in the primary or the replica region."""
    if replica:
        return (s3_bytes * costs.S3_REPLICA_STORAGE_PER_GB_MONTH
                + ddb_bytes * costs.DDB_REPLICA_STORAGE_PER_GB_MONTH) / costs.GB
    return (s3_bytes * costs.S3_STORAGE_PER_GB_MONTH + ddb_bytes * costs.DDB_STORAGE_PER_GB_MONTH) / costs.GB


def row(run: dict[str, Any], config: str, replicate_s3: bool, global_table: bool) -> dict[str, Any] | None:
    """One configuration of one run, per 1,000 steps (None if the run measured no replication
    fields: an earlier JSON rendered with --render)."""
    w = run["phases"]["write"]
    steps = run.get("steps") or 0
    if not steps or "s3_objects_written" not in w:
        return None
    k = 1000 / steps
    sb = run["stored"].get("before_delete", {})
    s3_puts = w["s3_objects_written"] if replicate_s3 else 0
    s3_bytes = w["s3_object_bytes"] if replicate_s3 else 0
    ddb_writes = w["ddb_replicated_writes"] if global_table else 0
    ddb_units = w["ddb_replicated_units"] if global_table else 0.0
    ddb_bytes = w["ddb_replicated_bytes"] if global_table else 0
    put_usd = s3_puts * costs.S3_REPLICATION_PUT_PER_REQUEST
    rwru_usd = ddb_units * costs.DDB_PER_REPLICATED_WRITE_UNIT
    transfer_usd = (s3_bytes * costs.S3_INTER_REGION_PER_GB + ddb_bytes * costs.DDB_INTER_REGION_PER_GB) / costs.GB
    primary_usd = w["cost"]
    return {
        "config": config,
        "steps": steps,
        "primary_requests": w["requests"] * k,
        "replica_s3_puts": s3_puts * k,
        "replica_ddb_writes": ddb_writes * k,
        "replica_rwru": ddb_units * k,
        "requests": (w["requests"] + s3_puts + ddb_writes) * k,
        "s3_mb": s3_bytes * k / 1024**2,
        "ddb_mb": ddb_bytes * k / 1024**2,
        "primary_usd": primary_usd * k,
        "replica_put_usd": put_usd * k,
        "rwru_usd": rwru_usd * k,
        "transfer_usd": transfer_usd * k,
        "usd": (primary_usd + put_usd + rwru_usd + transfer_usd) * k,
        # Storage of what the run kept (before its delete phase), per month, apart.
        "primary_storage_month": storage_month(sb.get("s3_bytes", 0), sb.get("ddb_bytes", 0)),
        "replica_storage_month": storage_month(sb.get("s3_bytes", 0) if replicate_s3 else 0,
                                               sb.get("ddb_bytes", 0) if global_table else 0, replica=True),
        # A write phase that deletes objects would replicate delete markers (not priced here).
        "s3_deletes": w.get("s3_deletes", 0),
    }


def model(doc: dict[str, Any]) -> dict[str, Any]:
    """Per mode: each saver's single-region row, then its cross-region configurations."""
    rows = []
    for mode in _modes(doc):
        for key, configs in CONFIGS.items():
            run = doc["runs"].get(f"{key}/{mode}")
            if not (run and run.get("ok")) or run.get("workload_error"):  # a saver that failed: no rows
                continue
            single = row(run, SINGLE, False, False)
            if single is None:
                continue
            rows.append({"mode": mode, "saver": key, **single})
            for config, s3, table in configs:
                r = row(run, config, s3, table)
                if r is not None:
                    rows.append({"mode": mode, "saver": key, **r})
    return {
        "primary_region": "us-east-1",
        "replica_region": costs.REPLICA_REGION,
        "prices": {
            "s3_replication_put_per_1k": costs.S3_REPLICATION_PUT_PER_REQUEST * 1000,
            "s3_inter_region_per_gb": costs.S3_INTER_REGION_PER_GB,
            "ddb_rwru_per_million": costs.DDB_PER_REPLICATED_WRITE_UNIT * 1e6,
            "ddb_inter_region_per_gb": costs.DDB_INTER_REGION_PER_GB,
            "s3_replica_storage_gb_month": costs.S3_REPLICA_STORAGE_PER_GB_MONTH,
            "ddb_replica_storage_gb_month": costs.DDB_REPLICA_STORAGE_PER_GB_MONTH,
        },
        "rows": rows,
    }
