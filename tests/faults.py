"""A loopback fault-injection proxy between a saver and its store (moto or SeaweedFS).

Every request is forwarded to the upstream as it came (a signed request passes
unchanged: the upstream checks the ``Host`` header the client signed, which names
the proxy; moto and SeaweedFS accept it). Per request, a seeded ``random.Random``
decides whether to inject a fault and which one:

* ``s3_500`` / ``s3_503``: S3 ``500 InternalError`` / ``503 SlowDown`` with S3's XML
  error body, nothing forwarded;
* ``ddb_throttle`` / ``ddb_provisioned`` / ``ddb_500``: DynamoDB ``400
  ThrottlingException`` / ``400 ProvisionedThroughputExceededException`` / ``500
  InternalServerError`` with DynamoDB's JSON body and ``x-amzn-ErrorType`` header,
  nothing forwarded;
* ``ddb_tx_conflict`` (not in ``ALL_KINDS``: ask for it): a ``TransactWriteItems``
  answered ``400 TransactionCanceledException``, its first action's reason
  ``TransactionConflict`` (another transaction, or a write, on its item), nothing forwarded;
* ``reset_before``: the client's connection is reset (RST), nothing forwarded;
* ``reset_after``: forwarded, the upstream applies it, then the client's connection
  is reset without an answer;
* ``hold``: forwarded, then the answer waits ``hold_seconds`` (past the client's
  read timeout) before it is sent;
* ``reset_mid_body`` (not in ``ALL_KINDS``: ask for it): forwarded, then the answer's
  head (with the full ``Content-Length``) and half of its body are sent and the
  connection is reset: a connection dropped while a GetObject body is read.
* ``GARBAGE_KINDS`` (not in ``ALL_KINDS``: ask for them): a ``200`` whose body the
  saver cannot read, what a captive portal, a corporate proxy or a half-compatible
  store may send. ``ok_html``: a sign-in page (well-formed XHTML, so that botocore's
  own "200 with an XML error" check lets it through), nothing forwarded; ``ok_empty``:
  no header, no body, nothing forwarded; ``ok_truncated``: forwarded (the upstream
  applies it), then its answer is sent with every header but half of its body (with
  a ``Content-Length`` that says so): a store's answer cut by a proxy; ``ok_replaced``:
  forwarded, then its answer's body is replaced by the sign-in page, its headers kept
  (``ETag`` included) but for the checksums of the body: an object that does not decode.

Knobs (attributes, changeable at run time): ``enabled``, ``rate``, ``kinds``,
``window`` (seconds: faults stop this long after the first one, e.g. a store that
throttles every write for 3 s),
``operations`` (a predicate on :class:`Req`, e.g. :func:`writes_only`, or
:func:`calls` for the requests of some boto3 methods: ``calls("put_object")``),
``max_faults`` (a cap, so that a 100 % rate ends), ``first_attempt_only`` (fault a
call's first attempt only, read from the SDK's ``amz-sdk-request`` header, so that
"every write is reset once after it was applied" can be asked for). A fault kind that does not apply
to a request's service (an S3 error on a DynamoDB call) is never drawn for it.
``pause_when`` (a predicate) makes the proxy forward the matching request, then
(if the upstream applied it: a 2xx answer) hold its answer, set ``paused`` and wait for ``release`` (used to kill a writer
between its object write and its commit). Counters: ``requests``, ``faults``
(by kind), ``ops`` (by operation), ``per_request`` (faults by request identity:
how many times one call was refused, its retries included).

Only 127.0.0.1 is contacted. Randomness is drawn under a lock in request order,
so a run is reproducible as far as the client's request order is.
"""

from __future__ import annotations

import http.client
import json
import random
import hashlib
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

S3_KINDS = ("s3_500", "s3_503")
DDB_KINDS = ("ddb_throttle", "ddb_provisioned", "ddb_500")
NET_KINDS = ("reset_before", "reset_after", "hold")
ALL_KINDS = S3_KINDS + DDB_KINDS + NET_KINDS
BODY_KINDS = ("reset_mid_body",)
TX_KINDS = ("ddb_tx_conflict",)
GARBAGE_KINDS = ("ok_html", "ok_empty", "ok_truncated", "ok_replaced")
CAPTIVE_PORTAL = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml">'
    b"<head><title>Sign in to the network</title></head>"
    b'<body><form action="/login"><p>Accept the terms to continue.</p></form></body></html>'
)

