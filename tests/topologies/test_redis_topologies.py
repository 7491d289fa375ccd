"""The test topologies' servers (tests/support/redis_topologies.py) start on a free port even
when another process takes the port first, as parallel test workers do."""

from __future__ import annotations

import socket

import redis
from support.redis_topologies import Server, data_args


def test_a_server_whose_port_another_process_listens_on_moves_to_a_free_one() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server([*data_args()], port=port)
        try:
            # A connection to the port succeeds (the other process answers it): only the
            # server's own word says it listens.
            server.start()
            assert server.port != port
            client = redis.Redis(port=server.port, socket_timeout=5)
            assert client.ping()
            assert server.process is not None
            assert client.info("server")["process_id"] == server.process.pid
            client.close()
        finally:
            server.close()
