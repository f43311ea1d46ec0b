"""Intervals of a ratio of two means: within one run from its batch means, between runs from their spread.

Pure Python on purpose, like ``stats``: ``lightning-perf compare`` uses these on a machine without torch.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist
from typing import List, Optional, Sequence, Tuple

from lightning_perf.measure.stats.streaming import BlockSeries

__all__ = ["batch_means_ratio_ci", "between_runs_ratio_ci", "exp_or_inf", "rank_sum_counts", "shift_ratio_ci",
           "student_t_quantile", "t_quantile_at_least"]


def student_t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (Cornish-Fisher expansion around the normal
    quantile, Abramowitz & Stegun 26.7.5: for 0.5 < p <= 0.975, within 0.15% of the exact value from df = 3;
    at p = 0.995, within 0.8% at df = 3 and 0.1% from df = 5)."""
    z = NormalDist().inv_cdf(p)
    terms = (
        (z**3 + z) / 4.0,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96.0,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384.0,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160.0,
    )
    return z + sum(term / df ** (i + 1) for i, term in enumerate(terms))


def exp_or_inf(x: float) -> float:
    """``math.exp``, but inf past the float range (figures 1e450 apart) instead of an OverflowError."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _batches(series: BlockSeries, min_batch: int, max_batches: int) -> List[Tuple[float, int]]:
    """The series cut into at most ``max_batches`` batches of consecutive values, each at least ``min_batch`` long
    where the stored blocks allow (whole stored blocks are grouped, so the last batch may be shorter)."""
    stored = series.blocks()
    want = max(1, min(max_batches, series.count // min_batch))
    group = max(1, -(-len(stored) // want))
    return [(sum(s for s, _ in stored[i : i + group]), sum(c for _, c in stored[i : i + group]))
            for i in range(0, len(stored), group)]


def _log_mean_and_variance(batches: List[Tuple[float, int]]) -> Tuple[float, float]:
    """log of the mean (total / count) and the variance of that log, from the spread of the batch means (the ratio
    estimator's variance, so batches of unequal length weigh by their length)."""
    n = sum(c for _, c in batches)
    mean = sum(s for s, _ in batches) / n
    b = len(batches)
    # deviations over the mean: each within n, so no square passes 1e308 and no mean of 1e-300 squares to 0
    return math.log(mean), sum((s / mean - c) ** 2 for s, c in batches) / (b - 1) * b / (n * n)


def batch_means_ratio_ci(
    numerator: BlockSeries,
    denominator: BlockSeries,
    confidence: float = 0.95,
    min_batch: int = 8,
    max_batches: int = 12,
    min_batches: int = 4,
) -> Optional[Tuple[float, float]]:
    """Batch-means CI of ``mean(numerator) / mean(denominator)``, for autocorrelated series (iteration times).

    Each run is cut into at most ``max_batches`` batches of at least ``min_batch`` consecutive iterations; the spread
    of the batch means gives the variance of each run's log mean, and the interval of the log ratio uses Student's t
    with Welch-Satterthwaite degrees of freedom. Long batches keep bursts of slow iterations, every-k-th stalls and
    slow drifts inside a batch, so neighbouring batch means are close to independent; t with few degrees of freedom
    pays for having few batches. Checked on synthetic series (``tests/test_speed_verdict.py``): with stalls, bursts
    and autocorrelation, two runs of one distribution are called different at close to the nominal 5% rate (the
    percentile block bootstrap this replaces called 12 to 25% of them different).

    Returns:
        (low, high), or None when either run has fewer than ``min_batches`` batches (``min_batch * min_batches``
        iterations) or a mean that is not positive.
    """
    parts = []
    for series in (numerator, denominator):
        if series.count < min_batch * min_batches:
            return None
        batches = _batches(series, min_batch, max_batches)
        if len(batches) < min_batches or sum(s for s, _ in batches) <= 0:
            return None
        parts.append((*_log_mean_and_variance(batches), len(batches)))
    (log_a, var_a, b_a), (log_b, var_b, b_b) = parts
    total = var_a + var_b
    if total > 0:
        df = total * total / (var_a * var_a / (b_a - 1) + var_b * var_b / (b_b - 1))
    else:
        df = b_a + b_b - 2
    half = student_t_quantile(1.0 - (1.0 - confidence) / 2.0, df) * math.sqrt(total)
    diff = log_a - log_b
    return exp_or_inf(diff - half), exp_or_inf(diff + half)


def positive_logs(values: Sequence[float]) -> Optional[List[float]]:
    """The logs of per-run figures, or None where one is not a finite positive number (a bool is not a figure)."""
    if any(not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0)
           for v in values):
        return None
    return [math.log(v) for v in values]


