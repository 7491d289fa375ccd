"""Small statistics helpers shared by the sections."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest-rank: a value that was actually measured."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def paired_ratio(values: Sequence[float], base: Sequence[float]) -> float:
    """Median of per-round ratios of ``values`` to ``base``: the two measures of one round
    saw the same load of a shared machine."""
    return median([value / b for value, b in zip(values, base, strict=True)])
