"""Rounds until decided (lightning_perf/bench/sequential.py): the always-valid interval keeps its error rates with the
stopping rule applied, on synthetic rounds with this machine's noise; and ``race --repeats auto`` stops when decided."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import SLEEPY_SCRIPT, claims
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
    looks_boundary,
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
def test_the_group_sequential_alternative_looks_only_where_planned_and_holds_5pct(model):
    """benchmarks/sequential_power.py --looks: the design race's rule was measured against reads its t interval at
    its planned rounds only (Bonferroni over them), so its A/A error holds too, and off a look it decides nothing."""
    looks = (5, 10, 20, 40)
    factor = looks_boundary(looks)
    assert [math.isinf(factor(n)) for n in (4, 5, 6, 39, 40)] == [True, False, True, True, False]
    from lightning_perf.measure.stats.ratio_ci import t_quantile_at_least
    assert factor(20) == pytest.approx(t_quantile_at_least(1 - 0.05 / 4 / 2, 19) / math.sqrt(20 * 19))
    found = run_sequential(model, 0.0, TRIALS, DEFAULT_MAX_ROUNDS, seed=11, boundary=factor)
    assert found["faster"] + found["slower"] <= 0.05, found
    slow = run_sequential(model, -20.0, 200, 4, seed=5, boundary=factor)  # no look in 4 rounds: nothing decided
    assert slow["slower"] == 0.0 and slow["mean_rounds"] == 4.0, slow


@pytest.mark.parametrize("model", NOISE_MODELS)
def test_peeking_at_a_fixed_round_interval_would_not_hold(model):
    """The check above has teeth: Student's t at 95%, looked at after every round from 3 on, decides A/A pairs in
    well over 5% of trials on the same series."""
    from lightning_perf.measure.stats.ratio_ci import t_quantile_at_least

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


def test_run_rounds_stops_once_decided_and_says_why():
    from lightning_perf.bench.rounds import run_rounds

    seen = []
    info = run_rounds(["a", "b"], 40, lambda name, k: seen.append((name, k)) or k, log=lambda m: None,
                      until=lambda sofar: sofar["done"] >= 3)
    assert info["done"] == 3 and info["stop"] == "decided" and info["rule"] == "sequential"
    assert seen == [("a", 1), ("b", 1), ("b", 2), ("a", 2), ("a", 3), ("b", 3)]
    capped = run_rounds(["a", "b"], 4, lambda name, k: k, log=lambda m: None, until=lambda sofar: False)
    assert capped["done"] == 4 and capped["stop"] == "max rounds"
    ticks = iter(range(1000))
    budget = run_rounds(["a"], 40, lambda name, k: k, budget_s=2.5, log=lambda m: None, until=lambda sofar: False,
                        clock=lambda: float(next(ticks)))
    assert budget["stop"] == "budget" and budget["done"] < 40
    fixed = run_rounds(["a"], 2, lambda name, k: k, log=lambda m: None)
    assert fixed["rule"] == "fixed" and fixed["stop"] == "planned"
    said = []

    def broken(sofar):
        raise ValueError("no rate")

    kept = run_rounds(["a"], 3, lambda name, k: k, log=said.append, until=broken)
    assert kept["done"] == 3 and kept["stop"] == "max rounds"
    assert any("could not read the rounds so far (ValueError: no rate)" in line for line in said)


def _race(tmp_path, *args):
    script = tmp_path / "train.py"
    script.write_text(SLEEPY_SCRIPT.lstrip())
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", "race", *args, "--threads", "keep",
                           "--out", "out"], capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.slow
def test_race_auto_stops_early_once_a_slow_command_is_decided_slower(tmp_path):
    """A command against itself plus a sleep worth ~10 steps of its own: decided slower in a few rounds, the rounds
    stopped there (well before the cap), and race.json says how and why."""
    py = sys.executable
    proc = _race(tmp_path, "--cmd", f"base={py} train.py 20 0.002", "--cmd", f"slow={py} train.py 20 0.03",
                 "--noise-floor", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    rounds = result["rounds"]
    assert rounds["rule"] == "sequential" and rounds["stop"] == "decided", rounds
    assert rounds["done"] < DEFAULT_MAX_ROUNDS and rounds["planned"] == DEFAULT_MAX_ROUNDS
    assert rounds["budget_s"] == 600
    cmp = result["comparisons"]["slow"]
    assert cmp["verdict"]["verdict"] == "slower" and cmp["sequential"]["verdict"] == SLOWER
    assert cmp["between_runs"]["method"] == "always valid, paired by round"
    assert cmp["between_runs"]["high"] < 1.0
    assert "interleaved rounds ran until decided" in proc.stdout and "stopped: decided" in proc.stdout
    assert "slow against base: " in proc.stdout and "slower, decided" in proc.stdout


@pytest.mark.slow
def test_race_auto_of_a_command_against_itself_never_says_different(tmp_path):
    """An A/A race capped at 5 rounds (the first with a finite interval): never decided faster or slower, and no line
    of the verdict claims a difference (tests/helpers.CLAIM_WORDS); an undecided verdict says what
    would decide."""
    py = sys.executable
    proc = _race(tmp_path, "--cmd", f"a={py} train.py 10 0.002", "--cmd", f"b={py} train.py 10 0.002 again",
                 "--repeats", "auto", "--max-rounds", "5", "--noise-floor", "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    assert result["rounds"]["done"] <= 5 and result["rounds"]["stop"] in ("max rounds", "decided")
    verdict = result["comparisons"]["b"]["verdict"]
    assert verdict["verdict"] not in ("faster", "slower"), verdict
    if result["rounds"]["stop"] == "max rounds" and verdict["verdict"] != "the same within +/-5%":
        assert "would find 10%" in verdict["why"] and "lightning-perf run --trial" in verdict["why"], verdict
    text = proc.stdout.split("RACE VERDICT", 1)[1]
    assert claims(text) == [], text
    assert "{'ratio'" not in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--budget", "-3"], "argument --budget: expected seconds or a duration such as 90s, 10m or 1.5h, finite and > 0,"
                         " got '-3'"),
    (["--budget", "10x"], "argument --budget: expected seconds or a duration such as 90s, 10m or 1.5h, finite and > 0,"
                          " got '10x'"),
    (["--repeats", "often"], "argument --repeats: expected auto or an integer >= 1, got 'often'"),
    (["--max-rounds", "0"], "argument --max-rounds: expected a positive integer, got '0'"),
    (["--repeats", "3", "--max-rounds", "9"], "--max-rounds 9: only with --repeats auto (--repeats 3 runs 3 rounds)"),
    (["--same-within", "-1"], "argument --same-within: expected a finite number > 0, got '-1'"),
])
def test_bad_round_options_are_one_line_and_exit_2(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "race", "--cmd", "a=true", "--cmd", "b=true",
                           *args, "--out", "out"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


#: A command that writes the summary SOURCE where race or the matrix reads it; the matrix's script takes it from
#: ``--summary=FILE`` among its overrides.
FAKE = '''
import os, shutil, sys

source = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--summary=")), sys.argv[-1])
path = os.environ.get("LIGHTNING_PERF_SUMMARY_PATH") or os.path.join(os.environ["LIGHTNING_PERF_RUN_OUT"],
                                                                     "perf_summary.json")
shutil.copyfile(source, path)
'''


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A summary of a real fit that completed: every run of a fake command reports it, so every round is alike."""
    from helpers import fit

    from lightning_perf import IterationTimer

    root = tmp_path_factory.mktemp("recorded")
    done = root / "completed.json"
    fit(root / "done", [IterationTimer(warmup_steps=2, summary_path=str(done))], max_steps=20, max_epochs=None,
        num_sanity_val_steps=0, limit_val_batches=0)
    return str(done)


@pytest.mark.slow
def test_matrix_auto_stops_once_every_variant_is_decided_the_same(tmp_path, recorded):
    """Every run of every variant reports the same figures: from the first round with an interval (5) the variant is
    decided the same within +/-5% and the rounds stop there, well before the cap; the findings say so."""
    (tmp_path / "fake.py").write_text(FAKE.lstrip())
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "matrix", "--script", "fake.py",
                           "--variant", f"baseline=--summary={recorded}",
                           "--variant", f"other=--summary={recorded} --x",
                           "--repeats", "auto", "--threads", "keep", "--out", "runs", "--format", "csv"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "every comparison decided after 5 round(s): stopping" in proc.stderr
    import csv
    import io

    rows = {r["variant"]: r for r in csv.DictReader(io.StringIO(proc.stdout.split("\n\n")[0]))}
    assert rows["other"]["rounds_done"] == "5" and rows["other"]["rounds_planned"] == str(DEFAULT_MAX_ROUNDS)
    assert rows["other"]["end_to_end_verdict"] == "the same within +/-5%", rows["other"]
    assert not (tmp_path / "runs" / "other" / "repeat_6").exists()