def between_runs_ratio_ci(numerators: Sequence[float], denominators: Sequence[float],
                          confidence: float = 0.95) -> Optional[Tuple[float, float, float]]:
    """The ratio of the geometric means of two sets of per-run figures (repeats of two setups) and its interval from
    the spread between the runs: Student's t on the logs, with ``n_a + n_b - 2`` degrees of freedom where both sides
    ran as often (with equal counts the test holds for unequal spreads too), else Welch-Satterthwaite's. Each run's figure
    carries its within-run noise, so the spread between runs holds both that and the drift between runs (other load,
    clocks, caches) that an interval from one run a side cannot see.

    Returns:
        (ratio, low, high), or None with fewer than 2 runs a side or a figure that is not a finite positive number.
    """
    parts = []
    for values in (numerators, denominators):
        logs = positive_logs(values)
        if logs is None or len(logs) < 2:
            return None
        mean = sum(logs) / len(logs)
        parts.append((mean, sum((x - mean) ** 2 for x in logs) / (len(logs) - 1) / len(logs), len(logs)))
    (mean_a, var_a, n_a), (mean_b, var_b, n_b) = parts
    total = var_a + var_b
    if n_a == n_b or total <= 0:
        df = float(n_a + n_b - 2)
    else:
        df = total * total / (var_a * var_a / (n_a - 1) + var_b * var_b / (n_b - 1))
    half = t_quantile_at_least(1.0 - (1.0 - confidence) / 2.0, df) * math.sqrt(total)
    diff = mean_a - mean_b
    return exp_or_inf(diff), exp_or_inf(diff - half), exp_or_inf(diff + half)


def t_quantile_at_least(p: float, df: float) -> float:
    """Student's t quantile at ``floor(df)`` degrees of freedom (never narrower than at ``df``): exact for 1 and 2,
    where the expansion of :func:`student_t_quantile` is not close, that expansion from 3."""
    whole = max(1, int(df))
    if whole == 1:
        return math.tan(math.pi * (p - 0.5))
    if whole == 2:
        return (2.0 * p - 1.0) / math.sqrt(2.0 * p * (1.0 - p))
    return student_t_quantile(p, whole)


@lru_cache(maxsize=64)
def rank_sum_counts(n: int, m: int) -> Tuple[int, ...]:
    """How many of the ``C(n + m, n)`` equally likely orders of two samples of ``n`` and ``m`` distinct values give
    each Mann-Whitney count ``U`` (0 to ``n * m``: the pairs in which the first sample's value is the smaller): the
    coefficients of the Gaussian binomial ``[n + m choose n]``, built as the product over ``i`` of
    ``(1 - q^(m+i)) / (1 - q^i)``."""
    counts = [1]
    for i in range(1, n + 1):
        counts += [0] * m
        for k in range(len(counts) - 1, m + i - 1, -1):  # times (1 - q^(m+i))
            counts[k] -= counts[k - m - i]
        for k in range(i, len(counts)):  # over (1 - q^i), exact
            counts[k] += counts[k - i]
    return tuple(counts)


def shift_ratio_ci(numerators: Sequence[float], denominators: Sequence[float], confidence: float = 0.95
                   ) -> Optional[Tuple[float, Optional[float], Optional[float]]]:
    """The ratio of two sets of per-run figures by ranks: ``exp`` of the Hodges-Lehmann shift (the median of the
    ``n * m`` differences ``log a_i - log b_j``), and its exact Mann-Whitney (Wilcoxon rank-sum) interval: the
    ``k``-th smallest and ``k``-th largest of those differences, ``k`` the largest count with
    ``P(U < k) <= (1 - confidence) / 2`` when the two sets come from one distribution.

    Where both sets are runs of one setup in any order (an A/A pair, or runs whose noise is anything but the same
    for each run), the interval excludes 1 in at most ``1 - confidence`` of trials, whatever the distribution of the
    noise: a run that a busy machine made 20% slower moves a rank, not the estimate. Few runs have no interval at
    95%: 3 + 3 and 2 + 4 do not (``low``/``high`` None), 4 + 4, 3 + 6 and 5 + 5 do.

    Returns:
        (ratio, low, high), or None where a side is empty or holds a figure that is not a finite positive number.
    """
    sides = []
    for values in (numerators, denominators):
        logs = positive_logs(values)
        if not logs:
            return None
        sides.append(logs)
    diffs = sorted(x - y for x in sides[0] for y in sides[1])
    total = len(diffs)
    ratio = exp_or_inf((diffs[(total - 1) // 2] + diffs[total // 2]) / 2.0)
    counts = rank_sum_counts(*sorted((len(sides[0]), len(sides[1]))))
    tail = round((1.0 - confidence) / 2.0 * 1_000_000)  # P(U < k) <= tail / 1e6, in whole numbers
    orders, below, k = sum(counts), 0, 0
    while k < len(counts) and (below + counts[k]) * 1_000_000 <= tail * orders:
        below += counts[k]
        k += 1
    if k == 0:
        return ratio, None, None
    return ratio, exp_or_inf(diffs[k - 1]), exp_or_inf(diffs[total - k])
