"""Percentiles and the few summaries the figures need."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Summary:
    n: int
    p50: float
    p95: float
    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan)
        return cls(
            n=len(values),
            p50=percentile(values, 50),
            p95=percentile(values, 95),
            mean=statistics.fmean(values),
            low=min(values),
            high=max(values),
        )


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
