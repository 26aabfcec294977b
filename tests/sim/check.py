"""What is read back after a schedule, by a fresh saver, and every assertion on it.

(a) every thread reads as some order of the schedule's operations says
    (``model.linearize``), and the saver's reads agree with one another:
    ``list`` order, ``get_tuple`` latest per namespace and by id,
    ``list(before=, limit=, filter=)``;
(b) ``audit(older_than=0)`` finds nothing missing and no broken index;
(c) a deleted thread left nothing behind (the leftover check: the only place
    that looks at keys, and only for the thread's id inside them); an erased one
    no version and no delete marker either, in a versioned bucket too;
(d) ``collect_garbage(older_than=0)`` changes no read;
(e) before it and after it, the index of a thread that was deleted names no
    pending write whose checkpoint is not in the index (issue 33: a step's
    writes racing the delete were committed into the new generation, invisible
    to every read, so (a) cannot see them, and (c) skips a thread written during
    its delete; before the collection, which takes such writes out, put_writes
    must have refused them);
(f) last, after a schedule with ``archive_idle``: runs of it until one has
    nothing to do archive every live thread (all idle by then) that no cut-off
    operation touched: no run's drop took away an activity entry that a write
    made after the run read it (issue 41: a writer restoring a thread the run
    archived writes the day's entry again, and writes no other that day).
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from typing import Any

from sim import model as M
from sim.workload import SUB_NS, cfg

NAMESPACES = ("", SUB_NS)
TOMBSTONE_MAX_BYTES = 2048


class Failure(AssertionError):
    pass


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def read_thread(saver: Any, t: str) -> list[tuple[M.Key, dict]]:
    return [M.norm(x) for x in saver.list(cfg(t, None))]


def read_all(saver: Any, threads: list[str], problems: list[str]) -> dict[str, dict[M.Key, dict]] | None:
    """Every thread's full list (with the order checked); None when a read raised."""
    observed: dict[str, dict[M.Key, dict]] = {}
    for t in threads:
        try:
            rows = read_thread(saver, t)
        except Exception as exc:
            problems.append(f"(a) list({t}) raised {_err(exc)}")
            return None
        keys = [k for k, _ in rows]
        if keys != sorted(keys, reverse=True) or len(set(keys)) != len(keys):
            problems.append(
                f"(a) list({t}) order: expected namespaces descending, newest first in each, got "
                + ", ".join((k[0] or "root") + "/" + k[1][-6:] for k in keys)
            )
        observed[t] = dict(rows)
    return observed


def consistent_reads(saver: Any, t: str, rows: dict[M.Key, dict], rng: random.Random, problems: list[str]) -> None:
    """get_tuple and list with arguments, against the thread's full list."""
    ordered = sorted(rows.items(), key=lambda kv: kv[0], reverse=True)

    def check(what: str, got: list[tuple[M.Key, dict]], want: list[tuple[M.Key, dict]]) -> None:
        if [k for k, _ in got] != [k for k, _ in want]:
            problems.append(f"(a) {what} on {t}: got {_keys(got)}, the full list says {_keys(want)}")
            return
        for (k, a), (_, b) in zip(got, want):
            if a != b:
                problems.append(f"(a) {what} on {t} {k}: " + "; ".join(M.differences(a, b)))

    try:
        for ns in NAMESPACES:
            in_ns = [kv for kv in ordered if kv[0][0] == ns]
            latest = saver.get_tuple(cfg(t, ns))
            check(f"get_tuple(ns={ns!r})", [] if latest is None else [M.norm(latest)], in_ns[:1])
            if in_ns and ns != "":
                check(f"list(ns={ns!r})", read_thread_ns(saver, t, ns), in_ns)
        if not ordered:
            return
        for (ns, cid), _ in rng.sample(ordered, min(2, len(ordered))):
            got = saver.get_tuple(cfg(t, ns, cid))
            check(f"get_tuple(id={cid[-6:]})", [] if got is None else [M.norm(got)], [kv for kv in ordered if kv[0] == (ns, cid)])
        (bns, bid), payload = rng.choice(ordered)
        limit = rng.choice([1, 2, 3])
        if rng.random() < 0.5:
            got = [M.norm(x) for x in saver.list(cfg(t, None), before=cfg(t, None, bid), limit=limit)]
            check(f"list(before={bid[-6:]}, limit={limit})", got, [kv for kv in ordered if kv[0][1] < bid][:limit])
        else:
            got = [M.norm(x) for x in saver.list(cfg(t, ""), before=cfg(t, "", bid), limit=limit)]
            want = [kv for kv in ordered if kv[0][0] == "" and kv[0][1] < bid][:limit]
            check(f"list(ns='', before={bid[-6:]}, limit={limit})", got, want)
        flt = rng.choice([
            {"run_id": payload["metadata"].get("run_id")},
            {"tag": "x", "source": "loop"},
            {"step": payload["metadata"].get("step")},
        ])
        flimit = rng.choice([None, 2])
        got = [M.norm(x) for x in saver.list(cfg(t, None), filter=flt, limit=flimit)]
        want = [kv for kv in ordered if all(kv[1]["metadata"].get(k, M._ABSENT) == v for k, v in flt.items())]
        check(f"list(filter={flt}, limit={flimit})", got, want[:flimit] if flimit else want)
    except Exception as exc:
        problems.append(f"(a) a read of {t} raised {_err(exc)}")


