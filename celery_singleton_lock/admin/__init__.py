"""The admin side of the lock core: who holds what, live or stale (:mod:`.inspect`), and
clearing safely (:mod:`.clear`). Every name is importable from here."""

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
    HEARTBEAT_FRESH,
    HEARTBEAT_STOPPED,
    KINDS,
    LEASES,
    LIVE,
    MISSED_TICKS,
    NO_EVIDENCE,
    QUEUED,
    RELEASE_DELAY,
    RELEASED_WITH_DELAY,
    STALE,
    TICKS_PER_TTL,
    Check,
    Lister,
    Listing,
    LockInfo,
    escape,
    heartbeat_stopped,
    list_locks,
    listed,
    listers,
    literal_name,
    lock_info,
    server_ms,
    skipped_note,
)

__all__ = [
    "BATCH", "CLAIMED", "CLAIM_OWNER_PREFIX", "CLEARED", "GONE", "HEARTBEAT_FRESH",
    "HEARTBEAT_STOPPED", "KINDS", "LEASES", "LIVE", "MISSED_TICKS", "NO_EVIDENCE", "QUEUED",
    "RELEASED_WITH_DELAY", "RELEASE_DELAY", "RESUMED", "STALE", "TAKEN", "TICKS_PER_TTL",
    "Check", "Lister", "Listing", "LockInfo", "clear", "clear_info", "clear_listed",
    "escape", "heartbeat_stopped", "list_locks", "listed", "listers", "literal_name",
    "lock_info", "release_holder", "server_ms", "skipped_note",
]  # fmt: skip