_DDB_ERRORS = {
    "ddb_throttle": (400, "ThrottlingException", "Rate of requests exceeds the allowed throughput."),
    "ddb_provisioned": (
        400,
        "ProvisionedThroughputExceededException",
        "The level of configured provisioned throughput for the table was exceeded.",
    ),
    "ddb_500": (500, "InternalServerError", "Internal server error"),
}
_DDB_PREFIX = "com.amazonaws.dynamodb.v20120810#"
_S3_ERRORS = {
    "s3_500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    "s3_503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}
_DDB_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "expect", "content-length",
}


@dataclass(frozen=True)
class Req:
    """What the proxy knows of a request when it decides."""

    service: str  # "s3" | "dynamodb"
    operation: str  # DynamoDB: the X-Amz-Target suffix; S3: the method ("PUT", "GET", ...)
    method: str
    path: str
    attempt: int = 1  # from the SDK's amz-sdk-request header ("attempt=N; max=M"); 1 when absent
    # The request's identity (method, path, body): the saver's own retries are new SDK
    # calls (attempt=1 again) carrying the same request.
    digest: str = ""
    # The boto3 method that sent it (``put_object``, ``transact_write_items``).
    call: str = ""

    @property
    def is_write(self) -> bool:
        if self.service == "dynamodb":
            return self.operation in _DDB_WRITES
        return self.method in ("PUT", "POST", "DELETE")

    @property
    def is_object_put(self) -> bool:
        """A PUT of a checkpoint/blob/writes object (under ``live/``), not an index write."""
        return self.service == "s3" and self.method == "PUT" and "/live/" in self.path

    @property
    def is_commit(self) -> bool:
        """An index write: a DynamoDB write, or a PUT of a manifest head/segment."""
        if self.service == "dynamodb":
            return self.operation in _DDB_WRITES
        return self.method == "PUT" and "/manifests/" in self.path


def calls(*names: str) -> Callable[[Req], bool]:
    """A predicate for ``operations``: the requests of these boto3 methods."""
    wanted = frozenset(names)
    return lambda req: req.call in wanted


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def s3_call(method: str, path: str, query: str, headers: Any) -> str:
    """The boto3 method of an S3 request (path-style addressing: ``/bucket[/key]``)."""
    params = {part.split("=", 1)[0] for part in query.split("&") if part}
    on_object = "/" in path.strip("/")
    if method == "GET":
        if on_object:
            return "get_object"
        for sub, name in (("list-type", "list_objects_v2"), ("versions", "list_object_versions"),
                          ("versioning", "get_bucket_versioning"),
                          ("lifecycle", "get_bucket_lifecycle_configuration")):
            if sub in params:
                return name
        return "list_objects"
    if method == "HEAD":
        return "head_object" if on_object else "head_bucket"
    if method == "POST":
        return "delete_objects" if "delete" in params else "restore_object" if "restore" in params else "post"
    if method == "DELETE":
        return "delete_object" if on_object else "delete_bucket"
    if method == "PUT":
        if on_object:
            return "copy_object" if headers.get("x-amz-copy-source") else "put_object"
        for sub in ("versioning", "lifecycle", "policy", "tagging"):
            if sub in params:
                return {"lifecycle": "put_bucket_lifecycle_configuration"}.get(sub, f"put_bucket_{sub}")
        return "create_bucket"
    return method.lower()


def writes_only(req: Req) -> bool:
    return req.is_write


