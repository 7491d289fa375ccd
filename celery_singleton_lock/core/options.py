"""The options of a lock, defined once: :class:`LockOptions` (``ttl``, ``heartbeat``,
``max_hold``, ``wait``, ``owner_info``, ``on_lost``) and a lease's extras (``fair``, and for the
sync lease ``owner`` and ``take_over``).

The factories and constructors that take them as keywords (``client.lease("job", ttl=30,
wait=5)``, ``Lease(client, "job", ttl=30)``, ``client.multi(names, ...)``) are written with
one parameter for them, an options object, and decorated by :func:`options_after` (or
:func:`options_after_two`): the caller still writes keywords, which mypy checks against the
fields of the class named there (their names, types and defaults), and the method receives
the object those keywords make. The values are checked, with the lock's name, by
:meth:`LockOptions.check` when the handle is made: ConfigurationError naming the first bad
one, before any Redis call.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, get_origin

from . import validate
from .handle_state import Options, check_options
from .holder import HOSTNAME
from .validate import HolderProcess

H = TypeVar("H")
P = ParamSpec("P")
O = TypeVar("O")  # noqa: E741
S = TypeVar("S")
A = TypeVar("A")
B = TypeVar("B")
R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class LockOptions(Generic[H]):
    """The options every lock handle takes (docs/lease.md), as given; ``H`` is the handle
    ``on_lost`` is called with."""

    #: Seconds the lock lasts unless renewed; the heartbeat renews it to this length.
    ttl: float = 30.0
    #: Whether the process's heartbeat renews it while held.
    heartbeat: bool = True
    #: Seconds after acquisition past which it is no longer renewed (None: never).
    max_hold: float | None = None
    #: Default seconds ``acquire`` waits for a busy lock (``math.inf``: forever).
    wait: float = 0.0
    #: Stored with the holder record (the admin tools show it).
    owner_info: dict[str, Any] | None = None
    #: Called with the handle when it is found lost.
    on_lost: Callable[[H], object] | None = None

    def check(self, name: object) -> Options:
        """These options and the lock's ``name``, checked in the constructors' order;
        ConfigurationError naming the first bad one."""
        return check_options(
            name, self.ttl, self.heartbeat, self.max_hold, self.wait, self.owner_info, self.on_lost
        )


@dataclass(frozen=True, kw_only=True)
class FairOptions(LockOptions[H]):
    """A lease's options: ``fair``, blocked acquires are handed the lease by releases,
    oldest first."""

    fair: bool = False

    def lease_extras(self) -> tuple[bool, str | None, str | None]:
        """``fair``, the fixed owner token and the owner token taken over, checked."""
        return validate.check_bool(self.fair, "fair"), None, None


@dataclass(frozen=True, kw_only=True)
class LeaseOptions(FairOptions[H]):
    """The sync lease's options: ``owner``, hold it under this owner token instead of a
    fresh one per acquisition; ``take_over``, an acquire also takes the name over from a
    hold under this owner token (see ``LockClient.lease``)."""

    owner: str | None = None
    take_over: str | None = None

    def lease_extras(self) -> tuple[bool, str | None, str | None]:
        fair = super().lease_extras()[0]
        owner = None if self.owner is None else validate.check_owner(self.owner, "owner")
        take_over = self.take_over
        take_over = None if take_over is None else validate.check_owner(take_over, "take_over")
        return fair, owner, take_over


@dataclass(frozen=True, kw_only=True)
class ProcessOptions:
    """Whose holds a supervisor releases (every ``release_holder``): run ``task_id`` in
    process ``pid`` on ``host`` (None: this machine), after a release delay of ``delay``
    seconds."""

    task_id: str
    pid: int
    host: str | None = None
    delay: float = 0.0

    def check(self) -> HolderProcess:
        """Checked (ConfigurationError naming the first bad one), the host filled in."""
        return validate.check_holder_process(
            self.task_id, self.pid, self.host, self.delay, HOSTNAME
        )


def options_only(
    make: Callable[P, O],
) -> Callable[[Callable[[S, O], R]], Callable[Concatenate[S, P], R]]:
    """:func:`options_after` for a method ``(self, options)``."""
    return functools.partial(_taking, make)


def options_after(
    make: Callable[P, O],
) -> Callable[[Callable[[S, A, O], R]], Callable[Concatenate[S, A, P], R]]:
    """A method ``(self, first, options)`` as callers call it: ``(self, first,
    **keywords)``, the keywords those of ``make`` (an options class), which makes the
    ``options`` the method receives."""
    return functools.partial(_taking, make)


def options_after_two(
    make: Callable[P, O],
) -> Callable[[Callable[[S, A, B, O], R]], Callable[Concatenate[S, A, B, P], R]]:
    """:func:`options_after` for a method ``(self, first, second, options)``: a
    constructor's ``(self, client, name, options)``."""
    return functools.partial(_taking, make)


def _taking(make: Callable[..., Any], method: Callable[..., R]) -> Callable[..., R]:
    @functools.wraps(method)
    def taking(self: Any, *positional: Any, **keywords: Any) -> R:
        return method(self, *positional, make(**keywords))

    # What help() and the docs show: the method's parameters, the options' keywords.
    signature = inspect.signature(method)
    fields = dataclasses.fields(get_origin(make) or make)  # type: ignore[arg-type]
    keywords = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if field.default is MISSING else field.default,
            annotation=field.type,
        )
        for field in fields
    ]
    parameters = [*list(signature.parameters.values())[:-1], *keywords]
    taking.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return taking
