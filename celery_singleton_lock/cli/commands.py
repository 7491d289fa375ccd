"""``celery -A proj locks ...`` and ``python -m celery_singleton_lock ...``: list, show and
clear locks, and check the deployment (``doctor``; see docs/admin.md).

Both front ends run the same four commands; they differ only in where the Redis URL comes
from and in the evidence available (only ``celery locks`` has an app whose workers and result
backend can be asked). Celery imports every plugin's CLI module at start, so this one imports
only click and celery.bin.base at module level; the lock core loads inside the commands.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from celery.bin.base import CeleryCommand, CeleryOption, handle_preload_options
from celery.signals import worker_init

from ..core.keys import DEFAULT_PREFIX

#: ``doctor --max-keys`` default (admin/doctor.py's DEFAULT_MAX_KEYS, which this module
#: does not import at start: Celery imports it in every ``celery`` program).
DEFAULT_MAX_KEYS = 100_000

if TYPE_CHECKING:
    from ..admin import Check, LockInfo
    from ..admin.doctor import AppFacts
    from ..client import LockClient

F = TypeVar("F", bound=Callable[..., Any])

#: Celery's decorator (untyped) with a type: passes preload options to the app's receivers
#: instead of crashing the group on them.
preload_options: Callable[[F], F] = handle_preload_options

#: Exit codes (docs/admin.md).
EXIT_OK, EXIT_NOTHING, EXIT_ERROR = 0, 1, 2
#: ``doctor``: a check found something that breaks a guarantee (the code of "nothing
#: matched" for the other commands: both say "not what you hoped", neither is a usage error).
EXIT_FAILED = 1
#: Seconds ``celery locks`` waits for workers to say which tasks they run.
DEFAULT_TIMEOUT = 1.0
#: Seconds between two listings of ``list --watch`` without a value.
WATCH_INTERVAL = 2.0
_SESSION = "celery_singleton_lock.session"


@dataclass(frozen=True)
class Session:
    """What a command needs from its front end."""

    url: str | None
    prefix: str
    app: Any = None  # the Celery app of ``celery -A``: workers and result backend to ask
    timeout: float = DEFAULT_TIMEOUT
    no_color: bool = False
    #: Keyword arguments for the redis-py client, as the app's tasks connect (TLS options
    #: taken from ``broker_use_ssl``, ``singleton_lock_client_kwargs``).
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    #: Where the URL came from, named by errors that mean the URL must change (a password).
    url_source: str = "--url (or $REDIS_URL)"

    def __repr__(self) -> str:
        from ..client import mask_password

        url = None if self.url is None else mask_password(self.url)
        return f"Session(url={url!r}, prefix={self.prefix!r}, app={self.app!r})"

    def connect(self) -> LockClient:
        from ..client import LockClient

        if not self.url:  # an app's session always has one (AppSettings refuses none)
            raise click.UsageError(
                "no Redis URL: pass --url redis://HOST:PORT/DB (or set REDIS_URL); "
                "python -m celery_singleton_lock has no Celery app to read it from"
            )
        # Short socket timeouts: an admin command should fail fast, naming the server (unless
        # the app's own client settings say otherwise).
        options: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 10}
        options.update(self.client_kwargs)
        client = LockClient.from_url(self.url, prefix=self.prefix, **options)
        client.connection.url_argument = self.url_source
        return client

    def checks(self, *, purged: bool = False) -> list[Check]:
        """What the app's workers, result backend and broker say of the holders (in this
        order: where a claim's message is comes last); ``purged``: see ``clear --purged``."""
        if self.app is None:
            return []
        from ..celery.evidence import backend_check, queue_check, worker_check

        found = [
            worker_check(self.app, timeout=self.timeout),
            backend_check(self.app),
            queue_check(self.app, timeout=self.timeout, purged=purged),
        ]
        return [check for check in found if check is not None]

    def app_facts(self) -> AppFacts:
        """What the app says for ``doctor`` (nothing without an app)."""
        from ..admin.doctor import AppFacts

        if self.app is None:
            return AppFacts()
        from ..celery.doctor import app_facts

        return app_facts(self.app, timeout=self.timeout)


def app_session(app: Any, *, timeout: float, no_color: bool) -> Session:
    """Where a Celery app's locks live: ``singleton_lock_url`` (else a Redis broker URL) and
    ``singleton_lock_prefix``, read exactly as the app's tasks read them (celery/options.py)."""
    from ..celery.options import AppSettings
    from ..exceptions import ConfigurationError

    try:
        settings = AppSettings.from_conf(app.conf)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    return Session(
        url=settings.url,
        prefix=settings.prefix,
        app=app,
        timeout=timeout,
        no_color=no_color,
        client_kwargs=dict(settings.client_kwargs),
        url_source=settings.url_setting,
    )


