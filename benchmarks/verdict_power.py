"""How often the matrix's verdict between runs is wrong, and how often it finds a 10% change: a seeded simulation of a
baseline, its A/A copy and a variant, each run ``--runs`` times, under two models of the noise between runs.

- ``lognormal``: each run's rate off the setup's by a lognormal drift of 3% (sd of the log);
- ``slow runs``: each run, with probability 1/8, 15 to 25% slower (uniform), else a lognormal drift of 2.5%: what a
  shared 2-core virtual machine showed (noise there only ever added time: 2 of 16 runs of one CPU-bound setup read
  39.4 and 40.0 ms a step against 30.0 to 33.0 for the other 14);
- ``slow runs, variant spared``: as ``slow runs``, but the variant never has a slow run (on that machine the variant
  that slept a little each step never had one): only the baseline's setup pays for the machine.

For each rule it prints, in % of the trials: ``A/A`` the A/A pair (the copy against the baseline) decided different
(the matrix then decides nothing), ``A/A/A`` a third copy of the baseline decided faster or slower (a false verdict),
``10% slower`` / ``10% faster`` a variant 1.1x slower / faster decided in the right direction, and the 95% interval's
coverage of the true ratio for the A/A/A variant and the slower one. The rules:

- ``t, 5 v 5, point band`` (the rule before ranks): geometric means, Student's t on the logs against the baseline's
  runs, the band of the A/A pair's geometric-mean ratio;
- ``t, pooled, band``: the same against the baseline's and the copy's runs together;
- ``ranks, 5 v 5, band``: Hodges-Lehmann shift with the exact Mann-Whitney interval against the baseline's runs;
- ``ranks, pooled, no band``: the matrix's rule without the band (the A/A pair's drift check only);
- ``ranks, pooled, band`` (the matrix's rule, :mod:`lightning_perf.bench.noise_floor`): the variant by ranks against
  the baseline's and the copy's runs together, the A/A pair by ranks, the band of its ratio;
- ``compare: t`` / ``compare: ranks``: two sides and no A/A pair, as ``compare --base-repeats --candidate-repeats``
  decides (its ``A/A/A`` column is then an A/A pair called significant); compare keeps t.

Pure Python, seeded: the same figures every time.

    python benchmarks/verdict_power.py                     # 2,000 trials, 5 runs a setup, about 10 s
    python benchmarks/verdict_power.py --runs 3 8 --trials 1000
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
    SLOWER,
    decide,
    noise_floor,
    ratio_between,
    shift_between,
)

#: ``model(rng, true_ratio, runs, spared)`` -> the runs' rates of one setup.
Model = Callable[[random.Random, float, int, bool], List[float]]


def lognormal(rng: random.Random, true_ratio: float, runs: int, spared: bool = False, sd: float = 0.03) -> List[float]:
    return [true_ratio * math.exp(rng.gauss(0.0, sd)) for _ in range(runs)]


def slow_runs(rng: random.Random, true_ratio: float, runs: int, spared: bool = False, sd: float = 0.025,
              p_slow: float = 1.0 / 8.0) -> List[float]:
    """Lognormal ``sd``; with probability ``p_slow`` (never where ``spared``) the run takes 15 to 25% longer."""
    out = []
    for _ in range(runs):
        rate = true_ratio * math.exp(rng.gauss(0.0, sd))
        if not spared and rng.random() < p_slow:
            rate /= rng.uniform(1.15, 1.25)
        out.append(rate)
    return out


MODELS: Dict[str, Tuple[Model, bool]] = {
    "lognormal 3%": (lognormal, False),
    "slow runs (1 in 8, +15-25%)": (slow_runs, False),
    "slow runs, variant spared": (slow_runs, True),
}


def _floor_of(cmp: Dict[str, Any]) -> Dict[str, Any]:
    """The A/A floor from the pair's comparison, as :func:`noise_floor` builds it."""
    d = max(cmp["ratio"], 1.0 / cmp["ratio"])
    drifted = None if cmp["low"] is None else (cmp["low"] > 1.0 or cmp["high"] < 1.0)
    return dict(cmp, band=(1.0 / d, d), drifted=drifted)


