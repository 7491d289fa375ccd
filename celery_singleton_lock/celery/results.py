"""What a skipped run returns, and how to recognise it (the task returns it, tests check it)."""

from __future__ import annotations

from typing import Any

#: The ``status`` of the result a skipped run returns.
SKIPPED = "skipped"
_RESULT_MARK = "__singleton_lock__"


def skipped_result(name: str, holder_task_id: str | None, reason: str = "") -> dict[str, Any]:
    """What a skipped run returns: a JSON-friendly dict that :func:`is_skipped` recognises.
    ``reason`` says what stood in the way, as the log line does (``held by task <id>``,
    ``in a release delay until <time>``, ...)."""
    return {_RESULT_MARK: SKIPPED, "lock": name, "holder_task_id": holder_task_id, "reason": reason}


def is_skipped(result: Any) -> bool:
    """True if ``result`` (a task's return value) says the run was skipped for its lock."""
    return isinstance(result, dict) and result.get(_RESULT_MARK) == SKIPPED
