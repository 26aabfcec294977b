"""An operation's keys: loaded before it seals or opens its threads' content.

With ``encryption=``, every operation that writes or reads a thread's content loads the
thread's key first (``Crypt.load``: from the cache at no request in the steady state) and
goes on with a copy of its context that carries them (``Context.sealer``). A read loads
them in the same waves as its first index read (``keyed_beside``): a cold process pays the
key store's GET beside that read, then, with KMS, one ``Decrypt``. A writer loads them
before it seals its first object (``keyed``, ``create=True``: a thread's first key is made
there). Without encryption both return at once, sending nothing.

A key this process cached may have been destroyed by another process's erase (and the
thread written anew under a new key). Nothing is decided on it unchecked: a read that
meets content sealed under another key runs again once with the thread's record read
(``rekeying``); a write whose key an erase destroyed is refused at its commit and sealed
anew under the thread's key as read then (``rekeyed``, from ``_ops/commit``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from s3_saver._crypto.sealer import StaleKey
from s3_saver._format.entries import Tombstone
from s3_saver._index.terms import Archived
from s3_saver._ops.context import Context
from s3_saver._transport.protocol import Emit, Op, T, gather
from s3_saver.errors import S3SaverError

# Writes sealed again after their key was found destroyed at their index write (a
# commit, a copy's or an import's): each time another erase of the thread came in
# between (and a new life began after it).
MAX_REKEYS = 3


def keyed(ctx: Context, thread_ids: Iterable[str], *, create: bool = False) -> Op[Context]:
    """``ctx`` holding the keys of ``thread_ids`` too; ``create``: a thread without a
    live key gets one (a writer's)."""
    if ctx.crypt is None:
        return ctx
    held = ctx.sealer.keys
    wanted = [t for t in dict.fromkeys(thread_ids) if t not in held or (create and held[t].key is None)]
    if not wanted:
        return ctx
    keys = yield from ctx.crypt.load(wanted, create=create)
    return replace(ctx, sealer=ctx.sealer.with_keys(keys))


def keyed_beside(ctx: Context, thread_ids: Iterable[str], op: Op[T]) -> Op[tuple[Context, T]]:
    """``op`` (an index read that needs no key), with the keys of ``thread_ids``
    loaded in the same waves: ``ctx`` holding them, and ``op``'s result.

    An index read that finds the thread archived (``Archived``) lets the keys finish
    loading, and the exception carries them: the read goes on against the archive,
    which opens under them (``archived.or_archive``). Read again there, a key loaded
    here would come from the cache, unchecked, and its GET would be sent twice."""
    if ctx.crypt is None:
        return ctx, (yield from op)
    keyed_ctx, (result, archived) = yield from gather(keyed(ctx, thread_ids), _archived_caught(op))
    if archived is not None:
        archived.sealer = keyed_ctx.sealer
        raise archived
    return keyed_ctx, result


def _archived_caught(op: Op[T]) -> Op[tuple[T | None, Archived | None]]:
    try:
        return (yield from op), None
    except Archived as archived:
        return None, archived


def rekeyed(ctx: Context, thread_id: str) -> Op[Context]:
    """``ctx`` holding the thread's key as the key store has it now, made for a new
    life when the one held was destroyed (a writer refused at its commit because an
    erase destroyed the key it sealed with)."""
    assert ctx.crypt is not None
    ctx.crypt.forget(thread_id)
    return (yield from keyed(replace(ctx, sealer=ctx.sealer.without(thread_id)), [thread_id], create=True))


def key_gone(ctx: Context, record: Tombstone, thread_id: str) -> bool:
    """Whether ``record`` refused an index write of ``thread_id`` because an erase
    destroyed the key this operation seals the thread's content with."""
    key_id = ctx.sealer.key_id(thread_id)
    return key_id is not None and key_id in record.gone_keys


def rekeyed_too_often(thread_id: str) -> S3SaverError:
    return S3SaverError(
        f"thread {thread_id!r}: the write was sealed again {MAX_REKEYS} times, each time under a key an erase "
        "destroyed before it committed (the thread keeps being erased while it is written); nothing was committed"
    )


def writer_keyed(ctx: Context, thread_id: str, record: Tombstone) -> Op[Context]:
    """The key an operation that writes a thread whole (copy, import) seals with: the
    thread's (made for a new thread), read again when it is one an erase destroyed as
    ``record`` (the thread's index record, read by the operation) says: this process
    cached it before another process erased the thread."""
    ctx = yield from keyed(ctx, [thread_id], create=True)
    return (yield from not_gone(ctx, thread_id, record))


def not_gone(ctx: Context, thread_id: str, record: Tombstone) -> Op[Context]:
    """``ctx``, its key of ``thread_id`` (loaded with ``create=True``, maybe beside the
    read of ``record``) read again when ``record`` says an erase destroyed it (see
    ``writer_keyed``)."""
    key_id = ctx.sealer.key_id(thread_id)
    if key_id is not None and key_id in record.gone_keys:
        ctx = yield from rekeyed(ctx, thread_id)
    return ctx


def rekeying(ctx: Context, make: Callable[[Context], Op[T]]) -> Op[T]:
    """The read ``make(ctx)``, run again when it met content sealed under another key
    than the one this process cached for its thread (``StaleKey``: the cached key is
    dropped, so the next run reads the thread's record; once per thread). Not once it
    has emitted results (a ``list`` half done): the caller would see some checkpoints
    twice; the error then says to call again. Without encryption: ``make(ctx)``."""
    if ctx.crypt is None:
        return (yield from make(ctx))
    renewed: set[str] = set()
    while True:
        op = make(ctx)
        emitted = False
        reply: Any = None
        try:
            while True:
                try:
                    step = op.send(reply)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                emitted = emitted or isinstance(step, Emit)
                reply = yield step
        except StaleKey as stale:
            # A thread's key is read again at most once per call: its second run
            # reads the record, so a second StaleKey names another thread.
            if emitted or stale.thread_id in renewed:
                if stale.thread_id in renewed and stale.instead is not None:
                    raise stale.instead from None
                raise
            renewed.add(stale.thread_id)
