"""prune and delete_for_runs: take checkpoints out of threads, keeping what the rest read through.

A checkpoint that stays can depend on ones that go, in two ways:

* ``loc``: an unchanged channel's value lives in the object of the checkpoint
  that stored it (or in a blob object that checkpoint wrote);
* LangGraph's ``DeltaChannel`` stores no value at most steps: its state is the
  writes of the ancestors back to the last snapshot, replayed
  (``get_delta_channel_history``). Each checkpoint's metadata says which delta
  channels have writes since their snapshot (``counters_since_delta_snapshot``).

So the checkpoints those reads go through stay too, hidden (``hidden``: never
listed or returned, read only through the ones that stay): exactly the
ancestors back to each delta channel's snapshot, with their writes, and the
checkpoints whose objects hold values that stay. Everything else of what goes
(entries, writes, objects) is deleted, entries before objects
(``Index.drop``): a prune cut short leaves every kept checkpoint readable, and
running it again finishes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from s3_saver._index.base import IN_BLOB_OBJECT, IN_CHECKPOINT_OBJECT, CheckpointEntry, IndexEntry, Key3
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import delete_keys, delete_thread, object_keys
from s3_saver._ops.resolve import Resolver
from s3_saver._protocol import Op, gather
from s3_saver.errors import ConfigurationError

STRATEGIES = ("keep_latest", "delete")
# Threads handled side by side: their round trips share waves.
_THREADS_AT_ONCE = 16
_DELTA_COUNTERS = "counters_since_delta_snapshot"


def prune(ctx: Context, thread_ids: Sequence[str], strategy: str, keep_last: int | None) -> Op[None]:
    threads = _ids(thread_ids, "thread_ids")
    if strategy not in STRATEGIES:
        raise ConfigurationError(f"unknown prune strategy {strategy!r}: use one of {', '.join(map(repr, STRATEGIES))}")
    if keep_last is not None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ConfigurationError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        if strategy != "keep_latest":
            raise ConfigurationError("keep_last goes with strategy='keep_latest'")
    for thread_id in threads:
        target({"configurable": {"thread_id": thread_id}})  # refuse bad ids before anything goes

    def one(thread_id: str) -> Op[None]:
        if strategy == "delete":
            yield from delete_thread(ctx, thread_id)
            return
        entries = yield from ctx.index.contents(thread_id)
        newest: dict[str, list[CheckpointEntry]] = {}
        for entry in sorted(entries, key=lambda e: e.checkpoint_id, reverse=True):
            if not entry.hidden and not ctx.expired(entry):
                newest.setdefault(entry.ns, []).append(entry)
        kept = {e.key for per_ns in newest.values() for e in per_ns[: keep_last or 1]}
        yield from _take_out(ctx, thread_id, entries, kept)

    for i in range(0, len(threads), _THREADS_AT_ONCE):
        yield from gather(*(one(t) for t in threads[i : i + _THREADS_AT_ONCE]))


def delete_for_runs(ctx: Context, run_ids: Sequence[str]) -> Op[None]:
    runs = _ids(run_ids, "run_ids")
    if not runs:
        return
    # The run hints name the threads; each thread's own index says which of its
    # checkpoints the runs wrote.
    found = yield from ctx.index.runs(runs)
    threads = sorted({t for ts in found.values() for t in ts})
    gone = set(runs)

    def one(thread_id: str) -> Op[None]:
        entries = yield from ctx.index.contents(thread_id)
        here = sorted({e.run_id for e in entries if e.run_id in gone and not e.hidden})  # type: ignore[misc]
        if here:
            # First, so that a run still in flight cannot commit a checkpoint that
            # points at what goes next (its put raises RunDeletedError).
            yield from ctx.index.bury_runs(thread_id, here)
            kept = {e.key for e in entries if not e.hidden and e.run_id not in gone}
            yield from _take_out(ctx, thread_id, entries, kept)

    for i in range(0, len(threads), _THREADS_AT_ONCE):
        yield from gather(*(one(t) for t in threads[i : i + _THREADS_AT_ONCE]))
    yield from ctx.index.forget_runs([(r, t) for r, ts in found.items() for t in ts])


def _take_out(ctx: Context, thread_id: str, entries: list[CheckpointEntry], kept: set[Key3]) -> Op[None]:
    """Keep ``kept`` (and hide what they read through); drop the rest."""
    by_key = {e.key: e for e in entries}
    chain = yield from _delta_chains(ctx, by_key, [by_key[k] for k in kept])
    # Objects of the checkpoints that are read (kept ones, and the delta chains'
    # seeds) hold values; so do the blob objects their loc names.
    read = kept | chain
    sources: set[Key3] = set()
    blobs: set[str] = set()
    for key in read:
        e = by_key[key]
        for ch, (version, src, kind, _) in e.loc.items():
            if kind == IN_CHECKPOINT_OBJECT and src != e.checkpoint_id:
                sources.add((thread_id, e.ns, src))
            elif kind == IN_BLOB_OBJECT:
                blobs.add(ctx.layout.blob_key(thread_id, e.ns, ch, version, src))
    stay = read | {k for k in sources if k in by_key}
    hide = [e for e in entries if e.key in stay and e.key not in kept and not e.hidden]
    drop = [e for e in entries if e.key not in stay]
    if not hide and not drop:
        return
    doomed: list[IndexEntry] = []
    for e in drop:
        # Its own blobs that nothing staying points at; its checkpoint object is
        # never a source of one that stays (that one would stay too).
        own = {
            ch: v for ch, v in e.loc.items()
            if v[2] == IN_BLOB_OBJECT and v[1] == e.checkpoint_id
            and ctx.layout.blob_key(thread_id, e.ns, ch, v[0], v[1]) not in blobs
        }
        doomed.append(CheckpointEntry(thread_id, e.ns, e.checkpoint_id, e.parent_id, own))
        doomed.extend(e.writes or ())

    def delete_objects(items: list[IndexEntry]) -> Op[None]:
        yield from delete_keys(ctx, sorted(set(object_keys(ctx, items))), f"thread {thread_id!r}")

    yield from ctx.index.drop(thread_id, hide, drop, doomed, delete_objects)
    # A writer of this process continues from what it read: not from what went.
    ctx.locs.forget_thread(thread_id)


def _delta_chains(ctx: Context, by_key: dict[Key3, CheckpointEntry], kept: list[CheckpointEntry]) -> Op[set[Key3]]:
    """The ancestors each kept checkpoint's DeltaChannels replay: back to the one
    that stores each channel's value (a snapshot), as the walk of
    ``get_delta_channel_history`` goes."""
    resolver = Resolver(ctx)
    for e in kept:
        resolver.add(e)
    unknown = [e for e in kept if resolver.metadata(e) is None]
    if unknown:
        yield from resolver.fetch_records(unknown)
    chain: set[Key3] = set()
    for e in kept:
        counters: Any = (resolver.metadata(e) or {}).get(_DELTA_COUNTERS) or {}
        pending = set(counters) - set(e.loc)
        parent = e.parent_id
        while pending and parent is not None:
            ancestor = by_key.get((e.thread_id, e.ns, parent))
            if ancestor is None:
                break
            chain.add(ancestor.key)
            pending -= set(ancestor.loc)
            parent = ancestor.parent_id
    return chain


def _ids(ids: Any, name: str) -> list[str]:
    """A list of ids; a bare string is refused (it would be read as its characters).
    Run ids may be UUIDs, as LangGraph's server makes them: they compare as strings."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence | set | frozenset):
        raise ConfigurationError(f"{name} must be a list of ids, got {type(ids).__name__}: {ids!r}")
    out = []
    for value in ids:
        if value is None or value == "" or (name == "thread_ids" and not isinstance(value, str | int)):
            raise ConfigurationError(f"{name} must hold non-empty ids, got {value!r}")
        out.append(str(value))
    return list(dict.fromkeys(out))
