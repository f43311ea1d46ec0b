"""The A/A noise floor and the verdicts between runs (matrix, race): proven on synthetic drift between runs, on the
rounds' order and budget with a clock the test moves, and on real fits timed on the virtual clock while another
process keeps a core busy."""

import json
import math
import multiprocessing
import random
import time

import pytest

from helpers import PacedModel, fit, use_virtual_clock
from lightning_perf import IterationTimer
from lightning_perf.bench.noise_floor import (
    FASTER,
    NO_VERDICT,
    SLOWER,
    WITHIN_NOISE,
    best_or_tie,
    decide,
    noise_floor,
    ratio_between,
)
from lightning_perf.bench.rounds import DEFAULT_REPEATS, run_rounds


# -- the rule, on synthetic drift ---------------------------------------------------------------------------------
def _drifted(rng, runs, sd, true_ratio=1.0):
    """Per-run rates of one setup: each run's figure off the setup's by a drift drawn from lognormal(0, sd)."""
    return [true_ratio * math.exp(rng.gauss(0.0, sd)) for _ in range(runs)]


def _matrix_trials(n_trials, runs, sd, true_ratio, seed):
    """A baseline, its A/A copy and a variant, each ``runs`` runs: how often the variant is decided (either way), and
    how often its interval covers the true ratio."""
    rng = random.Random(seed)
    decided = covered = 0
    for _ in range(n_trials):
        base, copy, variant = _drifted(rng, runs, sd), _drifted(rng, runs, sd), _drifted(rng, runs, sd, true_ratio)
        cmp = ratio_between(variant, base)
        decided += decide(cmp, noise_floor(copy, base))["verdict"] in (FASTER, SLOWER)
        covered += cmp["low"] <= true_ratio <= cmp["high"]
    return decided / n_trials, covered / n_trials


@pytest.mark.parametrize("runs", [3, DEFAULT_REPEATS])
def test_an_aa_variant_is_rarely_decided_and_the_interval_covers_at_its_rate(runs):
    """Three setups alike (A/A/A), 3% drift between runs: the variant decided in at most 5% of 400 trials (2,000
    trials: 1.3% with 3 runs, 0.7% with 5), and its interval covers the true ratio in at least 93% (nominal 95%)."""
    decided, covered = _matrix_trials(400, runs, 0.03, 1.0, seed=runs)
    assert decided <= 0.05 and covered >= 0.93, (decided, covered)


def test_a_ten_percent_change_is_found_with_the_default_repeats():
    """10% slower, 2.5% drift between runs, the default 5 runs a side with the A/A copy: decided slower in at least
    90% of 400 trials (2,000 trials: 94%; 3% drift: 90%; 4 runs a side at 2.5%: 90%, at 3%: 82%)."""
    decided, covered = _matrix_trials(400, DEFAULT_REPEATS, 0.025, 1.0 / 1.1, seed=11)
    assert decided >= 0.90 and covered >= 0.93, (decided, covered)


def test_the_noise_floor_keeps_a_change_the_pair_itself_shows_within_noise():
    """A variant 4% faster in every run, where the A/A pair differs by 6%: its interval excludes 1, but it reaches
    the band of the A/A ratio, so it is within noise; with no A/A pair it would be decided on its interval alone."""
    base, copy, fast = [1.0, 1.01, 0.99, 1.0, 1.0], [1.06, 1.07, 1.05, 1.06, 1.06], [1.04, 1.05, 1.03, 1.04, 1.04]
    floor = noise_floor(copy, base)
    assert floor["band"][1] == pytest.approx(floor["ratio"]) and floor["drifted"] is True
    # the pair itself differed beyond its interval: nothing is decided
    assert decide(ratio_between(fast, base), floor)["verdict"] == NO_VERDICT
    floor = noise_floor([1.06, 0.96, 1.08, 0.99, 1.07], base)  # the same 2% or so, with the spread to show it
    assert floor["drifted"] is False
    verdict = decide(ratio_between(fast, base), floor)
    assert verdict["verdict"] == WITHIN_NOISE and "A/A noise floor" in verdict["why"], verdict
    assert decide(ratio_between(fast, base), None)["verdict"] == FASTER
    assert decide(ratio_between([1.04], [1.0]), floor)["verdict"] == NO_VERDICT  # one run a side


def test_the_best_is_named_only_when_decided_otherwise_the_ties():
    rng = random.Random(3)
    base = _drifted(rng, 5, 0.01)
    floor = noise_floor(_drifted(rng, 5, 0.01), base)
    clear = best_or_tie({"base": base, "fast": _drifted(rng, 5, 0.01, 1.3), "mid": _drifted(rng, 5, 0.01, 1.1)},
                        floor)
    assert clear == {"best": "fast", "top": "fast", "tie": ["fast"]}
    tied = best_or_tie({"base": base, "a": _drifted(rng, 5, 0.01, 1.3), "b": _drifted(rng, 5, 0.01, 1.3)}, floor)
    assert tied["best"] is None and sorted(tied["tie"]) == ["a", "b"]


