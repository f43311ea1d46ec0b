"""benchmarks/overhead.py's --hooks-only and --against, run as a developer runs them (a subprocess)."""

import os
import re
import shutil
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
SCRIPT = os.path.join(ROOT, "benchmarks", "overhead.py")


def bench(*args, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_bad_against_is_one_line_and_exit_2(tmp_path):
    proc = bench("--against", str(tmp_path))
    assert proc.returncode == 2 and "--against compares --hooks-only figures" in proc.stderr
    proc = bench("--hooks-only", "IterationTimer", "--against", str(tmp_path))
    assert proc.returncode == 2 and f"--against {str(tmp_path)!r}: no lightning_perf package" in proc.stderr


def test_against_measures_the_other_checkout_in_runs_alternating_with_this_one(tmp_path):
    """A copy of the package whose IterationTimer sleeps 3 ms in a step hook: its figure holds the sleep, this
    checkout's does not, so each side ran its own code."""
    other = tmp_path / "other"
    shutil.copytree(os.path.join(ROOT, "lightning_perf"), other / "lightning_perf")
    path = other / "lightning_perf" / "callbacks" / "iteration_timer.py"
    source = path.read_text()
    hook = "        self._stepped = True\n"
    assert source.count(hook) == 1
    path.write_text(source.replace(hook, hook + "        __import__('time').sleep(0.003)\n"))
    proc = bench("--hooks-only", "IterationTimer", "--against", str(other), "--steps", "10", "--rounds", "1")
    assert proc.returncode == 0, proc.stderr
    rows = dict(re.findall(r"^  IterationTimer\s+(this checkout|--against)\s+median\s+([0-9.]+)", proc.stdout, re.M))
    assert set(rows) == {"this checkout", "--against"}, proc.stdout
    assert float(rows["--against"]) >= 3000.0 > float(rows["this checkout"]) + 1000.0
    assert "1 alternating round of" in proc.stdout and str(other) in proc.stdout
