"""Run moto's ThreadedMotoServer on 127.0.0.1 in its own process.

Prints the port on stdout, then serves until stdin closes (the parent exits or
closes the pipe), so a crashed benchmark never leaves a server behind.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    import logging
    import socket

    # The test session's fixes to moto (atomic conditional writes, DynamoDB requests
    # serialised, TransactWriteItems without a whole-table copy): the saver's commits
    # are transactions, and moto's own copy loses writes and breaks under concurrency.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from moto_fixes import atomic_conditional_writes

    atomic_conditional_writes()
    fast_attribute_values()

    from moto.moto_server import werkzeug_app
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    handler = werkzeug_app.MotoRequestHandler
    original_setup = handler.setup

    def setup(self: object) -> None:
        original_setup(self)
        # Small header and body writes would otherwise wait on delayed ACKs.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[attr-defined]

    handler.setup = setup  # type: ignore[method-assign]
    handler.log_request = lambda *a, **k: None  # type: ignore[method-assign]

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    sys.stdin.read()
    server.stop()


def _wire(value: dict) -> dict:
    """One DynamoDB attribute value as moto's serializer writes it, from the ``{type: value}``
    dict moto hands it (binary as raw bytes, numbers as strings)."""
    import base64

    ((kind, v),) = value.items()
    if kind == "B":
        return {"B": base64.b64encode(v).decode()}
    if kind == "BS":
        return {"BS": [base64.b64encode(b).decode() for b in v]}
    if kind == "L":
        return {"L": [_wire(x) for x in v]}
    if kind == "M":
        return {"M": {k: _wire(x) for k, x in v.items()}}
    if kind in ("S", "N"):
        return {kind: str(v)}
    if kind in ("SS", "NS"):
        return {kind: [str(x) for x in v]}
    if kind in ("BOOL", "NULL"):
        return {kind: v}
    raise ValueError(kind)


def fast_attribute_values() -> None:
    """moto's generic response serializer walks every DynamoDB attribute value through the
    service model, several hundred microseconds per number: a Scan page of items holding a
    256-number embedding (DynamoDBStore's vectors) took 8 s, and the proxy's side read of
    each page as much again (benchmarks/memory_store.py). This writes an ``AttributeValue``
    straight to the same JSON (the result is byte for byte the serializer's; moto falls
    back to it for anything else). Only the benchmark's moto: the tests keep moto as is."""
    from moto.core.serialize import BaseJSONSerializer

    if getattr(BaseJSONSerializer, "_s3_saver_fast", False):
        return
    original = BaseJSONSerializer._serialize_type_structure

    def serialize(self, serialized, value, shape, key):  # type: ignore[no-untyped-def]
        if key and shape.name == "AttributeValue" and isinstance(value, dict) and len(value) == 1:
            try:
                wire = _wire(value)
            except (ValueError, TypeError, AttributeError):
                wire = None
            if wire is not None:
                serialized[self.get_serialized_name(shape, key)] = wire
                return
        original(self, serialized, value, shape, key)

    BaseJSONSerializer._serialize_type_structure = serialize
    BaseJSONSerializer._s3_saver_fast = True


if __name__ == "__main__":
    main()
