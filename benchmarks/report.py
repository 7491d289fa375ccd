"""Tables: what every section returns, printed as aligned text or as Markdown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Table:
    title: str
    headers: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Columns right-aligned in text output (numbers); the rest are left-aligned.
    numeric: frozenset[int] = frozenset()

    def add(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])


def render_text(table: Table) -> str:
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if i in table.numeric else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [table.title, "=" * len(table.title), line(table.headers)]
    out.append("  ".join("-" * w for w in widths))
    out += [line(row) for row in table.rows]
    out += [f"  * {note}" for note in table.notes]
    return "\n".join(out)


def render_markdown(table: Table) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    rule = ["---:" if i in table.numeric else "---" for i in range(len(table.headers))]
    out = [f"**{table.title}**", "", line(table.headers), "| " + " | ".join(rule) + " |"]
    out += [line(row) for row in table.rows]
    if table.notes:
        out.append("")
        out += [f"- {note}" for note in table.notes]
    return "\n".join(out)


def verdict(passed: bool) -> str:
    return "PASS" if passed else "MISS"
