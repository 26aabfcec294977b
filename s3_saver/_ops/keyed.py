"""An operation's keys: loaded before it seals or opens its threads' content.

With ``encryption=``, every operation that writes or reads a thread's content loads the
thread's key first (``Crypt.load``: from the cache at no request in the steady state) and
goes on with a copy of its context that carries them (``Context.sealer``). A read loads
them in the same waves as its first index read (``keyed_beside``): a cold process pays the
key store's GET beside that read, then, with KMS, one ``Decrypt``. A writer loads them
before it seals its first object (``keyed``, ``create=True``: a thread's first key is made
there). Without encryption both return at once, sending nothing.

Operations that cannot encrypt yet refuse to run on an encrypting saver (``unsupported``)
rather than write or move plaintext.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from s3_saver._ops.context import Context
from s3_saver._transport.protocol import Op, T, gather
from s3_saver.errors import ConfigurationError


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
    loaded in the same waves: ``ctx`` holding them, and ``op``'s result."""
    if ctx.crypt is None:
        return ctx, (yield from op)
    keyed_ctx, result = yield from gather(keyed(ctx, thread_ids), op)
    return keyed_ctx, result


def unsupported(ctx: Any, operation: str) -> None:
    """Refuse an operation that cannot keep a thread encrypted yet (it would write or
    move content without the thread's key), before it sends anything."""
    if ctx.crypt is not None:
        raise ConfigurationError(
            f"{operation} is not yet supported with encryption= ({ctx.crypt.describe()}): it would write or move "
            "thread content without encrypting it under the thread's key. Nothing was done"
        )
