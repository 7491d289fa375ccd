"""Throwaway Redis topologies for the deployment tests: a 3-master Cluster, a master + replica
+ sentinel, a TLS server and an ACL server. Real ``redis-server`` processes on loopback and
free ports, killed when the fixture ends; every wait polls the servers' own state against a
deadline.

Imported by tests/test_cluster.py, tests/test_sentinel.py and tests/test_acl_tls.py, which
declare module-scoped fixtures on top of these classes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from celery_singleton_lock.embedded import free_port, redis_server_binary

T = TypeVar("T")

#: Redis Cluster has 16384 hash slots.
SLOTS = 16384


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy (errors count as falsy) or
    ``timeout`` seconds pass (then AssertionError naming ``what``)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
            if value:
                return value
            last = value
        except (redis.RedisError, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: {last!r}")
        time.sleep(interval)  # polling an external process's state, with a deadline


class Server:
    """One ``redis-server`` (or sentinel) child process with its own directory."""

    def __init__(self, args: list[str], *, port: int | None = None, config: str = "") -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="csl-topo-")
        self.args = args
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = Path(self.dir, "server.log").open("ab")  # noqa: SIM115 - handed to the child
        command = [redis_server_binary()]
        if self.config:
            conf = Path(self.dir, "server.conf")
            conf.write_text(self.config)
            command.append(str(conf))
        command += [
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def log(self) -> str:
        return Path(self.dir, "server.log").read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def wait_ready(self, ping: Callable[[], object], timeout: float = 10.0) -> None:
        def ready() -> object:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"server on {self.port} exited: {self.log()}")
            return ping()

        wait_until(ready, timeout, f"server on port {self.port}")


def data_args() -> list[str]:
    return ["--save", "", "--appendonly", "no", "--protected-mode", "no"]


class Cluster:
    """Three cluster-mode masters, no replicas, slots split evenly by ``CLUSTER ADDSLOTSRANGE``
    and joined by ``CLUSTER MEET`` (no redis-cli needed)."""

    def __init__(self, masters: int = 3) -> None:
        self.bus_ports = [free_port() for _ in range(masters)]
        self.servers = [
            Server(
                [
                    *data_args(),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    # The bus port defaults to port + 10000, too high for many free ports.
                    "--cluster-port",
                    str(bus),
                ]  # fmt: skip
            )
            for bus in self.bus_ports
        ]

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+cluster://{hosts}"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5)

    def start(self) -> None:
        for server in self.servers:
            server.start()
        nodes = [self.node(port) for port in self.ports]
        try:
            for server, node in zip(self.servers, nodes, strict=True):
                server.wait_ready(node.ping)
            share = SLOTS // len(nodes)
            for i, node in enumerate(nodes):
                last = SLOTS - 1 if i == len(nodes) - 1 else (i + 1) * share - 1
                node.execute_command("CLUSTER ADDSLOTSRANGE", i * share, last)
            for node in nodes[1:]:
                node.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0], self.bus_ports[0])
            for node in nodes:
                wait_until(
                    lambda node=node: cluster_ok(node, len(nodes)),
                    30,
                    "cluster_state:ok on every node",
                )
        finally:
            for node in nodes:
                node.close()

    def client(self, **kwargs: Any) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)

    def close(self) -> None:
        for server in self.servers:
            server.close()


def cluster_ok(node: redis.Redis, size: int) -> bool:
    """``cluster_state:ok`` and every node known, as ``node`` sees it."""
    info = node.execute_command("CLUSTER INFO")
    if isinstance(info, bytes):
        info = dict(line.split(":", 1) for line in info.decode().split() if ":" in line)
    state = {str(k): str(v) for k, v in info.items()}
    return state.get("cluster_state") == "ok" and state.get("cluster_known_nodes") == str(size)


SENTINEL_MASTER = "cslmaster"


class SentinelSet:
    """A master, one replica and one sentinel watching them, with quick failover
    (down-after 1 s, failover-timeout 3 s, quorum 1)."""

    def __init__(self) -> None:
        # No 5 s wait for more replicas before the first sync.
        self.master = Server([*data_args(), "--repl-diskless-sync-delay", "0"])
        self.replica = Server(
            [*data_args(), "--replicaof", "127.0.0.1", "0"]  # port set in start()
        )
        self.sentinel = Server([], config="")

    def start(self) -> None:
        self.master.start()
        self.replica.args[-1] = str(self.master.port)
        self.replica.start()
        self.sentinel.args = ["--sentinel"]
        self.sentinel.config = "\n".join(
            [
                "bind 127.0.0.1",
                "protected-mode no",
                f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {self.master.port} 1",
                f"sentinel down-after-milliseconds {SENTINEL_MASTER} 1000",
                f"sentinel failover-timeout {SENTINEL_MASTER} 3000",
                f"sentinel parallel-syncs {SENTINEL_MASTER} 1",
                # Known from the start: no waiting for the master's INFO to announce it.
                f"sentinel known-replica {SENTINEL_MASTER} 127.0.0.1 {self.replica.port}",
                "",
            ]
        )
        master, replica = self.node(self.master.port), self.node(self.replica.port)
        sentinel = self.node(self.sentinel.port)
        try:
            self.master.wait_ready(master.ping)
            self.replica.wait_ready(replica.ping)
            wait_until(
                lambda: replica.info("replication").get("master_link_status") == "up",
                30,
                "the replica to sync",
            )
            # Started only now: the sentinel asks a replica for INFO when it connects and then
            # every 10 s, so a sentinel that met the replica mid-sync would not see its link up
            # (and would not promote it) until the next refresh.
            self.sentinel.start()
            self.sentinel.wait_ready(sentinel.ping)
            wait_until(
                lambda: self._replica_seen(sentinel), 30, "the sentinel to reach the replica"
            )
        finally:
            for node in (master, replica, sentinel):
                node.close()

    def _replica_seen(self, sentinel: redis.Redis) -> bool:
        """The sentinel is connected to the replica and has its INFO."""
        for entry in sentinel.execute_command("SENTINEL REPLICAS", SENTINEL_MASTER):
            fields = (
                entry
                if isinstance(entry, dict)
                else dict(zip(entry[::2], entry[1::2], strict=True))
            )
            flags = str(fields.get("flags", ""))
            if str(fields.get("port")) == str(self.replica.port) and flags == "slave":
                return str(fields.get("master-link-status")) == "ok"
        return False

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.sentinel.port}/{SENTINEL_MASTER}"

    @staticmethod
    def node(port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5, decode_responses=True)

    def master_port(self) -> int:
        """The master as the sentinel sees it now."""
        sentinel = self.node(self.sentinel.port)
        try:
            host, port = sentinel.execute_command(
                "SENTINEL GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER
            )
            return int(port)
        finally:
            sentinel.close()

    def close(self) -> None:
        for server in (self.sentinel, self.replica, self.master):
            server.close()


class TLSServer:
    """A ``redis-server`` serving TLS only, with a self-signed certificate made by openssl."""

    def __init__(self) -> None:
        self.server = Server([])
        self.cert = Path(self.server.dir, "cert.pem")
        self.key = Path(self.server.dir, "key.pem")

    def start(self) -> None:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                str(self.key),
                "-out",
                str(self.cert),
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ],  # fmt: skip
            check=True,
            capture_output=True,
        )
        self.port = self.server.port
        self.server.args = [
            *data_args(),
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.cert),
            "--tls-key-file", str(self.key),
            "--tls-ca-cert-file", str(self.cert),
            "--tls-auth-clients", "no",
        ]  # fmt: skip
        self.server.port = 0  # plain TCP off: TLS only
        self.server.start()
        probe = redis.Redis(host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=str(self.cert))
        try:
            self.server.wait_ready(probe.ping)
        finally:
            probe.close()

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.server.close()


class ACLServer:
    """A ``redis-server`` whose default user is off and whose one user logs in with a
    password (``ACL SETUSER``)."""

    USER = "locker"

    def __init__(self, password: str) -> None:
        self.password = password
        self.server = Server(data_args())

    def start(self) -> None:
        self.server.start()
        admin = redis.Redis(port=self.server.port)
        try:
            self.server.wait_ready(admin.ping)
            admin.execute_command(
                "ACL", "SETUSER", self.USER, "on", f">{self.password}", "~*", "&*", "+@all"
            )
            admin.execute_command("ACL", "SETUSER", "default", "off")
        finally:
            admin.close()

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"redis://{self.USER}:{self.password}@127.0.0.1:{self.server.port}/0"

    def close(self) -> None:
        self.server.close()
