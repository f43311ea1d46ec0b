"""How often the matrix's verdict between runs is wrong, and how often it finds a 10% change: a seeded simulation of
matrices of a baseline, a variant and the baseline's A/A copy, each run once a round for ``--runs`` interleaved rounds
in the matrix's order (baseline, variant, copy; reversed each round), under models of the noise between runs.

- ``lognormal 3%``: each run's rate off the setup's by a lognormal drift of 3% (sd of the log);
- ``slow runs``: each run, with probability 1/8, 15 to 25% slower (uniform), else a lognormal drift of 2.5%: what a
  shared 2-core virtual machine showed (noise there only ever added time: 2 of 16 runs of one CPU-bound setup read
  39.4 and 40.0 ms a step against 30.0 to 33.0 for the other 14);
- ``slow runs, variant spared``: as ``slow runs``, but the variant never has a slow run (on that machine the variant
  that slept a little each step never had one): only the baseline's setup pays for the machine;
- ``round drift 20%``: every setup of a round shares that round's speed, lognormal with sd 20% from round to round,
  on top of 3% (or 8%) between runs, or of the slow runs: what the same machine showed with one core kept busy (the
  denoise matrix's round means 58, 43, 38, 35 and 36 ms a step; 7 to 10% between the runs of a round);
- ``trend 62->33 ms``: the machine speeds up run after run, within rounds too (62 ms a step at the first run, 33 +
  29 exp(-run / 2.8) ms after: all setups read 62-64 ms in the first round and 33-39 in the last), plus 3% or 8%.

For each rule it prints, in % of the trials: ``A/A`` the A/A pair (the copy against the baseline) decided different
(the matrix then decides nothing), ``A/A/A`` a variant alike to the baseline decided faster or slower (a false
verdict), ``10% slower`` / ``10% faster`` a variant 1.1x slower / faster decided in the right direction, the 95%
interval's coverage of the true ratio for the A/A/A variant and the slower one, and ``paired`` the share of the slower
variant's verdicts measured within rounds. The rules:

- ``t, 5 v 5, point band`` (the rule before ranks): geometric means, Student's t on the logs against the baseline's
  runs, the band of the A/A pair's geometric-mean ratio;
- ``ranks, pooled, band`` (the rule before rounds): Hodges-Lehmann shift with the exact Mann-Whitney interval against
  the baseline's and the copy's runs together, the A/A pair by ranks, the band of its ratio;
- ``aligned ranks, always``: the blocked rule wherever it has an interval, whatever the rounds' F;
- ``matrix: by rounds at F >= 3`` (the matrix's rule, :func:`lightning_perf.bench.noise_floor.shift_by_rounds`):
  within rounds by aligned ranks where the rounds' two-way F is at least 3, else the rule before rounds;
- ``compare: t, no A/A``: two sides and no A/A pair, as ``compare --base-repeats --candidate-repeats`` decides (its
  ``A/A/A`` column is then an A/A pair called significant).

Pure Python, seeded: the same figures every time.

    python benchmarks/verdict_power.py                          # 2,000 trials, 5 rounds, about 5 minutes
    python benchmarks/verdict_power.py --runs 8 --trials 400    # 8 rounds, about 4 minutes
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lightning_perf.bench.noise_floor import (  # noqa: E402
    FASTER,
    PAIRED_INTERVAL,
    SLOWER,
    decide,
    noise_floor,
    ratio_between,
    shift_between,
    shift_by_rounds,
)
from lightning_perf.bench.rounds import round_order  # noqa: E402
from lightning_perf.measure.stats.round_blocks import aligned_rank_shift_ci  # noqa: E402

#: The matrix's order of the setups in odd rounds (the A/A copy is added last); even rounds reverse it.
ORDER = ("base", "variant", "copy")


def draw_matrix(rng: random.Random, variant_ratio: float, rounds: int, sd: float = 0.03, round_sd: float = 0.0,
                p_slow: float = 0.0, trend: bool = False, spared: bool = False) -> Dict[str, List[float]]:
    """Each setup's rates, one a round, in the rounds' order of runs: a run's log rate is its setup's, plus the
    round's shared drift (sd ``round_sd``), minus the machine's trend at that run, plus its own noise (sd ``sd``);
    with probability ``p_slow`` (never the variant's where ``spared``) the run takes 15 to 25% longer."""
    ratios = {"base": 1.0, "variant": variant_ratio, "copy": 1.0}
    out: Dict[str, List[float]] = {name: [] for name in ORDER}
    run = 0
    for k in range(1, rounds + 1):
        shared = rng.gauss(0.0, round_sd) if round_sd else 0.0
        for name in round_order(ORDER, k):
            log_rate = math.log(ratios[name]) + shared + rng.gauss(0.0, sd)
            if trend:
                log_rate -= math.log((33.0 + 29.0 * math.exp(-run / 2.8)) / 33.0)
            if p_slow and not (spared and name == "variant") and rng.random() < p_slow:
                log_rate -= math.log(rng.uniform(1.15, 1.25))
            out[name].append(math.exp(log_rate))
            run += 1
    return out


MODELS: Dict[str, Dict[str, Any]] = {
    "lognormal 3%": dict(sd=0.03),
    "slow runs (1 in 8, +15-25%)": dict(sd=0.025, p_slow=1.0 / 8.0),
    "slow runs, variant spared": dict(sd=0.025, p_slow=1.0 / 8.0, spared=True),
    "round drift 20%, runs 3%": dict(sd=0.03, round_sd=0.2),
    "round drift 20%, runs 8%": dict(sd=0.08, round_sd=0.2),
    "round drift 20%, slow runs": dict(sd=0.025, round_sd=0.2, p_slow=1.0 / 8.0),
    "trend 62->33 ms, runs 3%": dict(sd=0.03, trend=True),
    "trend 62->33 ms, runs 8%": dict(sd=0.08, trend=True),
}


def _floor_of(cmp: Dict[str, Any]) -> Dict[str, Any]:
    """The A/A floor from the pair's comparison, as :func:`noise_floor` builds it."""
    d = max(cmp["ratio"], 1.0 / cmp["ratio"])
    drifted = None if cmp["low"] is None else (cmp["low"] > 1.0 or cmp["high"] < 1.0)
    return dict(cmp, band=(1.0 / d, d), drifted=drifted)


def before_ranks(variant: Sequence[float], base: Sequence[float], copy: Sequence[float]):
    return ratio_between(variant, base), _floor_of(ratio_between(copy, base))


def before_rounds(variant: Sequence[float], base: Sequence[float], copy: Sequence[float]):
    return shift_between(variant, list(base) + list(copy)), noise_floor(copy, base)


def aligned_always(variant: Sequence[float], base: Sequence[float], copy: Sequence[float]):
    """The blocked rule wherever it has an interval (the floor's estimate blocked, its interval from 6 rounds)."""
    cmp, floor = before_rounds(variant, base, copy)
    found = aligned_rank_shift_ci(variant, [[b, c] for b, c in zip(base, copy)])
    if found is not None and found[1] is not None:
        cmp = dict(cmp, ratio=found[0], low=found[1], high=found[2], method=PAIRED_INTERVAL)
    pair = aligned_rank_shift_ci(copy, [[b] for b in base])
    if pair is not None and pair[1] is not None:
        floor = _floor_of({"ratio": pair[0], "low": pair[1], "high": pair[2]})
    elif pair is not None:
        d = max(pair[0], 1.0 / pair[0])
        floor = dict(floor, ratio=pair[0], band=(1.0 / d, d))
    return cmp, floor


def matrix_rule(variant: Sequence[float], base: Sequence[float], copy: Sequence[float]):
    """The matrix's rule, as :func:`lightning_perf.bench.matrix_verdicts.add_verdicts` applies it to full rounds."""
    return shift_by_rounds(variant, [base, copy]), noise_floor(copy, base, by_rounds=True)


def compare_t(variant: Sequence[float], base: Sequence[float], copy: Sequence[float]):
    return ratio_between(variant, base), None


RULES: Dict[str, Callable] = {
    "t, 5 v 5, point band (before)": before_ranks,
    "ranks, pooled, band": before_rounds,
    "aligned ranks, always": aligned_always,
    "matrix: by rounds at F >= 3": matrix_rule,
    "compare: t, no A/A": compare_t,
}


def _covers(cmp: Dict[str, Any], truth: float) -> bool:
    return cmp["low"] is not None and cmp["low"] <= truth <= cmp["high"]


def simulate(model: Dict[str, Any], rules: Dict[str, Callable], runs: int, trials: int, seed: int,
             change: float = 1.1) -> Dict[str, Dict[str, float]]:
    """Each rule's rates over ``trials`` seeded trials of three matrices each (A/A/A, 10% slower, 10% faster: the
    same draws for every rule), in %."""
    rng = random.Random(seed)
    keys = ("aa", "aaa", "slower", "faster", "cover_aaa", "cover_slower", "paired")
    counts = {name: dict.fromkeys(keys, 0) for name in rules}
    for _ in range(trials):
        alike, slow, fast = (draw_matrix(rng, ratio, runs, **model) for ratio in (1.0, 1.0 / change, change))
        for name, rule in rules.items():
            c = counts[name]
            cmp, floor = rule(alike["variant"], alike["base"], alike["copy"])
            c["aa"] += bool(floor and floor["drifted"])
            c["aaa"] += decide(cmp, floor)["verdict"] in (FASTER, SLOWER)
            c["cover_aaa"] += _covers(cmp, 1.0)
            cmp, floor = rule(slow["variant"], slow["base"], slow["copy"])
            c["slower"] += decide(cmp, floor)["verdict"] == SLOWER
            c["cover_slower"] += _covers(cmp, 1.0 / change)
            c["paired"] += cmp.get("method") == PAIRED_INTERVAL
            cmp, floor = rule(fast["variant"], fast["base"], fast["copy"])
            c["faster"] += decide(cmp, floor)["verdict"] == FASTER
    return {name: {k: 100.0 * v / trials for k, v in c.items()} for name, c in counts.items()}


def table(runs: int, trials: int, seed: int, models: Optional[Sequence[str]] = None) -> str:
    head = (f"{'rule':32} {'A/A':>6} {'A/A/A':>6} {'10% slower':>11} {'10% faster':>11} {'cover A/A/A':>12}"
            f" {'cover slower':>13} {'paired':>7}")
    lines = [f"{runs} rounds, {trials} trials, seed {seed} (% of trials)"]
    for label in models or MODELS:
        lines += ["", f"noise: {label}", head]
        for name, r in simulate(MODELS[label], RULES, runs, trials, seed).items():
            lines.append(f"{name:32} {r['aa']:6.1f} {r['aaa']:6.1f} {r['slower']:11.1f} {r['faster']:11.1f}"
                         f" {r['cover_aaa']:12.1f} {r['cover_slower']:13.1f} {r['paired']:7.1f}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[5],
                        help="rounds: runs a setup (the matrix's --repeats)")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", nargs="+", choices=sorted(MODELS), help="only these noise models")
    args = parser.parse_args(argv)
    for runs in args.runs:
        print(table(runs, args.trials, args.seed, args.model), flush=True)
        print()


if __name__ == "__main__":
    main()
