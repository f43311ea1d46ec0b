"""compare's verdict between runs: one run a side is no verdict (the drift between runs was not measured); repeats
of each side give an interval from the spread between runs, proven on synthetic drift; a run measured on a busy
machine is flagged. The command runs in a subprocess on real summary files."""

import copy
import itertools
import json
import math
import random
import subprocess
import sys

import pytest

from helpers import TinyModel, find_summary, fit
from lightning_perf import IterationTimer
from lightning_perf.measure.stats.ratio_ci import between_runs_ratio_ci, rank_sum_counts, shift_ratio_ci
from lightning_perf.summary.compare import MIN_EFFECT_PCT, compare_summaries


# -- the rule, on synthetic drift ---------------------------------------------------------------------------------
def _trials(n_trials, runs, sd, true_ratio, seed):
    """Per-run speeds of two setups, each run's figure off its setup's by a drift drawn from lognormal(0, sd): how
    often the rule calls the pair significant, and how often the interval covers the true ratio."""
    rng = random.Random(seed)
    significant = covered = 0
    for _ in range(n_trials):
        base = [math.exp(rng.gauss(0.0, sd)) for _ in range(runs)]
        cand = [true_ratio * math.exp(rng.gauss(0.0, sd)) for _ in range(runs)]
        ratio, lo, hi = between_runs_ratio_ci(cand, base)
        significant += (lo > 1.0 or hi < 1.0) and abs(ratio - 1.0) * 100.0 >= MIN_EFFECT_PCT
        covered += lo <= true_ratio <= hi
    return significant / n_trials, covered / n_trials


@pytest.mark.parametrize("runs", [2, 3, 5])
def test_an_aa_pair_with_repeats_is_rarely_called_significant_and_the_interval_covers_at_its_rate(runs):
    """Between-run drift of 5% (sd): A/A trials called significant at the nominal 5% (2,000 trials of each count
    read 4.4 to 6.1% over three seeds); here 400, whose binomial spread is ~1.1 points: at most 7%, and the interval
    covers the true ratio (1) in at least 93%."""
    called, covered = _trials(400, runs, 0.05, 1.0, seed=runs)
    assert called <= 0.07 and covered >= 0.93, (called, covered)


def test_a_ten_percent_change_is_found_with_three_runs_a_side():
    """Drift of 2.5% (sd) between runs, three runs a side: a 10% change is found in at least 90% (2,000 trials:
    93%; with 3% drift 82%, with 2% 99%)."""
    called, covered = _trials(400, 3, 0.025, 1.10, seed=7)
    assert called >= 0.90 and covered >= 0.93, (called, covered)


def test_fewer_than_two_runs_or_a_bad_figure_gives_no_interval():
    assert between_runs_ratio_ci([1.0], [1.0, 1.1]) is None
    assert between_runs_ratio_ci([1.0, float("nan")], [1.0, 1.1]) is None
    assert between_runs_ratio_ci([1.0, 0.0], [1.0, 1.1]) is None
    ratio, lo, hi = between_runs_ratio_ci([2.0, 2.0], [1.0, 1.0])  # no spread at all: a point
    assert ratio == lo == hi == pytest.approx(2.0)


@pytest.mark.parametrize("n, m", [(5, 5), (5, 10), (3, 6), (4, 4), (8, 8)])
def test_the_rank_interval_of_two_sets_of_one_setup_excludes_1_at_most_at_its_level_whatever_the_noise(n, m):
    """Every order of n + m runs of one setup is equally likely whatever their noise (slow runs included), so the
    share of orders whose rank interval excludes 1, counted over all of them, is the interval's exact error rate:
    at most 5%, and the counts of the Mann-Whitney U match a count of the orders themselves."""
    values = [1.0 + 0.01 * i for i in range(n + m)]  # distinct rates: only their order matters
    excluded = 0
    by_u = [0] * (n * m + 1)
    for picked in itertools.combinations(range(n + m), n):
        a = [values[i] for i in picked]
        b = [values[i] for i in range(n + m) if i not in picked]
        by_u[sum(x < y for x in a for y in b)] += 1
        _, lo, hi = shift_ratio_ci(a, b)
        excluded += lo > 1.0 or hi < 1.0
    orders = math.comb(n + m, n)
    assert tuple(by_u) == rank_sum_counts(min(n, m), max(n, m))
    assert excluded / orders <= 0.05, excluded / orders
    assert excluded / orders >= 0.02  # not wider than the level needs (5 + 5: 8 of 252, 3.2%; 4 + 4: 2 of 70)


def test_the_rank_estimate_ignores_one_slow_run_and_few_runs_have_no_interval():
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    # one run of five 20% slower moves the geometric means' ratio by 4%; the median of the pairwise ratios by < 1%
    slow_run = [110.0, 111.0, 109.0, 110.5, 110.0 / 1.2]
    ratio, lo, hi = shift_ratio_ci(slow_run, base)
    assert ratio == pytest.approx(1.10, abs=0.01) and lo < ratio < hi
    assert between_runs_ratio_ci(slow_run, base)[0] < 1.07
    assert shift_ratio_ci([1.3, 1.31, 1.29], [1.0, 1.01, 0.99])[1:] == (None, None)  # 3 + 3: none at 95%
    assert shift_ratio_ci([1.0, float("nan")], [1.0]) is None and shift_ratio_ci([], [1.0]) is None


# -- the command, on real summaries -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("one")
    fit(root, [IterationTimer(warmup_steps=2)], model=TinyModel(), max_epochs=8, limit_val_batches=0,
        num_sanity_val_steps=0, enable_progress_bar=False)
    return find_summary(root)