def _keys(rows: list[tuple[M.Key, dict]]) -> list[str]:
    return [(k[0] or "root") + "/" + k[1][-6:] for k, _ in rows]


def read_thread_ns(saver: Any, t: str, ns: str) -> list[tuple[M.Key, dict]]:
    return [M.norm(x) for x in saver.list(cfg(t, ns))]


def audit(saver: Any, problems: list[str], when: str) -> None:
    try:
        report = saver.audit(older_than=timedelta(0))
    except Exception as exc:
        problems.append(f"(b) audit {when} raised {_err(exc)}")
        return
    for p in report.missing + report.broken:
        problems.append(f"(b) audit {when}: {p.kind} {p.thread_id} {p.key}: {p.detail[:200]}")


def leftovers(world: Any, prefix: str, t: str) -> list[str]:
    """(c) What a deleted thread left: at most one small index record."""
    out = []
    objects = world.objects_naming(prefix, t)
    items = world.items_naming(prefix, t)
    if world.mode == "manifest":
        big = [o for o in objects if o[1] > TOMBSTONE_MAX_BYTES]
        if len(objects) > 1 or big:
            out.append(f"(c) deleted thread {t} left {len(objects)} objects (at most its head may stay): {objects[:6]}")
    else:
        if objects:
            out.append(f"(c) deleted thread {t} left {len(objects)} objects in the bucket: {objects[:6]}")
        sizes = [len(json.dumps(i, default=lambda b: "x" * len(b))) for i in items]  # B attributes: bytes
        if len(items) > 1 or any(s > TOMBSTONE_MAX_BYTES for s in sizes):
            shown = [{k: v.get("S", "...") for k, v in i.items() if k in ("pk", "sk")} for i in items[:6]]
            out.append(f"(c) deleted thread {t} left {len(items)} index items (at most one small tombstone): {shown}")
    return out


def deleted_cleanly(history: list[Any], state: M.ModelState, t: str) -> bool:
    """Whether the leftover check applies to ``t``: a delete_thread of it answered,
    the model's final thread is empty, no operation on it was abandoned or cut
    (a write cut short before its commit leaves objects by design: garbage for
    collect_garbage), and no write to it that succeeded ran alongside or after
    the delete (it may come after the delete: what it wrote is new, not left)."""
    deletes = [
        op for op in history
        if isinstance(op.step.model, M.DeleteThread) and op.step.model.t == t and op.outcome and op.outcome[0] == "ok"
    ]
    if not deletes or not state.nothing(t):
        return False
    started = min(op.start for op in deletes if op.start is not None)
    for op in history:
        if t not in op.step.model.threads or op in deletes:
            continue
        if op.outcome is None or op.outcome[0] == "abandoned" or op.cuts:
            return False
        wrote = op.outcome[0] == "ok" and isinstance(op.step.model, (M.Put, M.PutWrites))
        if wrote and (op.end is None or op.end >= started):
            return False
    return True


