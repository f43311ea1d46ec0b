"""`lightning-perf race`: two training commands (seed 000's baseline and optimised checkouts) run in interleaved rounds
with the suite attached, run as a user runs it, in a subprocess on tiny CPU scripts."""

import json
import math
import subprocess
import sys
import textwrap

import pytest
from helpers import SLEEPY_SCRIPT

pytestmark = pytest.mark.slow

def race(*args, cwd):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", "race", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SLEEPY_SCRIPT).lstrip())
    return path


def test_two_commands_race_in_interleaved_rounds_and_each_repeat_keeps_its_summary(tmp_path, script):
    py = sys.executable
    proc = race("--cmd", f"baseline={py} {script} 40 0.002", "--cmd", f"optimized={py} {script} 40 0.001",
                "--repeats", "2", "--out", "out", "--report", "race.txt", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # interleaved: each round once per command, the order reversed in the second; the A/A copy of the baseline too
    started = [line.split("]", 1)[1].split(":")[0].strip() for line in proc.stderr.splitlines()
               if line.startswith("[race] ") and "round" not in line and " exit " not in line]
    assert started == ["baseline", "optimized", "baseline_aa", "baseline_aa", "optimized", "baseline"], proc.stderr
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    speeds = {}
    for name in ("baseline", "optimized", "baseline_aa"):
        speeds[name] = []
        for k in (1, 2):
            summary = json.loads((tmp_path / "out" / name / f"repeat_{k}" / "perf_summary.json").read_text())
            assert summary["run"]["name"] == name and "section_profiler" in summary
            speeds[name].append(1000.0 / summary["iteration_timer"]["ms_per_iter"]["mean"])
    # the between-run ratio is the geometric means' ratio of the repeats' own figures
    geo = {n: math.exp(sum(map(math.log, v)) / len(v)) for n, v in speeds.items()}
    cmp = result["comparisons"]["optimized"]
    assert cmp["speedup_interval"] == "between runs" and cmp["repeats"] == {"base": 2, "candidate": 2}
    assert cmp["speedup"] == pytest.approx(geo["optimized"] / geo["baseline"], rel=1e-6)
    # the verdict's: against the runs of the baseline and of its copy together; 2 runs against 4 have no 95% rank
    # interval, so Student's t on the logs (geometric means), and the report names it
    pooled = math.exp(sum(map(math.log, speeds["baseline"] + speeds["baseline_aa"])) / 4)
    assert cmp["between_runs"]["ratio"] == pytest.approx(geo["optimized"] / pooled, rel=1e-6)
    assert cmp["between_runs"]["method"] == "Student's t interval" and cmp["between_runs"]["runs"] == [2, 4]
    assert result["noise_floor"]["ratio"] == pytest.approx(geo["baseline_aa"] / geo["baseline"], rel=1e-6)
    assert cmp["verdict"]["verdict"] in ("faster", "slower", "within noise", "no verdict")
    text = (tmp_path / "race.txt").read_text()
    assert "TRAINING TIME COMPARISON" in text and "RACE VERDICT" in text
    assert "2 of 2 interleaved rounds ran" in text and "Noise floor (A/A: baseline_aa against baseline):" in text
    assert "(Student's t interval) over 2 + 2 runs" in text and "Student's t interval, it/s, over 4 + 2 runs" in text
    assert "### baseline_aa against" not in text  # the copy is the floor, not a contender


def test_a_budget_stops_starting_rounds_and_the_report_says_so(tmp_path, script):
    py = sys.executable
    proc = race("--cmd", f"a={py} {script} 8 0", "--cmd", f"b={py} {script} 8 0", "--repeats", "3",
                "--budget", "0.5", "--noise-floor", "off", "--out", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 of 3 interleaved rounds ran" in proc.stdout and "stopped after 1 of 3 race" in proc.stdout
    assert "the verdicts are from the rounds that ran" in proc.stdout
    assert not (tmp_path / "out" / "a" / "repeat_2").exists()
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    assert result["comparisons"]["b"]["verdict"]["verdict"] == "no verdict"  # one run a side decides nothing
    assert "significant" not in proc.stdout.split("RACE VERDICT")[1]


@pytest.mark.parametrize("args, message", [
    (["--cmd", "a=python x.py"], "give at least two --cmd NAME=COMMAND to race (got 1)"),
    (["--cmd", "python x.py", "--cmd", "b=python y.py"], "--cmd 'python x.py': expected NAME=COMMAND"),
    (["--cmd", "a=python x.py", "--cmd", "a=python y.py"], "--cmd 'a' is given twice"),
    (["--cmd", "a=", "--cmd", "b=python y.py"], "--cmd 'a=': no command after '='"),
    (["--cmd", "../up=python x.py", "--cmd", "b=python y.py"], "the name '../up' must be"),
    (["--cmd", "a=python 'x.py", "--cmd", "b=python y.py"], "the command cannot be split"),
    (["--cmd", "a=python x.py", "--cmd", "b=python y.py", "--noise-floor", "c"], "--noise-floor 'c': expected auto"),
    (["--cmd", "a=python x.py", "--cmd", "b=python y.py", "--repeats", "0"], "--repeats"),
])
def test_a_bad_argument_is_one_line_naming_it_and_nothing_runs(tmp_path, args, message):
    proc = race(*args, "--out", "out", cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
