import json
import math
import random

import pytest

from lightning_perf.measure.stats import LogHistogram, bootstrap_median_ratio_ci


def exact_quantile(sorted_values, q):
    return sorted_values[int(q * (len(sorted_values) - 1))]


@pytest.mark.parametrize("dist", ["lognormal", "bimodal", "uniform"])
def test_quantiles_within_one_percent_of_exact(dist):
    rng = random.Random(1)
    if dist == "lognormal":
        values = [rng.lognormvariate(3.0, 0.5) for _ in range(50_000)]
    elif dist == "bimodal":
        values = [rng.gauss(10, 0.5) if rng.random() < 0.9 else rng.gauss(80, 3) for _ in range(50_000)]
    else:
        values = [rng.uniform(0.5, 2.0) for _ in range(50_000)]
    hist = LogHistogram()
    for v in values:
        hist.add(v)
    values.sort()
    for q in (0.5, 0.95, 0.99):
        assert hist.quantile(q) == pytest.approx(exact_quantile(values, q), rel=0.01)
    assert hist.min == values[0] and hist.max == values[-1]
    mean = sum(values) / len(values)
    assert hist.mean == pytest.approx(mean, rel=1e-9)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert hist.std == pytest.approx(std, rel=1e-6)


def test_a_million_values_keep_a_few_kilobytes():
    rng = random.Random(2)
    hist = LogHistogram()
    for _ in range(1_000_000):
        hist.add(rng.lognormvariate(3.0, 1.0))
    assert hist.count == 1_000_000
    assert len(hist.bins) < 3000
    assert len(json.dumps(hist.to_dict())) < 100_000


def test_round_trip_through_dict_is_exact():
    hist = LogHistogram()
    for v in [0.0, 1.5, 2.5, 2.5, 100.0]:
        hist.add(v)
    again = LogHistogram.from_dict(json.loads(json.dumps(hist.to_dict())))
    assert again.summary() == hist.summary()
    assert again.bucket_edges() == hist.bucket_edges()


def test_empty_histogram_reports_none():
    hist = LogHistogram()
    assert hist.quantile(0.5) is None
    assert all(v is None for v in hist.summary().values())


@pytest.mark.parametrize("bad", [0, -0.1, 0.5])
def test_bad_accuracy_is_rejected(bad):
    with pytest.raises(ValueError, match="relative_accuracy"):
        LogHistogram(bad)


def _hist(values):
    h = LogHistogram()
    for v in values:
        h.add(v)
    return h


def test_bootstrap_ci_finds_a_real_five_percent_gain_and_no_gain_in_noise():
    rng = random.Random(3)
    base = _hist(rng.gauss(20.0, 1.0) for _ in range(3000))
    faster = _hist(rng.gauss(20.0 / 1.05, 1.0 / 1.05) for _ in range(3000))
    same = _hist(rng.gauss(20.0, 1.0) for _ in range(3000))
    lo, hi = bootstrap_median_ratio_ci(base, faster)
    assert 1.0 < lo < 1.05 < hi
    lo, hi = bootstrap_median_ratio_ci(base, same)
    assert lo < 1.0 < hi  # interpolation inside buckets: not stuck on a bucket edge


def test_bootstrap_ci_needs_two_values_each():
    assert bootstrap_median_ratio_ci(_hist([1.0]), _hist([1.0, 2.0])) is None
