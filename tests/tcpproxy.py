"""A TCP proxy that can cut the line: a database that becomes unreachable, then comes back.

Terminating a backend only drops one connection, and the next connect
succeeds at once; an outage is when connecting fails too. Between the server
and PostgreSQL, ``cut()`` closes every connection through the proxy and
refuses new ones until ``restore()``. A database that hangs is another
thing: ``pause()`` holds every byte, both ways, without closing anything
(connections open and are accepted, nothing is answered) until ``resume()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int):
        self._target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._up = True
        self.refused = 0  # connections closed at once while cut
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up:
                client.close()  # connecting fails: as a database that is down
                self.refused += 1
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    @property
    def connections(self) -> int:
        """The connections open through the proxy now."""
        with self._lock:
            return len(self._sockets) // 2

    def cut(self) -> None:
        """Close every connection and refuse new ones."""
        self._up = False
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._drop(sock)

    def restore(self) -> None:
        self._up = True

    def pause(self) -> None:
        """Hold every byte, in both directions, and close nothing: a database that hangs."""
        self._flowing.clear()

    def resume(self) -> None:
        """Let the held bytes through, in order, and every one after them."""
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self.resume()
        self.cut()
        # Closing a socket does not wake a thread blocked in its accept(); shutting it down does.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(5)
