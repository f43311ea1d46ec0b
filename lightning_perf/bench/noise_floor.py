"""Verdicts between setups run several times, against the A/A noise floor: the baseline run twice in the same rounds.

Each setup's runs give one rate each (iterations, samples or fits per second). A setup's ratio to the baseline is
measured by ranks (:func:`shift_between`): the Hodges-Lehmann shift of the log rates (the median of every run's
ratio to every reference run) with its exact Mann-Whitney 95% interval, against the runs of the baseline *and* of its
A/A copy together (both are the baseline's setup: 10 reference runs instead of 5 at the default repeats). The A/A
pair (the copy against the baseline, by the same ranks) shows how far two runs of one setup land apart on this
machine: its ratio ``d`` is the noise floor, the band of ratios from ``1/d`` to ``d``. A setup is decided faster or
slower only when its interval excludes 1, its change is at least ``min_effect_pct``, and its interval stays outside
that band; where the A/A pair itself is decided different, the machine drifted more than the intervals allow and
nothing is decided (fail closed). Pure Python: no torch.

Why ranks: on a shared machine a run now and then reads 15 to 25% slower with nothing in it to show why (noise only
adds time); such a run widens a mean's interval and moves the A/A ratio, where it moves only a rank here. The
interval is exact for any noise when the runs of one setup are alike, so an A/A/A triple is decided in at most 5%.
Runs too few for a 95% rank interval (3 + 3 and fewer) get Student's t on the logs instead, as ``compare`` does.

Why rounds as blocks (:func:`shift_by_rounds`): every setup runs once a round, and a busy machine's speed can move
by 20 to 40% from one round to the next while the setups of one round share it. Where the rounds differ that much
(the two-way F of the rounds at least :data:`ROUND_DRIFT_F`) and every setup has a run in every round, the ratio is
measured within rounds by aligned ranks (:func:`lightning_perf.measure.stats.round_blocks.aligned_rank_shift_ci`), exact
under exchangeability within rounds; otherwise (the machine kept its speed, a round lacks a run, too few rounds for
the blocked interval) by the unpaired ranks above, which lose less to an occasional slow run.
Measured by ``benchmarks/verdict_power.py`` (cases in ``tests/test_noise_floor.py``): see docs/cli.md."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

from lightning_perf.measure.stats.ratio_ci import between_runs_ratio_ci, exp_or_inf, shift_ratio_ci
from lightning_perf.measure.stats.round_blocks import aligned_rank_shift_ci, round_drift_f

#: A change smaller than this (in %) is never decided, whatever the interval (compare's --min-effect default).
MIN_EFFECT_PCT = 2.0

#: How the intervals of :func:`shift_between` are named where one is printed.
RANK_INTERVAL, T_INTERVAL, PAIRED_INTERVAL = "rank interval", "Student's t interval", "paired by round"

#: The rounds are used as blocks where their two-way F (:func:`round_drift_f`) is at least this: the rounds' means
#: spread at least 3 times as far as the runs within them. At 3, the unpaired rule keeps its power where the machine
#: kept its speed, and the blocked one is used wherever the rounds drifted 20% (benchmarks/verdict_power.py).
ROUND_DRIFT_F = 3.0
#: Rounds below this are never used as blocks: the least that gives a blocked interval (with two reference setups);
#: with fewer, the rounds' F has one or two degrees of freedom and passes ROUND_DRIFT_F by chance.
MIN_BLOCKED_ROUNDS = 4

#: What a verdict can be.
FASTER, SLOWER, WITHIN_NOISE, NO_VERDICT = "faster", "slower", "within noise", "no verdict"


def _usable(values: Sequence[Optional[float]]) -> List[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]


def ratio_between(values: Sequence[Optional[float]], reference: Sequence[Optional[float]]) -> Dict[str, Any]:
    """``ratio`` (geometric means, values over reference), ``low``/``high`` (95%, Student's t between runs; None with
    fewer than two runs a side) and ``runs`` (counted runs a side). ``ratio`` None where a side has no usable run.
    bench's rounds use it (3 rounds have no rank interval); the matrix and race use :func:`shift_between`."""
    a, b = _usable(values), _usable(reference)
    out: Dict[str, Any] = {"ratio": None, "low": None, "high": None, "runs": (len(a), len(b))}
    if not a or not b:
        return out
    out["ratio"] = exp_or_inf(sum(map(math.log, a)) / len(a) - sum(map(math.log, b)) / len(b))
    found = between_runs_ratio_ci(a, b)
    if found is not None:
        out["low"], out["high"] = found[1], found[2]
    return out