def orphan_writes(saver: Any, t: str, when: str) -> list[str]:
    """(e) Pending writes the thread's index keeps whose checkpoint it does not
    hold: a run of the thread may still be in flight only when an operation on it
    was abandoned or cut (the caller checks), so none may stay here."""
    from s3_saver._format.entries import CheckpointEntry, WritesEntry

    held = saver._sync.run(saver._ctx.index.holdings(t))
    entries = [*held.live, *held.kept]
    present = {(e.ns, e.checkpoint_id) for e in entries if isinstance(e, CheckpointEntry)}
    orphans = sorted({(e.ns, e.checkpoint_id[-6:], e.task_id) for e in entries if isinstance(e, WritesEntry) and (e.ns, e.checkpoint_id) not in present})
    return [f"(e) after delete_thread, {when}, {t}'s index keeps writes of absent checkpoints: {orphans[:6]}"] if orphans else []


def settled_after_delete(history: list[Any], t: str) -> bool:
    """Whether (e) applies to ``t``: a delete_thread of it answered, and no
    operation on it was abandoned or cut (such a run may still be in flight)."""
    deleted = any(
        isinstance(op.step.model, M.DeleteThread) and op.step.model.t == t and op.outcome and op.outcome[0] == "ok" for op in history
    )
    return deleted and all(
        op.outcome is not None and op.outcome[0] != "abandoned" and not op.cuts for op in history if t in op.step.model.threads
    )


def erased_cleanly(history: list[Any], state: M.ModelState, t: str) -> bool:
    """Whether the version check applies to ``t``: an erase_thread of it answered,
    the model's final thread is empty, every other operation on it ended before
    that erase began (a write refused after it, or one it kept as maybe in
    flight, leaves versions by design: the next erase's), and none but a delete
    was abandoned or cut (a write cut short leaves young objects: reported).

    Not ``deleted_cleanly``'s rule that no write succeed after the first delete:
    a write after a delete starts the thread afresh, and the erase after it must
    remove both lives (the earlier one's run hints and listing object too)."""
    erases = [
        op for op in history
        if isinstance(op.step.model, M.EraseThread) and op.step.model.t == t and op.outcome and op.outcome[0] == "ok"
    ]
    if not erases or not state.nothing(t):
        return False
    last = max(erases, key=lambda op: op.end)
    for op in history:
        if t not in op.step.model.threads or op is last or isinstance(op.step.model, M.DeleteThread):
            continue
        if op.outcome is None or op.outcome[0] == "abandoned" or op.cuts:
            return False
    # A collect_garbage that listed the thread's objects before the erase deleted
    # them deletes them again after it: a delete marker in a versioned bucket.
    # Ticks count calls: an answer at the tick an op starts came before its first call.
    gcs = [op for op in history if isinstance(op.step.model, M.CollectGarbage)]
    return all(
        op.end is not None and last.start is not None and op.end <= last.start
        for op in history
        if (t in op.step.model.threads and op is not last) or (op in gcs and not (op.start or 0) > last.end)
    )


def erased_leftovers(world: Any, prefix: str, t: str) -> list[str]:
    """(c) What an erased thread left: no version and no delete marker naming it,
    but the manifest's head (its delete record, current, small)."""
    versions = world.versions_naming(prefix, t)
    record = [v for v in versions if world.mode == "manifest" and v[0].endswith("/head") and v[2] and v[1] <= TOMBSTONE_MAX_BYTES]
    left = [v for v in versions if v not in record[:1]]
    if left:
        return [f"(c) erased thread {t} left {len(left)} versions or delete markers (key, size, current): {left[:6]}"]
    return []


def idle_not_found(world: Any, prefix: str, history: list[Any], state: M.ModelState, threads: list[str]) -> list[str]:
    """(f) The live threads that runs of ``archive_idle`` (no grace: every thread
    is idle now) leave live, of those no operation left in flight (abandoned:
    it may still land) and with a root checkpoint for sure."""
    watched = [
        t for t in threads
        if any(ns == "" for ns, _ in state.certain(t))
        and not any(t in op.step.model.threads and (op.outcome is None or op.outcome[0] == "abandoned") for op in history)
    ]
    if not watched:
        return []
    saver = world.saver(prefix)
    try:
        for _ in range(3):
            report = saver.archive_idle(timedelta(0))
            if not report and not report.more:
                break
        live = [t for t in watched if saver._sync.run(saver._ctx.index.archive_of(t)).archive is None]
    except Exception as exc:
        return [f"(f) archive_idle after the schedule raised {_err(exc)}"]
    return [f"(f) {t} is live and idle, and no archive_idle run archives it: no activity entry names it" for t in live]
