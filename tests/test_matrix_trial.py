"""`lightning-perf matrix --trial CHANGE`: an A/B trial inside each variant's fits, one pooled figure per variant."""

import json
import os
import subprocess
import sys

import pytest
from helpers import write_toy_cli

from lightning_perf.bench.matrix_trial import add_trial, pooled_trial, trial_cell
from lightning_perf.measure.trials.blocks import paired_ratio


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def _result(pairs, reason=None):
    trial = {"change": "tf32", "reason": reason, "pair_off_ms": [a for a, _ in pairs],
             "pair_on_ms": [b for _, b in pairs]}
    return {"summary": {"trial": trial}}


def test_a_variants_trial_pools_the_pairs_of_all_its_runs():
    first, second = [(10.0, 11.0), (10.2, 10.6), (9.9, 10.8)], [(20.0, 21.5), (20.4, 21.0)]
    out = pooled_trial("tf32", [_result(first), _result(second)])
    ratio, low, high = paired_ratio(first + second)
    assert out["trial_pairs"] == 5 and out["trial_runs"] == 2
    assert out["trial_speedup"] == pytest.approx(1 / ratio) and out["trial_speedup_low"] == pytest.approx(1 / high)
    assert out["trial_verdict"] == "slower" and out["trial_speedup_high"] < 1
    one = pooled_trial("tf32", [_result(first)])  # one run: that run's own statistic
    assert one["trial_speedup"] == pytest.approx(1 / paired_ratio(first)[0]) and one["trial_runs"] == 1
    cut = pooled_trial("tf32", [_result(first[:1], reason="the fit ended after 50 of 260 iterations")])
    assert cut["trial_speedup"] is None and "1 complete pair(s) of blocks in 1 run(s)" in cut["trial_reason"]
    assert "the fit ended after 50" in cut["trial_reason"] and trial_cell(cut) == "n/a"
    refused = _result([], reason="ABTrial(change='tf32') cannot be tried in this run: no CUDA")
    refused["summary"]["trial"]["status"] = "not-started"
    reason = pooled_trial("tf32", [refused])["trial_reason"]
    assert reason == "ABTrial(change='tf32') cannot be tried in this run: no CUDA"
    rows = [{"variant": "a"}]
    add_trial(rows, [{"summary": {}, "repeats": []}], "tf32")
    assert rows[0]["trial_reason"] == "no run of this variant has a trial section"


@pytest.mark.slow
def test_matrix_trial_reports_each_variants_in_run_speedup_from_its_summaries(tmp_path):
    """A real matrix of one variant in two rounds, matmul_precision tried inside each fit: the row's figure is the
    pairs of both runs' trial sections pooled; the first run alone gives its own section's figure."""
    write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=64)
    # 70 steps: warm-up 20, blocks of 10: 2 complete pairs a run
    proc = cli("matrix", "--script", "cli_toy.py", "--variant", "baseline=--trainer.max_steps=70", "--repeats", "2",
               "--noise-floor", "off", "--trial", "matmul_precision", "--out", "runs", "--csv", "m.csv",
               cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = []
    for folder in ("runs/baseline", "runs/baseline/repeat_2"):
        with open(tmp_path / folder / "perf_summary.json") as fh:
            trials.append(json.load(fh)["trial"])
    assert [t["change"] for t in trials] == ["matmul_precision"] * 2 and [t["pairs"] for t in trials] == [2, 2]
    first = list(zip(trials[0]["pair_off_ms"], trials[0]["pair_on_ms"]))
    assert 1 / paired_ratio(first)[0] == pytest.approx(trials[0]["speedup"], rel=1e-9)
    pooled = first + list(zip(trials[1]["pair_off_ms"], trials[1]["pair_on_ms"]))
    ratio, low, high = paired_ratio(pooled)
    from test_bench import read_csv

    row = read_csv(tmp_path / "m.csv")[0]
    assert row["trial_change"] == "matmul_precision" and row["trial_pairs"] == "4" and row["trial_runs"] == "2"
    assert float(row["trial_speedup"]) == pytest.approx(1 / ratio, rel=1e-6)
    assert float(row["trial_speedup_low"]) == pytest.approx(1 / high, rel=1e-6)
    assert float(row["trial_speedup_high"]) == pytest.approx(1 / low, rel=1e-6)
    assert "| Trial: matmul_precision in-run speedup (95% CI) |" in proc.stdout
    cell = f"{1 / ratio:.3f}x [{1 / high:.3f}-{1 / low:.3f}], 4 pairs of 2 runs"
    assert cell in proc.stdout and "- Trial of matmul_precision inside each fit" in proc.stdout, proc.stdout


def test_matrix_trial_refuses_an_unknown_change_before_any_run(tmp_path):
    write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=64)
    proc = cli("matrix", "--script", "cli_toy.py", "--variant", "baseline", "--trial", "turbo", "--out", "runs",
               cwd=str(tmp_path))
    assert proc.returncode == 2 and "argument --trial: invalid choice: 'turbo'" in proc.stderr, proc.stderr
    assert "'channels_last'" in proc.stderr and "'autocast_bf16'" in proc.stderr
    assert not os.path.exists(tmp_path / "runs")