# -- the rounds -----------------------------------------------------------------------------------------------------
def test_rounds_alternate_and_the_budget_stops_a_round_that_would_not_fit():
    """Each run takes 10 s on the test's clock, two setups a round: 20 s a round. A 50 s budget lets round 2 start
    (20 s spent + 20 s) and not round 3 (40 + 20 > 50); the first round always runs, even past the budget."""
    now = [0.0]
    order = []

    def run_one(name, k):
        order.append((name, k))
        now[0] += 10.0
        return f"{name}{k}"

    info = run_rounds(["a", "b"], 4, run_one, budget_s=50.0, log=lambda m: None, clock=lambda: now[0])
    assert order == [("a", 1), ("b", 1), ("b", 2), ("a", 2)]
    assert info["done"] == 2 and info["planned"] == 4 and info["results"] == {"a": ["a1", "a2"], "b": ["b1", "b2"]}
    assert info["stopped"].startswith("stopped after 2 of 4 rounds: round 3 would have passed the budget of 50 s")
    info = run_rounds(["a", "b"], 3, run_one, budget_s=1.0, log=lambda m: None, clock=lambda: now[0])
    assert info["done"] == 1 and info["stopped"]
    with pytest.raises(ValueError, match="budget must be a finite number of seconds > 0, got 0"):
        run_rounds(["a"], 2, run_one, budget_s=0)


# -- real fits, one core kept busy ------------------------------------------------------------------------------------
def _spin():
    while True:
        pass


def _paced_runs(tmp_path, monkeypatch, name, step_s, factors):
    """One setup's runs: real fits whose training step costs ``step_s`` times the run's drift factor on the virtual
    clock, as a result of ``run_matrix`` (the first run, the others in ``repeats``)."""
    results = []
    for k, factor in enumerate(factors, start=1):
        clock = use_virtual_clock(monkeypatch)
        path = tmp_path / name / f"repeat_{k}" / "perf_summary.json"
        fit(tmp_path / name / f"repeat_{k}", [IterationTimer(warmup_steps=2, summary_path=str(path))],
            model=PacedModel(clock, step_s * factor), max_epochs=3, limit_val_batches=0, num_sanity_val_steps=0,
            enable_progress_bar=False)
        results.append({"name": name, "overrides": [], "exit_code": 0, "wall_s": 1.0,
                        "summary": json.loads(path.read_text()), "summary_path": str(path), "log": ""})
    first, *later = results
    first["repeats"] = later
    return first


@pytest.mark.slow
def test_with_a_core_kept_busy_the_aa_pair_is_within_noise_and_a_ten_percent_cost_is_found(tmp_path, monkeypatch):
    """Real fits while another process spins on a core; each run's step cost on the virtual clock drifts by a seeded
    2% between runs (the machine's part, known). The A/A copy is within noise, and the variant whose step costs 10%
    more is decided slower, by 10% +- 3%, on both bases."""
    from lightning_perf.bench.matrix import findings, matrix_rows

    rng = random.Random(5)
    drift = {name: [math.exp(rng.gauss(0.0, 0.02)) for _ in range(DEFAULT_REPEATS)]
             for name in ("baseline", "baseline_aa", "slow")}
    spinner = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    spinner.start()
    try:
        time.sleep(0.3)
        results = [_paced_runs(tmp_path, monkeypatch, "baseline", 0.010, drift["baseline"]),
                   _paced_runs(tmp_path, monkeypatch, "baseline_aa", 0.010, drift["baseline_aa"]),
                   _paced_runs(tmp_path, monkeypatch, "slow", 0.011, drift["slow"])]
    finally:
        spinner.terminate()
        spinner.join(10)
    rows = {r["variant"]: r for r in matrix_rows(results, noise_floor="baseline_aa")}
    aa, slow = rows["baseline_aa"], rows["slow"]
    assert aa["noise_floor"] and aa["steady_verdict"] == WITHIN_NOISE and aa["end_to_end_verdict"] == WITHIN_NOISE
    assert slow["steady_verdict"] == SLOWER and slow["end_to_end_verdict"] == SLOWER, slow
    assert 1.0 / slow["speedup"] == pytest.approx(1.10, abs=0.03)
    assert 1.0 / slow["end_to_end_speedup"] == pytest.approx(1.10, abs=0.03)
    # the interval holds the ratio of the drifts the test put in (the truth, known here)
    truth = math.exp(sum(map(math.log, drift["baseline"])) / 5 - sum(map(math.log, drift["slow"])) / 5) / 1.1
    assert slow["speedup_ci_low"] <= truth <= slow["speedup_ci_high"]
    found = findings(list(rows.values()), best_by="steady")
    assert any(f.startswith("Decided against baseline: slow 1.1") for f in found), found
    assert any(f.startswith("Noise floor (A/A: baseline_aa") for f in found), found