def _copies(one_run, tmp_path, name, means_ms, busy=False):
    """Summary files of one setup run len(means_ms) times: the real summary with its mean ms/iter set to each."""
    paths = []
    for i, mean in enumerate(means_ms):
        s = copy.deepcopy(one_run)
        s["iteration_timer"]["ms_per_iter"]["mean"] = mean
        if busy:
            s["vram"] = {"activity": {"host_logical_cores": 2, "phases": {"train": {
                "cpu_wait_pct": {"mean": 40.0, "p5": 30.0, "samples": 20},
                "process_cpu_cores": {"mean": 0.6, "p5": 0.5, "samples": 20},
                "host_cpu_pct": {"mean": 100.0, "p5": 100.0, "samples": 20}}}}}
        path = tmp_path / f"{name}{i}.json"
        path.write_text(json.dumps(s))
        paths.append(str(path))
    return paths


def _compare(*args):
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "compare", *args], capture_output=True,
                          text=True, timeout=120)
    return proc


def test_one_run_a_side_is_no_verdict(one_run, tmp_path):
    (a,), (b,) = _copies(one_run, tmp_path, "a", [10.0]), _copies(one_run, tmp_path, "b", [6.0])
    text = _compare(a, b).stdout
    speed = next(line for line in text.splitlines() if line.strip().startswith("Speed ratio:"))  # no direction
    assert "within each run" in speed and "no verdict: the drift between runs was not measured" in speed
    assert "significant" not in speed
    result = json.loads(_compare(a, b, "--format", "json").stdout)
    assert result["speedup_significant"] is None and result["speedup_interval"] == "within runs"
    assert result["repeats"] == {"base": 1, "candidate": 1}


def test_repeats_of_an_aa_pair_are_within_noise(one_run, tmp_path):
    a = _copies(one_run, tmp_path, "a", [10.0, 10.6, 9.7])
    b = _copies(one_run, tmp_path, "b", [9.6, 10.3, 10.1])
    proc = _compare(a[0], b[0], "--base-repeats", *a[1:], "--candidate-repeats", *b[1:], "--format", "json",
                    "--fail-if-slower", "5")
    result = json.loads(proc.stdout)
    assert result["speedup_interval"] == "between runs" and result["repeats"] == {"base": 3, "candidate": 3}
    assert result["speedup_significant"] is False
    lo, hi = result["speedup_ci95"]
    assert lo < 1.0 < hi
    geo = math.exp(sum(map(math.log, [10.0, 10.6, 9.7])) / 3 - sum(map(math.log, [9.6, 10.3, 10.1])) / 3)
    assert result["speedup"] == pytest.approx(geo)
    assert proc.returncode == 0  # the gate decides on the between-run estimate: 1.4% faster


def test_repeats_find_a_ten_percent_slowdown_and_the_gate_fails(one_run, tmp_path):
    a = _copies(one_run, tmp_path, "a", [10.0, 10.1, 9.9])
    b = _copies(one_run, tmp_path, "b", [11.0, 11.1, 10.9])
    proc = _compare(a[0], b[0], "--base-repeats", *a[1:], "--candidate-repeats", *b[1:], "--fail-if-slower", "5")
    speed = next(line for line in proc.stdout.splitlines() if line.strip().startswith("Slowdown:"))
    assert "between 3 + 3 runs, significant" in speed and "1.10x slower" in speed
    assert proc.returncode == 1 and "slower than base" in proc.stderr


def test_a_run_on_a_busy_machine_is_flagged_and_so_is_a_difference_in_contention(one_run, tmp_path):
    (a,) = _copies(one_run, tmp_path, "a", [10.0], busy=False)
    (b,) = _copies(one_run, tmp_path, "b", [12.0], busy=True)
    quiet = copy.deepcopy(one_run)
    quiet["vram"] = {"activity": {"host_logical_cores": 2, "phases": {"train": {
        "cpu_wait_pct": {"mean": 1.0, "p5": 0.0, "samples": 20}}}}}
    result = compare_summaries(quiet, json.loads(open(b).read()), base_name="quiet", candidate_name="busy")
    notes = result["notes"]
    assert any(n.startswith("busy was measured on a busy machine (the training thread waited for a CPU 40%")
               for n in notes), notes
    assert any("different contention (quiet quiet)" in n for n in notes), notes
    # a base with no activity at all is neither quiet nor busy: no claim of a difference
    result = compare_summaries(json.loads(open(a).read()), json.loads(open(b).read()))
    assert not any("different contention" in n for n in result["notes"])


def test_report_notes_each_run_measured_on_a_busy_machine(one_run, tmp_path):
    a = _copies(one_run, tmp_path, "a", [10.0])
    b = _copies(one_run, tmp_path, "b", [12.0], busy=True)
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "report", *a, *b, "--names", "quiet", "busy"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stdout.splitlines() if line.startswith("- ")]
    assert notes == ["- busy: measured while the machine was busy: the training thread waited for a CPU 40% of the"
                     " time (the process got 0.60 of 2 cores while the machine ran at 100%): its speed and its"
                     " Change may be the machine's"], proc.stdout


def test_a_change_of_data_loading_boundary_between_the_runs_is_noted(one_run):
    a, b = copy.deepcopy(one_run), copy.deepcopy(one_run)
    a["section_profiler"] = {"data_loading_boundary": "batch_gap"}
    b["section_profiler"] = {"data_loading_boundary": "fetch"}
    notes = compare_summaries(a, b)["notes"]
    assert any(n.startswith("data_loading was timed at different boundaries (base: batch_gap, candidate: fetch")
               for n in notes), notes
    assert not any("boundaries" in n for n in compare_summaries(b, copy.deepcopy(b))["notes"])
