"""Rounds until decided: an always-valid confidence sequence on the per-round log-ratios of a comparison, so that
``race`` and ``matrix`` can add rounds until every comparison is decided and the verdict stays valid however the
rounds were stopped. Pure Python: no torch, no Lightning.

The method (docs/bench.md, "Rounds until decided"). Round ``k`` gives one paired figure per comparison:
``d_k = log(rate of the setup) - log(rate of its reference)`` in that round, the reference the baseline's run (the mean
of the logs of the baseline's run and its A/A copy's, where the copy ran), so a shift of the machine that hits every
run of the round alike drops out. The interval on the mean of ``d`` is Lai's (1976) scale-invariant t mixture: the
likelihood ratio of "mean ``mu``" against a normal mixture over ``(mean - mu) / sd`` (precision :data:`MIXTURE_RHO`),
the unknown spread integrated out with the scale-invariant prior, is a nonnegative martingale under "mean ``mu``", so
by Ville's inequality it passes ``1 / alpha`` at any round, ever, with probability at most ``alpha``. The interval is
every ``mu`` it has not passed at: ``mean +/- sqrt(b V / (n (n - b)))`` with ``V`` the sum of squares about the mean
and ``b = (1 - (alpha^2 rho / (n + rho)) ** (1 / n)) (n + rho)`` (infinite while ``n <= b``: 4 rounds and fewer).
A decision read from it at a round chosen by looking at it (or by a budget) is as valid as one at a fixed round.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Dict, List, Optional, Sequence

from lightning_perf.measure.stats.ratio_ci import exp_or_inf

#: Two-sided error of every interval and decision: at most 5% over all rounds together.
ALPHA = 0.05
#: The mixture's precision over (change / spread): 1 spends the error where a change of about one spread would be
#: found (5 to 30 rounds); the interval is finite from 5 rounds.
MIXTURE_RHO = 1.0
#: ``--same-within``'s default: two setups are called the same when the interval lies within +/-5%.
DEFAULT_EQUIVALENCE_PCT = 5.0
#: ``--max-rounds``' default in ``--repeats auto``: the cap on rounds when no budget or decision stops them first.
DEFAULT_MAX_ROUNDS = 40
#: ``--budget``'s default in ``--repeats auto``: a user with 10 minutes.
DEFAULT_BUDGET_S = 600.0
#: The change the "what would decide" line sizes the rounds for, in %.
TARGET_PCT = 10.0
#: Power of the smallest detectable change.
POWER = 0.8
#: The in-run trial in the words of an undecided verdict, where no exact line can be given (the change is not a switch
#: the trial knows: lightning_perf/bench/what_would_decide.py gives the line where it is).
IN_RUN_HINT = ("(or an in-run trial, which pairs the change inside one fit: `lightning-perf run --trial ...` /"
               " ABTrial)")

#: What a sequential verdict can be.
FASTER, SLOWER, SAME, UNDECIDED, NO_VERDICT = "faster", "slower", "the same", "undecided", "no verdict"
#: Why the rounds stopped.
STOP_DECIDED, STOP_BUDGET, STOP_MAX_ROUNDS, STOP_INTERRUPTED = "decided", "budget", "max rounds", "interrupted"


def boundary_factor(n: int, alpha: float = ALPHA, rho: float = MIXTURE_RHO) -> float:
    """``k_n``: the interval's half-width is ``k_n * sqrt(V)`` after ``n`` rounds, ``V`` the sum of squares of the
    round figures about their mean; ``inf`` where ``n`` rounds give no finite interval."""
    if n < 2:
        return math.inf
    c = (alpha * alpha * rho / (n + rho)) ** (1.0 / n)
    b = (1.0 - c) * (n + rho)
    return math.sqrt(b / (n * (n - b))) if n > b else math.inf


def _logs_of(values: Sequence[Optional[float]]) -> List[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def confidence_sequence(diffs: Sequence[Optional[float]], alpha: float = ALPHA, rho: float = MIXTURE_RHO
                        ) -> Dict[str, Any]:
    """The always-valid interval on the mean of the round figures ``diffs`` (log-ratios; a None or non-finite one is
    left out): ``n``, ``mean``, ``sd`` (None under 2), ``low``/``high`` (log units, +/-inf while infinite)."""
    d = _logs_of(diffs)
    n = len(d)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "low": -math.inf, "high": math.inf}
    mean = sum(d) / n
    v = sum((x - mean) ** 2 for x in d)
    half = boundary_factor(n, alpha, rho) * math.sqrt(v)
    if v == 0 and n >= 2 and math.isfinite(boundary_factor(n, alpha, rho)):
        half = 0.0
    return {"n": n, "mean": mean, "sd": math.sqrt(v / (n - 1)) if n > 1 else None,
            "low": mean - half if math.isfinite(half) else -math.inf,
            "high": mean + half if math.isfinite(half) else math.inf}


def smallest_change(sd: Optional[float], n: int, alpha: float = ALPHA, power: float = POWER) -> Optional[float]:
    """The smallest change (log units) that ``n`` rounds with spread ``sd`` find with probability ``power``: the
    interval's half-width plus ``z_power`` standard errors; None where not known (under 2 rounds, or infinite)."""
    if sd is None or n < 2:
        return None
    k = boundary_factor(n, alpha)
    if not math.isfinite(k):
        return None
    return (k * math.sqrt(n - 1) + NormalDist().inv_cdf(power) / math.sqrt(n)) * sd


