"""Runs operations with boto3; the calls of one wave go out together on a thread pool."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
from botocore.exceptions import BotoCoreError, ClientError, ConnectionClosedError

from s3_saver._transport.answers import confirm
from s3_saver._transport.mode import ModeMark, marked
from s3_saver._transport.ownership import Ownership, owned
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

ClientFactory = Callable[[str, str], Any]  # (service, site) -> client
OwnerLookup = Callable[[str], Ownership | None]  # site -> its table's ownership check
MarkLookup = Callable[[str], ModeMark | None]  # site -> its prefix's index-mode check


def checked(op: Op[T], owners: OwnerLookup, marks: MarkLookup) -> Op[T]:
    """``op`` with the checks that ride on a site's first wave: the prefix's index
    mode (outside: judged first, so a saver of the other mode claims no table
    record either) and the table's owner."""
    return marked(owned(op, owners), marks)


class SyncDriver:
    def __init__(
        self,
        make_client: ClientFactory,
        stats: RequestStats,
        max_concurrency: int,
        policy: RetryPolicy,
        owners: OwnerLookup = lambda site: None,
        marks: MarkLookup = lambda site: None,
    ) -> None:
        self._make_client = make_client
        self._owners = owners
        self._marks = marks
        self._stats = stats
        self._policy = policy
        self._max_concurrency = max_concurrency
        self._clients: dict[str, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run(self, op: Op[T], policy: RetryPolicy | None = None) -> T:
        steps = self.iterate(op, policy)
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value

    def iterate(self, op: Op[T], policy: RetryPolicy | None = None) -> Iterator[Any]:
        """Yield the operation's Emit values; return its return value."""
        op = resilient(checked(op, self._owners, self._marks), policy or self._policy)
        reply: Any = None
        try:
            while True:
                try:
                    step = op.send(reply)
                except StopIteration as stop:
                    return stop.value
                reply = None
                if isinstance(step, Emit):
                    yield step.value
                elif isinstance(step, Sleep):
                    time.sleep(step.seconds)
                elif isinstance(step, Wait):
                    step.signal.wait(step.timeout)
                else:
                    reply = self._wave(step)
        finally:
            # An operation left behind (an exception, an abandoned iteration) is
            # closed now, not when collected: its ``finally`` blocks hand on
            # what others of this process wait for (a group commit's lead).
            op.close()

    def _wave(self, calls: tuple[Call, ...]) -> list[Any]:
        self._stats.record(calls)
        if len(calls) == 1:
            return [self._send(calls[0])]
        return list(self._executor().map(self._send, calls))

    def _send(self, call: Call) -> Any:
        try:
            client = self._client(call.service, site_of(call))
            response = getattr(client, call.operation)(**call.params)
            if call.operation == "get_object":
                # StreamingBody.read, not the raw stream its ``with`` hands out: botocore
                # wraps a connection dropped mid-body (urllib3's ProtocolError) as a
                # BotoCoreError there, so the body read is retried like the request.
                body = response["Body"]
                try:
                    response["Body"] = body.read()
                finally:
                    body.close()
        except (ClientError, BotoCoreError) as exc:
            # AWS answers and botocore failures (connection, timeout, credentials)
            # alike go back to the operation, which decides (errors.classify).
            return exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # Below botocore, should a path not wrap it: the same failure as above.
            return ConnectionClosedError(endpoint_url=f"{call.describe()}: {type(exc).__name__}: {exc}")
        # Every answer is checked before an operation reads it (an answer that
        # confirms nothing comes back as a failure: ``_transport/answers``).
        return confirm(call, response)

    def _client(self, service: str, site: str = PRIMARY) -> Any:
        key = client_key(service, site)
        client = self._clients.get(key)
        if client is None:
            with self._lock:
                client = self._clients.get(key)
                if client is None:
                    client = self._clients[key] = self._make_client(service, site)
        return client

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._max_concurrency, thread_name_prefix="s3_saver")
        return self._pool

    def close(self, keep: list[Any]) -> None:
        """Shut the pool down and close the clients made here (not those in ``keep``)."""
        with self._lock:
            pool, self._pool = self._pool, None
            clients, self._clients = list(self._clients.values()), {}
        # Outside the lock: a worker still finishing a wave may need it to create a client.
        if pool is not None:
            pool.shutdown(wait=True)
        for client in clients:
            if not any(client is k for k in keep):
                client.close()