@contextmanager
def _connected(ctx: click.Context) -> Iterator[tuple[Session, LockClient]]:
    """The session and a client; lock errors end the command with exit 2 and a message
    naming the server (without its password)."""
    from ..exceptions import LockError

    session: Session = ctx.meta[_SESSION]()
    # `celery locks list --timeout 0`: the group's option, typed after the sub-command.
    if ctx.params.get("timeout") is not None:
        session = replace(session, timeout=ctx.params["timeout"])
    try:
        client = session.connect()
    except LockError as exc:
        _fail(ctx, str(exc))
    try:
        yield session, client
    except LockError as exc:
        _fail(ctx, str(exc))
    finally:
        client.close()


def _fail(ctx: click.Context, message: str) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    ctx.exit(EXIT_ERROR)


class LocksGroup(click.Group):
    """A click group whose options are shown in Celery's help groups."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        CeleryCommand.format_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)


# -- the commands (shared by both front ends) ------------------------------------------------


def _option(group: str, *decls: str, **attrs: Any) -> Callable[[F], F]:
    """An option shown under ``group`` in Celery's help."""
    return click.option(*decls, cls=CeleryOption, help_group=group, **attrs)


def _timeout_option(group: str) -> Callable[[F], F]:
    """The group's ``--timeout``, also taken after the sub-command (where users type it)."""
    return _option(
        group,
        "--timeout",
        type=click.FloatRange(min=0),
        default=None,
        help="Seconds to wait for workers to say which tasks they run (0: do not ask; "
        "celery locks only).",
    )


def _json_option(group: str) -> Callable[[F], F]:
    return _option(
        group,
        "--json",
        "as_json",
        is_flag=True,
        help="Print a JSON list of lock objects instead of a table.",
    )


@click.command("list", cls=CeleryCommand)
@_option(
    "List Options",
    "--pattern",
    metavar="GLOB",
    help="Only locks whose NAME matches this glob (case-sensitive).",
)
@_option("List Options", "--stale", is_flag=True, help="Only stale locks.")
@_json_option("List Options")
@_option(
    "List Options",
    "--watch",
    metavar="[SECONDS]",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=WATCH_INTERVAL,
    default=None,
    help=f"List again every SECONDS (default {WATCH_INTERVAL:g}) until Ctrl-C: redrawn in "
    "place on a terminal, one table (or one JSON line) after another when piped.",
)
@_timeout_option("List Options")
@click.pass_context
def list_locks(
    ctx: click.Context,
    pattern: str | None,
    stale: bool,
    as_json: bool,
    watch: float | None,
    timeout: float | None,
) -> None:
    """List the locks, who holds them and whether they are live, stale or in a release delay.

    Exit 1 when no lock matched (without --watch).
    """
    from .. import admin
    from . import output

    def listed(session: Session, client: LockClient) -> admin.Listing:
        infos = admin.list_locks(client, pattern, checks=session.checks())
        return infos.only(lambda info: info.state == admin.STALE) if stale else infos

    with _connected(ctx) as (session, client):
        if watch is not None:
            _watch(lambda: listed(session, client), watch, as_json, _color(session))
            ctx.exit(EXIT_OK)
        infos = listed(session, client)
        # Only an empty, unfiltered listing looks further: the common path costs nothing, and
        # a filter that matched nothing is no sign of a wrong prefix.
        elsewhere = None
        if not infos and pattern is None and not stale:
            from ..admin.prefixes import find_prefixes

            elsewhere = find_prefixes(client)
    output.show_list(infos, as_json=as_json, color=_color(session))
    output.show_skipped(infos)
    if elsewhere is not None:
        output.show_other_prefixes(elsewhere, session.prefix, app=session.app is not None)
    ctx.exit(EXIT_OK if infos else EXIT_NOTHING)


def _watch(
    listed: Callable[[], list[LockInfo]], interval: float, as_json: bool, color: bool
) -> None:
    """List every ``interval`` seconds until Ctrl-C (which ends the command quietly)."""
    from . import output

    # Redrawn in place only for a person at a terminal; piped output keeps every round.
    redraw = sys.stdout.isatty() and not as_json
    try:
        while True:
            started = time.monotonic()
            infos = listed()
            if redraw:
                click.clear()
            output.show_round(infos, as_json=as_json, color=color)
            output.show_skipped(infos)
            if not redraw:
                sys.stdout.flush()
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        click.echo("")


