"""Claims: a lock held on behalf of a queued message rather than a running process.

A claim is an ordinary lock hash whose owner token is derived from the task id and attempt
number. It is taken at enqueue (``lock_on_enqueue``) or handed over when a task retries, and
the worker that runs exactly that attempt takes it over (acquire.lua, ARGV[5]), so no other
run of the key slips in between. A redelivered copy of the same attempt finds the claim
already consumed. A claim that is never run expires by itself.
"""

from __future__ import annotations

#: Result states after which a task holds nothing any more, and a claim of it is stale.
FINISHED_STATES = ("SUCCESS", "FAILURE", "REVOKED")

#: Every claim's owner token starts with this.
CLAIM_PREFIX = "claim:"


def claim_owner(task_id: str, attempt: int) -> str:
    """The owner token of the claim for attempt ``attempt`` (``request.retries``) of a task."""
    return f"{CLAIM_PREFIX}{task_id}:{attempt}"
