"""Synthetic rounds with this machine's noise, and the sequential rule (:mod:`lightning_perf.bench.sequential`)
applied to thousands of them at once with numpy: the false-positive rate, the equivalence error and the power that
``tests/test_sequential_rounds.py`` checks and ``benchmarks/sequential_power.py`` prints (docs/bench.md)."""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional

from lightning_perf.bench.sequential import ALPHA, DEFAULT_EQUIVALENCE_PCT, boundary_factor

#: The noise models of a shared VM, each run's log rate = round shift + the run's own noise:
#: ``shifts``: the machine's speed moves 20% (sd) from round to round, hitting every run of the round alike, and
#: drifts along the rounds; each run 3% of its own. ``two_group``: each process lands in a fast or a slow mode (half
#: each), 15 to 40% apart (drawn per trial), 2% of its own, rounds 10% apart. ``one_in_eight``: one run in eight is
#: 15 to 25% slower, 3% of its own, rounds 10% apart.
NOISE_MODELS = ("shifts", "two_group", "one_in_eight")


def simulate_logs(model: str, trials: int, rounds: int, setups: int, rng):
    """Log rates, shape (trials, rounds, setups), with no change between the setups."""
    import numpy as np

    shape = (trials, rounds, setups)
    if model == "shifts":
        walk = np.cumsum(rng.normal(0.0, 0.05, (trials, rounds, 1)), axis=1)
        return rng.normal(0.0, 0.2, (trials, rounds, 1)) + walk + rng.normal(0.0, 0.03, shape)
    if model == "two_group":
        gap = np.log1p(rng.uniform(0.15, 0.40, (trials, 1, 1)))
        slow = rng.random(shape) < 0.5
        return rng.normal(0.0, 0.1, (trials, rounds, 1)) - gap * slow + rng.normal(0.0, 0.02, shape)
    if model == "one_in_eight":
        slow = (rng.random(shape) < 1.0 / 8.0) * np.log1p(rng.uniform(0.15, 0.25, shape))
        return rng.normal(0.0, 0.1, (trials, rounds, 1)) - slow + rng.normal(0.0, 0.03, shape)
    raise ValueError(f"model {model!r}: expected one of {', '.join(NOISE_MODELS)}")


def run_sequential(model: str, change_pct: float, trials: int = 2000, max_rounds: int = 40, seed: int = 0,
                   same_within_pct: float = DEFAULT_EQUIVALENCE_PCT, min_effect_pct: float = 2.0,
                   alpha: float = ALPHA, floor: bool = True,
                   boundary: Optional[Callable[[int], float]] = None) -> Dict[str, float]:
    """``trials`` races of a baseline, its A/A copy (where ``floor``) and a candidate ``change_pct`` faster (negative:
    slower), a round at a time, each stopped at its first decision or at ``max_rounds``, as
    :func:`lightning_perf.bench.sequential.decide_rounds` decides (``boundary``: another rule's half-width factor
    after ``n`` rounds, ``inf`` where it does not look, as :func:`looks_boundary`). Returns the share of trials ending ``faster``,
    ``slower``, ``same``, ``no_verdict``, ``undecided`` and ``mean_rounds`` (rounds run)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    logs = simulate_logs(model, trials, max_rounds, 3 if floor else 2, rng)
    logs[:, :, -1] += math.log1p(change_pct / 100.0)
    final, first = sequential_outcomes(logs, floor, same_within_pct, min_effect_pct, alpha, boundary)
    shares = {name: float(np.mean(final == code)) for code, name in enumerate(OUTCOMES)}
    shares["mean_rounds"] = float(np.mean(first + 1))
    return shares


#: The outcomes of :func:`sequential_outcomes`, by code.
OUTCOMES = ("undecided", "faster", "slower", "same", "no_verdict")


def sequential_outcomes(logs, floor: bool = True, same_within_pct: float = DEFAULT_EQUIVALENCE_PCT,
                        min_effect_pct: float = 2.0, alpha: float = ALPHA,
                        boundary: Optional[Callable[[int], float]] = None):
    """For log rates of shape (trials, rounds, setups) (the baseline, its copy where ``floor``, the candidate last):
    each trial's outcome (a code of :data:`OUTCOMES`) at its first decision, else at the last round, and that round
    (from 0), as :func:`lightning_perf.bench.sequential.decide_rounds` decides round by round."""
    import numpy as np

    trials, max_rounds = logs.shape[:2]
    base = logs[:, :, 0] if not floor else logs[:, :, :2].mean(axis=2)
    d = logs[:, :, -1] - base
    n = np.arange(1, max_rounds + 1)
    k = np.array([boundary(int(i)) if boundary else boundary_factor(int(i), alpha) for i in n])

    def interval(x):
        mean = np.cumsum(x, axis=1) / n
        v = np.maximum(np.cumsum(x * x, axis=1) - n * mean * mean, 0.0)
        half = np.where(np.isfinite(k), np.where(np.isfinite(k), k, 0.0) * np.sqrt(v), np.inf)
        return mean, mean - half, mean + half

    mean, low, high = interval(d)
    band = np.zeros_like(mean)
    drifted = np.zeros(mean.shape, dtype=bool)
    if floor:
        fmean, flow, fhigh = interval(logs[:, :, 1] - logs[:, :, 0])
        band = np.abs(fmean)
        drifted = (flow > 0) | (fhigh < 0)
    big = np.abs(np.expm1(mean)) * 100.0 >= min_effect_pct
    edge = math.log1p(same_within_pct / 100.0)
    outcome = np.full(mean.shape, 0)
    outcome[(low >= -edge) & (high <= edge)] = 3
    outcome[(high < -band) & big] = 2
    outcome[(low > band) & big] = 1
    outcome[drifted] = 4
    decided = outcome > 0
    first = np.where(decided.any(axis=1), decided.argmax(axis=1), max_rounds - 1)
    return outcome[np.arange(trials), first], first


def looks_boundary(looks, alpha: float = ALPHA) -> Callable[[int], float]:
    """The alternative the rule was measured against: a group-sequential design that reads a Student's t interval
    at planned rounds only (``looks``), each at ``alpha / len(looks)`` (Bonferroni: valid whatever the stopping), as
    a half-width factor of ``sqrt(V)`` like :func:`lightning_perf.bench.sequential.boundary_factor`."""
    from lightning_perf.measure.stats.ratio_ci import t_quantile_at_least

    looks, share = frozenset(int(n) for n in looks), alpha / len(looks)

    def factor(n: int) -> float:
        if n not in looks or n < 2:
            return math.inf
        return t_quantile_at_least(1.0 - share / 2.0, n - 1) / math.sqrt(n * (n - 1))
    return factor


def power_table(changes=(5.0, 10.0, 20.0), budgets=(10, 20, 40), trials: int = 2000,
                model: Optional[str] = None) -> Dict[str, Dict[int, Dict[float, float]]]:
    """model -> max rounds -> change -> the share of trials decided slower (the change made slower)."""
    out: Dict[str, Dict[int, Dict[float, float]]] = {}
    for name in ([model] if model else NOISE_MODELS):
        out[name] = {}
        for budget in budgets:
            out[name][budget] = {c: run_sequential(name, -c, trials, budget, seed=int(c * 10) + budget)["slower"]
                                 for c in changes}
    return out
