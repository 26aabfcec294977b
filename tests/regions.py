"""Two regions on 127.0.0.1: a switchable TCP proxy, a replication simulator, the `regions` fixture.

One moto server holds one global store, so "two regions" are two buckets (and two
DynamoDB regions: moto keeps tables per region) on the same moto, with the PRIMARY
reached through a :class:`Proxy` that a test can take down:

* :class:`Proxy` - a threaded TCP proxy in front of ``host:port``, switchable at any
  time between ``up()`` (bytes forwarded both ways), ``refuse()`` (every connection
  reset, open ones too), ``hang()`` (requests read, never answered) and
  ``fail(status)`` (every request answered with an S3-style XML or DynamoDB-style JSON
  error, keep-alive kept).
* :class:`Replicator` - S3 replication (and a DynamoDB global table) done by hand:
  ``capture()`` what changed on the source since the last capture, then ``deliver()``
  it to the target, in order, shuffled (an older version of a key may land after a
  newer one), or not at all (``drop_pending()``).
* the `regions` fixture (registered in conftest.py): both buckets (versioned), the
  proxy, direct clients for both sites, ``replicator`` / ``reverse`` and
  ``make_saver(mode, **kw)`` for an S3Saver whose primary is behind the proxy and whose
  replica is moto direct.

Import names from here (``from regions import Proxy``), not the module itself: tests
take a fixture called ``regions``.
"""

from __future__ import annotations

import http
import inspect
import itertools
import json
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

PRIMARY_BUCKET = "primary-ckpt"
PRIMARY_REGION = "us-east-1"
REPLICA_BUCKET = "replica-ckpt"
REPLICA_REGION = "eu-west-1"
TABLE_NAME = "ckpt-index"  # both sites: a global table keeps its name in every region


# --- Proxy -------------------------------------------------------------------------

UP, REFUSE, HANG, FAIL = "up", "refuse", "hang", "fail"
_MODES = (UP, REFUSE, HANG, FAIL)
_TICK = 0.02  # seconds a connection thread waits on its sockets before it looks at the mode again
_ACK_TIMEOUT = 2.0  # seconds a mode switch waits for the open connections to apply it
_MAX_HEAD = 64 * 1024

_S3_ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("ServiceUnavailable", "Service is unable to handle request."),
}


def _hostport(upstream: str) -> tuple[str, int]:
    if "//" not in upstream:
        upstream = f"http://{upstream}"
    parts = urlsplit(upstream)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _reset(sock: socket.socket | None) -> None:
    """Close ``sock`` with a RST (SO_LINGER 0): the peer sees ECONNRESET, not a clean end."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _close(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.close()
    except OSError:
        pass


@dataclass
class _Request:
    method: str
    headers: dict[str, str]
    body_start: int
    end: int | None  # None: the body is not all here yet


def _chunked_end(buf: bytes | bytearray, pos: int) -> int | None:
    """End of a chunked body starting at ``pos``, or None when incomplete."""
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0].strip() or b"0", 16)
        pos = eol + 2
        if size == 0:
            if buf[pos : pos + 2] == b"\r\n":
                return pos + 2
            end = buf.find(b"\r\n\r\n", pos)
            return end + 4 if end >= 0 else None
        pos += size + 2
        if len(buf) < pos:
            return None


def _parse_request(buf: bytearray) -> _Request | None:
    """The first HTTP request in ``buf``: None while its head is incomplete."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        if len(buf) > _MAX_HEAD:
            raise ValueError("no HTTP request head")
        return None
    lines = bytes(buf[:head_end]).decode("latin-1").split("\r\n")
    method = lines[0].split(" ", 1)[0].upper()
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body_start = head_end + 4
    if "chunked" in headers.get("transfer-encoding", "").lower():
        end = _chunked_end(buf, body_start)
    else:
        length = int(headers.get("content-length", "0") or "0")
        end = body_start + length if len(buf) >= body_start + length else None
    return _Request(method, headers, body_start, end)


