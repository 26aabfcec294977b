"""Runs operations with aioboto3; the calls of one wave go out with asyncio.gather.

Clients belong to an event loop. AWS Lambda's async handlers (``asyncio.run``
per invocation) start a new loop each time, so clients are made lazily per loop
and closed when their loop shuts down (see ``_LoopClients``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ReadTimeoutError,
)

from s3_saver._transport.answers import confirm
from s3_saver._transport.clients import prepare
from s3_saver._transport.protocol import (
    PRIMARY,
    Call,
    Emit,
    Op,
    RequestStats,
    Sleep,
    T,
    Wait,
    client_key,
    site_of,
)
from s3_saver._transport.retry import RetryPolicy, resilient
from s3_saver._transport.sync import MarkLookup, OwnerLookup, checked

ClientContextFactory = Callable[[str, str], Any]  # (service, site) -> async context manager of a client


class AsyncDriver:
    def __init__(
        self,
        make_client: ClientContextFactory,
        stats: RequestStats,
        policy: RetryPolicy,
        owners: OwnerLookup = lambda site: None,
        marks: MarkLookup = lambda site: None,
    ) -> None:
        self._make_client = make_client
        self._owners = owners
        self._marks = marks
        self._stats = stats
        self._policy = policy
        self._loops: dict[asyncio.AbstractEventLoop, _LoopClients] = {}

    async def run(self, op: Op[T], policy: RetryPolicy | None = None) -> T:
        op = resilient(checked(op, self._owners, self._marks), policy or self._policy)
        reply: Any = None
        try:
            while True:
                try:
                    step = op.send(reply)
                except StopIteration as stop:
                    return stop.value
                reply = await self._step(step)
        finally:
            op.close()  # as the sync driver does: a cancelled task hands on at once

    async def iterate(self, op: Op[Any], policy: RetryPolicy | None = None) -> AsyncIterator[Any]:
        op = resilient(checked(op, self._owners, self._marks), policy or self._policy)
        reply: Any = None
        try:
            while True:
                try:
                    step = op.send(reply)
                except StopIteration:
                    return
                if isinstance(step, Emit):
                    reply = None
                    yield step.value
                else:
                    reply = await self._step(step)
        finally:
            op.close()

    async def _step(self, step: Any) -> Any:
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, Wait):
            loop = asyncio.get_running_loop()
            woken = loop.create_future()

            def wake() -> None:  # from whichever thread sets the signal
                loop.call_soon_threadsafe(lambda: woken.done() or woken.set_result(None))

            if step.signal.subscribe(wake):
                try:
                    await asyncio.wait_for(woken, step.timeout)
                except asyncio.TimeoutError:
                    pass
            return None
        if isinstance(step, Emit):
            return None
        self._stats.record(step)
        if len(step) == 1:
            return [await self._send(step[0])]
        return list(await asyncio.gather(*(self._send(c) for c in step)))

    async def _send(self, call: Call) -> Any:
        try:
            client = await self._client(call.service, site_of(call))
            response = await getattr(client, call.operation)(**call.params)
            if call.operation == "get_object":
                async with response["Body"] as body:
                    response["Body"] = await body.read()
        except (ClientError, BotoCoreError) as exc:
            # As in the sync driver: the operation decides (errors.classify).
            return exc
        except (asyncio.TimeoutError, OSError) as exc:
            # Below botocore: a connection dropped or stalled in the middle of a
            # body. The same failure as the sync driver sees, so the same policy.
            if isinstance(exc, asyncio.TimeoutError):
                return ReadTimeoutError(endpoint_url=call.describe())
            return ConnectionClosedError(endpoint_url=f"{call.describe()}: {exc}")
        except Exception as exc:
            if type(exc).__module__.split(".")[0] == "aiohttp":  # ClientPayloadError and kin
                return ConnectionClosedError(endpoint_url=f"{call.describe()}: {type(exc).__name__}: {exc}")
            raise
        return confirm(call, response)  # as the sync driver does (``_transport/answers``)

    async def _client(self, service: str, site: str = PRIMARY) -> Any:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            for dead in [lp for lp in self._loops if lp.is_closed()]:
                del self._loops[dead]  # a loop closed without shutdown_asyncgens: nothing to await on
            state = self._loops[loop] = _LoopClients()
            # Forgotten at shutdown only if still this loop's (aclose() may have made way for another).
            await state.watch_shutdown(lambda: self._loops.get(loop) is state and self._loops.pop(loop))
        key = client_key(service, site)
        client = state.clients.get(key)
        if client is None:
            async with state.lock:
                client = state.clients.get(key)
                if client is None:
                    client = state.clients[key] = prepare(await state.stack.enter_async_context(self._make_client(service, site)))
        return client

    async def aclose(self) -> None:
        """Close the clients of the running loop (others belong to loops we cannot await on)."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.close()


class _LoopClients:
    """One event loop's clients, closed when the loop shuts down.

    ``asyncio.run`` (an async Lambda handler's loop, one per invocation) ends with
    ``loop.shutdown_asyncgens()``, which closes every async generator still open in
    the loop, inside it. A generator parked at its first ``yield`` is that hook: its
    ``finally`` closes the clients (their aiohttp sessions) while the loop can still
    await, so a user who never calls ``aclose()`` gets no "Unclosed client session".
    """

    def __init__(self) -> None:
        self.stack = AsyncExitStack()
        self.clients: dict[str, Any] = {}
        self.lock = asyncio.Lock()
        self._watch: AsyncGenerator[None, None] | None = None

    async def watch_shutdown(self, forget: Callable[[], object]) -> None:
        async def watch() -> AsyncGenerator[None, None]:
            try:
                yield
            finally:
                forget()
                await self.stack.aclose()

        # The first __anext__ registers the generator with the running loop (its
        # asyncgen hooks); the loop holds it weakly, this object strongly.
        self._watch = watch()
        await self._watch.__anext__()

    async def close(self) -> None:
        if self._watch is not None:
            await self._watch.aclose()  # runs its finally: the clients close
        else:
            await self.stack.aclose()
