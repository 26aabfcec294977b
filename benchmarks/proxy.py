"""A latency-injecting, counting HTTP proxy in front of the moto server.

Every request a saver sends (boto3 or aiobotocore, any process) passes through
here. The proxy waits ``latency`` seconds (a stand-in for a real AWS round
trip), forwards the request to moto, and records what it was:

* service: KMS when the request's ``X-Amz-Target`` header names ``TrentService``,
  DynamoDB when it names another, else S3;
* operation: the ``X-Amz-Target`` suffix, or for S3 inferred from the method,
  the query string and headers (``costs.s3_operation``);
* payload bytes up and down, start and end times (``time.monotonic``, which is
  the same clock in every process on the machine, so a child process can say
  when each saver call started and ended and the requests are matched to it);
* DynamoDB read and write units, computed from item sizes the way DynamoDB
  bills them. When a request hides the billed size (a projection, a filter, a
  delete), the proxy asks moto directly for the full items first; that side
  request is neither counted nor delayed, and its time is taken off the
  injected latency so the caller waits the same. An update's new size is read
  the same way right after moto answers (a few ms added to that request);
* what replication would copy to a second region (``benchmarks/crossregion.py``
  prices it): an S3 write's stored object size, and each DynamoDB item a
  write changes (item writes, their units at 1 per KB, their bytes): a global
  table replays each changed item in the replica as a plain write, never a
  ``ConditionCheck``, a transaction's second unit, or a delete of nothing.

Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from benchmarks import costs

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",
}


@dataclass
class Request:
    t_start: float
    t_end: float
    service: str  # "s3" | "dynamodb"
    operation: str
    method: str
    status: int
    bytes_up: int
    bytes_down: int
    read_units: float = 0.0
    write_units: float = 0.0
    cost: float = 0.0
    # S3: the object's storage class when not the default (an archive), as the
    # request or response names it; priced by it (costs.s3_request_cost).
    storage_class: str = ""
    # Replication (benchmarks/crossregion.py): the object an S3 write stored (its
    # size; S3 replication copies it as one PUT), and the DynamoDB items a write
    # changed (a global table writes each in the replica: units at 1 per KB of
    # max(old, new) item size, bytes = the new item, or a deleted item's key).
    object_bytes: int = 0
    s3_objects_written: int = 0
    replicated_writes: int = 0
    replicated_units: float = 0.0
    replicated_bytes: int = 0
    # The region the request was signed for (SigV4 credential scope): the failover
    # drill tells the primary's requests (us-east-1) from the replica's.
    region: str = ""
    # DynamoDB items a read returned (the long conversation's "objects fetched":
    # S3 GETs + these; benchmarks/longconv.py).
    items_read: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_TOKEN = re.compile(r"[#:][A-Za-z0-9_]+")
_SCOPE = re.compile(r"Credential=[^/,]+/\d{8}/([a-z0-9-]+)/")


class _DynamoSide:
    """Uncounted, undelayed DynamoDB requests straight to moto, to learn billed sizes."""

    def __init__(self, port: int) -> None:
        self.port = port

    def call(self, operation: str, body: dict[str, Any], auth: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            data = json.dumps(body).encode()
            conn.request(
                "POST",
                "/",
                body=data,
                headers={
                    "X-Amz-Target": f"DynamoDB_20120810.{operation}",
                    "Content-Type": "application/x-amz-json-1.0",
                    "Authorization": auth,
                    "Content-Length": str(len(data)),
                },
            )
            resp = conn.getresponse()
            payload = resp.read()
            return json.loads(payload) if resp.status == 200 else {}
        finally:
            conn.close()

    def full_item_size(self, table: str, key: dict[str, Any], auth: str) -> int:
        item = self.call("GetItem", {"TableName": table, "Key": key, "ConsistentRead": True}, auth).get("Item")
        return costs.item_size(item) if item else 0

    def scanned_items_size(self, operation: str, body: dict[str, Any], auth: str) -> int:
        """Total size of the items a Query/Scan reads (before its filter and projection)."""
        side = {k: v for k, v in body.items() if k not in (
            "FilterExpression", "ProjectionExpression", "Select", "AttributesToGet",
            "QueryFilter", "ScanFilter", "ConditionalOperator", "ReturnConsumedCapacity")}
        used = set(_TOKEN.findall(side.get("KeyConditionExpression", "")))
        for field in ("ExpressionAttributeNames", "ExpressionAttributeValues"):
            if field in side:
                kept = {k: v for k, v in side[field].items() if k in used}
                if kept:
                    side[field] = kept
                else:
                    del side[field]
        result = self.call(operation, side, auth)
        return sum(costs.item_size(i) for i in result.get("Items", []))


def dynamo_capacity(
    operation: str, body: dict[str, Any], response: dict[str, Any], side: _DynamoSide, auth: str,
    pre: dict[str, Any],
) -> tuple[float, float]:
    """(read units, write units) of one DynamoDB request, as DynamoDB on-demand bills them."""
    if operation == "PutItem":
        return 0.0, costs.write_units(max(costs.item_size(body["Item"]), pre.get("old", 0)))
    if operation in ("DeleteItem", "UpdateItem"):
        new = pre.get("new", 0)
        return 0.0, costs.write_units(max(pre.get("old", 0), new))
    if operation == "BatchWriteItem":
        units = 0
        for table, reqs in body.get("RequestItems", {}).items():
            for i, r in enumerate(reqs):
                if "PutRequest" in r:
                    units += costs.write_units(costs.item_size(r["PutRequest"]["Item"]))
                else:
                    units += costs.write_units(pre.get((table, i), 0))
        return 0.0, units
    if operation == "TransactWriteItems":
        units = 0
        for i, entry in enumerate(body.get("TransactItems", [])):
            if "Put" in entry:
                units += costs.write_units(costs.item_size(entry["Put"]["Item"]))
            else:
                units += costs.write_units(max(pre.get(i, 0), pre.get(("new", i), 0)))
        return 0.0, 2 * units
    if operation == "GetItem":
        consistent = bool(body.get("ConsistentRead"))
        if "ProjectionExpression" in body or "AttributesToGet" in body:
            size = pre.get("full", 0)
        else:
            size = costs.item_size(response["Item"]) if response.get("Item") else 0
        return costs.read_units(size, consistent), 0.0
    if operation == "BatchGetItem":
        units = 0.0
        for table, spec in body.get("RequestItems", {}).items():
            consistent = bool(spec.get("ConsistentRead"))
            projected = "ProjectionExpression" in spec or "AttributesToGet" in spec
            if projected:
                sizes = pre.get(table, [])
            else:
                sizes = [costs.item_size(i) for i in response.get("Responses", {}).get(table, [])]
            # Keys not found still cost the minimum read.
            missing = max(0, len(spec.get("Keys", [])) - len(sizes))
            units += sum(costs.read_units(s, consistent) for s in sizes) + missing * costs.read_units(0, consistent)
        return units, 0.0
    if operation in ("Query", "Scan"):
        consistent = bool(body.get("ConsistentRead"))
        if "full" in pre:
            size = pre["full"]
        else:
            size = sum(costs.item_size(i) for i in response.get("Items", []))
        return costs.read_units(size, consistent), 0.0
    if operation == "TransactGetItems":
        units = sum(2 * costs.read_units(s, True) for s in pre.get("sizes", []))
        return units, 0.0
    return 0.0, 0.0


def dynamo_pre(operation: str, body: dict[str, Any], side: _DynamoSide, auth: str) -> dict[str, Any]:
    """Side reads needed before forwarding: sizes the request itself does not show."""
    pre: dict[str, Any] = {}
    if operation in ("DeleteItem", "UpdateItem"):
        pre["old"] = side.full_item_size(body["TableName"], body["Key"], auth)
    elif operation == "BatchWriteItem":
        for table, reqs in body.get("RequestItems", {}).items():
            for i, r in enumerate(reqs):
                if "DeleteRequest" in r:
                    pre[(table, i)] = side.full_item_size(table, r["DeleteRequest"]["Key"], auth)
    elif operation == "TransactWriteItems":
        for i, entry in enumerate(body.get("TransactItems", [])):
            for kind in ("Delete", "Update", "ConditionCheck"):
                if kind in entry:
                    pre[i] = side.full_item_size(entry[kind]["TableName"], entry[kind]["Key"], auth)
    elif operation == "GetItem" and ("ProjectionExpression" in body or "AttributesToGet" in body):
        pre["full"] = side.full_item_size(body["TableName"], body["Key"], auth)
    elif operation == "BatchGetItem":
        for table, spec in body.get("RequestItems", {}).items():
            if "ProjectionExpression" in spec or "AttributesToGet" in spec:
                sizes = [side.full_item_size(table, k, auth) for k in spec.get("Keys", [])]
                pre[table] = [s for s in sizes if s]
    elif operation in ("Query", "Scan") and any(
        k in body for k in ("FilterExpression", "ProjectionExpression", "Select", "AttributesToGet",
                            "QueryFilter", "ScanFilter")
    ):
        pre["full"] = side.scanned_items_size(operation, body, auth)
    elif operation == "TransactGetItems":
        pre["sizes"] = [side.full_item_size(e["Get"]["TableName"], e["Get"]["Key"], auth)
                        for e in body.get("TransactItems", [])]
    return pre


def dynamo_post(operation: str, body: dict[str, Any], side: _DynamoSide, auth: str, pre: dict[str, Any]) -> None:
    """After a successful update: the item's new size (an update bills and replicates
    max(old, new); the request shows neither). Uncounted, like ``dynamo_pre``."""
    if operation == "UpdateItem":
        pre["new"] = side.full_item_size(body["TableName"], body["Key"], auth)
    elif operation == "TransactWriteItems":
        for i, entry in enumerate(body.get("TransactItems", [])):
            if "Update" in entry:
                pre[("new", i)] = side.full_item_size(entry["Update"]["TableName"], entry["Update"]["Key"], auth)


def dynamo_replicated(operation: str, body: dict[str, Any], pre: dict[str, Any]) -> tuple[int, float, int]:
    """(item writes, write units, bytes) a global table replays in each replica for one
    successful request: every item it changed, as a plain (non-transactional) write of
    1 unit per KB of max(old, new) size; bytes are the new item (a delete: its key).
    A ``ConditionCheck`` changes nothing and a delete of a missing item changes nothing
    (DynamoDB Streams, which global tables replicate from, records neither)."""
    writes: list[tuple[int, int]] = []  # (billed size, bytes sent)

    def put(item: dict[str, Any], old: int = 0) -> None:
        size = costs.item_size(item)
        writes.append((max(size, old), size))

    def delete(key: dict[str, Any], old: int) -> None:
        if old:
            writes.append((old, costs.item_size(key)))

    def update(old: int, new: int) -> None:
        if new or old:
            writes.append((max(old, new), new) if new else (old, 0))

    if operation == "PutItem":
        put(body["Item"], pre.get("old", 0))
    elif operation == "DeleteItem":
        delete(body["Key"], pre.get("old", 0))
    elif operation == "UpdateItem":
        update(pre.get("old", 0), pre.get("new", 0))
    elif operation == "BatchWriteItem":
        for table, reqs in body.get("RequestItems", {}).items():
            for i, r in enumerate(reqs):
                if "PutRequest" in r:
                    put(r["PutRequest"]["Item"])
                elif "DeleteRequest" in r:
                    delete(r["DeleteRequest"]["Key"], pre.get((table, i), 0))
    elif operation == "TransactWriteItems":
        for i, entry in enumerate(body.get("TransactItems", [])):
            if "Put" in entry:
                put(entry["Put"]["Item"])
            elif "Delete" in entry:
                delete(entry["Delete"]["Key"], pre.get(i, 0))
            elif "Update" in entry:
                update(pre.get(i, 0), pre.get(("new", i), 0))
    return len(writes), float(sum(costs.write_units(b) for b, _ in writes)), sum(n for _, n in writes)


def dynamo_items_read(operation: str, response: dict[str, Any]) -> int:
    """Items a DynamoDB read handed back (a Query's or Scan's before its filter)."""
    if operation == "GetItem":
        return 1 if response.get("Item") else 0
    if operation in ("Query", "Scan"):
        return max(len(response.get("Items", [])), int(response.get("ScannedCount", 0)))
    if operation == "BatchGetItem":
        return sum(len(items) for items in response.get("Responses", {}).values())
    if operation == "TransactGetItems":
        return sum(1 for r in response.get("Responses", []) if r.get("Item"))
    return 0


# S3 writes that store an object (S3 replication copies each as one PUT in the replica).
S3_OBJECT_WRITES = frozenset({"PutObject", "CopyObject", "CompleteMultipartUpload", "PostObject"})


class LatencyProxy:
    """Threaded proxy on 127.0.0.1; ``records`` lists every request it forwarded."""

    def __init__(self, upstream_port: int, latency: float = 0.015) -> None:
        self.upstream_port = upstream_port
        self.latency = latency
        self.records: list[Request] = []
        self._lock = threading.Lock()
        # Path -> (storage class, size) of every object written with a class header:
        # a RestoreObject names neither, and is priced by both.
        self._classes: dict[str, tuple[str, int]] = {}
        self._side = _DynamoSide(upstream_port)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LatencyProxy:
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
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            break
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(chunks)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                t_start = time.monotonic()
                body = self._read_body()
                headers = {k: v for k, v in self.headers.items()}
                target = self.headers.get("X-Amz-Target")
                url = urlsplit(self.path)
                kms = bool(target) and target.startswith("TrentService.")
                service = "kms" if kms else "dynamodb" if target else "s3"
                pre: dict[str, Any] = {}
                req_json: dict[str, Any] = {}
                if kms:
                    operation = target.rsplit(".", 1)[-1]
                elif target:
                    operation = target.rsplit(".", 1)[-1]
                    try:
                        req_json = json.loads(body or b"{}")
                        pre = dynamo_pre(operation, req_json, proxy._side, self.headers.get("Authorization", ""))
                    except Exception:  # accounting must never break the request
                        pre = {}
                else:
                    operation = costs.s3_operation(self.command, url.path, url.query, headers)
                remaining = proxy.latency - (time.monotonic() - t_start)
                if remaining > 0:
                    time.sleep(remaining)
                status, reason, resp_headers, data = self._forward(body)
                read_u = write_u = 0.0
                replicated = (0, 0.0, 0)
                items = 0
                if target and not kms and status == 200:
                    try:
                        dynamo_post(operation, req_json, proxy._side, self.headers.get("Authorization", ""), pre)
                        resp_json = json.loads(data or b"{}")
                        read_u, write_u = dynamo_capacity(
                            operation, req_json, resp_json, proxy._side, "", pre)
                        replicated = dynamo_replicated(operation, req_json, pre)
                        items = dynamo_items_read(operation, resp_json)
                    except Exception:
                        pass
                object_bytes = objects_written = 0
                if not target and status == 200 and operation in S3_OBJECT_WRITES:
                    objects_written = 1
                    object_bytes = proxy._object_size(operation, url.path, headers, body)
                # Status line, headers and body in one send: separate small
                # writes would meet Nagle + delayed ACK (a 40 ms stall each).
                lines = [f"HTTP/1.1 {status} {reason}"]
                for k, v in resp_headers:
                    if k.lower() not in HOP_BY_HOP:
                        lines.append(f"{k}: {v}")
                if self.command == "HEAD":
                    cl = next((v for k, v in resp_headers if k.lower() == "content-length"), None)
                    if cl is not None:
                        lines.append(f"Content-Length: {cl}")
                elif status not in (204, 304):
                    lines.append(f"Content-Length: {len(data)}")
                if self.close_connection:
                    lines.append("Connection: close")
                head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
                has_body = self.command != "HEAD" and status not in (204, 304)
                # Stamped before sending: once the bytes are out the caller may
                # return (and record its call's end) before this thread runs again.
                t_end = time.monotonic()
                self.wfile.write(head + data if has_body else head)
                self.wfile.flush()
                storage_class = ""
                if service == "s3":
                    storage_class, retrieved, tier = proxy._s3_class(self.command, operation, url.path, headers,
                                                                     resp_headers, body, len(data), status)
                    cost = costs.s3_request_cost(self.command, operation, storage_class, retrieved, tier)
                elif kms:
                    cost = costs.KMS_PER_REQUEST
                else:
                    cost = costs.ddb_cost(read_u, write_u)
                rec = Request(t_start, t_end, service, operation, self.command, status, len(body), len(data),
                              read_u, write_u, cost, storage_class, object_bytes, objects_written, *replicated,
                              region=next(iter(_SCOPE.findall(self.headers.get("Authorization", ""))), ""),
                              items_read=items)
                with proxy._lock:
                    proxy.records.append(rec)

            def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=300)
                try:
                    conn.connect()
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        if k.lower() not in HOP_BY_HOP:
                            conn.putheader(k, v)
                    if body or self.command in ("PUT", "POST"):
                        conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body or None)
                    resp = conn.getresponse()
                    data = resp.read()
                    return resp.status, resp.reason, resp.getheaders(), data
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def _s3_class(self, method: str, operation: str, path: str, headers: dict[str, str],
                  resp_headers: list[tuple[str, str]], body: bytes, down: int,
                  status: int) -> tuple[str, int, str]:
        """(storage class, bytes retrieved, restore tier) of an S3 request; class "" =
        the default, S3 Standard (every live object of the workload)."""
        sent = next((v for k, v in headers.items() if k.lower() == "x-amz-storage-class"), "")
        if sent and operation == "PutObject" and status == 200:
            with self._lock:
                self._classes[path] = (sent, len(body))
        if sent:
            return sent, 0, ""
        if operation == "RestoreObject":
            cls, size = self._classes.get(path, ("", 0))
            tier = re.search(rb"<Tier>(\w+)</Tier>", body)
            return cls, size, tier.group(1).decode() if tier else "Standard"
        got = next((v for k, v in resp_headers if k.lower() == "x-amz-storage-class"), "")
        return got, down if method == "GET" else 0, ""

    def _object_size(self, operation: str, path: str, headers: dict[str, str], body: bytes) -> int:
        """Size of the object a successful S3 write stored: a PutObject's body (its
        decoded length when sent aws-chunked), else asked of moto (uncounted HEAD)."""
        h = {k.lower(): v for k, v in headers.items()}
        if operation == "PutObject":
            return int(h.get("x-amz-decoded-content-length") or len(body))
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        try:
            conn.request("HEAD", path.split("?", 1)[0])
            resp = conn.getresponse()
            resp.read()
            return int(resp.getheader("Content-Length") or 0) if resp.status == 200 else 0
        except OSError:
            return 0
        finally:
            conn.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def take(self) -> list[Request]:
        with self._lock:
            out, self.records = self.records, []
        return out
