"""The checkpoint methods of S3Saver: get_tuple, list, put, put_writes, the delta channel
history and the next channel version (LangGraph's BaseCheckpointSaver interface).

A mixin of [S3Saver][s3_saver.S3Saver], first among its bases, so these methods keep the
precedence they had as its own. Each method is one line: an operation and a driver.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)

from s3_saver._ops import delta, put, put_writes, read
from s3_saver._ops.context import Context
from s3_saver._transport.aio import AsyncDriver
from s3_saver._transport.protocol import Op
from s3_saver._transport.retry import RetryPolicy
from s3_saver._transport.sync import SyncDriver

# The random part of channel versions: from the OS's generator, never the random
# module's shared state, which a user's tests may seed (see keys.new_token).
_VERSIONS = random.SystemRandom()


class Checkpoints:
    """The checkpoints of a thread: read, listed, written (S3Saver's ``_sync``, ``_async`` and
    ``_reading`` run them)."""

    _sync: SyncDriver
    _async: AsyncDriver
    _ctx: Context
    _reading: Callable[..., tuple[Op[Any], RetryPolicy | None]]

    # -- BaseCheckpointSaver ---------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Fetch a checkpoint (the latest of the thread/namespace without ``checkpoint_id``).

        Args:
            config: ``{"configurable": {"thread_id", "checkpoint_ns"?, "checkpoint_id"?}}``.

        Returns:
            The checkpoint tuple with channel values and pending writes, or None.
        """
        return self._sync.run(*self._reading(lambda ctx: read.get_tuple(ctx, config)))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async version of [get_tuple()][s3_saver.S3Saver.get_tuple]."""
        return await self._async.run(*self._reading(lambda ctx: read.get_tuple(ctx, config)))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """List checkpoints newest first.

        Args:
            config: Thread (and optionally namespace) to list. Without
                ``checkpoint_ns`` every namespace is listed, newest first within
                each namespace, namespaces in descending key order (so subgraph
                namespaces come before the root's); ``None`` lists every thread
                (a table scan: for admin use).
            filter: Metadata equality filter: every key must be present with an
                equal JSON value. Bools are not numbers (``True`` does not match
                ``1``), numbers compare as numbers (``1`` matches ``1.0``), lists and
                dicts compare whole by the same rules, and ``None`` matches only a
                present null.
            before: Only checkpoints older than this config's ``checkpoint_id``.
            limit: At most this many results (after filtering).

        Yields:
            Checkpoint tuples.
        """
        return self._sync.iterate(*self._reading(lambda ctx: read.list_checkpoints(ctx, config, filter, before, limit)))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async version of [list()][s3_saver.S3Saver.list]."""
        async for item in self._async.iterate(
            *self._reading(lambda ctx: read.list_checkpoints(ctx, config, filter, before, limit))
        ):
            yield item

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: its objects first, then its index item.

        Only channels in ``new_versions`` are stored; the others point at the
        object that already holds their version.

        Returns:
            The config of the stored checkpoint.

        Raises:
            ThreadDeletedError: The thread was deleted after the parent checkpoint
                was written (a run in flight cannot bring it back); its subclass
                RunDeletedError: this run was deleted by ``delete_for_runs``.
            KeyTooLongError: The ids leave no room for the keys the thread needs.
        """
        return self._sync.run(put.put(self._ctx, config, checkpoint, metadata, new_versions))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async version of [put()][s3_saver.S3Saver.put]."""
        return await self._async.run(put.put(self._ctx, config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for the checkpoint in ``config``.

        Regular writes are first-write-wins per ``(task_id, index)``; the special
        channels of ``WRITES_IDX_MAP`` (errors, interrupts, resumes) last-write-wins,
        both in the order the index commits them (never by a clock). Writes may
        arrive before their checkpoint is stored.

        Raises:
            ThreadDeletedError: The thread was deleted after the checkpoint was written.
        """
        self._sync.run(put_writes.put_writes(self._ctx, config, writes, task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async version of [put_writes()][s3_saver.S3Saver.put_writes]."""
        await self._async.run(put_writes.put_writes(self._ctx, config, writes, task_id, task_path))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Writes and seed of each channel along the parent chain (for ``DeltaChannel``).

        Reads the chain as one index range instead of one ``get_tuple`` per
        ancestor, then fetches the seeds in one more wave.
        """
        return self._sync.run(*self._reading(lambda ctx: delta.delta_channel_history(ctx, config, channels)))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Async version of [get_delta_channel_history()][s3_saver.S3Saver.get_delta_channel_history]."""
        return await self._async.run(*self._reading(lambda ctx: delta.delta_channel_history(ctx, config, channels)))

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Next channel version: a zero-padded counter plus a random part.

        Monotonic, and unique across forks of one thread (two branches bumping the
        same version get different strings), so a (channel, version) key is never
        written with two different values.
        """
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{_VERSIONS.random():016}"
