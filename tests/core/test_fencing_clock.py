"""Fencing tokens against a real server clock stepped back and forth (libfaketime in the
server): the counter follows a clock stepped back by any amount while the server keeps its
data, and where the guarantee stops (docs/fencing.md): a counter lost with its data while the
next server's clock reads behind the last token by more than the slack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from support.redis_topologies import data_args, running, wait_until
from support.stepped_clock import SteppedClockServer

from celery_singleton_lock import LockClient

#: fencing.lua's FENCE_SLACK_MS, in seconds: how long past the time its token stands for
#: (by the server's clock) a counter lives.
SLACK = 10


@pytest.fixture
def stepped() -> Iterator[SteppedClockServer]:
    with running(SteppedClockServer()) as server:
        yield server


def lock_client(server: SteppedClockServer, prefix: str) -> LockClient:
    return LockClient.from_url(server.url, prefix=prefix)


def token_of(client: LockClient, name: str, **options: object) -> int:
    lease = client.lease(name, heartbeat=False, **options)  # type: ignore[arg-type]
    with lease:
        assert lease.token is not None
        return lease.token


def test_tokens_increase_across_a_clock_stepped_back(
    stepped: SteppedClockServer, lock_prefix: str
) -> None:
    client = lock_client(stepped, lock_prefix)
    try:
        fence = client.connection.keys("n").fence
        tokens = [token_of(client, "n")]
        stepped.step_to(-60)
        tokens.append(token_of(client, "n"))  # released
        # The counter lives until the stepped clock passes its token, plus the slack: the
        # memory a step back costs is its length.
        assert 60_000 < client.redis.pttl(fence) <= (60 + SLACK) * 1000 + 1000
        held = client.lease("n", heartbeat=False)
        held.acquire()
        tokens.append(held.token)
        assert client.clear("n", force=True)  # cleared by the admin, not released
        tokens.append(token_of(client, "n"))
        expiring = client.lease("n", ttl=1, heartbeat=False)
        expiring.acquire()
        tokens.append(expiring.token)
        stepped.step_to(-58)  # two seconds on: the lease has expired, the counter has not
        assert client.holders("n") == []
        tokens.append(token_of(client, "n"))
        stepped.step_to(-30)  # forward again, still behind the host
        tokens.append(token_of(client, "n"))
        stepped.step_to(0)
        tokens.append(token_of(client, "n"))
        assert tokens == sorted(set(tokens))
        assert tokens[1:7] == [tokens[0] + i for i in range(1, 7)]
    finally:
        client.close()


@pytest.mark.parametrize("persisted", [False, True], ids=["no-persistence", "appendonly"])
def test_a_restart_with_the_clock_behind(persisted: bool, lock_prefix: str) -> None:
    """Where the guarantee stops: a restart that loses the counter, with the clock now behind
    the last token, gives a lower token. A server that keeps its data (appendonly) does not:
    the counter comes back with its absolute expiry."""
    args = data_args()
    if persisted:
        args[args.index("--appendonly") + 1] = "yes"
        args += ["--appendfsync", "always"]
    with running(SteppedClockServer(args)) as server:
        client = lock_client(server, lock_prefix)
        try:
            first = token_of(client, "restarted")
            server.step_to(-60)
            server.restart()
            again = token_of(client, "restarted")
        finally:
            client.close()
    if persisted:
        assert again == first + 1
    else:
        assert again < first


def replication_up(replica: redis.Redis) -> bool:
    return replica.info("replication").get("master_link_status") == "up"


@pytest.mark.parametrize(
    ("skew", "increasing"), [(SLACK // 2, True), (SLACK + 5, False)], ids=["within", "beyond"]
)
def test_a_promoted_replica_with_a_clock_behind(
    skew: int, increasing: bool, lock_prefix: str
) -> None:
    """The master's counter expired (by its clock, the slack after its token) and its DEL
    replicated; the replica, whose clock is ``skew`` seconds behind, is promoted. Within the
    slack its clock is past the last token; beyond it (where the guarantee stops) it is not."""
    with running(SteppedClockServer()) as master:
        replica_server = SteppedClockServer(
            [*data_args(), "--replicaof", "127.0.0.1", str(master.port)]
        )
        replica_server.step_to(-skew)
        with running(replica_server):
            replica = redis.Redis(port=replica_server.port)
            client = lock_client(master, lock_prefix)
            try:
                wait_until(lambda: replication_up(replica), 10, "the replica's link")
                first = token_of(client, "failover")
                fence = client.connection.keys("failover").fence
                assert client.redis.execute_command("WAIT", 1, 5000) == 1
                assert replica.exists(fence)
                # Both clocks a slack and a second later, the skew kept: the master finds
                # its counter expired (a read expires it) and replicates the DEL.
                master.step_to(SLACK + 1)
                replica_server.step_to(SLACK + 1 - skew)
                assert client.redis.get(fence) is None
                wait_until(lambda: not replica.exists(fence), 10, "the counter's DEL")
                replica.execute_command("REPLICAOF", "NO", "ONE")
            finally:
                client.close()
            promoted = lock_client(replica_server, lock_prefix)
            try:
                after = token_of(promoted, "failover")
            finally:
                promoted.close()
                replica.close()
    assert (after > first) is increasing