def error_response(status: int, request_headers: dict[str, str], method: str, code: str | None = None) -> bytes:
    """A minimal HTTP/1.1 error answer: DynamoDB's JSON shape for a DynamoDB call
    (``X-Amz-Target`` header), S3's XML otherwise. Keep-alive: Content-Length set,
    no body for HEAD."""
    reason = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ else "Error"
    default_code, message = _S3_ERRORS.get(status, (reason.replace(" ", ""), reason))
    code = code or default_code
    if "x-amz-target" in request_headers:
        body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": message}).encode()
        extra = f"Content-Type: application/x-amz-json-1.0\r\nx-amzn-ErrorType: {code}\r\n"
    else:
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>PROXY</RequestId></Error>"
        ).encode()
        extra = "Content-Type: application/xml\r\n"
    head = (
        f"HTTP/1.1 {status} {reason}\r\n{extra}"
        f"x-amz-request-id: PROXY\r\nx-amzn-RequestId: PROXY\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    return head if method == "HEAD" else head + body


class _Conn:
    """One accepted client connection and its thread."""

    def __init__(self, proxy: Proxy, client: socket.socket, generation: int) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.generation = generation
        self.inbuf = bytearray()  # client bytes read while down, not yet answered
        self.unanswered: list[_Request] = []  # whole requests read while hung
        self.continued = False  # "100 Continue" sent for the request at the head of inbuf
        self.client_eof = False
        client.settimeout(5.0)
        self.thread = threading.Thread(target=self.run, name=f"proxy-conn-{proxy.port}", daemon=True)

    # The thread: look at the mode, apply a switch, move bytes for one tick, repeat.
    def run(self) -> None:
        proxy = self.proxy
        try:
            while True:
                with proxy._cond:
                    mode, generation, options = proxy._mode, proxy._generation, proxy._options
                    closing = proxy._closing
                if closing:
                    self.kill()
                    return
                if generation != self.generation:
                    alive = self.switch(mode, options)
                    with proxy._cond:
                        self.generation = generation
                        proxy._cond.notify_all()
                    if not alive:
                        return
                if mode == REFUSE:
                    self.kill()
                    return
                alive = self.pump_up() if mode == UP else self.pump_down(mode, options)
                if not alive:
                    return
        except Exception:
            self.kill()
        finally:
            _close(self.upstream)
            _close(self.client)
            with proxy._cond:
                proxy._conns.discard(self)
                proxy._cond.notify_all()

    def kill(self) -> None:
        _reset(self.upstream)
        self.upstream = None
        _reset(self.client)

    def switch(self, mode: str, options: dict[str, Any]) -> bool:
        """Apply a mode switch to this connection; False when it is closed by it."""
        if mode == REFUSE:
            self.kill()
            return False
        if mode == UP:
            if self.inbuf or self.unanswered:
                self.kill()  # a request was swallowed or is half read: this stream is lost
                return False
            return True
        # Down (hang or fail): whatever the upstream would still send is cut off.
        _reset(self.upstream)
        self.upstream = None
        if mode == FAIL:
            return self.answer(options)
        return True

    def pump_up(self) -> bool:
        watched = [] if self.client_eof else [self.client]
        if self.upstream is not None:
            watched.append(self.upstream)
        if not watched:
            return False
        readable, _, _ = select.select(watched, [], [], _TICK)
        if self.client in readable:
            data = self.client.recv(65536)
            if not data:
                if self.upstream is None:
                    return False
                self.client_eof = True
                self.upstream.shutdown(socket.SHUT_WR)
            else:
                if self.upstream is None:
                    try:
                        self.upstream = socket.create_connection(self.proxy.upstream, timeout=2.0)
                    except OSError:
                        self.kill()
                        return False
                    self.upstream.settimeout(5.0)
                self.upstream.sendall(data)
        if self.upstream is not None and self.upstream in readable:
            data = self.upstream.recv(65536)
            if not data:
                # The upstream ended the connection (moto answers with Connection: close).
                _close(self.upstream)
                self.upstream = None
                try:
                    self.client.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return False
            self.client.sendall(data)
        return True

    def pump_down(self, mode: str, options: dict[str, Any]) -> bool:
        readable, _, _ = select.select([self.client], [], [], _TICK)
        if not readable:
            return True
        data = self.client.recv(65536)
        if not data:
            return False
        self.inbuf += data
        while True:
            try:
                request = _parse_request(self.inbuf)
            except ValueError:
                self.kill()
                return False
            if request is None:
                return True
            if request.end is None:
                if mode == FAIL and not self.continued and request.headers.get("expect", "").lower() == "100-continue":
                    self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    self.continued = True
                return True
            del self.inbuf[: request.end]
            self.continued = False
            with self.proxy._cond:
                self.proxy.requests += 1
            self.unanswered.append(request)
            if mode == FAIL and not self.answer(options):
                return False

    def answer(self, options: dict[str, Any]) -> bool:
        """Answer every whole request read so far with the configured error."""
        while self.unanswered:
            request = self.unanswered.pop(0)
            with self.proxy._cond:
                self.proxy.answered += 1  # before the answer: a client that got it sees the count
            try:
                self.client.sendall(error_response(options["status"], request.headers, request.method, options.get("code")))
            except OSError:
                return False
        return True


class Proxy:
    """A TCP proxy on 127.0.0.1 (a free port of its own) in front of ``upstream``.

    Modes, switchable at any time from any thread; a switch returns once every open
    connection applied it (botocore keeps connections in a pool: they switch too):

    * ``up()``: bytes are forwarded both ways.
    * ``refuse()``: new connections are accepted and reset at once, open ones are reset:
      a client sees ConnectionClosedError / EndpointConnectionError at once.
    * ``hang()``: requests are read and never answered: a client hits its read timeout.
      A connection that swallowed a request is reset when the mode changes to up.
    * ``fail(status=503, code=None)``: every request is answered with ``status`` and a
      small S3 XML error (``<Error><Code>ServiceUnavailable</Code>...``; DynamoDB calls get
      DynamoDB's JSON shape), Content-Length set, the connection kept alive; requests hung
      before are answered too.

    Counters: ``connections`` (accepted), ``refused`` (reset on accept), ``requests``
    (requests read while hung or failing), ``answered`` (error answers sent).
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = _hostport(upstream)
        self._cond = threading.Condition()
        self._mode = UP
        self._options: dict[str, Any] = {}
        self._generation = 0
        self._closing = False
        self._conns: set[_Conn] = set()
        self.connections = 0
        self.refused = 0
        self.requests = 0
        self.answered = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    def up(self) -> Proxy:
        return self._switch(UP)

    def refuse(self) -> Proxy:
        return self._switch(REFUSE)

    def hang(self) -> Proxy:
        return self._switch(HANG)

    def fail(self, status: int = 503, code: str | None = None) -> Proxy:
        return self._switch(FAIL, status=status, code=code)

    def reset_counts(self) -> None:
        with self._cond:
            self.connections = self.refused = self.requests = self.answered = 0

    @property
    def open_connections(self) -> int:
        with self._cond:
            return len(self._conns)

    def _switch(self, mode: str, **options: Any) -> Proxy:
        assert mode in _MODES, mode
        with self._cond:
            self._mode = mode
            self._options = options
            self._generation += 1
            generation = self._generation
            self._cond.wait_for(
                lambda: all(c.generation >= generation for c in self._conns), timeout=_ACK_TIMEOUT
            )
        return self

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                if self._closing:
                    return
                continue
            except OSError:
                return
            with self._cond:
                if self._closing:
                    _reset(sock)
                    return
                self.connections += 1
                if self._mode == REFUSE:
                    self.refused += 1
                    _reset(sock)
                    continue
                conn = _Conn(self, sock, self._generation)
                self._conns.add(conn)
            conn.thread.start()

    def close(self) -> None:
        """Stop accepting, reset every connection; never blocks for long."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            conns = list(self._conns)
        self._thread.join(timeout=1.0)
        _close(self._listener)
        for conn in conns:
            conn.thread.join(timeout=1.0)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Proxy({self.url} -> {self.upstream[0]}:{self.upstream[1]}, {self._mode})"


# --- Replicator ----------------------------------------------------------------------

OBJECT, DELETE_OBJECT, ITEM, DELETE_ITEM = "object", "delete-object", "item", "delete-item"


@dataclass(eq=False)
class Event:
    """One change captured on the source, waiting to be applied to the target.

    ``kind``: "object" (``key``, ``body``, ``metadata``, ``storage_class``), "delete-object"
    (``key``), "item" (``item``; ``key`` is its key attributes) or "delete-item" (``key``).
    ``seq`` orders the events of one Replicator (capture order: a key's versions in the
    order they were written). ``as_tuple()`` gives the short form.
    """

    kind: str
    key: Any
    seq: int
    body: bytes | None = None
    metadata: dict[str, str] | None = None
    storage_class: str | None = None
    content_type: str | None = None
    item: dict[str, Any] | None = None
    version_id: str | None = None  # the source version (objects and delete markers)
    at: float = field(default_factory=time.monotonic)  # when captured: a table item's write time

    @property
    def ident(self) -> tuple[str, str]:
        """What the event overwrites: an object key, or a table item's key."""
        if self.kind in (OBJECT, DELETE_OBJECT):
            return ("s3", self.key)
        return ("ddb", _item_ident(self.key))

    def as_tuple(self) -> tuple:
        if self.kind == OBJECT:
            return (OBJECT, self.key, self.body, self.metadata, self.storage_class)
        if self.kind == ITEM:
            return (ITEM, self.item)
        return (self.kind, self.key)

    def __repr__(self) -> str:
        if self.kind in (OBJECT, DELETE_OBJECT):
            size = "" if self.body is None else f", {len(self.body)} B"
            return f"Event#{self.seq}({self.kind} {self.key!r}{size})"
        return f"Event#{self.seq}({self.kind} {_item_ident(self.key)})"


def _item_ident(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True)


def _moto_bucket(name: str) -> Any:
    """moto's in-process bucket object (the tests' moto runs in this process), or None."""
    try:
        from moto.s3.models import s3_backends

        partition, account_id = s3_backends.bucket_accounts[name]
        return s3_backends[account_id][partition].buckets.get(name)
    except Exception:
        return None


def _moto_version_order(bucket_name: str) -> dict[str, tuple[Any, int]] | None:
    """version id -> (write time to the microsecond, index among its key's versions).

    S3's listing gives LastModified to the second, and moto lists the versions written
    in one millisecond oldest first: the write order comes from moto's own store."""
    bucket = _moto_bucket(bucket_name)
    if bucket is None:
        return None
    for _ in range(5):
        try:
            order = {}
            for _key, versions in list(bucket.keys.iterlists()):
                for index, version in enumerate(list(versions)):
                    order[version.version_id] = (version.last_modified, index)
            return order
        except RuntimeError:  # changed while read
            continue
    return None


def _moto_body(bucket_name: str, key: str, version_id: str) -> bytes | None:
    """A version's bytes straight from moto (a GLACIER object cannot be read by GET)."""
    bucket = _moto_bucket(bucket_name)
    if bucket is None:
        return None
    for version in bucket.keys.getlist(key, []) or []:
        if version.version_id == version_id:
            return bytes(version.value)
    return None


def _error_code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


class Replicator:
    """S3 replication (and a DynamoDB global table) from a source to a target, by hand.

    Clients talk to moto directly. ``capture()`` records each new object version and
    delete marker of the source bucket (versioned) and each item of the source table that
    changed or went away since the last capture (a whole scan, items compared whole);
    ``deliver()`` applies pending events to the target with plain writes, in capture
    order, shuffled by an ``rng``, or only some of them; ``drop_pending()`` forgets them.

    A reverse replicator (``reversed()``) shares what each one wrote, so that neither
    captures the other's deliveries as new changes (S3 marks them REPLICA and does not
    send them back either). Paired, table items resolve as a global table does, last
    writer wins: an item event is not applied over a write of that item the other side
    captured later (the target's own newer write stays).
    """

    def __init__(
        self,
        *,
        source_s3: Any,
        source_bucket: str,
        target_s3: Any,
        target_bucket: str,
        source_dynamodb: Any = None,
        source_table: str | None = None,
        target_dynamodb: Any = None,
        target_table: str | None = None,
        name: str = "",
    ) -> None:
        self.source_s3, self.source_bucket = source_s3, source_bucket
        self.target_s3, self.target_bucket = target_s3, target_bucket
        self.source_dynamodb, self.source_table = source_dynamodb, source_table
        self.target_dynamodb, self.target_table = target_dynamodb, target_table
        self.name = name or f"{source_bucket}->{target_bucket}"
        self.pending: list[Event] = []
        self.delivered = 0
        self.applied: list[Event] = []  # every event applied, in application order
        self.superseded: list[Event] = []  # skipped by keep_version_order: a newer one was there
        self.dropped: list[Event] = []
        self._seq = itertools.count(1)
        self._seen_versions: set[str] = set()
        self._items: dict[str, dict[str, Any]] = {}
        self._key_names: list[str] | None = None
        self._newest: dict[tuple[str, str], int] = {}
        # Per table item: when this side captured its newest write (see _apply).
        self._item_at: dict[tuple[str, str], float] = {}
        self._lock = threading.RLock()
        self.peer: Replicator | None = None

    @classmethod
    def between(cls, source: Site, target: Site, *, tables: bool = True) -> Replicator:
        return cls(
            source_s3=source.s3,
            source_bucket=source.bucket,
            target_s3=target.s3,
            target_bucket=target.bucket,
            source_dynamodb=source.dynamodb if tables else None,
            source_table=source.table if tables else None,
            target_dynamodb=target.dynamodb if tables else None,
            target_table=target.table if tables else None,
            name=f"{source.region}->{target.region}",
        )

    def reversed(self) -> Replicator:
        """The other direction (target -> source), paired with this one."""
        other = Replicator(
            source_s3=self.target_s3,
            source_bucket=self.target_bucket,
            target_s3=self.source_s3,
            target_bucket=self.source_bucket,
            source_dynamodb=self.target_dynamodb,
            source_table=self.target_table,
            target_dynamodb=self.source_dynamodb,
            target_table=self.source_table,
            name="->".join(reversed(self.name.split("->"))),
        )
        self.peer, other.peer = other, self
        return other

    # -- capture ---------------------------------------------------------------------
    def capture(self, prefix: str | None = None, *, objects: bool = True, items: bool = True) -> list[Event]:
        """Record every change of the source since the last capture; returns the new events.

        ``prefix``: only the objects under it (a write's own key: what one call
        changed, without listing the whole bucket); ``objects``/``items``: which
        of the bucket and the table to look at."""
        with self._lock:
            events = (self._capture_objects(prefix) if objects else []) + (self._capture_items() if items else [])
            self.pending.extend(events)
            return events

    def _capture_objects(self, prefix: str | None = None) -> list[Event]:
        found = []  # (kind, key, version id, storage class, listing position)
        try:
            where = {"Bucket": self.source_bucket} if prefix is None else {"Bucket": self.source_bucket, "Prefix": prefix}
            pages = self.source_s3.get_paginator("list_object_versions").paginate(**where)
            for page in pages:
                for v in page.get("Versions", ()):
                    found.append((OBJECT, v["Key"], v["VersionId"], v.get("StorageClass"), v["LastModified"]))
                for v in page.get("DeleteMarkers", ()):
                    found.append((DELETE_OBJECT, v["Key"], v["VersionId"], None, v["LastModified"]))
        except Exception as exc:
            if _error_code(exc) == "NoSuchBucket":
                return []
            raise
        new = [f for f in found if f[2] not in self._seen_versions]
        if not new:
            return []
        order = _moto_version_order(self.source_bucket)
        if order is not None and all(f[2] in order for f in new):
            new.sort(key=lambda f: order[f[2]])
        else:
            # The listing alone: seconds, and newest first within a key.
            position = {id(f): i for i, f in enumerate(found)}
            new.sort(key=lambda f: (f[4], -position[id(f)]))
        events = []
        for kind, key, version_id, storage_class, _ in new:
            self._seen_versions.add(version_id)
            if kind == DELETE_OBJECT:
                events.append(Event(DELETE_OBJECT, key, next(self._seq), version_id=version_id))
                continue
            metadata: dict[str, str] = {}
            content_type = None
            try:
                got = self.source_s3.get_object(Bucket=self.source_bucket, Key=key, VersionId=version_id)
                body = got["Body"].read()
                metadata = got.get("Metadata", {})
                content_type = got.get("ContentType")
            except Exception as exc:
                code = _error_code(exc)
                if code in ("NoSuchVersion", "NoSuchKey"):
                    continue  # deleted for good in the meantime: nothing to replicate
                if code != "InvalidObjectState":
                    raise
                body = _moto_body(self.source_bucket, key, version_id)  # GLACIER: not readable by GET
                if body is None:
                    raise
                head = self.source_s3.head_object(Bucket=self.source_bucket, Key=key, VersionId=version_id)
                metadata = head.get("Metadata", {})
                content_type = head.get("ContentType")
            events.append(
                Event(
                    OBJECT,
                    key,
                    next(self._seq),
                    body=body,
                    metadata=metadata,
                    storage_class=storage_class,
                    content_type=content_type,
                    version_id=version_id,
                )
            )
        return events

    def _table_key_names(self) -> list[str]:
        if self._key_names is None:
            table = self.source_dynamodb.describe_table(TableName=self.source_table)["Table"]
            self._key_names = [k["AttributeName"] for k in table["KeySchema"]]
        return self._key_names

    def _scan(self) -> dict[str, dict[str, Any]] | None:
        """The source table's items by key; None when it does not exist."""
        try:
            names = self._table_key_names()
            items: dict[str, dict[str, Any]] = {}
            pages = self.source_dynamodb.get_paginator("scan").paginate(TableName=self.source_table, ConsistentRead=True)
            for page in pages:
                for item in page.get("Items", ()):
                    items[_item_ident({n: item[n] for n in names})] = item
            return items
        except Exception as exc:
            if _error_code(exc) == "ResourceNotFoundException":
                self._key_names = None
                return None
            raise

    def _capture_items(self) -> list[Event]:
        if not self.source_table or self.source_dynamodb is None:
            return []
        current = self._scan()
        if current is None:
            return []
        names = self._table_key_names()
        events = []
        for ident in sorted(current):
            item = current[ident]
            if self._items.get(ident) != item:
                events.append(Event(ITEM, {n: item[n] for n in names}, next(self._seq), item=item))
        for ident in sorted(set(self._items) - set(current)):
            events.append(Event(DELETE_ITEM, json.loads(ident), next(self._seq)))
        self._items = current
        for event in events:
            self._item_at[event.ident] = event.at
        return events

    # -- delivery --------------------------------------------------------------------
    def deliver(
        self,
        n: int | None = None,
        rng: random.Random | None = None,
        *,
        keep_version_order: bool = False,
        where: Callable[[Event], bool] | None = None,
    ) -> list[Event]:
        """Apply ``n`` pending events (all when None) to the target; returns those applied.

        Without ``rng``: the oldest ``n``, in capture order. With it: ``n`` drawn at
        random, applied in a shuffled order, so an older version of a key can land after
        a newer one (the target then holds the older). ``keep_version_order=True`` skips
        an event older than what the target already got for its key (``superseded``):
        the newest delivered version always stays. ``where`` picks the events considered
        (e.g. ``lambda e: e.kind == "item"``: the index before the objects).
        """
        with self._lock:
            chosen = [e for e in self.pending if where is None or where(e)]
            if rng is not None:
                rng.shuffle(chosen)
            if n is not None:
                chosen = chosen[:n]
            return self._apply(chosen, keep_version_order)

    def run(
        self, lag_events: int = 0, rng: random.Random | None = None, *, keep_version_order: bool = False
    ) -> list[Event]:
        """Capture, then deliver all pending events but the ``lag_events`` most recent
        (in capture order, or shuffled by ``rng``); returns those applied."""
        with self._lock:
            self.capture()
            chosen = self.pending[: max(len(self.pending) - lag_events, 0)]
            if rng is not None:
                chosen = list(chosen)
                rng.shuffle(chosen)
            return self._apply(chosen, keep_version_order)

    def sync(self) -> list[Event]:
        """Capture and deliver everything, in order: the target catches up."""
        return self.run()

    def drop_pending(self, where: Callable[[Event], bool] | None = None) -> list[Event]:
        """Forget the pending events (all, or those ``where`` picks): replication that
        never happens. Returns them."""
        with self._lock:
            dropped = [e for e in self.pending if where is None or where(e)]
            gone = {id(e) for e in dropped}
            self.pending = [e for e in self.pending if id(e) not in gone]
            self.dropped.extend(dropped)
            return dropped

    def _apply(self, events: list[Event], keep_version_order: bool) -> list[Event]:
        done = {id(e) for e in events}
        self.pending = [e for e in self.pending if id(e) not in done]
        applied = []
        for event in events:
            ident = event.ident
            if keep_version_order and self._newest.get(ident, 0) > event.seq:
                self.superseded.append(event)
                continue
            if self.peer is not None and event.kind in (ITEM, DELETE_ITEM) and self.peer._item_at.get(ident, 0) > event.at:
                # A global table resolves a conflict by last writer wins: the
                # target's own later write of the item stays.
                self.superseded.append(event)
                continue
            self._write(event)
            self._newest[ident] = max(self._newest.get(ident, 0), event.seq)
            self.delivered += 1
            self.applied.append(event)
            applied.append(event)
        return applied

    def _write(self, event: Event) -> None:
        peer = self.peer
        if event.kind == OBJECT:
            kwargs: dict[str, Any] = {
                "Bucket": self.target_bucket,
                "Key": event.key,
                "Body": event.body or b"",
                "Metadata": dict(event.metadata or {}),
            }
            if event.content_type:
                kwargs["ContentType"] = event.content_type
            if event.storage_class and event.storage_class != "STANDARD":
                kwargs["StorageClass"] = event.storage_class
            written = self.target_s3.put_object(**kwargs)
        elif event.kind == DELETE_OBJECT:
            written = self.target_s3.delete_object(Bucket=self.target_bucket, Key=event.key)
        elif event.kind == ITEM:
            self.target_dynamodb.put_item(TableName=self.target_table, Item=event.item)
            if peer is not None:
                with peer._lock:
                    peer._items[_item_ident(event.key)] = event.item
            return
        else:
            self.target_dynamodb.delete_item(TableName=self.target_table, Key=event.key)
            if peer is not None:
                with peer._lock:
                    peer._items.pop(_item_ident(event.key), None)
            return
        if peer is not None and written.get("VersionId"):
            with peer._lock:
                peer._seen_versions.add(written["VersionId"])

    def __repr__(self) -> str:
        return f"Replicator({self.name}, {len(self.pending)} pending, {self.delivered} delivered)"


# --- The `regions` fixture ------------------------------------------------------------


@dataclass
class Site:
    """One region's names and boto3 clients (straight to moto, never through the proxy)."""

    bucket: str
    region: str
    table: str
    s3: Any = field(repr=False)
    dynamodb: Any = field(repr=False)

    def keys(self, prefix: str = "") -> list[str]:
        """The bucket's current object keys."""
        paginator = self.s3.get_paginator("list_objects_v2")
        return [o["Key"] for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix) for o in page.get("Contents", ())]

    def read(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def items(self) -> list[dict[str, Any]]:
        """The table's items (low-level form); [] when there is no table."""
        try:
            pages = self.dynamodb.get_paginator("scan").paginate(TableName=self.table, ConsistentRead=True)
            return [item for page in pages for item in page.get("Items", ())]
        except Exception as exc:
            if _error_code(exc) == "ResourceNotFoundException":
                return []
            raise


def saver_client_config() -> Any:
    """The savers' botocore config here: a site that does not answer fails in about a second."""
    from botocore.config import Config

    return Config(connect_timeout=1, read_timeout=2)


def saver_retry() -> Any:
    """The savers' retry policy here: 2 attempts, short backoffs."""
    from s3_saver import RetryPolicy

    return RetryPolicy(attempts=2, base=0.05, cap=0.2, budget=3.0)


class Regions:
    """What the `regions` fixture yields (see the module docstring)."""

    def __init__(self, moto: str) -> None:
        import boto3
        from botocore.config import Config

        self.moto = moto
        self.proxy = Proxy(moto)
        self._clients: list[Any] = []
        self.savers: list[Any] = []

        def client(service: str, region: str) -> Any:
            config = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 2})
            c = boto3.client(service, endpoint_url=moto, region_name=region, config=config)
            self._clients.append(c)
            return c

        self.primary = Site(
            PRIMARY_BUCKET, PRIMARY_REGION, TABLE_NAME, client("s3", PRIMARY_REGION), client("dynamodb", PRIMARY_REGION)
        )
        self.replica = Site(
            REPLICA_BUCKET, REPLICA_REGION, TABLE_NAME, client("s3", REPLICA_REGION), client("dynamodb", REPLICA_REGION)
        )
        for site in (self.primary, self.replica):
            kwargs: dict[str, Any] = {"Bucket": site.bucket}
            if site.region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": site.region}
            site.s3.create_bucket(**kwargs)
            site.s3.put_bucket_versioning(Bucket=site.bucket, VersioningConfiguration={"Status": "Enabled"})
        self.replicator = Replicator.between(self.primary, self.replica)
        self.reverse = self.replicator.reversed()

    def make_saver(
        self,
        mode: str = "dynamodb",
        *,
        replica: bool = True,
        setup: bool = True,
        via_proxy: bool = True,
        replica_kw: dict[str, Any] | None = None,
        **kw: Any,
    ) -> Any:
        """An S3Saver on the primary (through the proxy), with the replica site as its Replica.

        ``mode``: "dynamodb" (table ``ckpt-index``) or "manifest". Keyword arguments that
        only ``Replica`` takes (failover_after, recheck_after, on_lag, global_table, and
        ``table``) go to it, with ``replica_kw``; the rest to S3Saver. Defaults:
        ``saver_client_config()`` and ``saver_retry()`` (to the Replica as well when it
        takes them). ``setup``: run ``saver.setup()`` (the primary's bucket and table)
        and zero the stats. ``replica=False``: no Replica. Savers are closed at teardown.
        """
        from s3_saver import S3Saver

        assert mode in ("dynamodb", "manifest"), mode
        kw.setdefault("client_config", saver_client_config())
        kw.setdefault("retry", saver_retry())
        if replica:
            from s3_saver import Replica

            replica_params = inspect.signature(Replica).parameters
            saver_params = inspect.signature(S3Saver).parameters
            rkw = dict(replica_kw or {})
            for name in list(kw):
                if name in replica_params and (name not in saver_params or name == "table"):
                    rkw[name] = kw.pop(name)
            for shared in ("client_config", "retry"):
                if shared in replica_params:
                    rkw.setdefault(shared, kw[shared])
            kw["replica"] = Replica(self.replica.bucket, region_name=self.replica.region, endpoint_url=self.moto, **rkw)
        saver = S3Saver(
            self.primary.bucket,
            table=self.primary.table if mode == "dynamodb" else None,
            region_name=self.primary.region,
            endpoint_url=self.proxy.url if via_proxy else self.moto,
            **kw,
        )
        self.savers.append(saver)
        if setup:
            saver.setup()
            saver.stats.reset()
            replica_stats = getattr(saver, "replica_stats", None)
            if replica_stats is not None and replica_stats is not saver.stats:
                replica_stats.reset()
        return saver

    def create_replica_table(self) -> dict[str, Any]:
        """The primary's table, same schema, in the replica region (a global table's
        replica, before replication fills it). Returns its description."""
        source = self.primary.dynamodb.describe_table(TableName=self.primary.table)["Table"]
        on_demand = source.get("BillingModeSummary", {}).get("BillingMode") == "PAY_PER_REQUEST"
        throughput = source.get("ProvisionedThroughput", {})
        capacity = {
            "ReadCapacityUnits": throughput.get("ReadCapacityUnits") or 1,
            "WriteCapacityUnits": throughput.get("WriteCapacityUnits") or 1,
        }
        params: dict[str, Any] = {
            "TableName": self.replica.table,
            "KeySchema": source["KeySchema"],
            "AttributeDefinitions": source["AttributeDefinitions"],
        }
        if on_demand:
            params["BillingMode"] = "PAY_PER_REQUEST"
        else:
            params["ProvisionedThroughput"] = capacity
        gsis = []
        for index in source.get("GlobalSecondaryIndexes", ()):
            gsi = {"IndexName": index["IndexName"], "KeySchema": index["KeySchema"], "Projection": index["Projection"]}
            if not on_demand:
                gsi["ProvisionedThroughput"] = capacity
            gsis.append(gsi)
        if gsis:
            params["GlobalSecondaryIndexes"] = gsis
        lsis = [
            {"IndexName": i["IndexName"], "KeySchema": i["KeySchema"], "Projection": i["Projection"]}
            for i in source.get("LocalSecondaryIndexes", ())
        ]
        if lsis:
            params["LocalSecondaryIndexes"] = lsis
        self.replica.dynamodb.create_table(**params)
        ttl = self.primary.dynamodb.describe_time_to_live(TableName=self.primary.table)["TimeToLiveDescription"]
        if ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING") and ttl.get("AttributeName"):
            self.replica.dynamodb.update_time_to_live(
                TableName=self.replica.table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
            )
        return self.replica.dynamodb.describe_table(TableName=self.replica.table)["Table"]

    def close(self) -> None:
        for saver in self.savers:
            try:
                saver.close()
            except Exception:
                pass
        self.proxy.close()
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass


@pytest.fixture
def regions(endpoint: str) -> Iterator[Regions]:
    """Two regions on the test's (reset) moto: see :class:`Regions`."""
    r = Regions(endpoint)
    try:
        yield r
    finally:
        r.close()