def shift_between(values: Sequence[Optional[float]], reference: Sequence[Optional[float]]) -> Dict[str, Any]:
    """As :func:`ratio_between`, by ranks: ``ratio`` the Hodges-Lehmann shift (the median of every run's ratio to
    every reference run), ``low``/``high`` its exact Mann-Whitney 95% interval
    (:func:`lightning_perf.measure.stats.ratio_ci.shift_ratio_ci`), ``runs`` (counted runs a side) and ``method``
    (:data:`RANK_INTERVAL`). Where the runs are too few for a 95% rank interval (3 + 3, 2 + 4 and fewer; 4 + 4 and
    3 + 6 have one), :func:`ratio_between`'s ratio and interval, ``method`` :data:`T_INTERVAL`."""
    found = ratio_between(values, reference)
    found["method"] = T_INTERVAL
    ranked = shift_ratio_ci(_usable(values), _usable(reference))
    if ranked is not None and ranked[1] is not None:
        found.update(ratio=ranked[0], low=ranked[1], high=ranked[2], method=RANK_INTERVAL)
    return found


def shift_by_rounds(values: Sequence[Optional[float]], reference_setups: Sequence[Sequence[Optional[float]]],
                    by_rounds: bool = True) -> Dict[str, Any]:
    """As :func:`shift_between` against the runs of ``reference_setups`` pooled (the baseline's, its A/A copy's),
    with ``round_drift_f`` added (None where not measured); where ``by_rounds`` (the caller knows that run ``i`` of
    every list ran in round ``i``), every list has a usable run in every round, and the rounds differ (that F at
    least :data:`ROUND_DRIFT_F`), the ratio and interval are the blocked ones
    (:func:`lightning_perf.measure.stats.round_blocks.aligned_rank_shift_ci`), ``method`` :data:`PAIRED_INTERVAL`. Where
    the rounds are fewer than :data:`MIN_BLOCKED_ROUNDS`, the unpaired rule stands (and the F is not measured)."""
    found = shift_between(values, [v for setup in reference_setups for v in setup])
    found["round_drift_f"] = None
    lists = [list(values), *map(list, reference_setups)]
    if (not by_rounds or len({len(x) for x in lists}) != 1 or len(lists[0]) < MIN_BLOCKED_ROUNDS
            or any(len(_usable(x)) != len(x) for x in lists)):
        return found
    rows = [list(run) for run in zip(*lists)]
    found["round_drift_f"] = f = round_drift_f(rows)
    if f is None or f < ROUND_DRIFT_F:
        return found
    paired = aligned_rank_shift_ci([row[0] for row in rows], [row[1:] for row in rows])
    if paired is not None and paired[1] is not None:
        found.update(ratio=paired[0], low=paired[1], high=paired[2], method=PAIRED_INTERVAL)
    return found


def noise_floor(copy_rates: Sequence[Optional[float]], base_rates: Sequence[Optional[float]],
                by_rounds: bool = False) -> Dict[str, Any]:
    """The A/A pair: the baseline's second copy against the baseline, by ranks (:func:`shift_between`). ``band`` is
    (1/d, d) with ``d`` the pair's ratio or its inverse, whichever is >= 1; ``drifted`` is True where the pair's own
    interval excludes 1 (the same setup decided different: the machine moved more than the intervals allow).

    With ``by_rounds`` (as :func:`shift_by_rounds`), where the rounds differ, the ratio is the blocked one, and so
    is the interval from 6 rounds (one reference a round: 5 rounds' 32 relabelings allow no 95% interval); with
    fewer rounds the interval (the drift check) stays the unpaired one, and ``method`` says both."""
    floor = shift_by_rounds(copy_rates, [base_rates], by_rounds=False)
    if by_rounds:
        blocked = shift_by_rounds(copy_rates, [base_rates])
        floor["round_drift_f"] = blocked["round_drift_f"]
        if blocked["method"] == PAIRED_INTERVAL:
            floor = blocked
        elif blocked["round_drift_f"] is not None and blocked["round_drift_f"] >= ROUND_DRIFT_F:
            paired = aligned_rank_shift_ci(list(copy_rates), [[b] for b in base_rates])
            if paired is not None:
                floor.update(ratio=paired[0], method=f"{PAIRED_INTERVAL} estimate, {floor['method']}")
    if floor["ratio"] is None:
        floor.update(band=None, drifted=None)
        return floor
    d = max(floor["ratio"], 1.0 / floor["ratio"])
    floor["band"] = (1.0 / d, d)
    floor["drifted"] = (None if floor["low"] is None else (floor["low"] > 1.0 or floor["high"] < 1.0))
    return floor


