"""What a failback's merge did not keep: recorded when it merges, read by ``verify``.

A failback merges two indexes into one (``_ops/settle``). Some committed
entries cannot stay: a task both regions ran keeps one run's writes (the
other run's parts go), and an entry whose objects are not all in the bucket
goes. The indexes they came from are replaced by the merge (a manifest head is
swapped, table items are rewritten), so nothing but a record says afterwards
that they were committed: one immutable object per thread and merge under
``set-aside/``, written before the merged index (objects first, index last: a
merge cut short and run again writes the same record, the same bytes under the
same key, or, after its index was written, nothing more to set aside).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from s3_saver._ops.context import Context
from s3_saver._protocol import Op, gather, request_one
from s3_saver._replica import ReplicationGap
from s3_saver._s3 import put_immutable

_VERSION = 1


@dataclass(frozen=True)
class SetAside:
    """A committed checkpoint, or a task's pending-write parts, the merge left out."""

    ns: str
    checkpoint_id: str
    kind: str  # "checkpoint" or "writes"
    task_id: str | None
    keys: tuple[str, ...]  # its objects (a checkpoint: its own object)
    reason: str


def record(ctx: Context, thread_id: str, parts: list[SetAside]) -> Op[None]:
    """Write the record of ``parts`` (none: nothing is written)."""
    if not parts:
        return
    body = json.dumps(
        {
            "v": _VERSION,
            "thread_id": thread_id,
            "parts": [
                {"ns": p.ns, "checkpoint_id": p.checkpoint_id, "kind": p.kind, "task_id": p.task_id,
                 "keys": list(p.keys), "reason": p.reason}
                for p in sorted(parts, key=lambda p: (p.ns, p.checkpoint_id, p.kind, p.task_id or ""))
            ],
        },
        sort_keys=True,
    ).encode()
    # Named by its bytes: the same merge run again meets its own record.
    key = ctx.layout.set_aside_key(thread_id, hashlib.sha256(body).hexdigest()[:32])
    yield from put_immutable(ctx.s3, {key: body})


def gaps(ctx: Context, thread_id: str) -> Op[list[ReplicationGap]]:
    """Every part the thread's records name (admin: a listing of its records)."""
    keys: list[str] = []
    token: str | None = None
    while True:
        page = yield from request_one(ctx.s3.list_keys(ctx.layout.set_aside_dir(thread_id), token))
        keys += [obj["Key"] for obj in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not token:
            break
    found: dict[tuple[str, str, str, str | None], ReplicationGap] = {}
    for body in (yield from gather(*(_read(ctx, key) for key in sorted(keys)))):
        for p in json.loads(body)["parts"]:
            ident = (p["ns"], p["checkpoint_id"], p["kind"], p["task_id"])
            before = found.get(ident)
            keys_of = tuple(sorted(set(p["keys"]) | set(before.missing if before else ())))
            found[ident] = ReplicationGap(thread_id, *ident, keys_of, before.reason if before else p["reason"])
    return [found[ident] for ident in sorted(found, key=lambda i: (i[0], i[1], i[2], i[3] or ""))]


def _read(ctx: Context, key: str) -> Op[bytes]:
    return (yield from request_one(ctx.s3.get(key)))["Body"]
