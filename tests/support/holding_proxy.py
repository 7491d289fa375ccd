"""A TCP proxy in front of a Redis server that can keep a reply from its client: the request
has run on the server, and the client is still waiting for the answer. That is the moment a
cancelled or failed call leaves behind, made on demand."""

from __future__ import annotations

import contextlib
import socket
import threading


class HoldingProxy:
    """Forwards ``127.0.0.1:port`` to a Redis server on ``target`` (a port of 127.0.0.1).
    After :meth:`hold_next_reply`, the next bytes the server sends to any client of the proxy,
    and all that follow on that connection, are never delivered (``holding`` is set then)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.holding = threading.Event()
        self._armed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def hold_next_reply(self) -> None:
        with self._lock:
            self._armed = True
            self.holding.clear()

    def close(self) -> None:
        for sock in [self.listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self._sockets += [client, server]
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                server.sendall(data)
        self._close(client, server)

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        held = False
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if not held:
                    with self._lock:
                        held, self._armed = self._armed, False
                    if held:
                        self.holding.set()
                if not held:
                    client.sendall(data)
        self._close(client, server)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
