"""``locks doctor``: does this deployment give the guarantees the docs promise?

Two halves, kept apart so that every check can be tested on its own:

- *Facts*: what the live deployment says (:class:`ServerFacts`, read by :func:`read_server`;
  :class:`KeyUsage`, read by :func:`read_key_usage`) and what the Celery app says
  (:class:`AppFacts`, gathered by the Celery layer, ``celery/doctor.py``: this module
  knows no Celery).
- *Checks*: pure functions from facts to one :class:`Finding` each, saying what breaks and
  the fix. :func:`diagnose` runs them all.

``None`` in a fact means *unknown* (``CONFIG`` disabled, no ``-A`` app): a check that needs
it says so (level ``info``) rather than guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from redis.exceptions import ResponseError

from ..core.holder import flatten
from ..core.keys import escape_glob
from ..core.scan import BATCH
from ..kinds.lease import CLAIM_OWNER_PREFIX

ERROR, WARNING, OK, INFO = "error", "warning", "ok", "info"
#: Levels, worst first.
LEVELS = (ERROR, WARNING, INFO, OK)

#: The oldest Redis the scripts run on: the fencing counter's ``SET ... PX ... GET``
#: (lua/fencing.lua) is Redis 6.2's; they also read ``TIME`` and then write, which needs
#: script effects replication (the default from 5.0).
MIN_REDIS = (6, 2)
#: Sharded pub/sub (``SPUBLISH``), which a Cluster's waiters use (docs/deployment.md).
SHARDED_PUBSUB_REDIS = (7, 0)
#: Hash slots of a Redis Cluster.
CLUSTER_SLOTS = 16384
#: A heartbeat renews every ``lease / TICKS`` seconds; a reply slower than one tick leaves
#: the lease running out before the next renewal can land (core/renewal.py).
TICKS = 3
#: kombu's Redis transport default ``visibility_timeout`` (seconds).
DEFAULT_VISIBILITY_TIMEOUT = 3600.0
#: What a check that reads the Celery app says without one.
NEEDS_APP = "needs celery -A proj"
#: Keys the key-usage report reads at most by default (a SCAN plus one pipeline per page).
DEFAULT_MAX_KEYS = 100_000


@dataclass(frozen=True)
class Finding:
    """One check's verdict: ``level`` (error, warning, info, ok), what was ``found``, what
    ``breaks`` because of it and the ``fix`` (None when nothing breaks)."""

    check: str
    level: str
    found: str
    breaks: str | None = None
    fix: str | None = None
    #: Figures behind the verdict, for ``--json`` (the key-usage table, the node names...).
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The object of ``doctor --json`` (docs/admin.md)."""
        return asdict(self)


@dataclass(frozen=True)
class ServerFacts:
    """What the lock Redis says of itself (on a Cluster: its worst primary, plus
    ``CLUSTER INFO``). ``None``: unknown."""

    version: str | None = None
    #: ``standalone``, ``cluster`` or ``sentinel`` (from the client and the URL).
    mode: str = "standalone"
    maxmemory: int | None = None
    maxmemory_policy: str | None = None
    appendonly: str | None = None
    #: ``CONFIG GET save``: "" when no save point is set.
    save: str | None = None
    connected_replicas: int | None = None
    cluster_state: str | None = None
    cluster_slots_ok: int | None = None


@dataclass(frozen=True)
class AppFacts:
    """What the Celery app says (``celery -A proj locks doctor``); ``None`` everywhere
    without an app."""

    #: Whether an app was read at all (False: ``python -m celery_singleton_lock``).
    from_app: bool = False
    #: ``singleton_lock_replicas``.
    replicas: int | None = None
    #: The app's lock client's ``socket_timeout`` (seconds; ``math.inf``: none set).
    socket_timeout: float | None = None
    #: ``lock_lease`` of each SingletonTask, by task name.
    leases: Mapping[str, float] = field(default_factory=dict)
    #: The names of the tasks among ``leases`` that run with ``acks_late``.
    acks_late: Sequence[str] = ()
    #: The broker's ``visibility_timeout`` when it is Redis (None: not a Redis broker).
    visibility_timeout: float | None = None
    #: The longest countdown or eta in use, when one can be known (None: unknowable).
    longest_countdown: float | None = None
    #: Node names of the workers that answered a ping (one per reply: a name used twice
    #: appears twice); None when not asked.
    workers: Sequence[str] | None = None
    #: ``worker_enable_remote_control``.
    remote_control: bool | None = None


