"""Numbers as markdown table cells. A "±" is a standard deviation and appears only where there are
at least two values to take it over (repeats, samples or seeds; each table says which)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def fmt(v: float | None, spec: str = "{:.2f}") -> str:
    """The number in `spec`, or '—' where there is none."""
    return "—" if v is None else spec.format(v)


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not None (None for none)."""
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def mean_std(values: list, digits: int = 2) -> str:
    """'mean ± sample std' of the values that are not None; the mean alone for one value; '—' for none."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.fmean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def mean_and_std(values: list[float]) -> tuple[float, float]:
    """(mean, sample std) of at least one value; the std of one value is 0."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