def _rule(measure: Callable, pooled: bool, band: bool, aa: bool = True) -> Callable:
    """A rule: (variant, base, copy) -> (verdict, the variant's comparison); ``aa`` False: no A/A pair at all (as
    ``compare`` decides two sides)."""

    def rule(variant: Sequence[float], base: Sequence[float], copy: Sequence[float]):
        floor = _floor_of(measure(copy, base)) if aa else None
        if floor is not None and not band:
            floor = dict(floor, band=None)
        cmp = measure(variant, list(base) + (list(copy) if pooled else []))
        return decide(cmp, floor)["verdict"], cmp

    return rule


def matrix_rule(variant: Sequence[float], base: Sequence[float], copy: Sequence[float]):
    """The matrix's rule, as :func:`lightning_perf.bench.matrix_verdicts.add_verdicts` applies it."""
    cmp = shift_between(variant, list(base) + list(copy))
    return decide(cmp, noise_floor(copy, base))["verdict"], cmp


RULES = {
    "t, 5 v 5, point band (before)": _rule(ratio_between, pooled=False, band=True),
    "t, pooled, band": _rule(ratio_between, pooled=True, band=True),
    "ranks, 5 v 5, band": _rule(shift_between, pooled=False, band=True),
    "ranks, pooled, no band": _rule(shift_between, pooled=True, band=False),
    "ranks, pooled, band (matrix)": matrix_rule,
    "compare: t, no A/A": _rule(ratio_between, pooled=False, band=False, aa=False),
    "compare: ranks, no A/A": _rule(shift_between, pooled=False, band=False, aa=False),
}


def _covers(cmp: Dict[str, Any], truth: float) -> bool:
    return cmp["low"] is not None and cmp["low"] <= truth <= cmp["high"]


def simulate(model: Model, spared: bool, rules: Dict[str, Callable], runs: int, trials: int, seed: int,
             change: float = 1.1) -> Dict[str, Dict[str, float]]:
    """Each rule's rates over ``trials`` seeded matrices (the same draws for every rule), in %."""
    rng = random.Random(seed)
    counts = {name: dict.fromkeys(("aa", "aaa", "slower", "faster", "cover_aaa", "cover_slower"), 0) for name in rules}
    for _ in range(trials):
        base, copy, third = (model(rng, 1.0, runs, False) for _ in range(3))
        slow, fast = model(rng, 1.0 / change, runs, spared), model(rng, change, runs, spared)
        for name, rule in rules.items():
            c = counts[name]
            c["aa"] += bool(_floor_of(shift_between(copy, base) if "ranks" in name else ratio_between(copy, base))
                            ["drifted"])
            verdict, cmp = rule(third, base, copy)
            c["aaa"] += verdict in (FASTER, SLOWER)
            c["cover_aaa"] += _covers(cmp, 1.0)
            verdict, cmp = rule(slow, base, copy)
            c["slower"] += verdict == SLOWER
            c["cover_slower"] += _covers(cmp, 1.0 / change)
            c["faster"] += rule(fast, base, copy)[0] == FASTER
    return {name: {k: 100.0 * v / trials for k, v in c.items()} for name, c in counts.items()}


def table(runs: int, trials: int, seed: int) -> str:
    head = (f"{'rule':32} {'A/A':>6} {'A/A/A':>6} {'10% slower':>11} {'10% faster':>11} {'cover A/A/A':>12}"
            f" {'cover slower':>13}")
    lines = [f"{runs} runs a setup, {trials} trials, seed {seed} (% of trials)"]
    for label, (model, spared) in MODELS.items():
        lines += ["", f"noise: {label}", head]
        for name, r in simulate(model, spared, RULES, runs, trials, seed).items():
            lines.append(f"{name:32} {r['aa']:6.1f} {r['aaa']:6.1f} {r['slower']:11.1f} {r['faster']:11.1f}"
                         f" {r['cover_aaa']:12.1f} {r['cover_slower']:13.1f}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[5], help="runs a setup (the matrix's --repeats)")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for runs in args.runs:
        print(table(runs, args.trials, args.seed))
        print()


if __name__ == "__main__":
    main()
