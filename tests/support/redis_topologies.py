"""Throwaway Redis topologies for the deployment tests: a 3-master Cluster (optionally with
replicas), a master + replica + sentinel, a TLS server and an ACL server. Real
``redis-server`` processes on loopback and free ports, killed when the fixture ends; every
wait polls the servers' own state against a deadline.

Imported by tests/topologies/test_cluster.py, test_cluster_failover.py, test_sentinel.py and
test_acl_tls.py, which declare fixtures on top of these classes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import redis

from celery_singleton_lock.embedded import free_port, redis_server_binary

T = TypeVar("T")

#: Redis Cluster has 16384 hash slots.
SLOTS = 16384


class Topology(Protocol):
    def start(self) -> None: ...
    def close(self) -> None: ...


Started = TypeVar("Started", bound=Topology)


@contextmanager
def running(topology: Started) -> Iterator[Started]:
    """``topology`` started, and closed (every process killed) on the way out, also when
    starting it failed half-way."""
    try:
        topology.start()
        yield topology
    finally:
        topology.close()


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


#: What a redis-server (or a sentinel) logs once it listens on its port.
LISTENING_LINES = ("Ready to accept connections", "Sentinel ID is")


class Server:
    """One ``redis-server`` (or sentinel) child process with its own directory."""

    def __init__(
        self,
        args: list[str],
        *,
        port: int | None = None,
        config: str = "",
        binary: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        #: The executable (default: redis_server_binary()) and extra environment variables.
        self.binary = binary or redis_server_binary()
        self.env = env
        self.dir = tempfile.mkdtemp(prefix="csl-topo-")
        self.args = args
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self._started = False

    def start(self) -> None:
        """Start the server. A port found free may be taken by another process before the
        server binds it (the tests run on parallel workers): on its first start a server
        that could not bind moves to other free ports; a restart keeps its ports, which the
        rest of its topology knows it by."""
        for _ in range(5):
            self._spawn()
            if self._started or self.port == 0 or not self._port_was_taken():
                break
            self.port = free_port()
            if "--cluster-port" in self.args:
                self.args[self.args.index("--cluster-port") + 1] = str(free_port())
        self._started = True

    @property
    def bus_port(self) -> int | None:
        """A cluster node's bus port (``--cluster-port``), None for other servers."""
        if "--cluster-port" not in self.args:
            return None
        return int(self.args[self.args.index("--cluster-port") + 1])

    def _port_was_taken(self, timeout: float = 10.0) -> bool:
        """Wait until the new process says it listens (False) or exits; True if it exited
        because its port was in use. Its log, not a connection to the port, says it
        listens: the process that took the port answers connections too."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return "Address already in use" in self.log()
            if any(line in self.log() for line in LISTENING_LINES):
                return False
            time.sleep(0.02)  # polling a child process's log, with a deadline
        return False

    def _spawn(self) -> None:
        log = Path(self.dir, "server.log").open("ab")  # noqa: SIM115 - handed to the child
        command = [self.binary]
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
        env = {**os.environ, **self.env} if self.env else None
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        log.close()

    def log(self, omit: tuple[str, ...] = ()) -> str:
        """The end of the server's log, without the lines that contain any of ``omit``."""
        text = Path(self.dir, "server.log").read_text(errors="replace")
        if omit:
            lines = text.splitlines(keepends=True)
            text = "".join(line for line in lines if not any(part in line for part in omit))
        return text[-3000:]

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
    """Three cluster-mode masters, slots split evenly by ``CLUSTER ADDSLOTSRANGE`` and joined
    by ``CLUSTER MEET`` (no redis-cli needed). With ``replicas=N``, each master also gets N
    replicas, attached by ``CLUSTER REPLICATE`` and synced before ``start`` returns, so that
    killing a master fails its slots over to its replica."""

    def __init__(self, masters: int = 3, *, replicas: int = 0) -> None:
        extra = (
            [
                # No 5 s wait for more replicas before a master's first sync.
                "--repl-diskless-sync-delay", "0",
                # A replica refuses to fail over, for good, once its master has been gone
                # longer than node timeout x (this factor + 1) + repl-ping-replica-period. A
                # starved machine can spend that long before the masters flag the dead one
                # FAIL and vote (a lost election is only retried after twice its own
                # timeout), and a test may hold the replica back on purpose: 0 lets it
                # always take over, however old its copy. Every copy here is synced
                # before the kill, so its age says nothing.
                "--cluster-replica-validity-factor", "0",
            ]
            if replicas
            else []
        )  # fmt: skip
        self.servers = [self._server(free_port(), extra) for _ in range(masters)]
        #: ``replicas[i]``: the replicas of ``servers[i]``.
        self.replicas = [
            [self._server(free_port(), extra) for _ in range(replicas)] for _ in range(masters)
        ]
        #: Replica node id -> its master's node id, once started.
        self.masters_of: dict[str, str] = {}

    @staticmethod
    def _server(bus_port: int, extra: list[str]) -> Server:
        return Server(
            [
                *data_args(),
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000",
                # The bus port defaults to port + 10000, too high for many free ports.
                "--cluster-port", str(bus_port),
                *extra,
            ]
        )  # fmt: skip

    @property
    def ports(self) -> list[int]:
        """The masters' ports (as started: a failover does not change this list)."""
        return [server.port for server in self.servers]

    @property
    def all_servers(self) -> list[Server]:
        """Masters, then replicas."""
        return [*self.servers, *(replica for group in self.replicas for replica in group)]

    @property
    def all_ports(self) -> list[int]:
        return [server.port for server in self.all_servers]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+cluster://{hosts}"

    @property
    def url_with_all_nodes(self) -> str:
        """A URL seeding the client with every node, replicas included."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.all_ports)
        return f"redis+cluster://{hosts}"

    def slot_range(self, index: int) -> tuple[int, int]:
        """First and last slot given to master ``index`` at start."""
        share = SLOTS // len(self.servers)
        last = SLOTS - 1 if index == len(self.servers) - 1 else (index + 1) * share - 1
        return index * share, last

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5)

    def start(self) -> None:
        servers = self.all_servers
        for server in servers:
            server.start()
        nodes = {server.port: self.node(server.port) for server in servers}
        try:
            for server in servers:
                server.wait_ready(nodes[server.port].ping)
            for i, port in enumerate(self.ports):
                nodes[port].execute_command("CLUSTER ADDSLOTSRANGE", *self.slot_range(i))
            for server in servers[1:]:
                nodes[server.port].execute_command(
                    "CLUSTER MEET", "127.0.0.1", self.ports[0], self.servers[0].bus_port
                )
            self._attach_replicas(nodes)
            for node in nodes.values():
                wait_until(
                    lambda node=node: cluster_ok(node, len(servers)) and self._roles_seen(node),
                    30,
                    "cluster_state:ok, every node and every replica's master known on every node",
                )
            wait_until(
                lambda: epochs_settled(list(nodes.values())),
                30,
                "every node to see the same, distinct config epoch of every master",
            )
        finally:
            for node in nodes.values():
                node.close()

    def _attach_replicas(self, nodes: dict[int, redis.Redis]) -> None:
        """``CLUSTER REPLICATE`` each replica to its master, then wait for their links."""
        for master, group in zip(self.servers, self.replicas, strict=True):
            master_id = node_id(nodes[master.port])
            for replica in group:
                node = nodes[replica.port]
                # A node only replicates a master it has heard of through the cluster bus.
                wait_until(
                    lambda node=node, master_id=master_id: master_id in cluster_nodes(node),
                    30,
                    f"the replica on {replica.port} to learn of its master",
                )
                node.execute_command("CLUSTER REPLICATE", master_id)
                self.masters_of[node_id(node)] = master_id
        for group in self.replicas:
            for replica in group:
                node = nodes[replica.port]
                wait_until(
                    lambda node=node: node.info("replication").get("master_link_status") == "up",
                    30,
                    f"the replica on {replica.port} to sync",
                )

    def _roles_seen(self, node: redis.Redis) -> bool:
        """``node`` knows every replica as a replica of its master (a master only votes for
        a replica it knows as one, so a failover needs this)."""
        known = cluster_nodes(node)
        return all(
            replica in known
            and "slave" in known[replica]["flags"]
            and known[replica]["master"] == master
            for replica, master in self.masters_of.items()
        )

    def wait_replicated(self, index: int, timeout: float = 10.0) -> None:
        """Until every replica of master ``index`` has applied all the master wrote so far."""
        master = self.node(self.servers[index].port)
        replicas = [self.node(replica.port) for replica in self.replicas[index]]
        try:
            offset = int(master.info("replication")["master_repl_offset"])
            for replica in replicas:
                wait_until(
                    lambda replica=replica: (
                        int(replica.info("replication").get("slave_repl_offset", -1)) >= offset
                    ),
                    timeout,
                    f"a replica of master {index} to reach offset {offset}",
                )
        finally:
            for node in (master, *replicas):
                node.close()

    def client(self, **kwargs: Any) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)

    def close(self) -> None:
        for server in self.all_servers:
            server.close()


def cluster_info(node: redis.Redis) -> dict[str, str]:
    """``CLUSTER INFO`` of ``node``: field -> value."""
    info = node.execute_command("CLUSTER INFO")
    if isinstance(info, bytes):
        info = dict(line.split(":", 1) for line in info.decode().split() if ":" in line)
    return {str(k): str(v) for k, v in info.items()}


def cluster_ok(node: redis.Redis, size: int) -> bool:
    """``cluster_state:ok`` and every node known, as ``node`` sees it."""
    state = cluster_info(node)
    return state.get("cluster_state") == "ok" and state.get("cluster_known_nodes") == str(size)


def epochs_settled(nodes: list[redis.Redis]) -> bool:
    """Every node sees the same config epoch of every node, the masters' are distinct, and
    every replica's is its master's (a replica's line shows its master's epoch as it knows
    it).

    Masters made by ``CLUSTER ADDSLOTSRANGE`` all start at epoch 0 and bump theirs apart
    over the bus. A master killed before its replica heard its last bump leaves the replica
    asking for its slots with the older epoch, which the other masters refuse for good
    ("Failover auth denied ... epoch (3) > reqEpoch (1)"): no failover ever happens."""
    views = [
        {node_id: entry["epoch"] for node_id, entry in cluster_nodes(node).items()}
        for node in nodes
    ]
    if any(view != views[0] for view in views[1:]):
        return False
    seen = cluster_nodes(nodes[0])
    masters = [entry["epoch"] for entry in seen.values() if "master" in entry["flags"]]
    replicas_behind = [
        entry
        for entry in seen.values()
        if "slave" in entry["flags"]
        and (entry["master"] not in seen or seen[entry["master"]]["epoch"] != entry["epoch"])
    ]
    return len(set(masters)) == len(masters) and not replicas_behind


def node_id(node: redis.Redis) -> str:
    reply = node.execute_command("CLUSTER MYID")
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def cluster_nodes(node: redis.Redis) -> dict[str, dict[str, Any]]:
    """``CLUSTER NODES`` as ``node`` sees it: node id -> ``port`` (int), ``flags`` (set),
    ``master`` (the master's node id, or ``-``), ``epoch`` (its config epoch; a replica's is
    its master's, as it knows it) and ``slots`` ([(first, last)])."""
    # "CLUSTER", "NODES" as two words: the raw text, not redis-py's parsed form.
    reply = node.execute_command("CLUSTER", "NODES")
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    nodes = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        address = fields[1].split("@", 1)[0]
        slots = []
        for item in fields[8:]:
            if item.startswith("["):
                continue  # a slot migrating or importing
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        nodes[fields[0]] = {
            "port": int(address.rpartition(":")[2] or 0),
            "flags": set(fields[2].split(",")),
            "master": fields[3],
            "epoch": int(fields[6]),
            "slots": slots,
        }
    return nodes


def slot_owner(node: redis.Redis, slot: int) -> int | None:
    """The port of the node that owns ``slot``, as ``node`` sees it (None: nobody)."""
    for entry in cluster_nodes(node).values():
        if any(first <= slot <= last for first, last in entry["slots"]):
            return int(entry["port"])
    return None


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
