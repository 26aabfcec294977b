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


if __name__ == "__main__":
    main()
