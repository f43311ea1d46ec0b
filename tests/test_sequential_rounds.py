"""Rounds until decided (lightning_perf/bench/sequential.py): the always-valid interval keeps its error rates with the
stopping rule applied, on synthetic rounds with this machine's noise; and ``race --repeats auto`` stops when decided."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from lightning_perf.bench.sequential import (
    DEFAULT_MAX_ROUNDS,
    FASTER,
    NO_VERDICT,
    SAME,
    SLOWER,
    UNDECIDED,
    boundary_factor,
    confidence_sequence,
    decide_rounds,
    rounds_for,
    smallest_change,
)
from lightning_perf.bench.sequential_sim import (
    NOISE_MODELS,
    OUTCOMES,
    power_table,
    run_sequential,
    sequential_outcomes,
    simulate_logs,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIALS = 2000


@pytest.mark.parametrize("model", NOISE_MODELS)
@pytest.mark.parametrize("floor", [True, False])
def test_aa_false_positive_rate_with_the_stopping_rule_applied(model, floor):
    """An A/A pair, a decision looked for after every round up to the cap and the rounds stopped at the first: called
    faster or slower in at most 5% of 2,000 trials (a fixed-round t interval looked at so often would pass 5%)."""
    found = run_sequential(model, 0.0, TRIALS, DEFAULT_MAX_ROUNDS, seed=11, floor=floor)
    assert found["faster"] + found["slower"] <= 0.05, found


@pytest.mark.parametrize("model", NOISE_MODELS)
def test_peeking_at_a_fixed_round_interval_would_not_hold(model):
    """The check above has teeth: Student's t at 95%, looked at after every round from 3 on, decides A/A pairs in
    well over 5% of trials on the same series."""
    from lightning_perf.measure.ratio_ci import t_quantile_at_least

    rng = np.random.default_rng(3)
    logs = simulate_logs(model, TRIALS, DEFAULT_MAX_ROUNDS, 2, rng)
    d = logs[:, :, 1] - logs[:, :, 0]
    n = np.arange(1, DEFAULT_MAX_ROUNDS + 1)
    mean = np.cumsum(d, axis=1) / n
    var = np.maximum(np.cumsum(d * d, axis=1) - n * mean * mean, 0.0) / np.maximum(n - 1, 1)
    crit = np.array([t_quantile_at_least(0.975, max(i - 1, 1)) for i in n])
    called = ((np.abs(mean) > crit * np.sqrt(var / n)) & (n >= 3)).any(axis=1).mean()
    assert called > 0.10


@pytest.mark.parametrize("model", NOISE_MODELS)
@pytest.mark.parametrize("change", [5.0, -5.0, 8.0])
def test_the_same_within_5pct_is_wrong_at_most_5pct_of_trials(model, change):
    """A change of 5% or more (5% is the edge: the hardest case) is called "the same within +/-5%" in at most 5% of
    trials, the stopping rule applied."""
    found = run_sequential(model, change, TRIALS, DEFAULT_MAX_ROUNDS, seed=23)
    assert found["same"] <= 0.05, found


@pytest.mark.parametrize("model", NOISE_MODELS)
def test_power_at_the_default_cap(model):
    """The power table of docs/bench.md (benchmarks/sequential_power.py): at the default cap of rounds a 20% change
    is decided in most trials on every noise model, a 10% one where the runs of a process do not jump between modes,
    and power grows with the change and with the rounds."""
    table = power_table(changes=(5.0, 10.0, 20.0), budgets=(10, DEFAULT_MAX_ROUNDS), trials=1000, model=model)[model]
    at_cap = table[DEFAULT_MAX_ROUNDS]
    assert at_cap[20.0] >= 0.9, table
    assert at_cap[5.0] <= at_cap[10.0] <= at_cap[20.0]
    assert all(table[10][c] <= at_cap[c] + 0.03 for c in at_cap), table
    if model != "two_group":
        assert at_cap[10.0] >= 0.9, table


def test_the_vectorised_rule_is_the_rule_race_applies():
    """The simulation's decisions are decide_rounds' own, round by round (so its rates are the CLI's)."""
    rng = np.random.default_rng(5)
    logs = simulate_logs("two_group", 150, 25, 3, rng)
    logs[:75, :, 2] += math.log(0.85)
    final, first = sequential_outcomes(logs)
    names = {FASTER: "faster", SLOWER: "slower", SAME: "same", NO_VERDICT: "no_verdict", UNDECIDED: "undecided"}
    for trial in range(150):
        d = list(logs[trial, :, 2] - logs[trial, :, :2].mean(axis=1))
        floor = list(logs[trial, :, 1] - logs[trial, :, 0])
        for k in range(1, 26):
            verdict = decide_rounds(d[:k], floor[:k])["verdict"]
            if verdict != UNDECIDED or k == 25:
                break
        assert (names[verdict], k - 1) == (OUTCOMES[final[trial]], first[trial])


def test_the_interval_and_what_would_decide():
    assert boundary_factor(4) == math.inf and math.isfinite(boundary_factor(5))
    assert boundary_factor(40) < boundary_factor(10)
    cs = confidence_sequence([0.1, -0.1, 0.05, -0.05, 0.0, 0.02])
    assert cs["low"] < 0.0 < cs["high"] and cs["n"] == 6
    sd = 0.15
    need = rounds_for(10.0, sd)
    assert smallest_change(sd, need) <= math.log(1.1) < smallest_change(sd, need - 1)
    found = decide_rounds([0.2, -0.15, 0.1, -0.2, 0.05, 0.0], [0.01, -0.02, 0.0, 0.03, -0.01, 0.0])
    assert found["verdict"] == UNDECIDED
    assert f"hides changes under ~{found['smallest_change_pct']:.0f}% at 6 rounds" in found["why"]
    assert f"about {found['rounds_for_10pct']} rounds would find 10%" in found["why"]
    assert "lightning-perf run --trial" in found["why"]
    assert decide_rounds([math.log(0.8) + e for e in (0.01, -0.01, 0.02, 0.0, -0.02, 0.01)])["verdict"] == SLOWER
    assert decide_rounds([e for e in (0.01, -0.01, 0.005, 0.0, -0.01, 0.01)])["verdict"] == SAME
    assert decide_rounds([0.3, 0.31, 0.29, 0.3, 0.3], [0.2, 0.21, 0.19, 0.2, 0.2])["verdict"] == NO_VERDICT