@dataclass(frozen=True)
class KindUsage:
    """Keys of one kind under the prefix: how many, their bytes (``MEMORY USAGE``), the
    longest idle (``OBJECT IDLETIME``: seconds since last touched, None when the eviction
    policy is LFU and Redis keeps no idle time), how many have no expiry and, for holds and
    claims, the age of the oldest."""

    kind: str
    keys: int = 0
    bytes: int = 0
    oldest_idle_s: int | None = None
    no_expiry: int = 0
    #: Holds and claims: seconds since the oldest was acquired (its ``acquired_ms``, on the
    #: server's clock); None for the other kinds, which record no time of their own.
    oldest_age_s: float | None = None


@dataclass(frozen=True)
class KeyUsage:
    """What the package keeps in Redis, by kind; ``capped``: the scan stopped at
    ``max_keys`` keys, so the figures are a lower bound."""

    kinds: Sequence[KindUsage]
    scanned: int
    capped: bool


# -- the checks --------------------------------------------------------------------------------


def check_eviction(server: ServerFacts) -> Finding:
    """Any eviction policy can evict a lock key: two holders, silently."""
    if server.maxmemory is None or server.maxmemory_policy is None:
        return Finding(
            "eviction",
            INFO,
            "maxmemory and maxmemory-policy unknown (CONFIG GET refused or disabled)",
            fix="check by hand that maxmemory is 0 or maxmemory-policy is noeviction",
        )
    if server.maxmemory == 0 or server.maxmemory_policy == "noeviction":
        return Finding(
            "eviction",
            OK,
            f"maxmemory {server.maxmemory}, maxmemory-policy {server.maxmemory_policy}: "
            "no key is ever evicted",
        )
    return Finding(
        "eviction",
        ERROR,
        f"maxmemory {server.maxmemory} with maxmemory-policy {server.maxmemory_policy}",
        breaks="when memory fills up Redis evicts keys, lock keys included (they all carry "
        "an expiry, so volatile-* policies pick them too): another process then acquires a "
        "lock its holder still believes it holds, and nothing tells either of them",
        fix="CONFIG SET maxmemory-policy noeviction (and in redis.conf), or give the locks "
        "a Redis of their own (singleton_lock_url) with maxmemory 0",
    )


def check_restarts(server: ServerFacts) -> Finding:
    """No persistence and no replica: a restarted Redis forgets every lock."""
    if server.appendonly is None or server.save is None or server.connected_replicas is None:
        return Finding(
            "restarts",
            INFO,
            "persistence unknown (CONFIG GET refused or disabled)",
            fix="check appendonly, save and the replicas by hand",
        )
    persisted = server.appendonly == "yes" or server.save.strip() != ""
    if persisted or server.connected_replicas > 0:
        how = []
        if server.appendonly == "yes":
            how.append("appendonly yes")
        if server.save.strip():
            how.append(f"save {server.save!r}")
        if server.connected_replicas:
            how.append(f"{server.connected_replicas} replica(s)")
        return Finding("restarts", OK, "locks survive a restart: " + ", ".join(how))
    return Finding(
        "restarts",
        WARNING,
        "no persistence (appendonly no, no save points) and no replica",
        breaks="a restarted Redis forgets every lock: until each holder's next heartbeat "
        "tick notices its lease gone (a third of lock_lease), a second run of a locked task "
        "can start beside the first",
        fix="appendonly yes (appendfsync everysec) keeps the locks across a restart, losing "
        "at most the last second's writes; a replica that takes over (Sentinel) keeps them "
        "across the loss of the server; singleton_lock_replicas=N makes a lock count as "
        "taken only once N replicas have it, so a failover cannot lose it",
    )