def decide(cmp: Dict[str, Any], floor: Optional[Dict[str, Any]], min_effect_pct: float = MIN_EFFECT_PCT
           ) -> Dict[str, Any]:
    """The verdict of one setup's ratio (:func:`ratio_between`) against the noise floor (:func:`noise_floor`, or None
    where no A/A pair ran): ``verdict`` (:data:`FASTER`, :data:`SLOWER`, :data:`WITHIN_NOISE`, :data:`NO_VERDICT`)
    and ``why`` in words."""
    ratio, lo, hi = cmp.get("ratio"), cmp.get("low"), cmp.get("high")
    if ratio is None:
        return {"verdict": NO_VERDICT, "why": "no rate to compare"}
    if lo is None:
        return {"verdict": NO_VERDICT, "why": "one run a side: the drift between runs was not measured"}
    if floor is not None and floor.get("drifted"):
        return {"verdict": NO_VERDICT, "why": "the A/A pair (the baseline twice) differed beyond its interval: the"
                                              " machine drifted more than the intervals allow"}
    if not (lo > 1.0 or hi < 1.0):
        return {"verdict": WITHIN_NOISE, "why": "its interval holds 1"}
    if abs(ratio - 1.0) * 100.0 < min_effect_pct:
        return {"verdict": WITHIN_NOISE, "why": f"a change below {min_effect_pct:g}%"}
    band = (floor or {}).get("band")
    if band is not None and lo <= band[1] and hi >= band[0]:
        return {"verdict": WITHIN_NOISE, "why": f"its interval reaches the A/A noise floor ({band[0]:.3f}x to"
                                                f" {band[1]:.3f}x)"}
    why = "" if band is not None else "no A/A pair ran: decided on its interval alone"
    return {"verdict": FASTER if lo > 1.0 else SLOWER, "why": why}


def best_or_tie(rates: Dict[str, Sequence[Optional[float]]], floor: Optional[Dict[str, Any]],
                min_effect_pct: float = MIN_EFFECT_PCT) -> Dict[str, Any]:
    """Of setups (name -> runs' rates, higher is better; give the baseline's entry its A/A copy's runs too), the
    fastest by median rate, and whether it is decided: ``best`` (its name, only where every other setup is decided
    slower than it, by :func:`decide` on :func:`shift_between` of the two), ``top`` (the fastest measured), ``tie``
    (the setups not decided apart from ``top``, ``top`` first)."""
    means = {name: shift_ratio_ci(_usable(values), [1.0]) for name, values in rates.items()}
    ranked = sorted((n for n in means if means[n] is not None), key=lambda n: -means[n][0])
    if not ranked:
        return {"best": None, "top": None, "tie": []}
    top = ranked[0]
    tie = [top] + [other for other in ranked[1:]
                   if decide(shift_between(rates[top], rates[other]), floor, min_effect_pct)["verdict"] != FASTER]
    return {"best": top if len(tie) == 1 else None, "top": top, "tie": tie}


def ratio_text(ratio: float) -> str:
    """``1.23x faster`` or ``1.10x slower`` (a ratio of rates)."""
    return f"{ratio:.2f}x faster" if ratio >= 1.0 else f"{1.0 / ratio:.2f}x slower"


def floor_text(floor: Optional[Dict[str, Any]]) -> str:
    """``1.01x, 95% CI 0.97x to 1.05x (rank interval) over 5 + 5 runs`` (the A/A ratio and its interval, and how it
    was measured), or why there is none."""
    if floor is None:
        return "not measured (no A/A pair)"
    if floor["ratio"] is None:
        return "n/a (the A/A pair has no rate)"
    runs = f" over {floor['runs'][1]} + {floor['runs'][0]} runs"
    if floor["low"] is None:
        return f"{floor['ratio']:.3f}x{runs} (no interval: one run a side)"
    return f"{floor['ratio']:.3f}x, 95% CI {floor['low']:.3f}x to {floor['high']:.3f}x ({floor['method']}){runs}"
