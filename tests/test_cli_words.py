"""Issue 45: words that read right (a slowdown said as one, one memory unit per line, compare's diagnoses each on
their own lines), and CLI answers found by an adversarial run (a mean without iterations, `--version`, a profiler
switched off by the environment)."""

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import PacedModel, fit, use_virtual_clock
from lightning_perf import IterationTimer, SectionProfiler, VRAMMonitor
from lightning_perf.summary.compare import compare_summaries, format_markdown, format_text
from lightning_perf.summary.report import format_report, report_rows



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """"fast" costs 2 ms a step, "slow" 14.4 ms (7.2x the time); both with SectionProfiler and VRAMMonitor."""
    root = tmp_path_factory.mktemp("words")
    paths = {}
    with pytest.MonkeyPatch.context() as mp:
        clock = use_virtual_clock(mp)
        for name, step_s in (("fast", 0.002), ("slow", 0.0144)):
            path = str(root / name / "perf_summary.json")
            fit(root / name, [IterationTimer(warmup_steps=1, summary_path=path),
                              SectionProfiler(warmup_steps=1, print_reports=False), VRAMMonitor()],
                model=PacedModel(clock, step_s), max_epochs=5)
            paths[name] = path
    return paths


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **(env or {})))


def load(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def saved(tmp_path, name, data):
    path = tmp_path / name / "perf_summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def again(tmp_path, path, name):
    """A second run of ``path``'s setup (its copy, started a minute later): with it, each side has repeats and the
    verdict is decided between runs (issue 59: with one run a side no line says faster or slower)."""
    data = load(path)
    data["run"]["started_at"] = "2026-01-01T00:01:00+00:00"
    return saved(tmp_path, name, data)


# -- a slowdown reads as one -------------------------------------------------------------------------------------------
def test_a_slower_candidate_is_said_slower_not_a_speedup_below_one(runs, tmp_path):
    """Before: "Speedup: 0.14x (-86.2%)" and "Time saved: -16.1 min (-624.4%)"."""
    repeats = [again(tmp_path, runs["fast"], "fast2"), again(tmp_path, runs["slow"], "slow2")]
    proc = cli("compare", runs["fast"], runs["slow"], "--base-repeats", repeats[0], "--candidate-repeats", repeats[1],
               "--names", "fast", "slow")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    result = compare_summaries(load(runs["fast"]), load(runs["slow"]), base_repeats=[load(repeats[0])],
                               candidate_repeats=[load(repeats[1])])
    factor = 1.0 / result["speedup"]
    assert 6.0 < factor < 8.5  # 14.4 ms against 2 ms a step, plus the loop's own time in both
    assert re.search(rf"Slowdown:\s+{factor:.2f}x slower", out), out
    assert not re.search(r"\b0\.\d+x", out), out  # no speed ratio below one anywhere
    longer = result["time_to_iterations_s"]["candidate"] - result["time_to_iterations_s"]["base"]
    assert longer > 0
    assert re.search(r"Time lost:\s+slow takes [\d.]+ (min|s|hours) longer \(\+[\d.]+%\)", out), out
    assert "Time saved" not in out and "-624" not in out and not re.search(r"Time \w+:\s+-", out), out
    md = format_markdown(result)
    assert f"{factor:.2f}x slower" in md and "longer" in md and "0." not in md.split("**Slowdown:**")[1][:6], md


def test_a_faster_candidate_still_reads_speedup_and_time_saved(runs, tmp_path):
    repeats = [again(tmp_path, runs["slow"], "slow2"), again(tmp_path, runs["fast"], "fast2")]
    out = cli("compare", runs["slow"], runs["fast"], "--base-repeats", repeats[0], "--candidate-repeats",
              repeats[1]).stdout
    result = compare_summaries(load(runs["slow"]), load(runs["fast"]))
    assert re.search(rf"Speedup:\s+{result['speedup']:.2f}x faster", out), out
    assert re.search(r"Time saved:\s+[\d.]+ (min|s|hours) \([\d.]+%\)", out), out
    # one run a side: the same figures, no direction decided (issue 59)
    out = cli("compare", runs["slow"], runs["fast"]).stdout
    assert re.search(rf"Speed ratio:\s+candidate/base speed {result['speedup']:.3f}", out), out
    assert re.search(r"Time change:\s+between [\d.]+ (min|s|hours) and [\d.]+ (min|s|hours) saved \(not decided\)",
                     out) or re.search(r"Time change:\s+[\d.]+ (min|s|hours) saved \(not decided\)", out), out
    assert "faster" not in out.split("TRAINING TIME COMPARISON")[1], out


# -- one memory unit per line ------------------------------------------------------------------------------------------
def test_memory_uses_one_unit_per_line_and_shows_a_change_only_where_there_is_one(runs, tmp_path):
    """Before: compare printed "1.01 GB -> 1.02 GB (+0.0%)" for 1039.32 -> 1039.41 MB (a 10 MB change that was
    0.09 MB), and report mixed GB and MB in one cell."""
    base, cand = load(runs["fast"]), load(runs["slow"])
    field = next(k for k, v in base["vram"]["phases"]["train"].items() if k.endswith("_mb") and v is not None)
    base["vram"]["phases"]["train"][field] = 1039.32
    cand["vram"]["phases"]["train"][field] = 1039.41
    out = format_text(compare_summaries(base, cand))
    line = next(l for l in out.splitlines() if "train peak" in l and "->" in l)
    assert "1039 MiB -> 1039 MiB (same within the noise floor (\u00b1156 MiB))" in line, line
    cand["vram"]["phases"]["train"][field] = 30000.0  # 29.30 GB: one unit, GB, for the three figures
    line = next(l for l in format_text(compare_summaries(base, cand)).splitlines() if "train peak" in l and "->" in l)
    assert "1.01 GiB -> 29.30 GiB (+28.28 GiB" in line and "MiB" not in line, line
    def train_peaks(table):
        lines = table.splitlines()
        column = [c.strip() for c in lines[0].split("|")].index("Train peak")
        return [[c.strip() for c in line.split("|")][column] for line in lines[2:4]]

    assert train_peaks(format_report(report_rows([base, cand], ["fast", "slow"]))) == [
        "1039 MiB", "29.30 GiB (+28.28 GiB, +2786.5%)"]
    cand["vram"]["phases"]["train"][field] = 1039.41
    assert train_peaks(format_report(report_rows([base, cand], ["fast", "slow"]))) == [
        "1039 MiB", "1039 MiB (same within the noise floor, \u00b1156 MiB)"]


# -- compare's first line ------------------------------------------------------------------------------------------------
def test_compare_puts_each_diagnosis_on_its_own_short_lines(runs, tmp_path):
    """Before: one line of 620 characters holding both runs' diagnoses."""
    base = load(runs["fast"])
    base["diagnosis"] = {"verdict": "not-enough-measured", "reason": "x " * 150, "advice": "y " * 100}
    out = cli("compare", saved(tmp_path, "base", base), runs["slow"], "--names", "base", "slow").stdout
    head = out.split("TRAINING TIME COMPARISON")[0].splitlines()
    assert head[0].startswith("Diagnosis of slow:"), head
    assert any(line.startswith("Diagnosis of base:") for line in head[1:]), head
    assert max(len(line) for line in head) <= 120, max(head, key=len)


# -- item 4: a mean without the iterations behind it cannot decide ------------------------------------------------------
def test_the_gate_fails_closed_on_a_mean_with_zero_measured_iterations(runs, tmp_path):
    """Before: exit 0, the candidate judged by a mean no iteration was behind."""
    for side in ("base", "cand"):
        data = load(runs["fast"])
        data["iteration_timer"]["measured_iterations"] = 0
        bad = saved(tmp_path, side, data)
        args = (bad, runs["fast"]) if side == "base" else (runs["fast"], bad)
        proc = cli("compare", *args, "--fail-if-slower", "50")
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        assert "cannot decide" in proc.stderr and "0 measured iterations" in proc.stderr, proc.stderr
        assert re.search(r"Speed ratio:\s+n/a", proc.stdout), proc.stdout


# -- item 4: --version ---------------------------------------------------------------------------------------------------
def test_version_is_one_line_on_stdout():
    from lightning_perf import __version__

    proc = cli("--version")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == f"lightning-perf {__version__}\n", proc.stdout


# -- item 4: the profiler switched off by the environment ----------------------------------------------------------------
def test_a_profiler_switched_off_by_the_environment_is_said_so_not_missing(tmp_path, monkeypatch, caplog):
    """Before: "Add SectionProfiler to the Trainer's callbacks" though it was there, switched off."""
    monkeypatch.setenv("LIGHTNING_PERF_PROFILE", "0")
    path = tmp_path / "perf_summary.json"
    fit(tmp_path, [IterationTimer(summary_path=str(path)), SectionProfiler()], max_epochs=1)
    diagnosis = load(path)["diagnosis"]
    text = f"{diagnosis['reason']} {diagnosis['advice']}"
    assert "LIGHTNING_PERF_PROFILE=0" in text and "Add SectionProfiler" not in text, text