def check_failover(server: ServerFacts, app: AppFacts) -> Finding:
    """Replicas or Sentinel, but acquisitions acknowledged before any replica has them."""
    replicated = (server.connected_replicas or 0) > 0 or server.mode == "sentinel"
    if not replicated:
        return Finding("failover", OK, "no replica and no Sentinel: nothing to fail over to")
    where = "Sentinel" if server.mode == "sentinel" else f"{server.connected_replicas} replica(s)"
    if app.replicas is None:
        return Finding(
            "failover",
            INFO,
            f"{where}; singleton_lock_replicas unknown: {NEEDS_APP}",
            fix="run celery -A proj locks doctor to check the app's setting",
        )
    if app.replicas > 0:
        return Finding("failover", OK, f"{where}; singleton_lock_replicas={app.replicas}")
    return Finding(
        "failover",
        WARNING,
        f"{where}, but singleton_lock_replicas=0",
        breaks="a lock is acknowledged before any replica has it: a failover to a lagging "
        "replica forgets it, and a second holder gets it",
        fix="singleton_lock_replicas = 1 (each lock write waits for one replica, "
        "docs/deployment.md)",
    )


def check_socket_timeout(app: AppFacts) -> Finding:
    """One slow reply must not outlast the lease: at most a third of the shortest one."""
    if not app.from_app:
        return Finding("socket-timeout", INFO, NEEDS_APP)
    if not app.leases or app.socket_timeout is None:
        found = "the app has no SingletonTask" if not app.leases else "socket_timeout unknown"
        return Finding("socket-timeout", INFO, found)
    task, lease = min(app.leases.items(), key=lambda item: item[1])
    limit = lease / TICKS
    shown = "none" if math.isinf(app.socket_timeout) else f"{app.socket_timeout:g} s"
    if app.socket_timeout <= limit:
        return Finding(
            "socket-timeout",
            OK,
            f"socket_timeout {shown} <= a third of the shortest lock_lease ({task}: {lease:g} s)",
        )
    return Finding(
        "socket-timeout",
        ERROR,
        f"socket_timeout {shown} is above a third of the shortest lock_lease ({task}: {lease:g} s)",
        breaks="a renewal that waits that long for its reply lets the lease run out "
        "meanwhile: another run takes the lock while this one still runs",
        fix=f"socket_timeout <= {limit:g} s (singleton_lock_client_kwargs or the URL's "
        f"?socket_timeout=), or lock_lease >= {TICKS * app.socket_timeout:g} s",
    )


def check_visibility(app: AppFacts) -> Finding:
    """A Redis broker redelivers a message not acknowledged within ``visibility_timeout``."""
    if not app.from_app:
        return Finding("visibility-timeout", INFO, NEEDS_APP)
    if app.visibility_timeout is None:
        return Finding("visibility-timeout", INFO, "the broker is not Redis: not checked")
    vt = app.visibility_timeout
    late = {name: app.leases[name] for name in app.acks_late if name in app.leases}
    short = sorted(name for name, lease in late.items() if vt < lease)
    countdown = app.longest_countdown
    problems = []
    if short:
        problems.append(f"below lock_lease of acks_late task(s) {', '.join(short)}")
    if countdown is not None and vt < countdown:
        problems.append(f"below the longest countdown/eta in use ({countdown:g} s)")
    if not problems:
        known = "" if countdown is not None else " (countdowns/etas in use not known)"
        return Finding("visibility-timeout", OK, f"visibility_timeout {vt:g} s{known}")
    return Finding(
        "visibility-timeout",
        WARNING,
        f"visibility_timeout {vt:g} s is " + " and ".join(problems),
        breaks="the broker delivers a second copy of such a message while the first still "
        "runs or waits: the package keeps the copy from running beside it (re-queued with "
        "a countdown while the original holds the lock, dropped by its done mark once the "
        "call ended), at the cost of extra deliveries, a re-send every few seconds per copy "
        "and done marks kept two visibility timeouts",
        fix="broker_transport_options = {'visibility_timeout': S} with S above the longest "
        "lock_lease of an acks_late task and the longest countdown/eta",
    )


