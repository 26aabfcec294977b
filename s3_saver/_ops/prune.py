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
is deleted: entries first (``Index.drop``), then the objects they name that no
entry still in the index names (``_format/closure``: a value a kept checkpoint reads from
a dropped one's object stays). A prune cut short leaves every kept checkpoint
readable; running it again finishes what the index still holds (objects a cut
left unreferenced are collect_garbage's).

A run may commit while this runs: its commit needs its parent's entry in the
index (a condition of the commit), so once the drop is in, no new checkpoint
can read through what was dropped, and the objects are chosen by reading the
index again after the drop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from s3_saver._format.entries import (
    IN_CHECKPOINT_OBJECT,
    CheckpointEntry,
    Key3,
    ref_pieces,
)
from s3_saver._index.terms import Cut
from s3_saver._ops.context import Context, target
from s3_saver._ops.delete import delete_thread, deleter
from s3_saver._ops.keyed import keyed
from s3_saver._ops.resolve import Resolver
from s3_saver._transport.protocol import Op, gather
from s3_saver.errors import ConfigurationError

STRATEGIES = ("keep_latest", "delete")
# LangGraph Server (langgraph-api 0.16, its checkpointer gRPC service) names the
# base class's "delete" "delete_all" when it calls a custom checkpointer's aprune.
_SPELLINGS = {"delete_all": "delete"}
# Threads handled side by side: their round trips share waves.
_THREADS_AT_ONCE = 16
_RUN_LOOKUPS = 3
_DELTA_COUNTERS = "counters_since_delta_snapshot"


def prune(ctx: Context, thread_ids: Sequence[str], strategy: str, keep_last: int | None) -> Op[None]:
    threads = _ids(thread_ids, "thread_ids")
    strategy = _SPELLINGS.get(strategy, strategy) if isinstance(strategy, str) else strategy
    if strategy not in STRATEGIES:
        raise ConfigurationError(f"unknown prune strategy {strategy!r}: use one of {', '.join(map(repr, STRATEGIES))}")
    if keep_last is not None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ConfigurationError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        if strategy != "keep_latest":
            raise ConfigurationError("keep_last goes with strategy='keep_latest'")
    for thread_id in threads:
        target({"configurable": {"thread_id": thread_id}})  # refuse bad ids before anything goes

    def newest(entries: list[CheckpointEntry]) -> set[Key3]:
        by_ns: dict[str, list[CheckpointEntry]] = {}
        for entry in sorted(entries, key=lambda e: e.checkpoint_id, reverse=True):
            if not entry.hidden and not ctx.expired(entry):
                by_ns.setdefault(entry.ns, []).append(entry)
        return {e.key for per_ns in by_ns.values() for e in per_ns[: keep_last or 1]}

    def one(thread_id: str) -> Op[None]:
        if strategy == "delete":
            yield from delete_thread(ctx, thread_id)
        else:
            yield from _take_out(ctx, thread_id, newest)

    for i in range(0, len(threads), _THREADS_AT_ONCE):
        yield from gather(*(one(t) for t in threads[i : i + _THREADS_AT_ONCE]))


def delete_for_runs(ctx: Context, run_ids: Sequence[str]) -> Op[None]:
    runs = _ids(run_ids, "run_ids")
    if not runs:
        return
    # The run hints name the threads; each thread's own index says which of its
    # checkpoints the runs wrote. Looked up again once the threads found are
    # marked: a copy_thread that read a source before its mark notes the copy's
    # hints first and reads the source's deleted runs after (see _ops.copy), so
    # either this finds the copy or the copy finds the mark.
    done: set[str] = set()
    found: dict[str, list[str]] = {}
    for _ in range(_RUN_LOOKUPS):
        found = yield from ctx.index.runs(runs)
        threads = sorted({t for ts in found.values() for t in ts} - done)
        if not threads:
            break
        for i in range(0, len(threads), _THREADS_AT_ONCE):
            yield from gather(*(take_out_runs(ctx, t, runs) for t in threads[i : i + _THREADS_AT_ONCE]))
        done.update(threads)
    yield from ctx.index.forget_runs([(r, t) for r, ts in found.items() for t in ts])


def threads_of_runs(ctx: Context, run_ids: Sequence[str]) -> Op[dict[str, list[str]]]:
    runs = _ids(run_ids, "run_ids")
    if not runs:
        return {}
    found = yield from ctx.index.runs(runs)
    return {run: sorted(set(threads)) for run, threads in found.items() if threads}


def take_out_runs(ctx: Context, thread_id: str, runs: Sequence[str]) -> Op[None]:
    """delete_for_runs on one thread: the runs marked deleted first (read-decide-act
    is fenced at the commit: from here on a commit of these runs is refused with
    RunDeletedError, so the read that follows sees every checkpoint they will
    ever have on this thread), then their checkpoints taken out."""
    gone = set(runs)

    def others(entries: list[CheckpointEntry]) -> set[Key3]:
        return {e.key for e in entries if not e.hidden and e.run_id not in gone}

    yield from ctx.index.bury_runs(thread_id, sorted(gone))
    yield from _take_out(ctx, thread_id, others)


def _take_out(ctx: Context, thread_id: str, keep: Callable[[list[CheckpointEntry]], set[Key3]]) -> Op[None]:
    """Keep what ``keep`` picks (and hide what it reads through); drop the rest.

    ``Index.drop`` reads the thread, asks ``plan`` what to take out of what it
    read, and asks again if a commit lands before its change does: the decision
    is always made on the thread the change applies to."""

    decided: list[tuple[list[CheckpointEntry], Cut]] = []
    # The thread's key (with encryption): the plan reads its checkpoints' metadata.
    ctx = yield from keyed(ctx, [thread_id])

    def plan(entries: list[CheckpointEntry]) -> Op[Cut]:
        by_key = {e.key: e for e in entries}
        kept = keep(entries)
        chain = yield from _delta_chains(ctx, by_key, [by_key[k] for k in kept])
        read = kept | chain
        # Checkpoints whose objects hold values of the ones read stay too, hidden:
        # their entries carry those objects' bodies (a read needs no S3 GET).
        sources = {
            (thread_id, e.ns, p[1])
            for e in (by_key[k] for k in read)
            for ref in e.loc.values()
            for p in ref_pieces(ref)
            if p[2] == IN_CHECKPOINT_OBJECT and p[1] != e.checkpoint_id
        }
        stay = read | (sources & by_key.keys())
        cut = Cut(
            hide=[e for e in entries if e.key in stay and e.key not in kept and not e.hidden],
            drop=[e for e in entries if e.key not in stay],
        )
        decided.append((entries, cut))
        return cut

    yield from ctx.index.drop(thread_id, plan, deleter(ctx, thread_id))
    if decided:
        # The hints of runs left with no checkpoint here go too: a delete of the
        # thread finds the hints to remove through its checkpoints' runs.
        entries, cut = decided[-1]
        dropped = {e.key for e in cut.drop}
        left = {e.run_id for e in entries if e.key not in dropped}
        gone = sorted({e.run_id for e in cut.drop if e.run_id is not None} - left)
        yield from ctx.index.forget_runs([(r, thread_id) for r in gone])
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
