"""A TCP gate in front of the counting proxy: the failover drill's "primary region".

Up, it pipes each connection to the proxy (which delays, forwards and counts
the requests as usual). ``down()`` closes every open connection and from then
on accepts each new one and resets it at once (a region that does not answer):
each is one attempt of the client's (a retry opens a new connection), counted
in ``refused``. Only 127.0.0.1.
"""

from __future__ import annotations

import socket
import struct
import threading


class Gate:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.up = True
        self.refused = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(128)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.getsockname()[1]}"

    def down(self) -> None:
        with self._lock:
            self.up = False
            conns, self._open = list(self._open), set()
        for c in conns:
            _reset(c)

    def restore(self) -> None:
        with self._lock:
            self.up = True

    def close(self) -> None:
        self._closed = True
        self.down()
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                up = self.up
                if not up:
                    self.refused += 1
            if not up:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30)
            except OSError:
                _reset(client)
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with self._lock:
                    self._open.discard(s)
                _close(s)


def _reset(s: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0): the client sees the connection drop."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(s)


def _close(s: socket.socket) -> None:
    """Shut down (which wakes a pipe thread blocked in recv on it) and close, whatever state it is in."""
    for step in (lambda: s.shutdown(socket.SHUT_RDWR), s.close):
        try:
            step()
        except OSError:
            pass
