"""How the lock commands print: an aligned table (colored for a person) or JSON; the
doctor's findings as text or one JSON object."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone

import click

from ..admin import CLEARED, LIVE, QUEUED, RELEASE_DELAY, RESUMED, STALE, LockInfo, skipped_note
from ..admin.doctor import ERROR, INFO, LEVELS, OK, WARNING, Finding
from ..admin.prefixes import Prefixes

#: Color and boldness of each state.
STATE_STYLES = {
    LIVE: ("green", False),
    QUEUED: ("cyan", False),
    STALE: ("red", True),
    RELEASE_DELAY: ("yellow", False),
}
#: Color of each level of a doctor's finding.
LEVEL_STYLES = {
    ERROR: ("red", True),
    WARNING: ("yellow", True),
    OK: ("green", False),
    INFO: (None, False),
}
#: Columns of the doctor's key-usage table.
KEY_HEADERS = ("KIND", "KEYS", "BYTES", "OLDEST", "OLDEST IDLE", "NO EXPIRY")
#: Width the doctor's text wraps at.
DOCTOR_WIDTH = 100
HEADERS = ("NAME", "KIND", "STATE", "AGE", "EXPIRES", "HEARTBEAT", "HOLDER", "TASK", "EVIDENCE")


def to_json(infos: Sequence[LockInfo]) -> str:
    """The ``--json`` document: a list of lock objects (docs/admin.md)."""
    return json.dumps(
        [info.to_dict() for info in infos], indent=2, ensure_ascii=False, allow_nan=False
    )


def show_list(infos: Sequence[LockInfo], *, as_json: bool, color: bool) -> None:
    """Print ``infos`` as JSON, or as a table (nothing but a note on stderr when empty)."""
    if as_json:
        click.echo(to_json(infos))
        return
    if not infos:
        click.echo("no locks", err=True)
        return
    rows = [HEADERS, *(_row(info) for info in infos)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    for n, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        if color and n == 0:
            cells = [click.style(cell, bold=True) for cell in cells]
        elif color:
            cells[2] = _styled(cells[2], infos[n - 1].state)
        click.echo("  ".join(cells).rstrip(), color=color)


def show_skipped(infos: Sequence[LockInfo]) -> None:
    """Say on stderr how many keys the listing of ``infos`` (an ``admin.Listing``) skipped as
    not of the expected type, if any: stdout keeps its table or JSON list as documented,
    and the count reaches the person or the script's log either way."""
    skipped = getattr(infos, "skipped", 0)
    if skipped:
        click.echo(skipped_note(skipped), err=True)


def show_other_prefixes(prefixes: Prefixes, prefix: str, *, app: bool) -> None:
    """After an empty listing, say on stderr which other prefixes hold this package's locks
    and how to list them: ``--prefix``, or with ``app`` (``celery locks``, which reads the
    prefix from the app) the ``singleton_lock_prefix`` setting. Nothing if there are none."""
    others = [(found, count) for found, count in prefixes.found if found != prefix]
    if not others:
        return
    where = ", ".join(f"{found!r} ({count} key(s))" for found, count in others)
    bound = f" (among the first {prefixes.scanned} keys)" if prefixes.capped else ""
    first = others[0][0]
    how = (
        f"set singleton_lock_prefix = {first!r} in the app's configuration"
        if app
        else f"pass --prefix {shlex.quote(first)}"
    )
    click.echo(
        f"this package's locks are under prefix {where}{bound}, not {prefix!r}: to list "
        f"them, {how}",
        err=True,
    )


def show_round(infos: Sequence[LockInfo], *, as_json: bool, color: bool) -> None:
    """One round of ``list --watch``: a header with the time (UTC) and the count of each
    state, then the table; with ``as_json``, the list on one line (JSON Lines)."""
    if as_json:
        click.echo(json.dumps([info.to_dict() for info in infos], ensure_ascii=False))
        return
    counts = Counter(info.state for info in infos)
    states = ", ".join(
        _styled(f"{counts[state]} {state}", state) if color else f"{counts[state]} {state}"
        for state in STATE_STYLES
    )
    now = datetime.now(timezone.utc).strftime("%H:%M:%S UTC")
    click.echo(f"{now}  {len(infos)} lock(s): {states}", color=color)
    if infos:
        show_list(infos, as_json=False, color=color)
    else:
        click.echo("no locks")
    click.echo("")


def show_details(infos: Sequence[LockInfo], *, as_json: bool, color: bool) -> None:
    """Print every field of each holder, one ``field: value`` line each."""
    if as_json:
        click.echo(to_json(infos))
        return
    for n, info in enumerate(infos):
        if n:
            click.echo("")
        fields = info.to_dict()
        width = max(len(key) for key in fields)
        for key, value in fields.items():
            if key.endswith("_s"):
                text = _seconds(value)
            elif isinstance(value, dict):
                text = json.dumps(value, ensure_ascii=False, sort_keys=True)
            else:
                text = _plain(value)
            if key == "state" and color:
                text = _styled(text, info.state)
            click.echo(f"{key.ljust(width)}  {text}", color=color)