@click.command("show", cls=CeleryCommand)
@click.argument("name")
@_json_option("Show Options")
@_timeout_option("Show Options")
@click.pass_context
def show_lock(ctx: click.Context, name: str, as_json: bool, timeout: float | None) -> None:
    """Show every detail of lock NAME (each holder, for shared locks). Exit 1 if no lock
    has that name."""
    from . import output

    with _connected(ctx) as (session, client):
        infos = _named(client, [name], session.checks())
    output.show_details(infos, as_json=as_json, color=_color(session))
    if not infos:
        click.echo(f"no lock named {name!r}", err=True)
    ctx.exit(EXIT_OK if infos else EXIT_NOTHING)


@click.command("clear", cls=CeleryCommand)
@click.argument("names", metavar="NAME...", nargs=-1)
@_option("Clear Options", "--stale", is_flag=True, help="Every stale lock.")
@_option(
    "Clear Options",
    "--unqueued",
    is_flag=True,
    help="Every claim whose message is no longer queued (after `celery purge`, a lost "
    "message): its task is over, or (Redis broker) it is in no queue and on no worker.",
)
@_option(
    "Clear Options",
    "--purged",
    is_flag=True,
    help="With --unqueued, on a broker whose queues cannot be read (RabbitMQ, SQS): you "
    "purged the queues, so a claim that no worker answering within --timeout holds goes too.",
)
@_option("Clear Options", "--all", "all_", is_flag=True, help="Every lock.")
@_option(
    "Clear Options",
    "--pattern",
    metavar="GLOB",
    help="With --stale, --unqueued or --all: only locks whose NAME matches this glob.",
)
@_option(
    "Clear Options",
    "--force",
    is_flag=True,
    help="Also clear live locks (their holders lose them at their next heartbeat).",
)
@_option("Clear Options", "--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_timeout_option("Clear Options")
@click.pass_context
def clear_locks(
    ctx: click.Context,
    names: tuple[str, ...],
    stale: bool,
    unqueued: bool,
    purged: bool,
    all_: bool,
    pattern: str | None,
    force: bool,
    yes: bool,
    timeout: float | None,
) -> None:
    """Clear locks: the named ones, every stale one, every claim of a message no longer
    queued, or all. Each is cleared only if it still has the holder that was listed, so a
    lock taken again meanwhile (a claim taken over by its run) is left alone, and (without
    --force, always with --stale and --unqueued) a lock listed stale only if its heartbeat
    has not resumed since.

    Exit 1 when nothing matched (or the prompt was declined), 2 when a live lock would need
    --force or there is no terminal to confirm on and no --yes.
    """
    from .. import admin
    from . import output

    if (1 if names else 0) + stale + unqueued + all_ != 1:
        raise click.UsageError(
            "give lock NAMEs, --stale, --unqueued or --all (exactly one of them)"
        )
    if pattern is not None and names:
        raise click.UsageError("--pattern goes with --stale, --unqueued or --all, not with NAMEs")
    if purged and not unqueued:
        raise click.UsageError("--purged goes with --unqueued")
    with _connected(ctx) as (session, client):
        if unqueued and session.app is None:
            _fail(ctx, "--unqueued needs the app's broker and workers: use celery -A APP locks")
        if names:
            infos = _named(client, names, session.checks())
        else:
            infos = admin.list_locks(client, pattern, checks=session.checks(purged=purged))
            output.show_skipped(infos)
            if stale or unqueued:
                infos = [info for info in infos if info.state == admin.STALE]
            if unqueued:
                claim = admin.CLAIM_OWNER_PREFIX
                infos = [info for info in infos if (info.owner or "").startswith(claim)]
        if not infos:
            click.echo("no lock matched; nothing cleared", err=True)
            ctx.exit(EXIT_NOTHING)
        live = [info for info in infos if info.state in (admin.LIVE, admin.QUEUED)]
        if live and not force:
            listed = ", ".join(f"{info.name!r} ({info.evidence})" for info in live)
            _fail(
                ctx,
                f"refusing to clear {len(live)} live or queued lock(s) without --force: {listed}",
            )
        _confirm(ctx, infos, yes=yes, color=_color(session))
        cleared = 0
        for info in infos:
            # Re-checked at the clear: a lock listed stale whose heartbeat resumed since (a
            # paused holder, this prompt left open) is left alone; --force on named locks
            # clears whatever they are.
            outcome = admin.clear_listed(client, info, force=force and not (stale or unqueued))
            cleared += outcome == admin.CLEARED
            click.echo(output.clear_line(info, outcome))
    click.echo(f"cleared {cleared} of {len(infos)} lock(s)")
    ctx.exit(EXIT_OK if cleared else EXIT_NOTHING)


@click.command("doctor", cls=CeleryCommand)
@_option(
    "Doctor Options",
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (every finding) instead of text.",
)
@_option(
    "Doctor Options",
    "--max-keys",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_KEYS,
    show_default=True,
    help="Read at most this many keys under the prefix for the key-usage report.",
)
@_timeout_option("Doctor Options")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, max_keys: int, timeout: float | None) -> None:
    """Check that the deployment gives the guarantees the docs promise: eviction,
    persistence, failover, timeouts, Redis version and Cluster, what the package keeps in
    Redis, and (celery locks) the workers. Each finding says what breaks and the fix.

    Exit 0 when no check found an error, 1 when one did (a deploy gate), 2 when Redis
    could not be reached.
    """
    from .. import admin
    from ..admin import doctor as checks
    from . import output

    with _connected(ctx) as (session, client):
        call = client.connection.call
        server = call(checks.read_server, client.redis, client.url)
        now_ms = admin.server_ms(client)
        usage = call(
            checks.read_key_usage, client.redis, client.prefix, max_keys=max_keys, now_ms=now_ms
        )
        facts = session.app_facts()
    findings = checks.diagnose(server, facts, usage)
    output.show_findings(
        findings, url=client.url, prefix=client.prefix, as_json=as_json, color=_color(session)
    )
    ctx.exit(EXIT_FAILED if checks.failed(findings) else EXIT_OK)


