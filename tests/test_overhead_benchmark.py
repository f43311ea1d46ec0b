"""benchmarks/overhead.py's --hooks-only and --against, run as a developer runs them (a subprocess)."""

import os
import re
import shutil
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
SCRIPT = os.path.join(ROOT, "benchmarks", "overhead.py")


def bench(*args, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def copy_of_package(tmp_path):
    other = tmp_path / "other checkout"  # a space in the path
    shutil.copytree(os.path.join(ROOT, "lightning_perf"), other / "lightning_perf")
    return other


@pytest.mark.slow
def test_bad_against_is_one_line_and_exit_2(tmp_path):
    proc = bench("--against", str(tmp_path))
    assert proc.returncode == 2 and "--against compares --hooks-only figures" in proc.stderr
    proc = bench("--hooks-only", "IterationTimer", "--against", str(tmp_path))
    assert proc.returncode == 2 and f"--against {str(tmp_path)!r}: no lightning_perf package" in proc.stderr
    (tmp_path / "a file").write_text("")
    proc = bench("--hooks-only", "IterationTimer", "--against", str(tmp_path / "a file"))
    assert proc.returncode == 2 and "is not a directory: expected a checkout of lightning_perf" in proc.stderr


@pytest.mark.slow
def test_against_measures_the_other_checkout_in_runs_alternating_with_this_one(tmp_path):
    """A copy of the package whose IterationTimer sleeps 10 ms in a step hook: its figure holds the sleep, this
    checkout's does not, so each side ran its own code."""
    other = copy_of_package(tmp_path)
    path = other / "lightning_perf" / "callbacks" / "iteration_timer.py"
    source = path.read_text()
    hook = "        self._stepped = True\n"
    assert source.count(hook) == 1
    path.write_text(source.replace(hook, hook + "        __import__('time').sleep(0.010)\n"))
    proc = bench("--hooks-only", "IterationTimer", "--against", str(other), "--steps", "10", "--rounds", "1")
    assert proc.returncode == 0, proc.stderr
    rows = dict(re.findall(r"^  IterationTimer\s+(this checkout|--against)\s+median\s+([0-9.]+)", proc.stdout, re.M))
    assert set(rows) == {"this checkout", "--against"}, proc.stdout
    assert float(rows["--against"]) >= 10_000.0 and float(rows["this checkout"]) < 5_000.0
    assert "1 alternating round of" in proc.stdout and str(other) in proc.stdout


@pytest.mark.slow
def test_a_run_that_fails_in_the_other_checkout_stops_with_its_own_error(tmp_path):
    other = copy_of_package(tmp_path)
    init = other / "lightning_perf" / "__init__.py"
    init.write_text("raise ImportError('an older lightning_perf without what the benchmark needs')\n")
    proc = bench("--hooks-only", "QualityGate", "--against", str(other), "--steps", "10", "--rounds", "2")
    assert proc.returncode == 1
    assert f"with the lightning_perf of {other} (--against) failed" in proc.stderr
    assert "an older lightning_perf without what the benchmark needs" in proc.stderr
