"""settle: a promoted region's index made whole, from what indexes committed.

``promote`` leaves the region it makes the one written to with an index every
process can read as it is, in both directions:

* **failover** (the region left does not answer): the promoted region's own
  index, as replication brought it (a manifest head, a global table's items),
  can name checkpoints and pending writes whose objects never arrived (the
  outage ate them). Those entries go: each thread keeps exactly the committed
  entries whose objects are all there, so a fresh process reads its latest
  and its whole history without waiting for anything.
* **failback** (both answer): the region written to so far (the *authority*)
  holds the thread's line as it went on; the region promoted back holds,
  besides what came back by replication, what it committed itself before the
  outage and never replicated. Its index becomes the union: every entry of
  the authority, then the region's own entries the authority lacks (readable
  by id, a branch of the thread: ``verify`` reports them).

Only committed data is indexed: an entry comes from an index (never from an
object alone, so a write that raised at the outage, its object written and its
commit not, stays unreadable), and an entry is kept only when every object its
closure names is in the bucket (``_format/closure``). Pending writes are kept per task:
for each (namespace, checkpoint, task), the parts of one region's run only (a
mix of two runs is a state neither made), whether or not that region's index
held the checkpoint (writes may come before their checkpoint's put: a region
can resume a task on a checkpoint only the other region's index committed). The authority ran the task itself
only when it holds a call (a token) this region's parts lack: its run wins
then. Otherwise its parts are this region's calls, replicated in part before
the outage (an interrupt, and not the resume after it), and this region's run
stays whole. What is left out is recorded before the index is written
(``record_set_aside``), for ``verify`` (``set_aside``).

A manifest head is one object that replication replaces whole: after a
failback the promoted-back region's head is the authority's, replicated over
its own. Its own last head is still a version of that key in the (versioned)
bucket: each head names the bucket it was written to.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from s3_saver._format.closure import named_by
from s3_saver._format.entries import CheckpointEntry, WritesEntry
from s3_saver._index.terms import Archived, one_line
from s3_saver._ops.context import Context
from s3_saver._ops.delete import delete_thread
from s3_saver._regions.replica import ReplicationGap
from s3_saver._transport.protocol import Op, gather, request_one
from s3_saver._transport.s3 import put_immutable
from s3_saver.errors import ResourceMissingError


@dataclass
class Settled:
    """What ``settle`` left out: ``thread/ns/checkpoint_id`` of checkpoints, and
    ``thread/ns/checkpoint_id/task_id`` of pending writes."""

    checkpoints: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)


def settle(target: Context, authority: Context | None, *, write: bool = True) -> Op[Settled]:
    """Make ``target``'s index whole (see the module's docstring); ``authority``:
    the region written to until now, when it answers (a failback). ``write``
    False: only say what is not whole (a global table's failover: its items
    are the other region's too, and a delete here would replicate there and
    take that region's own writes; reads pass them over instead)."""
    settled = Settled()
    here, there = yield from gather(thread_ids(target), thread_ids(authority, True) if authority else _none())
    for thread_id in sorted(set(here) | set(there)):
        yield from _settle_thread(target, authority, thread_id, settled, write)
        if write and not here.get(thread_id, True):
            # Its head came without its listing object (replication copies them
            # apart): listed again, as the head's time says.
            yield from target.index.note(thread_id, (yield from target.index.created(thread_id)), None)
    return settled


def _settle_thread(
    target: Context, authority: Context | None, thread_id: str, settled: Settled, write: bool
) -> Op[None]:
    try:
        (theirs, their_loose), keys, created = yield from gather(
            _committed_here(target, authority, thread_id),
            object_keys(target, thread_id),
            target.index.created(thread_id),
        )
        mine: list[CheckpointEntry] = []
        my_loose: list[WritesEntry] = []
        if authority is not None:
            record, (mine, my_loose), their_record = yield from gather(
                authority.index.archive_of(thread_id),
                authority.index.committed(thread_id),
                target.index.archive_of(thread_id),
            )
            if record.gen > their_record.gen and not mine:
                # Deleted where it went on: deleted here too (a deleted thread stays deleted).
                yield from delete_thread(target, thread_id)
                return
            created = created or (yield from authority.index.created(thread_id))
    except Archived:
        return  # one archive object: replication copies it whole, and its marker with the index
    present = set(keys)

    def whole(entry: CheckpointEntry | WritesEntry) -> bool:
        return all(target.layout.object_key(o) in present for o in named_by(entry))

    aside: list[SetAside] = []

    def keys_of(entries: Iterable[CheckpointEntry | WritesEntry]) -> tuple[str, ...]:
        return tuple(sorted({target.layout.object_key(o) for e in entries for o in named_by(e)}))

    missing = f"its objects are not all in s3://{target.s3.bucket}"
    entries: dict[tuple[str, str, str], CheckpointEntry] = {}
    broken: dict[tuple[str, str, str], CheckpointEntry] = {}
    for entry in [*mine, *theirs]:
        if entry.key in entries:
            continue
        if whole(entry):
            entries[entry.key] = entry
        elif not entry.hidden:
            broken.setdefault(entry.key, entry)
    for key, entry in broken.items():
        if key not in entries:
            settled.checkpoints.append(f"{thread_id}/{entry.ns}/{entry.checkpoint_id}")
            aside.append(SetAside(entry.ns, entry.checkpoint_id, "checkpoint", None, keys_of([entry]), missing))
    # One region's run per task: the authority's, else the target's own. A
    # global table holds both regions' parts in each (see one_line).
    site = (authority or target).s3.bucket
    lines: dict[tuple[str, str, str], list[WritesEntry]] = {}
    incomplete: dict[tuple[str, str, str], list[WritesEntry]] = {}
    other_runs: list[WritesEntry] = []
    for source, loose in ((mine, my_loose), (theirs, their_loose)):
        here: dict[tuple[str, str, str], list[WritesEntry]] = {}
        # Invariant: every committed part counts, its checkpoint held by this
        # index or not (writes may come before their checkpoint's put: a region
        # can resume a task on a checkpoint the other region committed and
        # replication had not brought it yet; that checkpoint is kept from the
        # other index, and its task's two runs meet here like any other).
        every = [w for entry in source for w in entry.writes or ()] + loose
        one = one_line(every, site)
        kept_here = {id(w) for w in one}
        other_runs += [w for w in every if id(w) not in kept_here]
        for w in one:
            here.setdefault((w.ns, w.checkpoint_id, w.task_id), []).append(w)
        for task, parts in here.items():
            if task in lines:
                # Only a failback has two sources: the first is the authority's.
                calls = {w.token for w in lines[task]}
                if calls <= {w.token for w in parts} and all(whole(w) for w in parts):
                    # Every part the authority holds is one of this region's
                    # calls, replicated (the rest of its run did not get there
                    # before the outage): the authority never ran the task
                    # itself, and this region's run stays whole.
                    lines[task] = parts
                    continue
                lost = [w for w in parts if w.token not in calls]
                if lost:
                    # The authority holds a call of its own: it ran the task
                    # again, and its run wins whole (a mix is a state no run made).
                    settled.writes.append(f"{thread_id}/{task[0]}/{task[1]}/{task[2]}")
                    reason = f"another run of the task, in s3://{site}, was kept"
                    aside.append(SetAside(task[0], task[1], "writes", task[2], keys_of(lost), reason))
                continue
            if all(whole(w) for w in parts):
                lines[task] = parts
            else:
                incomplete.setdefault(task, []).extend(parts)
    for task, parts in incomplete.items():
        calls = {(w.part, w.token) for w in lines.get(task, ())}
        lost = [w for w in parts if (w.part, w.token) not in calls]
        if lost:
            settled.writes.append(f"{thread_id}/{task[0]}/{task[1]}/{task[2]}")
            aside.append(SetAside(task[0], task[1], "writes", task[2], keys_of(lost), missing))
    if authority is not None:
        # Invariant: every committed part the merge reads is kept or recorded.
        # A global table holds both regions' parts of a task (the old region's
        # stale items replicate after the promoted one ran the task again):
        # one_line keeps one region's run there, before the rule above sees
        # them, and the other's parts lose as a run of the task that lost.
        by_task: dict[tuple[str, str, str], list[WritesEntry]] = {}
        for w in other_runs:
            if (w.part, w.token) not in {(k.part, k.token) for k in lines.get((w.ns, w.checkpoint_id, w.task_id), ())}:
                by_task.setdefault((w.ns, w.checkpoint_id, w.task_id), []).append(w)
        for task, parts in by_task.items():
            settled.writes.append(f"{thread_id}/{task[0]}/{task[1]}/{task[2]}")
            reason = f"another run of the task, in s3://{site}, was kept"
            aside.append(SetAside(task[0], task[1], "writes", task[2], keys_of(parts), reason))
    # The writes of a checkpoint kept, and those of a checkpoint neither index
    # holds (they wait for its put, as in the index they came from); those of a
    # checkpoint left out go with it.
    read = {e.key for e in [*mine, *theirs]}
    writes = [
        w for (ns, cid, _), parts in lines.items()
        if (thread_id, ns, cid) in entries or (thread_id, ns, cid) not in read for w in parts
    ]
    if not write or (
        authority is None
        and _ids(theirs, [w for e in theirs for w in e.writes or ()] + their_loose) == _ids(entries.values(), writes)
    ):
        return  # whole already, or only told
    if authority is not None:
        # Before the index that leaves them out (see ``record_set_aside`` below).
        yield from record_set_aside(target, thread_id, aside)
    kept = [_chain_kept(replace(e, writes=[]), entries, writes) for e in entries.values()]
    yield from target.index.restore(thread_id, kept, writes, created or target.now())
    target.locs.forget_thread(thread_id)


def _chain_kept(
    entry: CheckpointEntry, entries: dict[tuple[str, str, str], CheckpointEntry], writes: list[WritesEntry]
) -> CheckpointEntry:
    """What the entry says of its parent, as the merge leaves it: a parent left
    out is gone (a replica reading the other region's copy of a global table
    must not take it for a hole), and the parent's write slots it names are
    those kept (see CheckpointEntry.chained)."""
    if not entry.chained or entry.parent_id is None:
        return entry
    if (entry.thread_id, entry.ns, entry.parent_id) not in entries:
        entry.parent_gone = True
    elif entry.parent_writes is not None:
        slots = {(w.task_id, w.part) for w in writes if (w.ns, w.checkpoint_id) == (entry.ns, entry.parent_id)}
        entry.parent_writes = tuple(s for s in entry.parent_writes if s in slots)
    return entry


def _ids(entries: Iterable[CheckpointEntry], writes: Iterable[WritesEntry]) -> tuple[set, set]:
    return {e.key for e in entries}, {(w.ns, w.checkpoint_id, w.task_id, w.part, w.token) for w in writes}


def _committed_here(
    target: Context, authority: Context | None, thread_id: str
) -> Op[tuple[list[CheckpointEntry], list[WritesEntry]]]:
    """What ``target``'s own index committed for the thread: its index as it is,
    or (a failback, manifest) its own last head, which replication replaced."""
    if authority is not None:
        own = yield from target.index.own_committed(thread_id)
        if own is not None:
            return own
    return (yield from target.index.committed(thread_id))


def _none() -> Op[dict[str, bool]]:
    return {}
    yield  # pragma: no cover - makes this a generator


def thread_ids(ctx: Context, missing_ok: bool = False) -> Op[dict[str, bool]]:
    """Every thread the index holds, each with whether it is listed
    (``missing_ok``: none when it has no table yet)."""
    try:
        return (yield from ctx.index.thread_ids())
    except ResourceMissingError:
        if missing_ok:
            return {}
        raise


def object_keys(ctx: Context, thread_id: str) -> Op[dict[str, str]]:
    """Every object key under the thread, with its ETag (admin: a listing)."""
    keys: dict[str, str] = {}
    token: str | None = None
    while True:
        page = yield from request_one(ctx.s3.list_keys(ctx.layout.thread_dir(thread_id), token))
        keys.update((obj["Key"], obj.get("ETag", "")) for obj in page.get("Contents", []))
        token = page.get("NextContinuationToken")
        if not token:
            return keys


# --- what a failback's merge did not keep ------------------------------------------
# The indexes the merge read are replaced by it (a manifest head swapped, table
# items rewritten): nothing but a record says afterwards that what it left out
# was committed. One immutable object per thread and merge under ``set-aside/``,
# written before the merged index (objects first, index last): a merge cut short
# and run again writes the same bytes under the same key, or, once its index is
# written, has nothing more to set aside.

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


def record_set_aside(ctx: Context, thread_id: str, parts: list[SetAside]) -> Op[None]:
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


def set_aside(ctx: Context, thread_id: str) -> Op[list[ReplicationGap]]:
    """Every part the thread's records name (admin: a listing of its records)."""
    keys: list[str] = []
    token: str | None = None
    while True:
        page = yield from request_one(ctx.s3.list_keys(ctx.layout.set_aside_dir(thread_id), token))
        keys += [obj["Key"] for obj in page.get("Contents", []) if ctx.layout.thread_of_set_aside(obj["Key"]) == thread_id]
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
