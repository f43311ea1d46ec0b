"""`lightning-perf run --trial NAME` on an unchanged script, and the trial's result in `compare` and `report`."""

import json
import subprocess
import sys

import pytest
from test_run_command import TRAIN, run_cli, write

pytestmark = pytest.mark.slow


def cli(*args):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_run_trial_tries_a_built_in_change_and_compare_and_report_show_it(tmp_path):
    script = write(tmp_path / "project" / "train.py", TRAIN.format(namespace="lightning.pytorch"))
    assert "lightning_perf" not in script.read_text()
    out = tmp_path / "runs"
    # 70 steps: warm-up 20, then blocks of 10 -> blocks 0 to 4 full, block 5 just started: 2 complete pairs
    proc = run_cli("--out", str(out), "--name", "mp", "--trial", "matmul_precision", "--", sys.executable,
                   str(script), "70", "0", "ckpt", cwd=str(script.parent))
    assert proc.returncode == 0, proc.stderr
    path = out / "mp" / "perf_summary.json"
    trial = json.loads(path.read_text())["trial"]
    assert trial["change"] == "matmul_precision" and trial["targets"] == "compute-bound"
    assert trial["status"] == "incomplete" and trial["pairs"] == 2 and trial["speedup"] is not None
    assert "ABTrial: with matmul_precision:" in proc.stderr + proc.stdout

    compared = cli("compare", str(path), str(path))
    assert compared.returncode == 0, compared.stderr
    assert "A/B trial inside the run" in compared.stdout
    assert compared.stdout.count("with matmul_precision:") == 2
    assert "the diagnosis's ceiling for compute-bound" in compared.stdout
    reported = cli("report", str(path))
    assert reported.returncode == 0, reported.stderr
    assert "trial with matmul_precision:" in reported.stdout


def test_run_trial_refuses_an_unknown_change(tmp_path):
    proc = run_cli("--trial", "turbo", "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2 and "--trial: invalid choice: 'turbo'" in proc.stderr


def test_run_trial_of_a_change_this_run_cannot_try_warns_and_the_rest_of_the_suite_measures(tmp_path):
    """The refused trial is recorded in its section; the other attached callbacks still measure the run (under
    `matrix --trial` a refusal would otherwise leave every variant unmeasured)."""
    script = write(tmp_path / "project" / "train.py", TRAIN.format(namespace="lightning.pytorch"))
    proc = run_cli("--out", str(tmp_path / "runs"), "--trial", "cudnn_benchmark", "--", sys.executable, str(script),
                   "6", "0", "ckpt", cwd=str(script.parent))
    assert proc.returncode == 0, proc.stderr
    assert "ABTrial(change='cudnn_benchmark') cannot be tried in this run" in proc.stderr
    assert "CUDA kernels only" in proc.stderr
    summary = json.loads((tmp_path / "runs" / "perf_summary.json").read_text())
    assert summary["iteration_timer"]["iterations"] == 6
    assert summary["trial"]["status"] == "not-started" and "CUDA kernels only" in summary["trial"]["reason"]
    assert summary["trial"]["pairs"] == 0 and summary["trial"]["speedup"] is None
