"""Release messages per node on a local Redis Cluster: sharded pub/sub against plain PUBLISH.

Starts its own throwaway clusters of 3 and 6 masters (no replicas), twice each: as they are
(Redis 7: releases go out with ``SPUBLISH``) and with ``SPUBLISH`` renamed away, which makes
the scripts and the listener fall back to ``PUBLISH``/``SUBSCRIBE`` as on a server older than
Redis 7. Each release is a lease's, of a name spread over every master, with a waiter
blocked on it (a release publishes only when a waiter marked the lock; the waiter's own
release then publishes nothing). A node *sees* a message when it runs the publish (``INFO
commandstats``) or receives it over the cluster bus (``CLUSTER INFO``
``cluster_stats_messages_publish*_received``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from celery_singleton_lock import LockClient
from celery_singleton_lock.embedded import free_port, redis_server_binary

from .context import Context
from .registry import section
from .report import Table

SLOTS = 16384
SIZES = (3, 6)


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--cluster-releases", type=int, help="releases per cluster (default 100)")


@contextmanager
def local_cluster(masters: int, *, spublish: bool) -> Iterator[list[int]]:
    """The ports of a started cluster of ``masters`` masters; killed on the way out."""
    root = tempfile.mkdtemp(prefix="csl-bench-cluster-")
    renamed = [] if spublish else ["--rename-command", "SPUBLISH", "SPUBLISH_DISABLED"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        ports, buses = [], []
        for _ in range(masters):
            process, port, bus = start_node(tempfile.mkdtemp(dir=root), renamed)
            processes.append(process)
            ports.append(port)
            buses.append(bus)
        nodes = [redis.Redis(port=port) for port in ports]
        share = SLOTS // masters
        for i, node in enumerate(nodes):
            last = SLOTS - 1 if i == masters - 1 else (i + 1) * share - 1
            node.execute_command("CLUSTER ADDSLOTSRANGE", i * share, last)
        for node in nodes[1:]:
            node.execute_command("CLUSTER MEET", "127.0.0.1", ports[0], buses[0])
        for node in nodes:
            wait_for(lambda n=node: cluster_ready(n, masters), "cluster_state:ok")
            node.close()
        yield ports
    finally:
        for process in processes:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)


def start_node(workdir: str, options: list[str]) -> tuple[subprocess.Popen[bytes], int, int]:
    """A cluster node started on free ports, answering: (process, port, bus port). Another
    process may take a port between ``free_port()`` and the node's bind, and the node then
    exits: it is started again on other ports."""
    for _ in range(5):
        port, bus = free_port(), free_port()
        process = subprocess.Popen(
            [
                redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                "--dir", workdir, "--save", "", "--appendonly", "no",
                "--cluster-enabled", "yes", "--cluster-port", str(bus),
                "--cluster-config-file", "nodes.conf", *options,
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        node = redis.Redis(port=port)
        try:
            # Up once it answers as this very process: another server that took the port
            # would answer a PING too.
            wait_for(
                lambda process=process, node=node: (
                    process.poll() is not None
                    or node.info("server").get("process_id") == process.pid
                ),
                "a node to start",
            )
        finally:
            node.close()
        if process.poll() is None:
            return process, port, bus
        process.wait()
    raise RuntimeError("no cluster node could start: its ports were taken each time")


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def cluster_ready(node: redis.Redis, masters: int) -> bool:
    info = node.execute_command("CLUSTER INFO")
    if isinstance(info, bytes):
        info = dict(line.split(":", 1) for line in info.decode().split() if ":" in line)
    state = {str(k): str(v) for k, v in info.items()}
    return state.get("cluster_state") == "ok" and state.get("cluster_known_nodes") == str(masters)


def messages_seen(port: int) -> int:
    """Publishes ``port``'s node has run, plus publish messages it got over the bus."""
    node = redis.Redis(port=port)
    try:
        stats = node.info("commandstats")
        ran = sum(
            int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
            for name in ("publish", "spublish")
        )
        info = node.execute_command("CLUSTER INFO")
        if isinstance(info, bytes):
            info = dict(line.split(":", 1) for line in info.decode().split() if ":" in line)
        received = sum(
            int(value)
            for key, value in info.items()
            if str(key).startswith("cluster_stats_messages_publish")
            and str(key).endswith("_received")
        )
        return ran + received
    finally:
        node.close()


def settle_bus(ports: list[int], before: dict[int, int], expected: int) -> None:
    """Wait until the nodes have seen ``expected`` messages, or no more for a second."""
    deadline = time.monotonic() + 30
    seen, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = sum(messages_seen(port) - before[port] for port in ports)
        if now >= expected:
            time.sleep(0.2)  # anything beyond the expected count would show up meanwhile
            return
        if now != seen:
            seen, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:
            return
        time.sleep(0.05)


def measure(masters: int, releases: int, *, spublish: bool) -> list[float]:
    """Messages per release seen by each node."""
    with local_cluster(masters, spublish=spublish) as ports:
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in ports)
        client = LockClient.from_url(url, prefix=f"bench:{uuid.uuid4().hex[:8]}:")
        try:
            names = [f"n{i}" for i in range(64)]  # spread over every master
            before = {port: messages_seen(port) for port in ports}
            for i in range(releases):
                name = names[i % len(names)]
                holder, waiter = client.lease(name, ttl=30), client.lease(name, ttl=30)
                if not holder.acquire():
                    raise RuntimeError("an unheld name was not taken")
                woken = threading.Thread(target=waiter.acquire, kwargs={"wait": 10})
                woken.start()
                lock = client.connection.keys(name).lock
                wait_for(lambda k=lock: client.redis.hget(k, "waiting"), "the waiter's mark")
                holder.release()
                woken.join()
                if not waiter.held:
                    raise RuntimeError("the waiter was not woken")
                waiter.release()
            # Bus messages arrive after the release returns: wait until every node counts
            # them, or until the counts stop growing (the bus gives no delivery guarantee:
            # a link reset on a loaded machine drops what was in flight).
            expected = releases if spublish else releases * masters
            settle_bus(ports, before, expected)
            return [(messages_seen(port) - before[port]) / releases for port in ports]
        finally:
            client.close()


@section(
    "cluster-pubsub",
    "release messages per node on a local Redis Cluster, PUBLISH against SPUBLISH",
    add_arguments=add_arguments,
    order=90,
)
def run(ctx: Context) -> list[Table]:
    releases = ctx.pick("cluster_releases", 30, 100)
    table = Table(
        f"release messages seen per node, per release ({releases} releases)",
        ["masters", "publish", "per node", "all nodes"],
        numeric=frozenset({0, 3}),
    )
    for masters in SIZES:
        for spublish in (False, True):
            per_node = measure(masters, releases, spublish=spublish)
            table.add(
                masters,
                "SPUBLISH" if spublish else "PUBLISH (no SPUBLISH)",
                " / ".join(f"{value:.2f}" for value in per_node),
                f"{sum(per_node):.2f}",
            )
    table.notes.append(
        "per node: the masters in slot order; a node sees a message when it runs the "
        "publish or receives it over the cluster bus"
    )
    return [table]
