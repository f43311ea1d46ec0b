"""Streaming statistics in bounded memory: a log-bucket histogram and a bootstrap CI for a ratio of medians.

Pure Python on purpose: the summary layer uses these to compare two files on a machine without torch.
"""

from __future__ import annotations

import math
import random
from typing import Any, Dict, Iterable, List, Optional, Tuple

__all__ = ["LogHistogram", "bootstrap_median_ratio_ci"]


class LogHistogram:
    """Histogram of positive values in log-spaced buckets (the DDSketch layout).

    Each bucket spans ``(gamma**(i-1), gamma**i]`` with ``gamma = (1 + a) / (1 - a)``, so any quantile is
    returned within relative error ``a`` of a true sample value. An update is one dict increment; the number of
    buckets grows with ``log(max / min)``, not with the number of values (about 2,300 buckets cover 1 µs to
    3 hours at ``a = 0.005``), so a million values fit in a few kB.

    Args:
        relative_accuracy: the ``a`` above, in (0, 0.1].

    Example::

        >>> h = LogHistogram()
        >>> for v in range(1, 101):
        ...     h.add(float(v))
        >>> round(h.quantile(0.5))
        50
    """

    def __init__(self, relative_accuracy: float = 0.005) -> None:
        if not 0 < relative_accuracy <= 0.1:
            raise ValueError(
                f"Unsupported parameter value `LogHistogram(relative_accuracy={relative_accuracy!r})`."
                " Possible values are in (0, 0.1]."
            )
        self.relative_accuracy = relative_accuracy
        self._gamma = (1 + relative_accuracy) / (1 - relative_accuracy)
        self._log_gamma = math.log(self._gamma)
        self.bins: Dict[int, int] = {}
        self.zero_count = 0
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        # Welford's running mean and sum of squared deviations, for a numerically stable std.
        self._mean = 0.0
        self._m2 = 0.0

    def add(self, value: float) -> None:
        """Adds one value; values <= 0 are counted in a zero bucket."""
        self.count += 1
        self.total += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value
        delta = value - self._mean
        self._mean += delta / self.count
        self._m2 += delta * (value - self._mean)
        if value <= 0.0:
            self.zero_count += 1
            return
        key = math.ceil(math.log(value) / self._log_gamma)
        self.bins[key] = self.bins.get(key, 0) + 1

    def __len__(self) -> int:
        return self.count

    @property
    def mean(self) -> Optional[float]:
        return self._mean if self.count else None

    @property
    def std(self) -> Optional[float]:
        """Sample standard deviation (n - 1), or None for fewer than two values."""
        return math.sqrt(self._m2 / (self.count - 1)) if self.count > 1 else None

    def _bucket_value(self, key: int) -> float:
        return 2.0 * self._gamma**key / (self._gamma + 1.0)

    def quantile(self, q: float) -> Optional[float]:
        """The ``q``-quantile (0 <= q <= 1) within the relative accuracy, clamped to the exact min and max."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1], got {q!r}")
        if self.count == 0:
            return None
        rank = q * (self.count - 1)
        seen = self.zero_count
        if rank < seen:
            return max(self.min, min(0.0, self.max))
        value = self.max
        for key in sorted(self.bins):
            seen += self.bins[key]
            if seen > rank:
                value = self._bucket_value(key)
                break
        return min(max(value, self.min), self.max)

    def summary(self) -> Dict[str, Optional[float]]:
        """mean, median, min, max, p50, p95, p99 and std, or Nones when empty."""
        if self.count == 0:
            return {k: None for k in ("mean", "median", "min", "max", "p50", "p95", "p99", "std")}
        p50 = self.quantile(0.5)
        return {
            "mean": self.mean,
            "median": p50,
            "min": self.min,
            "max": self.max,
            "p50": p50,
            "p95": self.quantile(0.95),
            "p99": self.quantile(0.99),
            "std": self.std,
        }

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready form that :meth:`from_dict` restores exactly."""
        keys = sorted(self.bins)
        return {
            "relative_accuracy": self.relative_accuracy,
            "count": self.count,
            "sum": self.total,
            "min": self.min if self.count else None,
            "max": self.max if self.count else None,
            "mean": self._mean,
            "m2": self._m2,
            "zero_count": self.zero_count,
            "bin_keys": keys,
            "bin_counts": [self.bins[k] for k in keys],
        }

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "LogHistogram":
        """Restores a histogram written by :meth:`to_dict`; raises ``ValueError`` on a malformed one."""
        try:
            hist = cls(float(data.get("relative_accuracy", 0.005)))
            keys = [int(k) for k in data.get("bin_keys", [])]
            counts = [int(c) for c in data.get("bin_counts", [])]
            if len(keys) != len(counts):
                raise ValueError("bin_keys and bin_counts differ in length")
            hist.bins = dict(zip(keys, counts))
            hist.zero_count = int(data.get("zero_count", 0))
            hist.count = int(data.get("count", sum(counts) + hist.zero_count))
            hist.total = float(data.get("sum", 0.0))
            hist.min = float(data["min"]) if data.get("min") is not None else math.inf
            hist.max = float(data["max"]) if data.get("max") is not None else -math.inf
            hist._mean = float(data.get("mean", 0.0))
            hist._m2 = float(data.get("m2", 0.0))
        except (TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"malformed histogram: {err}") from err
        return hist

    def bucket_edges(self) -> Tuple[List[Tuple[float, float]], List[int]]:
        """(low, high) value range of each used bucket, clamped to the exact min and max, and their counts."""
        edges: List[Tuple[float, float]] = []
        counts: List[int] = []
        if self.zero_count:
            edges.append((min(self.min, 0.0), 0.0))
            counts.append(self.zero_count)
        for key in sorted(self.bins):
            low = max(self._gamma ** (key - 1), self.min)
            high = min(self._gamma**key, self.max)
            edges.append((low, max(low, high)))
            counts.append(self.bins[key])
        return edges, counts