def parse_version(version: str) -> tuple[int, ...]:
    """``"7.0.15"`` -> (7, 0, 15); unreadable parts stop the tuple."""
    numbers: list[int] = []
    for part in version.split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def check_version(server: ServerFacts) -> Finding:
    """The scripts need Redis 5.0; a Cluster's waiters prefer 7.0 (sharded pub/sub)."""
    if server.version is None:
        return Finding("version", INFO, "Redis version unknown")
    version = parse_version(server.version)
    need = ".".join(map(str, MIN_REDIS))
    if version < MIN_REDIS:
        return Finding(
            "version",
            ERROR,
            f"Redis {server.version}",
            breaks=f"the lock scripts need Redis {need} or later (they read the server "
            "clock, then write): every acquire fails",
            fix=f"upgrade Redis to {need} or later",
        )
    if server.mode == "cluster" and version < SHARDED_PUBSUB_REDIS:
        return Finding(
            "version",
            INFO,
            f"Redis {server.version}: no sharded pub/sub",
            fix="Redis 7 lets a Cluster wake waiters on their slot's node only (SPUBLISH) "
            "instead of on every node",
        )
    return Finding("version", OK, f"Redis {server.version} (the scripts need {need})")


def check_cluster(server: ServerFacts) -> Finding:
    """A Cluster must be ``ok`` with every slot covered, or some locks cannot be taken."""
    if server.mode != "cluster":
        return Finding("cluster", OK, f"not a Cluster ({server.mode})")
    slots = server.cluster_slots_ok
    if server.cluster_state == "ok" and slots == CLUSTER_SLOTS:
        return Finding("cluster", OK, f"cluster_state ok, all {CLUSTER_SLOTS} slots covered")
    return Finding(
        "cluster",
        ERROR,
        f"cluster_state {server.cluster_state}, {slots} of {CLUSTER_SLOTS} slots ok",
        breaks="locks whose names hash to an uncovered slot cannot be taken, renewed or released",
        fix="assign the missing slots (redis-cli --cluster fix) and bring failed nodes back",
    )


def check_key_usage(usage: KeyUsage) -> Finding:
    """What the package keeps in Redis: never a fault, but a leak shows up here."""
    total = sum(kind.keys for kind in usage.kinds)
    size = sum(kind.bytes for kind in usage.kinds)
    capped = f" (stopped after {usage.scanned} keys: more exist)" if usage.capped else ""
    return Finding(
        "keys",
        INFO,
        f"{total} key(s), {size} bytes under the prefix{capped}",
        data={
            "capped": usage.capped,
            "scanned": usage.scanned,
            "kinds": [asdict(kind) for kind in usage.kinds],
        },
    )


def check_workers(app: AppFacts) -> Finding:
    """Worker node names must be unique: a restarted worker frees the holds its previous
    life left under its name, so two live workers of one name would free each other's."""
    if not app.from_app:
        return Finding("workers", INFO, NEEDS_APP)
    if app.workers is None:
        return Finding("workers", INFO, "workers not asked (--timeout 0)")
    if not app.workers:
        if app.remote_control is False:
            return Finding(
                "workers",
                WARNING,
                "worker_enable_remote_control is off",
                breaks="celery locks cannot ask workers which tasks they run, so a lock "
                "without a heartbeat is never shown stale by worker evidence",
                fix="worker_enable_remote_control = True",
            )
        return Finding("workers", INFO, "no worker answered")
    seen: dict[str, int] = {}
    for name in app.workers:
        seen[name] = seen.get(name, 0) + 1
    twice = sorted(name for name, count in seen.items() if count > 1)
    data = {"workers": sorted(seen)}
    if twice:
        return Finding(
            "workers",
            ERROR,
            f"node name(s) used by more than one worker: {', '.join(twice)}",
            breaks="a worker starting under a name frees the holds its previous life left "
            "under that name: it frees a live worker's locks instead",
            fix="give each worker its own name (celery worker -n name@%h)",
            data=data,
        )
    return Finding("workers", OK, f"{len(seen)} worker(s), each name unique", data=data)


