"""TCP proxies in front of a Redis server that misbehave on demand, to make the moments a
network fault leaves behind: a request that never arrives, one that ran on the server while
its client never hears back, or one whose answer comes after its client stopped waiting."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class ForwardingProxy:
    """Forwards ``127.0.0.1:port`` to a Redis server on ``target`` (a port of 127.0.0.1);
    a subclass decides, in :meth:`_connected`, what crosses each connection."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

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
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the server is down: its client sees the connection closed
                self._close(client)
                continue
            self._sockets += [client, server]
            self._connected(client, server)

    def _connected(self, client: socket.socket, server: socket.socket) -> None:
        raise NotImplementedError

    def _close(self, *socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a FIN now, even with a thread in recv()
            with contextlib.suppress(OSError):
                sock.close()


class HoldingProxy(ForwardingProxy):
    """After :meth:`hold_next_reply`, the next bytes the server sends to any client of the
    proxy, and all that follow on that connection, are never delivered (``holding`` is set
    then): the request ran, and its client is still waiting for the answer."""

    def __init__(self, target: int) -> None:
        self.holding = threading.Event()
        self._armed = False
        self._script_armed = False
        self._scripts_to_pass = 0
        self._stop_at: bytes | None = None
        self.stopped = threading.Event()
        self._go = threading.Event()
        self._lock = threading.Lock()
        super().__init__(target)

    def hold_next_reply(self) -> None:
        with self._lock:
            self._armed = True
            self.holding.clear()

    def hold_next_script_reply(self, after: int = 0) -> None:
        """:meth:`hold_next_reply` once the next script call (``EVALSHA``) but ``after`` is
        on its way: the replies of the calls before it are delivered."""
        with self._lock:
            self._script_armed = True
            self._scripts_to_pass = after
            self.holding.clear()

    def stop_next_call(self, marker: bytes) -> None:
        """The next request holding ``marker`` (a script's SHA1, say) waits at the proxy,
        ``stopped`` set, until :meth:`let_through`; then it runs and its reply is held back
        as after :meth:`hold_next_reply`: the test does what it must before it arrives."""
        with self._lock:
            self._stop_at = marker
            self.stopped.clear()
            self._go.clear()
            self.holding.clear()

    def let_through(self) -> None:
        self._go.set()

    def _connected(self, client: socket.socket, server: socket.socket) -> None:
        threading.Thread(target=self._up, args=(client, server), daemon=True).start()
        threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    stop = self._stop_at is not None and self._stop_at in data
                    if stop:
                        self._stop_at = None
                if stop:
                    self.stopped.set()
                    self._go.wait()
                    with self._lock:  # before sending: the reply may come back at once
                        self._armed = True
                elif b"EVALSHA" in data:
                    with self._lock:  # before sending: the reply may come back at once
                        if self._script_armed and self._scripts_to_pass:
                            self._scripts_to_pass -= 1
                        elif self._script_armed:
                            self._armed, self._script_armed = True, False
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


class CuttingProxy(ForwardingProxy):
    """``arm(mode)``: the next script call is dropped ("request") or forwarded with its reply
    dropped ("reply"), and the connection cut (``cut`` is set)."""

    def __init__(self, target: int) -> None:
        self.mode: str | None = None
        self.cut = threading.Event()
        super().__init__(target)

    def arm(self, mode: str) -> None:
        self.cut.clear()
        self.mode = mode

    def _connected(self, client: socket.socket, server: socket.socket) -> None:
        threading.Thread(target=self._up, args=(client, server), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        waiting_reply = threading.Event()
        threading.Thread(
            target=self._down, args=(server, client, waiting_reply), daemon=True
        ).start()
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                mode = None
                if b"EVALSHA" in data:  # only the script call is cut
                    mode, self.mode = self.mode, None
                if mode == "request":
                    break
                if mode == "reply":
                    waiting_reply.set()  # before sending: the reply may come back at once
                server.sendall(data)
        self._close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, drop: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if drop.is_set():
                    break
                client.sendall(data)
        self._close(client, server)

    def _close(self, *socks: socket.socket) -> None:
        super()._close(*socks)
        self.cut.set()


class OutageProxy(ForwardingProxy):
    """Forwards until told otherwise. :meth:`down` cuts every connection and refuses new ones
    until :meth:`up`: the server is unreachable for a moment. After :meth:`lose_next_reply`
    the next reply the server sends to any client is never delivered (``lost`` is set then)
    and the proxy goes down at that very moment, except that the connection waiting for the
    lost reply stays open and silent: its request ran, its client runs into its socket
    timeout, and nothing it does next reaches the server until :meth:`up`."""

    def __init__(self, target: int) -> None:
        self.lost = threading.Event()
        self.is_down = threading.Event()
        self._armed = False
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        super().__init__(target)

    def lose_next_reply(self) -> None:
        with self._lock:
            self._armed = True
            self.lost.clear()

    def down(self, keep: tuple[socket.socket, socket.socket] | None = None) -> None:
        self.is_down.set()
        with self._lock:
            pairs = [pair for pair in self._pairs if pair is not keep]
            self._pairs = [pair for pair in self._pairs if pair is keep]
        for pair in pairs:
            self._close(*pair)

    def up(self) -> None:
        self.is_down.clear()

    def _connected(self, client: socket.socket, server: socket.socket) -> None:
        if self.is_down.is_set():
            self._close(client, server)
            return
        pair = (client, server)
        with self._lock:
            self._pairs.append(pair)
        threading.Thread(target=self._up, args=pair, daemon=True).start()
        threading.Thread(target=self._down, args=(pair,), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                server.sendall(data)
        self._close(client, server)

    def _down(self, pair: tuple[socket.socket, socket.socket]) -> None:
        client, server = pair
        held = False
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if not held:
                    with self._lock:
                        held, self._armed = self._armed, False
                    if held:
                        self.down(keep=pair)
                        self.lost.set()
                if not held:
                    client.sendall(data)
        self._close(client, server)


class DelayingProxy(ForwardingProxy):
    """After :meth:`delay_next_script`, the next script call (``EVALSHA``/``EVAL``) through
    the proxy runs on the server at once, but its connection's replies are held back
    ``seconds`` (past the client's socket timeout, its client has given up by then and
    closed the connection). ``delayed`` counts the replies held back so far."""

    def __init__(self, target: int) -> None:
        self.delayed = 0
        self._seconds: float | None = None
        self._lock = threading.Lock()
        super().__init__(target)

    def delay_next_script(self, seconds: float) -> None:
        with self._lock:
            self._seconds = seconds

    def _connected(self, client: socket.socket, server: socket.socket) -> None:
        hold: list[float] = []  # seconds this connection's next reply is held back
        threading.Thread(target=self._up, args=(client, server, hold), daemon=True).start()
        threading.Thread(target=self._down, args=(server, client, hold), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, hold: list[float]) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if b"EVAL" in data:
                    with self._lock:
                        seconds, self._seconds = self._seconds, None
                    if seconds is not None:
                        hold.append(seconds)  # before sending: the reply may come at once
                server.sendall(data)
        self._close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, hold: list[float]) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if hold:
                    seconds = hold.pop()
                    with self._lock:
                        self.delayed += 1
                    time.sleep(seconds)  # the fault itself: the reply is late
                client.sendall(data)
        self._close(client, server)
