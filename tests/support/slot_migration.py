"""Moving one hash slot between two masters of a running :class:`Cluster`, the way
``redis-cli --cluster reshard`` does: ``CLUSTER SETSLOT <slot> IMPORTING`` on the target,
``MIGRATING`` on the source, ``CLUSTER GETKEYSINSLOT`` + ``MIGRATE ... KEYS`` in batches, then
``CLUSTER SETSLOT <slot> NODE <target>`` on the target, the source and the other masters.

:class:`SlotMigration` does it in steps, so that a test can act while the slot is half-moved
(some of its keys on each node): ``begin()``, ``move(1)``, the test's business, ``finish()``.
"""

from __future__ import annotations

import redis

from .redis_topologies import Cluster, node_id, slot_owner, wait_until


class SlotMigration:
    """Moves ``slot`` of ``cluster`` from the master that owns it to the master on
    ``target_port``."""

    def __init__(self, cluster: Cluster, slot: int, target_port: int) -> None:
        self.cluster = cluster
        self.slot = slot
        self.target_port = target_port
        probe = cluster.node(cluster.ports[0])
        try:
            owner = slot_owner(probe, slot)
        finally:
            probe.close()
        assert owner is not None and owner != target_port, (owner, target_port)
        self.source_port = owner
        self.source = cluster.node(owner)
        self.target = cluster.node(target_port)
        self.source_id = node_id(self.source)
        self.target_id = node_id(self.target)
        #: Keys moved so far.
        self.moved: list[bytes] = []

    def begin(self) -> None:
        """Mark the slot importing on the target, then migrating on the source (that order:
        a client the source sends on with ASK must find the target ready)."""
        self.target.execute_command("CLUSTER SETSLOT", self.slot, "IMPORTING", self.source_id)
        self.source.execute_command("CLUSTER SETSLOT", self.slot, "MIGRATING", self.target_id)

    def keys_left(self, count: int = 1000) -> list[bytes]:
        """Up to ``count`` keys of the slot still on the source."""
        return list(self.source.execute_command("CLUSTER GETKEYSINSLOT", self.slot, count))

    def move(self, count: int) -> list[bytes]:
        """``MIGRATE`` up to ``count`` keys of the slot from the source to the target (the
        keys keep their expiry); the keys moved."""
        return self.move_keys(self.keys_left(count))

    def move_keys(self, keys: list[bytes]) -> list[bytes]:
        """``MIGRATE`` these keys of the slot (each on the source) to the target."""
        if keys:
            self.source.execute_command(
                "MIGRATE", "127.0.0.1", self.target_port, "", 0, 5000, "KEYS", *keys
            )
            self.moved += keys
        return keys

    def finish(self, batch: int = 10) -> None:
        """Move every key left in batches, then give the slot to the target on every master
        and wait until each of them sees the target as its owner."""
        while self.move(batch):
            pass
        # Target first, then source (as redis-cli): the source then answers MOVED, never
        # ASK to a target that does not know it owns the slot yet.
        for node in (self.target, self.source):
            node.execute_command("CLUSTER SETSLOT", self.slot, "NODE", self.target_id)
        others = [
            port for port in self.cluster.ports if port not in (self.source_port, self.target_port)
        ]
        for port in others:
            node = self.cluster.node(port)
            try:
                node.execute_command("CLUSTER SETSLOT", self.slot, "NODE", self.target_id)
            finally:
                node.close()
        for port in self.cluster.ports:
            node = self.cluster.node(port)
            try:
                wait_until(
                    lambda node=node: slot_owner(node, self.slot) == self.target_port,
                    30,
                    f"the master on {port} to see slot {self.slot} on {self.target_port}",
                )
            finally:
                node.close()

    def run(self) -> None:
        """The whole migration at once."""
        self.begin()
        self.finish()

    def close(self) -> None:
        self.source.close()
        self.target.close()


def errors_seen(node: redis.Redis, prefix: str) -> int:
    """How many error replies starting with ``prefix`` (``TRYAGAIN``, ``ASK``) ``node`` has
    sent since it started (``INFO errorstats``)."""
    stats = node.info("errorstats")
    return int(stats.get(f"errorstat_{prefix}", {}).get("count", 0))