def _interpolated_quantile(edges: List[Tuple[float, float]], cumulative: List[int], u: float) -> float:
    """Empirical quantile at ``u`` in [0, 1], interpolated log-linearly inside the bucket that holds it."""
    total = cumulative[-1]
    target = u * total
    lo, hi = 0, len(cumulative) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cumulative[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    below = cumulative[lo - 1] if lo else 0
    count = cumulative[lo] - below
    frac = (target - below) / count if count else 0.0
    low_edge, high_edge = edges[lo]
    if low_edge <= 0.0:
        return low_edge + frac * (high_edge - low_edge)
    return low_edge * (high_edge / low_edge) ** frac


def bootstrap_median_ratio_ci(
    numerator: LogHistogram,
    denominator: LogHistogram,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Optional[Tuple[float, float]]:
    """Percentile-bootstrap CI of ``median(numerator) / median(denominator)`` from two stored histograms.

    Resampling ``n`` values with replacement from an empirical distribution and taking their median is the
    same, in distribution, as taking the empirical quantile at ``U``, where ``U ~ Beta(k, n + 1 - k)`` is the
    k-th order statistic of ``n`` uniforms. So each resample costs one beta draw and one binary search,
    whatever ``n`` is. Iteration times are autocorrelated, so the interval describes within-run noise only.

    Returns:
        (low, high), or None when either histogram has fewer than two values.
    """
    if numerator.count < 2 or denominator.count < 2:
        return None
    rng = random.Random(seed)
    prepared = []
    for hist in (numerator, denominator):
        edges, counts = hist.bucket_edges()
        cumulative: List[int] = []
        running = 0
        for c in counts:
            running += c
            cumulative.append(running)
        k = (hist.count + 1) // 2
        prepared.append((edges, cumulative, k, hist.count + 1 - k))
    ratios = []
    for _ in range(resamples):
        medians = [_interpolated_quantile(e, cum, rng.betavariate(a, b)) for e, cum, a, b in prepared]
        if medians[1] > 0:
            ratios.append(medians[0] / medians[1])
    if not ratios:
        return None
    ratios.sort()
    tail = (1.0 - confidence) / 2.0
    low = ratios[int(math.floor(tail * (len(ratios) - 1)))]
    high = ratios[int(math.ceil((1.0 - tail) * (len(ratios) - 1)))]
    return low, high


def finite_or_none(values: Iterable[Optional[float]]) -> List[float]:
    """The finite floats of ``values`` (drops None and NaN)."""
    return [v for v in values if v is not None and math.isfinite(v)]
