"""Streaming statistics in bounded memory: a log-bucket histogram and a block series (their intervals: ``ratio_ci``).

Pure Python on purpose: the summary layer uses these to compare two files on a machine without torch.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import accumulate, chain
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

try:  # CPython's C helper behind Counter: counts an iterable into a dict, in place
    from collections import _count_elements  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - another Python: the same in Python

    def _count_elements(mapping: Dict[Any, int], iterable: Iterable[Any]) -> None:
        for element in iterable:
            mapping[element] = mapping.get(element, 0) + 1

__all__ = ["FOLD_EVERY", "BlockSeries", "LogHistogram"]


#: Iterations whose raw times a probe keeps in a list before folding them into its histograms (``add_many``): the
#: step path appends a float, and memory stays bounded.
FOLD_EVERY = 64


#: Bounds of a restored histogram: its accuracy, and its bucket indices (a bucket of 1e300 ms at the finest
#: accuracy is index ~3.5 million).
MIN_RELATIVE_ACCURACY = 1e-4
MAX_RELATIVE_ACCURACY = 0.1
MAX_BIN_KEY = 10**7


def _count_sorted(bins: Dict[int, int], ordered: List[float], start: int, per_log: float, shift: float) -> None:
    """``bins[ceil(log(v) * per_log + shift)] += 1`` for each of ``ordered[start:]`` (ascending, positive).

    The key is non-decreasing in ``v``, so the values of one bucket are a contiguous run. Where the middle 80% of
    the values span fewer buckets than a quarter of their number (step times: a few dozen buckets for hundreds of
    values), each of their runs is found by bisecting at its bucket's upper edge: a few operations a bucket instead
    of a key a value, and the counts are exactly those of one key a value. An edge rounded high is caught by the
    key of the run's last value; one rounded low ends a run early, and the next run, at the same key, finds no
    value under that edge (``j <= i``, which also ends the loop): both leave the rest to one key a value. The
    tails, and everything where the middle is spread out, take one key a value."""
    log, ceil = math.log, math.ceil
    n = len(ordered)
    rest: Iterable[float] = ordered[start:]  # what takes one key a value
    cut = (n - start) // 10
    if n - start >= 40:
        low, high = start + cut, n - cut  # the middle: ordered[low:high]
        key = ceil(log(ordered[low]) * per_log + shift)
        if 4 * (ceil(log(ordered[high - 1]) * per_log + shift) - key + 1) < high - low:
            exp, log_gamma = math.exp, 1.0 / per_log
            i = low
            while i < high:
                edge = (key - shift) * log_gamma
                j = bisect_right(ordered, exp(edge) if edge < 709.0 else math.inf, i, high)  # exp(709.8) overflows
                if j <= i or ceil(log(ordered[j - 1]) * per_log + shift) != key:
                    break  # the edge's rounding left the run's end unconfirmed: a key a value from here
                bins[key] = bins.get(key, 0) + (j - i)
                i = j
                if i < high:
                    key = ceil(log(ordered[i]) * per_log + shift)
            rest = chain(ordered[start:low], ordered[i:])
    _count_elements(bins, [ceil(log(v) * per_log + shift) for v in rest])  # bins[key] += 1, in C


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
        if not 0 < relative_accuracy <= MAX_RELATIVE_ACCURACY:
            raise ValueError(
                f"Unsupported parameter value `LogHistogram(relative_accuracy={relative_accuracy!r})`."
                f" Possible values are in (0, {MAX_RELATIVE_ACCURACY:g}]."
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

    def add_many(self, values: Sequence[float], scale: float = 1.0) -> Optional[Tuple[float, float, float]]:
        """Adds ``value * scale`` for each of ``values`` (``scale`` > 0): the same histogram as one ``add`` each
        (a value within a rounding error of a bucket's edge may land in the neighbouring bucket), with the running
        mean and variance merged once (Chan et al.), at a third (values in few buckets) to two thirds (spread
        values) of the cost a value. The values are summed before scaling: a sum that overflows is refused, as a NaN
        is. Returns the scaled values' sum, min and max (None for no values)."""
        n = len(values)
        if n == 0:
            return None
        if not scale > 0.0:
            raise ValueError(f"add_many: scale must be > 0, got {scale!r}")
        if n == 1:
            value = values[0] * scale
            self.add(value)
            return value, value, value
        raw = sum(values)
        total = raw * scale
        if not math.isfinite(total):  # as add() refuses a NaN, before any figure changes
            raise ValueError(f"add_many: values must be finite, got a sum of {total!r}")
        # Unscaled: the deviations scale by ``scale``, their squares by its square, the bucket keys shift by
        # log(scale) / log(gamma); no scaled copy of the values is made. Sorted: min and max, the values <= 0 (the
        # zero bucket) first, and each bucket's values in one run.
        # The deviations' sum of squares as a Euclidean distance from the mean: computed in C, with the scaling and
        # extended precision of ``math.dist`` (~0.4 of the Python loop's time, at 64 values as at 512).
        # Squared by a product, not ``**``: a square past the float range is inf, as each deviation's was before.
        spread = math.dist(values, [raw / n] * n)
        m2 = spread * spread * (scale * scale)
        mean = total / n
        count = self.count + n
        delta = mean - self._mean
        self._mean += delta * n / count
        self._m2 += m2 + delta * delta * self.count * n / count
        self.count = count
        self.total += total
        ordered = sorted(values)
        low, high = ordered[0] * scale, ordered[-1] * scale
        if low < self.min:
            self.min = low
        if high > self.max:
            self.max = high
        start = 0
        if low <= 0.0:
            start = bisect_right(ordered, 0.0)
            self.zero_count += start
        _count_sorted(self.bins, ordered, start, 1.0 / self._log_gamma, math.log(scale) / self._log_gamma)
        return total, low, high

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

    def _values_at_ranks(self, low_rank: int) -> Tuple[float, float]:
        """The values of the ``low_rank``-th and the next smallest sample (0-based), each within the relative
        accuracy: the zero bucket, then the sorted buckets' cumulative counts, bisected (a bucket's value is worked
        out only for the two ranks found). A rank past the last bucket reads the maximum."""
        bins, zero_count = self.bins, self.zero_count
        keys = sorted(bins)
        # ends[j]: the samples in the zero bucket and the buckets before keys[j]; keys[j] holds ranks ends[j] to
        # ends[j + 1] - 1
        ends = list(accumulate(map(bins.__getitem__, keys), initial=zero_count))

        def at(rank: int) -> float:
            if rank < zero_count:
                return max(self.min, min(0.0, self.max))
            j = bisect_right(ends, rank)
            return self._bucket_value(keys[j - 1]) if j < len(ends) else self.max

        return at(low_rank), at(low_rank + 1)

    def quantile(self, q: float) -> Optional[float]:
        """The ``q``-quantile (0 <= q <= 1), interpolated linearly between the two order statistics around rank
        ``q * (n - 1)`` (numpy's default), each within the relative accuracy, and clamped to the exact min and max.
        So a p95 of a handful of values lies between the two largest, never below the mean of a skewed few."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1], got {q!r}")
        if self.count == 0:
            return None
        rank = q * (self.count - 1)
        low_rank = int(math.floor(rank))
        if low_rank >= self.count - 1:
            return self.max
        low, high = self._values_at_ranks(low_rank)
        low = min(max(low, self.min), self.max)
        high = min(max(high, self.min), self.max)
        if low_rank == 0:
            low = self.min
        if low_rank + 1 == self.count - 1:
            high = self.max
        return low + (rank - low_rank) * (high - low)

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
        """Restores a histogram written by :meth:`to_dict`; raises ``ValueError`` on a malformed one (wrong types,
        non-finite figures, counts that do not add up), so a checkpoint edited by hand is refused, not half-read."""
        if not isinstance(data, dict):
            raise ValueError(f"malformed histogram: a {type(data).__name__}, expected a dict")
        missing = [key for key in ("count", "bin_keys", "bin_counts") if key not in data]
        if missing:  # another version's keys, or another object: read as empty, it would silently lose the run
            raise ValueError(f"malformed histogram: no {', '.join(missing)} (keys: {', '.join(map(str, data))})")
        try:
            accuracy = _finite(data.get("relative_accuracy", 0.005), "relative_accuracy")
            if not MIN_RELATIVE_ACCURACY <= accuracy <= MAX_RELATIVE_ACCURACY:
                raise ValueError(f"relative_accuracy is {accuracy!r}, expected {MIN_RELATIVE_ACCURACY:g} to"
                                 f" {MAX_RELATIVE_ACCURACY:g}")
            hist = cls(accuracy)
            keys = [_integer(k, "bin_keys", minimum=None, maximum=MAX_BIN_KEY)
                    for k in _sequence(data.get("bin_keys", []), "bin_keys")]
            counts = [_integer(c, "bin_counts") for c in _sequence(data.get("bin_counts", []), "bin_counts")]
            if len(keys) != len(counts):
                raise ValueError("bin_keys and bin_counts differ in length")
            hist.bins = dict(zip(keys, counts))
            hist.zero_count = _integer(data.get("zero_count", 0), "zero_count")
            hist.count = _integer(data.get("count", sum(counts) + hist.zero_count), "count")
            if hist.count != sum(counts) + hist.zero_count:
                raise ValueError(f"count {hist.count} is not the sum of the bins and zero_count")
            hist.total = _finite(data.get("sum", 0.0), "sum")
            empty = hist.count == 0
            hist.min = math.inf if empty or data.get("min") is None else _finite(data["min"], "min")
            hist.max = -math.inf if empty or data.get("max") is None else _finite(data["max"], "max")
            hist._mean = _finite(data.get("mean", 0.0), "mean")
            hist._m2 = _finite(data.get("m2", 0.0), "m2")
            if not empty and (math.isinf(hist.min) or math.isinf(hist.max) or hist.min > hist.max):
                raise ValueError("min and max missing or out of order")
        except (TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"malformed histogram: {err}") from err
        except ValueError as err:
            raise ValueError(f"malformed histogram: {err}") from None
        return hist


def _sequence(value: Any, name: str) -> List[Any]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} is a {type(value).__name__}, expected a list")
    return list(value)


#: The largest count a restored state may hold: every integer up to here is exact as a float (a count of 10**18
#: iterations is an edited file, not a run).
MAX_COUNT = 2**53


def _integer(value: Any, name: str, minimum: Optional[int] = 0, maximum: int = MAX_COUNT) -> int:
    if (isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum)
            or abs(value) > maximum):
        low = f"{minimum} to " if minimum is not None else f"-{maximum} to "
        text = repr(value) if abs(value if isinstance(value, int) else 0) < 10**30 else "a huge integer"
        raise ValueError(f"{name} holds {text}, expected an integer from {low}{maximum}")
    return value


def _finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} is {value!r}, expected a finite number")
    return float(value)


class BlockSeries:
    """Consecutive values kept as sums of fixed-length blocks, in bounded memory, for a batch-means interval.

    Values arrive in order (one iteration time each). They are summed into blocks of ``block_len`` consecutive
    values; when ``max_blocks`` blocks are full, neighbours are merged in pairs and ``block_len`` doubles. So the
    series holds between ``max_blocks / 2`` and ``max_blocks`` blocks once it is long, whatever the run's length, and
    each block keeps the order information a batch-means interval needs (stalls that come in bursts stay together).

    Args:
        max_blocks: an even number >= 4 of blocks kept at most.
    """

    def __init__(self, max_blocks: int = 256) -> None:
        if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 4 or max_blocks % 2:
            raise ValueError(
                f"Unsupported parameter value `BlockSeries(max_blocks={max_blocks!r})`. Expected an even integer >= 4."
            )
        self.max_blocks = max_blocks
        self.block_len = 1
        self.sums: List[float] = []
        self._open_sum = 0.0
        self._open_count = 0

    @property
    def count(self) -> int:
        return len(self.sums) * self.block_len + self._open_count

    def add(self, value: float) -> None:
        self.add_many((value,))

    def add_many(self, values: Iterable[float]) -> None:
        """Adds each of ``values`` in order (``add`` of one value at a time gives the same series)."""
        open_sum, open_count, block_len, sums = self._open_sum, self._open_count, self.block_len, self.sums
        for value in values:
            open_sum += value
            open_count += 1
            if open_count == block_len:
                sums.append(open_sum)
                open_sum, open_count = 0.0, 0
                if len(sums) == self.max_blocks:
                    sums = [sums[i] + sums[i + 1] for i in range(0, len(sums), 2)]
                    block_len *= 2
        self._open_sum, self._open_count, self.block_len, self.sums = open_sum, open_count, block_len, sums

    def blocks(self) -> List[Tuple[float, int]]:
        """(sum, count) per block, the partly filled last block included."""
        out = [(s, self.block_len) for s in self.sums]
        if self._open_count:
            out.append((self._open_sum, self._open_count))
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"block_len": self.block_len, "sums": list(self.sums), "open_sum": self._open_sum,
                "open_count": self._open_count, "max_blocks": self.max_blocks}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "BlockSeries":
        """Restores a series written by :meth:`to_dict`; raises ``ValueError`` on a malformed one."""
        if not isinstance(data, dict):
            raise ValueError(f"malformed block series: a {type(data).__name__}, expected a dict")
        try:
            series = cls(_integer(data.get("max_blocks", 256), "max_blocks", minimum=2))
            series.block_len = _integer(data["block_len"], "block_len", minimum=1)
            series.sums = [_finite(v, "sums") for v in _sequence(data["sums"], "sums")]
            series._open_sum = _finite(data.get("open_sum", 0.0), "open_sum")
            series._open_count = _integer(data.get("open_count", 0), "open_count")
        except (TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"malformed block series: {err!r}") from err
        except ValueError as err:
            raise ValueError(f"malformed block series: {err}") from None
        if series.block_len < 1 or not 0 <= series._open_count < series.block_len + 1:
            raise ValueError("malformed block series: bad block_len or open_count")
        return series
