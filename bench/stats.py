"""Small statistics for latency samples: percentiles with linear interpolation
(numpy's default "linear" method, defined for one sample), median, CDF points,
and a summary dict for result rows."""

from __future__ import annotations

import math
from typing import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks.

    For sorted x of length n: rank h = (n - 1) * q / 100, value
    x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    xs = sorted(samples)
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (h - lo) * (xs[hi] - xs[lo]))


def median(samples: Sequence[float]) -> float:
    return percentile(samples, 50)


def cdf(samples: Sequence[float], points: int = 0) -> list[tuple[float, float]]:
    """(value, fraction of samples <= value) pairs, one per sample in order; with
    POINTS > 0, at most that many, evenly spaced in rank (the last always kept)."""
    xs = sorted(samples)
    n = len(xs)
    pairs = [(float(x), (i + 1) / n) for i, x in enumerate(xs)]
    if points and n > points:
        step = n / points
        keep = sorted({min(n - 1, int(round((k + 1) * step)) - 1) for k in range(points)})
        pairs = [pairs[i] for i in keep]
    return pairs


def summary(samples: Sequence[float]) -> dict:
    """n, min, mean, p50, p90, p99, max (empty samples give just n=0)."""
    if not samples:
        return {"n": 0}
    return {"n": len(samples), "min": float(min(samples)), "mean": sum(samples) / len(samples),
            "p50": percentile(samples, 50), "p90": percentile(samples, 90),
            "p99": percentile(samples, 99), "max": float(max(samples))}
