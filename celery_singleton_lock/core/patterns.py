"""Glob patterns over lock names: escaping a name, and the one name a pattern may spell."""

from __future__ import annotations

import re

_MAGIC = re.compile(r"([*?\[])")


def escape(name: str) -> str:
    """A glob pattern matching exactly ``name``."""
    return _MAGIC.sub(r"[\1]", name)


def literal_name(pattern: str) -> str | None:
    """The one name ``pattern`` matches if it has no wildcard (``[x]`` escapes allowed)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char in "*?":
            return None
        if char == "[":
            if pattern[i + 2 : i + 3] != "]" or pattern[i + 1 : i + 2] not in ("*", "?", "["):
                return None
            char, i = pattern[i + 1], i + 2
        out.append(char)
        i += 1
    return "".join(out)
