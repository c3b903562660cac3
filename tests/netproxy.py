"""A local TCP proxy that can play a network partition.

:class:`NetProxy` forwards ``127.0.0.1:<port>`` to an upstream server (a real PostgreSQL), a pair
of threads per connection. :meth:`NetProxy.blackhole` turns it into a partition: connections stay
open and every byte, both ways, is read and dropped; new connections are accepted and get no
answer. The peer's TCP stack still acknowledges what is sent (a proxy, a pooler or a frozen host
does that too), so TCP keepalives and ``tcp_user_timeout`` do not notice: only a bound on the wait
for the server's answer does. :meth:`NetProxy.heal` forwards again; connections that lost bytes are
closed (their protocol state is gone), new ones are forwarded.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["NetProxy"]


class NetProxy:
    """A threaded TCP proxy with a partition switch; use it as a context manager."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._partitioned = False
        self._dropped: list[socket.socket] = []  # sockets that lost bytes: closed on heal
        self._open: list[socket.socket] = []
        self._closed = False
        self.dropped_bytes = 0
        threading.Thread(target=self._accept, name="netproxy-accept", daemon=True).start()

    def blackhole(self) -> None:
        """Partition: drop every byte both ways, keep every connection open."""
        with self._lock:
            self._partitioned = True

    def heal(self) -> None:
        """End the partition: forward again; close the connections that lost bytes."""
        with self._lock:
            self._partitioned = False
            dropped, self._dropped = self._dropped, []
        for sock in dropped:
            _close(sock)

    def close(self) -> None:
        """Stop listening and close every connection."""
        with self._lock:
            self._closed = True
            socks, self._open = self._open, []
        _close(self._listener)
        for sock in socks:
            _close(sock)

    def __enter__(self) -> NetProxy:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    _close(client)
                    return
                self._open.append(client)
                partitioned = self._partitioned
            if partitioned:  # the server is unreachable: the connection never gets an answer
                self._drop_from(client)
                continue
            try:
                server = socket.create_connection(self._upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open.append(server)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                _close(sink)
                return
            with self._lock:  # a connection that lost bytes never forwards again
                partitioned = self._partitioned or source in self._dropped
                if partitioned:
                    self._dropped += [source, sink]
                    self.dropped_bytes += len(data)
            if partitioned:
                continue
            try:
                sink.sendall(data)
            except OSError:
                _close(source)
                return

    def _drop_from(self, sock: socket.socket) -> None:
        with self._lock:
            self._dropped.append(sock)

        def drain() -> None:
            with contextlib.suppress(OSError):
                while data := sock.recv(65536):
                    with self._lock:
                        self.dropped_bytes += len(data)

        threading.Thread(target=drain, daemon=True).start()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