def diagnose(server: ServerFacts, app: AppFacts, usage: KeyUsage | None) -> list[Finding]:
    """Every check, in the order the docs list them."""
    findings = [
        check_eviction(server),
        check_restarts(server),
        check_failover(server, app),
        check_socket_timeout(app),
        check_visibility(app),
        check_version(server),
        check_cluster(server),
    ]
    if usage is not None:
        findings.append(check_key_usage(usage))
    findings.append(check_workers(app))
    return findings


def failed(findings: Sequence[Finding]) -> bool:
    """Whether any finding breaks a guarantee (what makes ``doctor`` exit non-zero)."""
    return any(finding.level == ERROR for finding in findings)


# -- reading the facts -------------------------------------------------------------------------


def read_server(redis: Any, url: str) -> ServerFacts:
    """The :class:`ServerFacts` of the lock Redis behind ``redis`` (a redis-py client) at
    ``url``. On a Cluster every primary is read and the worst one's facts are given (one
    that evicts, else one that would forget its locks on a restart), with ``CLUSTER
    INFO``. ``CONFIG`` may be renamed away or refused by ACLs (managed Redis often does):
    its facts are then None, never an error."""
    primaries = getattr(redis, "get_primaries", None)
    if primaries is None:
        scheme = url.partition("://")[0]
        return _read_node(redis, "sentinel" if "sentinel" in scheme else "standalone")
    nodes = [_read_node(node.redis_connection, "cluster") for node in primaries()]
    worst = next(
        (facts for facts in nodes if check_eviction(facts).level == ERROR),
        next((facts for facts in nodes if check_restarts(facts).level == WARNING), nodes[0]),
    )
    cluster_info = _fields(primaries()[0].redis_connection.execute_command("CLUSTER INFO"))
    return replace(
        worst,
        cluster_state=cluster_info.get("cluster_state"),
        cluster_slots_ok=int(cluster_info.get("cluster_slots_ok", 0)),
    )


def _read_node(server: Any, mode: str) -> ServerFacts:
    """The facts of one server: ``INFO`` and one ``CONFIG GET``."""
    info = server.info()
    try:
        # One call, every server version (several patterns in one CONFIG GET need 7.0).
        config = _decoded(server.config_get("*"))
    except ResponseError:
        config = {}
    maxmemory = config.get("maxmemory")
    return ServerFacts(
        version=str(info.get("redis_version")) if info.get("redis_version") else None,
        mode=mode,
        maxmemory=int(maxmemory) if maxmemory is not None else None,
        maxmemory_policy=config.get("maxmemory-policy"),
        appendonly=config.get("appendonly"),
        save=config.get("save"),
        connected_replicas=int(info.get("connected_slaves", 0)),
    )


def _decoded(reply: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(key): _text(value) for key, value in reply.items()}