def _named(
    client: LockClient, names: tuple[str, ...] | list[str], checks: list[Check]
) -> list[LockInfo]:
    """Holders of exactly these names (read by key, no SCAN for leases), then checked."""
    from .. import admin

    infos = [
        info
        for name in dict.fromkeys(names)
        for info in admin.list_locks(client, admin.escape(name))
        if info.name == name
    ]
    for check in checks:
        infos = check(infos)
    return infos


def _interactive() -> bool:
    """Whether a person can answer a prompt (tests replace this)."""
    return sys.stdin.isatty()


def _confirm(ctx: click.Context, infos: list[LockInfo], *, yes: bool, color: bool) -> None:
    from . import output

    if yes:
        return
    if not _interactive():
        _fail(ctx, "not clearing without confirmation: no terminal to ask on; pass --yes")
    output.show_list(infos, as_json=False, color=color)
    # default="" lets a bare Enter decline instead of asking again; show_default=False keeps
    # click from printing that empty default as "[]" after the question.
    answer = click.prompt(
        f"Type 'yes' to clear these {len(infos)} lock(s)", default="", show_default=False
    )
    if answer.strip().lower() != "yes":
        click.echo("not confirmed; nothing cleared", err=True)
        ctx.exit(EXIT_NOTHING)


def _color(session: Session) -> bool:
    """Color only for a person: stdout is a terminal and NO_COLOR is unset."""
    return not session.no_color and "NO_COLOR" not in os.environ and sys.stdout.isatty()


# -- front end 1: the `celery locks` sub-command ---------------------------------------------


@click.group("locks", cls=LocksGroup)
@_option(
    "Lock Options",
    "--timeout",
    type=float,
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for workers to say which tasks they run (0: do not ask).",
)
@click.pass_context
@preload_options
def locks(ctx: click.Context, /, timeout: float, **kwargs: Any) -> None:
    """Inspect and clear the app's singleton locks (who holds what, live or stale), and
    check the deployment (doctor)."""
    obj = ctx.obj
    ctx.meta[_SESSION] = lambda: app_session(
        obj.app, timeout=timeout, no_color=bool(getattr(obj, "no_color", False))
    )


# -- front end 2: `python -m celery_singleton_lock`, no Celery app needed --------------------


@click.group("celery_singleton_lock", cls=LocksGroup)
@_option("Connection Options", "--url", envvar="REDIS_URL", help="Redis URL (default: $REDIS_URL).")
@_option(
    "Connection Options",
    "--prefix",
    default=DEFAULT_PREFIX,
    show_default=True,
    help="Key prefix the locks were made with.",
)
@click.pass_context
def main(ctx: click.Context, url: str | None, prefix: str) -> None:
    """Inspect and clear celery_singleton_lock locks in one Redis, and check that Redis
    (doctor); no Celery app needed."""
    ctx.meta[_SESSION] = lambda: Session(url=url, prefix=prefix)


for _command in (list_locks, show_lock, clear_locks, doctor):
    locks.add_command(_command)
    main.add_command(_command)


# -- an app that locks tasks by name -----------------------------------------------------------


def _lock_named_tasks(sender: Any = None, **_: Any) -> None:
    """``singleton_lock_tasks`` (celery/named_tasks.py) in a starting worker. Celery imports
    this module in every ``celery`` program, and no task of such an app need be a
    SingletonTask that would have added the worker step."""
    app = getattr(sender, "app", None)
    if app is not None and app.conf.get("singleton_lock_tasks", None):
        from ..celery.named_tasks import lock_named_tasks_at_worker_init

        lock_named_tasks_at_worker_init(app)


worker_init.connect(_lock_named_tasks, weak=False)