def rounds_for(change_pct: float, sd: Optional[float], alpha: float = ALPHA, power: float = POWER,
               cap: int = 100_000) -> Optional[int]:
    """The fewest rounds whose smallest change (:func:`smallest_change`) at spread ``sd`` is ``change_pct`` or less;
    None where ``sd`` is unknown or more than ``cap`` rounds would be needed."""
    if sd is None:
        return None
    target = math.log1p(change_pct / 100.0)
    if sd == 0:
        return 5
    lo, hi = 2, cap  # smallest_change falls with n from 5 rounds on: bisection
    found = smallest_change(sd, hi, alpha, power)
    if found is None or found > target:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        found = smallest_change(sd, mid, alpha, power)
        if found is not None and found <= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _pct(log_ratio: float) -> float:
    return 100.0 * math.expm1(log_ratio) if log_ratio < 700.0 else math.inf  # (expm1 raises past ~709)


def decide_rounds(diffs: Sequence[Optional[float]], floor_diffs: Optional[Sequence[Optional[float]]] = None,
                  same_within_pct: float = DEFAULT_EQUIVALENCE_PCT, min_effect_pct: float = 2.0,
                  alpha: float = ALPHA) -> Dict[str, Any]:
    """The verdict after the rounds so far. ``diffs``: the comparison's per-round log-ratios (setup over reference,
    higher rate is faster); ``floor_diffs``: the A/A pair's (the baseline's copy over the baseline), or None.

    ``faster``/``slower``: the interval excludes 1, the change is at least ``min_effect_pct`` and the interval lies
    beyond the A/A noise floor (the band from ``1/f`` to ``f``, ``f`` the A/A pair's ratio); ``the same``: the
    interval lies within ``+/-same_within_pct``; ``no verdict``: the A/A pair's own interval excludes 1 (the machine
    drifted more than the rounds allow: fail closed); else ``undecided``. Returns ``verdict``, ``why``, ``rounds``,
    ``ratio``/``low``/``high`` (ratios of rates; low/high None while infinite), ``sd`` (of the round log-ratios),
    ``smallest_change_pct`` (found with 80% power at these rounds) and ``rounds_for_10pct``."""
    cs = confidence_sequence(diffs, alpha)
    n = cs["n"]
    out: Dict[str, Any] = {"rounds": n, "ratio": None, "low": None, "high": None, "sd": cs["sd"],
                           "same_within_pct": same_within_pct, "smallest_change_pct": None,
                           "rounds_for_10pct": rounds_for(TARGET_PCT, cs["sd"], alpha)}
    found = smallest_change(cs["sd"], n, alpha)
    out["smallest_change_pct"] = _pct(found) if found is not None else None
    if n == 0:
        return dict(out, verdict=NO_VERDICT, why="no round with a rate on both sides")
    out["ratio"] = exp_or_inf(cs["mean"])
    if math.isfinite(cs["low"]):
        out["low"], out["high"] = exp_or_inf(cs["low"]), exp_or_inf(cs["high"])
    band = 0.0
    if floor_diffs is not None:
        floor = confidence_sequence(floor_diffs, alpha)
        if floor["n"] and (floor["low"] > 0 or floor["high"] < 0):
            return dict(out, verdict=NO_VERDICT, why="the A/A pair (the baseline twice) was decided different: the"
                                                     " machine drifted more than the rounds allow")
        band = abs(floor["mean"]) if floor["n"] else 0.0
    change = abs(_pct(cs["mean"]))
    if cs["low"] > band and change >= min_effect_pct:
        return dict(out, verdict=FASTER, why="")
    if cs["high"] < -band and change >= min_effect_pct:
        return dict(out, verdict=SLOWER, why="")
    edge = math.log1p(same_within_pct / 100.0)
    if cs["low"] >= -edge and cs["high"] <= edge:
        return dict(out, verdict=SAME, why=f"within +/-{same_within_pct:g}%")
    return dict(out, verdict=UNDECIDED, why=undecided_words(out))


def undecided_words(found: Dict[str, Any]) -> str:
    """What would decide: the smallest change these rounds could find and the rounds that would find 10%."""
    n, small, need = found["rounds"], found.get("smallest_change_pct"), found.get("rounds_for_10pct")
    if small is None:
        head = f"{n} round(s) give no interval yet (the interval is finite from 5 rounds)"
    else:
        head = f"this machine's drift hides changes under ~{small:.0f}% at {n} rounds"
    if need is None:
        tail = "the spread between rounds is not known yet"
    else:
        tail = f"about {need} rounds would find {TARGET_PCT:g}%"
    return f"{head}; {tail} {IN_RUN_HINT}"


def round_log_ratios(values: Sequence[Optional[float]], references: Sequence[Sequence[Optional[float]]]
                     ) -> List[Optional[float]]:
    """Per round, ``log value - mean(log references)`` (the rates of the setup and of its references in that round);
    None for a round where one of them has no finite positive rate."""
    out: List[Optional[float]] = []
    for k, value in enumerate(values):
        refs = [ref[k] if k < len(ref) else None for ref in references]
        figures = [value, *refs]
        if not refs or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                               for v in figures):
            out.append(None)
            continue
        out.append(math.log(value) - sum(math.log(r) for r in refs) / len(refs))
    return out