def _fields(reply: Any) -> dict[str, str]:
    """``CLUSTER INFO``'s ``name:value`` lines as a dict (redis-py may have parsed them)."""
    if isinstance(reply, Mapping):
        return _decoded(reply)
    lines = _text(reply).splitlines()
    return dict(line.strip().partition(":")[::2] for line in lines if ":" in line)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: The kind of a key, by the first part after its hash tag (core/keys.py's layout).
KEY_KINDS: dict[str, str] = {
    "lock": "holds",
    "fence": "fencing counters",
    "queue": "fair waiters",
    "w": "fair waiters",
    "m": "fair waiters",
    "freed": "release traces",
    "undo": "release traces",
    "waiting": "wait marks",
    "done": "done marks",
}
#: A lease hash whose owner starts with this is a claim (kinds/lease.py's CLAIM_OWNER_PREFIX).
CLAIMS = "claims"


def key_kind(suffix: bytes) -> str:
    """The kind of a key from what follows its ``}:`` (``lock``, ``done:<id>``...); the
    shared kinds' own keys (``rw:...``, ``range:...``, ``sem:...``) are grouped by family."""
    head = suffix.split(b":", 1)[0].decode("utf-8", "replace")
    return KEY_KINDS.get(head, f"{head} (reader-writer, range, semaphore)")


def read_key_usage(
    redis: Any, prefix: str, *, max_keys: int = DEFAULT_MAX_KEYS, now_ms: int | None = None
) -> KeyUsage:
    """Count the keys under ``prefix`` by kind (at most ``max_keys``: a SCAN, then one
    pipeline of MEMORY USAGE, OBJECT IDLETIME, PTTL per page of keys). A lease hash whose
    owner is a claim's counts as a claim; with ``now_ms`` (the server's clock), the age of
    the oldest hold and claim is given too."""
    pattern = escape_glob(prefix.encode()) + b"{*}:*"
    keys: list[bytes] = []
    capped = False
    for key in redis.scan_iter(match=pattern, count=BATCH):
        if len(keys) >= max_keys:
            capped = True
            break
        keys.append(key)
    keys = list(dict.fromkeys(keys))
    totals: dict[str, dict[str, Any]] = {}
    for start in range(0, len(keys), BATCH):
        page = keys[start : start + BATCH]
        pipe = redis.pipeline(transaction=False)
        for key in page:
            pipe.execute_command("MEMORY USAGE", key)
            pipe.execute_command("OBJECT IDLETIME", key)
            pipe.pttl(key)
            # A lease hash tells a hold from a claim by its owner (packed or not).
            if _suffix(prefix, key) == b"lock":
                pipe.hgetall(key)
            else:
                pipe.exists(key)
        replies = pipe.execute(raise_on_error=False)
        for n, key in enumerate(page):
            size, idle, pttl, owner = replies[4 * n : 4 * n + 4]
            kind = key_kind(_suffix(prefix, key))
            age = None
            if kind == "holds" and isinstance(owner, dict):
                fields = flatten(owner)
                if _is_claim(fields):
                    kind = CLAIMS
                acquired = fields.get(b"acquired_ms")
                if now_ms is not None and isinstance(acquired, bytes) and acquired.isdigit():
                    age = max(0.0, (now_ms - int(acquired)) / 1000)
            total = totals.setdefault(
                kind,
                {
                    "keys": 0,
                    "bytes": 0,
                    "oldest_idle_s": None,
                    "no_expiry": 0,
                    "oldest_age_s": None,
                },
            )
            if age is not None:
                total["oldest_age_s"] = max(age, total["oldest_age_s"] or 0.0)
            total["keys"] += 1
            total["bytes"] += size if isinstance(size, int) else 0
            if isinstance(idle, int):
                total["oldest_idle_s"] = max(idle, total["oldest_idle_s"] or 0)
            total["no_expiry"] += pttl == -1
    kinds = [KindUsage(kind, **values) for kind, values in sorted(totals.items())]
    return KeyUsage(kinds, scanned=len(keys), capped=capped)


def _suffix(prefix: str, key: bytes) -> bytes:
    """What follows the hash tag's ``}:``: after the prefix, the tag's braces are the only
    ones in a key (core/keys.py)."""
    return key[len(prefix.encode()) :].partition(b"}:")[2]


def _is_claim(fields: dict[bytes, Any]) -> bool:
    """Whether the fields of a lease hash (flattened: core/holder.py) are a claim's (its
    owner starts with ``claim:``)."""
    owner = fields.get(b"owner")
    return isinstance(owner, bytes) and owner.startswith(CLAIM_OWNER_PREFIX.encode())