def clear_line(info: LockInfo, outcome: int) -> str:
    """One line of ``clear`` output for ``outcome`` (admin.CLEARED, GONE, TAKEN, RESUMED)."""
    what = f"{_name(info)} ({info.kind}, token {info.token})"
    if outcome == CLEARED:
        return f"cleared {what}"
    if outcome == RESUMED:
        return f"left {what} alone: heartbeat resumed since it was listed stale"
    return f"left {what} alone: released, expired or taken again since it was listed"


def doctor_json(findings: Sequence[Finding], *, url: str, prefix: str) -> str:
    """The ``doctor --json`` document (docs/admin.md): ``ok`` is what the exit status says."""
    return json.dumps(
        {
            "ok": not any(finding.level == ERROR for finding in findings),
            "url": url,
            "prefix": prefix,
            "counts": {level: sum(f.level == level for f in findings) for level in LEVELS},
            "findings": [finding.to_dict() for finding in findings],
        },
        indent=2,
        ensure_ascii=False,
        allow_nan=False,
    )


def show_findings(
    findings: Sequence[Finding], *, url: str, prefix: str, as_json: bool, color: bool
) -> None:
    """Print the doctor's findings: per finding its level, check and what was found, then
    what breaks and the fix; last, a count of each level."""
    if as_json:
        click.echo(doctor_json(findings, url=url, prefix=prefix))
        return
    click.echo(f"Redis {url}, prefix {prefix!r}")
    for finding in findings:
        level = finding.level.upper().ljust(8)
        if color:
            fg, bold = LEVEL_STYLES.get(finding.level, (None, False))
            level = click.style(level, fg=fg, bold=bold)
        click.echo(f"{level}{finding.check}: {finding.found}", color=color)
        for label, text in (("breaks", finding.breaks), ("fix", finding.fix)):
            if text:
                indent = " " * 8
                click.echo(
                    click.wrap_text(
                        f"{label}: {text}",
                        DOCTOR_WIDTH,
                        initial_indent=indent,
                        subsequent_indent=indent + "  ",
                    )
                )
        if finding.check == "keys" and finding.data and finding.data["kinds"]:
            _key_table(finding.data["kinds"])
    counts = Counter(finding.level for finding in findings)
    summary = ", ".join(f"{counts[level]} {level}" for level in LEVELS)
    click.echo(f"\n{summary}" + (": a guarantee is broken" if counts[ERROR] else ""))


def _key_table(kinds: Sequence[dict[str, object]]) -> None:
    rows = [KEY_HEADERS] + [
        (
            str(kind["kind"]),
            str(kind["keys"]),
            str(kind["bytes"]),
            _seconds(kind["oldest_age_s"]),
            _seconds(kind["oldest_idle_s"]),
            str(kind["no_expiry"]),
        )
        for kind in kinds
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(KEY_HEADERS))]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        click.echo(" " * 8 + "  ".join(cells).rstrip())


def _row(info: LockInfo) -> tuple[str, ...]:
    beat = "off" if info.heartbeat is False else _seconds(info.heartbeat_age_s)
    holder = "-" if info.host is None else f"{info.host}:{_plain(info.pid)}"
    return (
        _name(info),
        _kind(info),
        info.state,
        _seconds(info.age_s),
        _seconds(info.lease_remaining_s),
        beat,
        holder,
        _task(info),
        info.evidence,
    )


def _kind(info: LockInfo) -> str:
    if info.mode is not None:
        return f"{info.kind}/{info.mode}"
    if info.limit is not None:
        return f"{info.kind}/{info.limit}"  # a permit, and how many its semaphore allows
    return info.kind


def _styled(text: str, state: str) -> str:
    fg, bold = STATE_STYLES.get(state, (None, False))
    return click.style(text, fg=fg, bold=bold)


def _name(info: LockInfo) -> str:
    if info.lo is None and info.hi is None:
        return info.name
    return f"{info.name} [{_plain(info.lo)}, {_plain(info.hi)}]"


def _task(info: LockInfo) -> str:
    if info.task_name is None and info.task_id is None:
        return "-"
    return f"{info.task_name or '?'}[{info.task_id or '?'}]"


def _plain(value: object) -> str:
    return "-" if value is None else str(value)


def _seconds(value: object) -> str:
    """12.3s, 4m05s, 2h07m, 3d04h: short enough for a table column."""
    if not isinstance(value, int | float):
        return _plain(value)
    seconds = float(value)
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
