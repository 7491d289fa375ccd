"""The admin side of the lock core: who holds what, live or stale (:mod:`.inspect`), and
clearing safely (:mod:`.clear`). Every name is importable from here, as before the split."""

from .clear import (
    CLEARED,
    GONE,
    RESUMED,
    TAKEN,
    clear,
    clear_info,
    clear_listed,
    release_holder,
)
from .inspect import (
    BATCH,
    CLAIM_OWNER_PREFIX,
    CLAIMED,
    COOLDOWN,
    DELAY_AFTER,
    HEARTBEAT_FRESH,
    HEARTBEAT_STOPPED,
    KINDS,
    LEASES,
    LIVE,
    MISSED_TICKS,
    NO_EVIDENCE,
    QUEUED,
    STALE,
    TICKS_PER_TTL,
    Check,
    Lister,
    LockInfo,
    escape,
    heartbeat_stopped,
    list_locks,
    listers,
    literal_name,
    lock_info,
    server_ms,
)

__all__ = [
    "BATCH", "CLAIMED", "CLAIM_OWNER_PREFIX", "CLEARED", "COOLDOWN", "DELAY_AFTER", "GONE",
    "HEARTBEAT_FRESH", "HEARTBEAT_STOPPED", "KINDS", "LEASES", "LIVE", "MISSED_TICKS",
    "NO_EVIDENCE", "QUEUED", "RESUMED", "STALE", "TAKEN", "TICKS_PER_TTL", "Check",
    "Lister", "LockInfo", "clear", "clear_info", "clear_listed",
    "escape", "heartbeat_stopped", "list_locks", "listers", "literal_name",
    "lock_info", "release_holder", "server_ms",
]  # fmt: skip
