"""ScriptBatch (core/scripts.py) without I/O: what a pipeline of script calls carries (the
WAITs of a replicated batch, on a Cluster each call and WAIT sent to its node by name), which
scripts it reloads after NOSCRIPT, and what its replies come to. Sent for real by the sync and
the asyncio run_batch (tests/topologies/test_replicated.py, tests/topologies/test_cluster.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import redis
from redis.exceptions import NoScriptError, ResponseError

from celery_singleton_lock import LockNotReplicated
from celery_singleton_lock.core.replication import Replication
from celery_singleton_lock.core.scripts import ScriptBatch, ScriptCall, register

REPLICATION = Replication(replicas=2, timeout_ms=100)


class Node(NamedTuple):
    """A Cluster node as ScriptBatch reads it: its name."""

    name: str


class CommandLog:
    """What ScriptBatch.queue puts on a pipeline: each command with its options."""

    def __init__(self) -> None:
        self.commands: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def execute_command(self, *args: Any, **options: Any) -> None:
        self.commands.append((args, options))


@pytest.fixture
def calls() -> list[ScriptCall]:
    client = redis.Redis()  # registering computes the SHA only: no connection is made
    first, second = register(client, "return 1"), register(client, "return 2")
    return [(first, [b"{a}k"], ["x"]), (second, [b"{b}k"], []), (first, [b"{a}j"], [])]


def node_of(key: bytes) -> Node:
    return Node("node-a" if key.startswith(b"{a}") else "node-b")


def test_a_replicated_batch_ends_with_its_wait(calls: list[ScriptCall]) -> None:
    log = CommandLog()
    ScriptBatch(calls, REPLICATION).queue(log)
    sent = [args for args, _ in log.commands]
    assert sent == [
        ("EVALSHA", calls[0][0].sha, 1, b"{a}k", "x"),
        ("EVALSHA", calls[1][0].sha, 1, b"{b}k"),
        ("EVALSHA", calls[2][0].sha, 1, b"{a}j"),
        ("WAIT", 2, 100),
    ]
    assert all(options == {} for _, options in log.commands)


def test_on_a_cluster_each_call_and_one_wait_per_node_go_to_their_node(
    calls: list[ScriptCall],
) -> None:
    log = CommandLog()
    ScriptBatch(calls, REPLICATION, node_of).queue(log)
    targets = [(args[0], options["target_nodes"].name) for args, options in log.commands]
    assert targets == [
        ("EVALSHA", "node-a"),
        ("EVALSHA", "node-b"),
        ("EVALSHA", "node-a"),
        ("WAIT", "node-a"),
        ("WAIT", "node-b"),
    ]


def test_a_batch_without_replication_sends_no_wait(calls: list[ScriptCall]) -> None:
    log = CommandLog()
    ScriptBatch(calls, None).queue(log)
    assert [args[0] for args, _ in log.commands] == ["EVALSHA"] * 3


def test_a_missing_script_is_loaded_once_per_node(calls: list[ScriptCall]) -> None:
    missing = NoScriptError("NOSCRIPT")
    plain = ScriptBatch(calls, None)
    plain.read([missing, 2, missing])
    assert plain.missing() == [(calls[0][0], None)]
    cluster = ScriptBatch(calls, None, node_of)
    cluster.read([missing, missing, missing])
    assert cluster.missing() == [(calls[0][0], Node("node-a")), (calls[1][0], Node("node-b"))]


def test_replies_acknowledged_by_too_few_replicas_raise_with_the_replies(
    calls: list[ScriptCall],
) -> None:
    batch = ScriptBatch(calls, REPLICATION, node_of)
    batch.read([1, 2, 1, 2, 1])  # node-b's WAIT: one replica of two
    with pytest.raises(LockNotReplicated) as info:
        batch.result()
    assert info.value.replies == [1, 2, 1]
    assert info.value.acknowledged == 1


def test_an_error_reply_is_raised_and_acknowledged_replies_returned(
    calls: list[ScriptCall],
) -> None:
    failed = ScriptBatch(calls, REPLICATION)
    failed.read([1, ResponseError("refused"), 1, 2])
    with pytest.raises(ResponseError, match="refused"):
        failed.result()
    batch = ScriptBatch(calls, REPLICATION)
    batch.read([1, 2, 1, 2])
    assert batch.result() == [1, 2, 1]
    assert batch.failed((ResponseError,)) == []