def object_puts_and_commits(req: Req) -> bool:
    """PUT of objects and every index write (PutItem, manifest CAS): all the saver's writes."""
    return req.is_object_put or req.is_commit


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        *,
        seed: int = 0,
        rate: float = 0.0,
        kinds: Iterable[str] = (),
        operations: Callable[[Req], bool] | None = None,
        max_faults: int | None = None,
        hold_seconds: float = 1.6,
    ) -> None:
        parts = urlsplit(upstream)
        assert parts.hostname in ("127.0.0.1", "localhost"), "loopback only"
        self.upstream_port = parts.port
        self.rng = random.Random(seed)
        self.enabled = True
        self.rate = rate
        self.kinds = tuple(kinds)
        self.operations = operations
        self.max_faults = max_faults
        self.first_attempt_only = False  # fault only a request's first attempt, never its retries
        self.window: float | None = None
        self._window_ends: float | None = None
        self.per_request: Counter[str] = Counter()
        self._faulted: set[str] = set()
        self.hold_seconds = hold_seconds
        self.pause_when: Callable[[Req], bool] | None = None
        self.paused = threading.Event()
        self.release = threading.Event()
        self.requests = 0
        self.faults: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- configuration ---------------------------------------------------------------
    def configure(self, *, seed: int | None = None, **knobs: Any) -> FaultProxy:
        with self._lock:
            if seed is not None:
                self.rng = random.Random(seed)
            for name, value in knobs.items():
                if not hasattr(self, name):
                    raise AttributeError(name)
                setattr(self, name, tuple(value) if name == "kinds" else value)
        return self

    def reset_counts(self) -> None:
        with self._lock:
            self.requests = 0
            self.faults.clear()
            self.ops.clear()
            self.per_request.clear()
            self._window_ends = None

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- decision --------------------------------------------------------------------
    def _decide(self, req: Req) -> str | None:
        with self._lock:
            self.requests += 1
            self.ops[f"{req.service}:{req.call or req.operation}"] += 1
            if not self.enabled or self.rate <= 0 or not self.kinds:
                return None
            if self.operations is not None and not self.operations(req):
                return None
            if self.first_attempt_only and (req.attempt != 1 or req.digest in self._faulted):
                return None
            if self.max_faults is not None and self.total_faults >= self.max_faults:
                return None
            if self._window_ends is not None and time.monotonic() >= self._window_ends:
                return None
            applicable = [
                k for k in self.kinds
                if k in NET_KINDS + BODY_KINDS + GARBAGE_KINDS
                or (k in TX_KINDS and req.call == "transact_write_items")
                or (k not in TX_KINDS and (k in S3_KINDS) == (req.service == "s3"))
            ]
            if not applicable or self.rng.random() >= self.rate:
                return None
            kind = self.rng.choice(applicable)
            if self.window is not None and self._window_ends is None:
                self._window_ends = time.monotonic() + self.window
            self.faults[kind] += 1
            self.per_request[req.digest] += 1
            self._faulted.add(req.digest)
            return kind

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    for _ in range(1_000_000):
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            for _ in range(1000):
                                if self.rfile.readline() in (b"\r\n", b"\n", b""):
                                    break
                            break
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(chunks)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _reset(self) -> None:
                # SO_LINGER 0: close() sends RST, what a dropped connection looks like.
                try:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                except OSError:
                    pass
                self.close_connection = True

            def _send(
                self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes, cut: bool = False
            ) -> None:
                lines = [f"HTTP/1.1 {status} {reason}"]
                lines += [f"{k}: {v}" for k, v in headers if k.lower() not in _HOP_BY_HOP]
                if self.command == "HEAD":
                    cl = next((v for k, v in headers if k.lower() == "content-length"), None)
                    if cl is not None:
                        lines.append(f"Content-Length: {cl}")
                elif status not in (204, 304):
                    lines.append(f"Content-Length: {len(data)}")
                has_body = self.command != "HEAD" and status not in (204, 304)
                head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
                try:
                    if cut and has_body and len(data) > 1:
                        self.wfile.write(head + data[: len(data) // 2])
                        self.wfile.flush()
                        return self._reset()
                    self.wfile.write(head + data if has_body else head)
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True

            def _handle(self) -> None:
                body = self._read_body()
                target = self.headers.get("X-Amz-Target")
                path = urlsplit(self.path).path
                attempt = re.search(r"attempt=(\d+)", self.headers.get("amz-sdk-request", ""))
                n = int(attempt.group(1)) if attempt else 1
                digest = hashlib.sha256(f"{self.command} {self.path}\n".encode() + body).hexdigest()
                if target:
                    action = target.rsplit(".", 1)[-1]
                    req = Req("dynamodb", action, self.command, path, n, digest, _snake(action))
                else:
                    name = s3_call(self.command, path, urlsplit(self.path).query, self.headers)
                    req = Req("s3", self.command, self.command, path, n, digest, name)
                kind = proxy._decide(req)
                if kind == "reset_before":
                    return self._reset()
                if kind in _S3_ERRORS:
                    status, reason, code, message = _S3_ERRORS[kind]
                    data = (
                        '<?xml version="1.0" encoding="UTF-8"?>\n'
                        f"<Error><Code>{code}</Code><Message>{message}</Message>"
                        f"<Resource>{path}</Resource><RequestId>FAULTPROXY</RequestId></Error>"
                    ).encode()
                    return self._send(status, reason, [("Content-Type", "application/xml")], data)
                if kind in _DDB_ERRORS:
                    status, code, message = _DDB_ERRORS[kind]
                    data = json.dumps({"__type": _DDB_PREFIX + code, "message": message}).encode()
                    headers = [
                        ("Content-Type", "application/x-amz-json-1.0"),
                        ("x-amzn-ErrorType", f"{code}:"),
                        ("x-amzn-RequestId", "FAULTPROXY"),
                    ]
                    reason = "Bad Request" if status == 400 else "Internal Server Error"
                    return self._send(status, reason, headers, data)
                if kind == "ddb_tx_conflict":
                    actions = len(json.loads(body or b"{}").get("TransactItems") or [None])
                    reasons = [{"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}]
                    reasons += [{"Code": "None"}] * (actions - 1)
                    message = "Transaction cancelled, please refer cancellation reasons for specific reasons"
                    data = json.dumps(
                        {"__type": _DDB_PREFIX + "TransactionCanceledException", "message": message,
                         "CancellationReasons": reasons}
                    ).encode()
                    headers = [
                        ("Content-Type", "application/x-amz-json-1.0"),
                        ("x-amzn-ErrorType", "TransactionCanceledException:"),
                        ("x-amzn-RequestId", "FAULTPROXY"),
                    ]
                    return self._send(400, "Bad Request", headers, data)
                if kind == "ok_html":
                    return self._send(200, "OK", [("Content-Type", "text/html; charset=utf-8")], CAPTIVE_PORTAL)
                if kind == "ok_empty":
                    return self._send(200, "OK", [], b"")
                try:
                    status, reason, headers, data = self._forward(body)
                except OSError:
                    return self._reset()
                if kind == "reset_after":
                    return self._reset()
                if kind == "ok_truncated" and 200 <= status < 300:
                    return self._send(status, reason, headers, data[: len(data) // 2])
                if kind == "ok_replaced" and 200 <= status < 300:
                    kept = [(k, v) for k, v in headers if "checksum" not in k.lower() and k.lower() != "x-amz-crc32"]
                    return self._send(status, reason, kept, CAPTIVE_PORTAL)
                if kind == "hold":
                    proxy._stop.wait(proxy.hold_seconds)
                # Only an applied request pauses (the object is stored): moto may answer a
                # request 500 under concurrency, and the caller's retry is the one to hold.
                applied = 200 <= status < 300
                if proxy.pause_when is not None and applied and proxy.pause_when(req) and not proxy.paused.is_set():
                    proxy.paused.set()
                    proxy.release.wait(30)
                    return self._reset()
                self._send(status, reason, headers, data, cut=kind == "reset_mid_body")

            def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        if k.lower() not in _HOP_BY_HOP:
                            conn.putheader(k, v)
                    if body or self.command in ("PUT", "POST"):
                        conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body or None)
                    resp = conn.getresponse()
                    data = resp.read()
                    return resp.status, resp.reason, resp.getheaders(), data
                finally:
                    conn.close()

            def do_GET(self) -> None:
                self._handle()

            do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that went away (timeout, reset) is expected here

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
