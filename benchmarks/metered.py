"""A checkpointer wrapper that records when each saver call starts and ends.

The proxy timestamps every request; a request belongs to the saver call whose
interval contains it. To make that exact, the wrapper lets one saver call run
at a time (LangGraph otherwise overlaps a background ``put`` with the next
step's ``put_writes``). This applies to every saver alike; it means wall times
do not credit that overlap.

``list`` results are collected inside the call, so its interval covers all the
requests it makes.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver


@dataclass
class CallRecord:
    phase: str
    method: str
    t_start: float
    t_end: float
    error: str | None = None


class Recorder:
    def __init__(self) -> None:
        self.phase = "setup"
        self.calls: list[CallRecord] = []

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(c) for c in self.calls]


def _takes_task_path(method: Any) -> bool:
    """Whether a saver's put_writes/aput_writes takes ``task_path`` (LangGraph passes it
    only to those that do; an older saver's signature lacks it)."""
    try:
        return "task_path" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True


class MeteredSaver(BaseCheckpointSaver):
    def __init__(self, inner: BaseCheckpointSaver, recorder: Recorder) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner
        self.recorder = recorder
        self._lock = threading.RLock()
        self._alock: asyncio.Lock | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None

    # -- plumbing --------------------------------------------------------------
    def _run(self, method: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            t0 = time.monotonic()
            error = None
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                error = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                self.recorder.calls.append(CallRecord(self.recorder.phase, method, t0, time.monotonic(), error))

    def _async_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._alock is None or self._aloop is not loop:
            self._alock, self._aloop = asyncio.Lock(), loop
        return self._alock

    async def _arun(self, method: str, coro_fn: Any, *args: Any, **kwargs: Any) -> Any:
        async with self._async_lock():
            t0 = time.monotonic()
            error = None
            try:
                return await coro_fn(*args, **kwargs)
            except BaseException as exc:
                error = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                self.recorder.calls.append(CallRecord(self.recorder.phase, method, t0, time.monotonic(), error))

    # -- sync --------------------------------------------------------------------
    def get_tuple(self, config: Any) -> Any:
        return self._run("get_tuple", self.inner.get_tuple, config)

    def list(self, config: Any, *, filter: Any = None, before: Any = None, limit: Any = None) -> Iterator[Any]:  # noqa: A002
        items = self._run(
            "list", lambda: list(self.inner.list(config, filter=filter, before=before, limit=limit))
        )
        yield from items

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return self._run("put", self.inner.put, config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        if not _takes_task_path(self.inner.put_writes):  # as LangGraph calls such a saver
            return self._run("put_writes", self.inner.put_writes, config, writes, task_id)
        return self._run("put_writes", self.inner.put_writes, config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        return self._run("delete_thread", self.inner.delete_thread, thread_id)

    # S3Saver's archival (benchmarks.child's archive mode); other savers have none.
    def archive_thread(self, thread_id: str, **kwargs: Any) -> Any:
        return self._run("archive_thread", self.inner.archive_thread, thread_id, **kwargs)

    def restore_thread(self, thread_id: str, **kwargs: Any) -> Any:
        return self._run("restore_thread", self.inner.restore_thread, thread_id, **kwargs)

    # S3Saver's replica region (benchmarks.child's failover mode).
    def promote(self, **kwargs: Any) -> Any:
        return self._run("promote", self.inner.promote, **kwargs)

    @property
    def last_read(self) -> Any:
        return getattr(self.inner, "last_read", None)

    def get_next_version(self, current: Any, channel: Any) -> Any:
        return self.inner.get_next_version(current, channel)

    def get_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Any:
        return self._run("get_delta_channel_history", self.inner.get_delta_channel_history,
                         config=config, channels=channels)

    # -- async -------------------------------------------------------------------
    async def aget_tuple(self, config: Any) -> Any:
        return await self._arun("get_tuple", self.inner.aget_tuple, config)

    async def alist(self, config: Any, *, filter: Any = None, before: Any = None, limit: Any = None) -> AsyncIterator[Any]:  # noqa: A002
        async def collect() -> list[Any]:
            return [t async for t in self.inner.alist(config, filter=filter, before=before, limit=limit)]

        for item in await self._arun("list", collect):
            yield item

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return await self._arun("put", self.inner.aput, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        if not _takes_task_path(self.inner.aput_writes):
            return await self._arun("put_writes", self.inner.aput_writes, config, writes, task_id)
        return await self._arun("put_writes", self.inner.aput_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        return await self._arun("delete_thread", self.inner.adelete_thread, thread_id)

    async def aget_delta_channel_history(self, *, config: Any, channels: Sequence[str]) -> Any:
        return await self._arun("get_delta_channel_history", self.inner.aget_delta_channel_history,
                                config=config, channels=channels)
