"""compare and the summary readers against inputs built to mislead them (issue 63): a failed repeat, a run passed
twice, a schema-2 mean without its iteration count, samples per iteration known on one side only, a percentage of
time over 100. The command runs in a subprocess on copies of one real summary."""

import copy
import json
import shutil
import subprocess
import sys

import pytest

from lightning_perf.summary.compare import compare_summaries
from test_between_runs import one_run  # noqa: F401 - the fixture: one real run, copied with other figures


def _write(tmp_path, name, summary):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(summary))
    return str(path)


def _run(one_run, mean_ms, **changes):
    """A copy of the real summary with its mean ms/iter set (it/s and samples/s kept consistent with it)."""
    s = copy.deepcopy(one_run)
    timer = s["iteration_timer"]
    per_iter = timer["samples_per_s"] / timer["it_per_s"]
    timer["ms_per_iter"]["mean"] = mean_ms
    timer["it_per_s"] = 1000.0 / mean_ms
    timer["samples_per_s"] = per_iter * 1000.0 / mean_ms
    for key, value in changes.items():
        s[key] = value
    return s


def _compare(*args):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", "compare", *args], capture_output=True,
                          text=True, timeout=120)


# -- 9: every run's status counts --------------------------------------------------------------------------------------
def test_a_failed_repeat_is_noted_and_the_gate_fails_closed_naming_its_file(one_run, tmp_path):
    a = [_write(tmp_path, f"a{i}", _run(one_run, m)) for i, m in enumerate([10.0, 10.1])]
    slow = _write(tmp_path, "cand_slow", _run(one_run, 10.2))
    failed = _write(tmp_path, "cand_failed", _run(one_run, 10.3, status="failed"))
    proc = _compare(a[0], slow, "--base-repeats", a[1], "--candidate-repeats", failed, "--fail-if-slower", "5")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "cannot decide" in proc.stderr and "cand_failed.json" in proc.stderr
    assert "status is 'failed'" in proc.stderr
    notes = [line for line in proc.stdout.splitlines() if line.startswith("  - ")]
    assert any("repeat 2 run status is 'failed'" in n for n in notes), notes
    # without the gate the figures are shown, the note with them, and the exit status is 0
    proc = _compare(a[0], slow, "--base-repeats", a[1], "--candidate-repeats", failed, "--format", "json")
    assert proc.returncode == 0
    assert any("repeat 2 run status is 'failed'" in n for n in json.loads(proc.stdout)["notes"])


# -- 10: a run passed twice counts once --------------------------------------------------------------------------------
def test_a_repeat_passed_twice_or_copied_under_another_name_is_dropped_with_a_note(one_run, tmp_path):
    a = [_write(tmp_path, f"a{i}", _run(one_run, m)) for i, m in enumerate([10.0, 10.1])]
    b = _write(tmp_path, "b0", _run(one_run, 10.3))
    twin = str(tmp_path / "b0_copy.json")
    shutil.copyfile(b, twin)
    for again in (b, twin):
        proc = _compare(a[0], b, "--base-repeats", a[1], "--candidate-repeats", again, "--format", "json")
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["repeats"] == {"base": 2, "candidate": 1}, result["repeats"]
        assert result["speedup_significant"] is not True
        assert any(n.startswith(f"{again} is the same run as {b}") and "counted once" in n
                   for n in result["notes"]), result["notes"]
    text = _compare(a[0], b, "--base-repeats", a[1], "--candidate-repeats", b).stdout
    assert "between 2 + 2 runs" not in text and "significant" not in text.split("Notes:")[0]


def test_one_run_given_as_a_base_and_as_a_candidate_with_repeats_exits_2_naming_both_files(one_run, tmp_path):
    a = [_write(tmp_path, f"a{i}", _run(one_run, m)) for i, m in enumerate([10.0, 10.1])]
    b = [_write(tmp_path, f"b{i}", _run(one_run, m)) for i, m in enumerate([10.3, 10.4])]
    proc = _compare(a[0], b[0], "--base-repeats", a[1], "--candidate-repeats", a[1])
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and a[1] in lines[0] and "--base-repeats" in lines[0], lines
    assert "--candidate-repeats" in lines[0] and "both" in lines[0]


# -- 15: a schema-2 mean needs its count; samples known on one side only -----------------------------------------------
def test_a_schema_2_mean_without_measured_iterations_cannot_pass_the_gate(one_run, tmp_path):
    base = _write(tmp_path, "base", _run(one_run, 10.0))
    cand = _run(one_run, 6.0)
    assert cand["schema_version"] == 2
    cand["iteration_timer"]["measured_iterations"] = None
    cand_path = _write(tmp_path, "cand", cand)
    proc = _compare(base, cand_path, "--fail-if-slower", "5")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "cannot decide" in proc.stderr and "measured_iterations" in proc.stderr
    result = compare_summaries(json.loads(open(base).read()), cand)
    assert result["speedup"] is None
    assert any("measured_iterations" in n for n in result["notes"]), result["notes"]
    # a repeat without it has no speed either: no between-run interval built on it
    repeats = [_run(one_run, 10.1), copy.deepcopy(cand)]
    repeats[1]["iteration_timer"]["ms_per_iter"]["mean"] = 6.1
    result = compare_summaries(json.loads(open(base).read()), _run(one_run, 6.0), base_repeats=repeats[:1],
                               candidate_repeats=repeats[1:])
    assert result["speedup"] is None, result["notes"]


def test_samples_known_on_one_side_only_is_noted_and_the_gate_does_not_pass_on_it(one_run, tmp_path):
    base = _write(tmp_path, "base", _run(one_run, 10.0))
    cand = _run(one_run, 6.7)  # half the batch at 1.5x the it/s: 25% slower per sample
    cand["iteration_timer"]["samples_per_s"] = None
    cand["iteration_timer"]["samples"] = None
    cand_path = _write(tmp_path, "cand", cand)
    proc = _compare(base, cand_path, "--names", "base", "half", "--fail-if-slower", "5", "--format", "json")
    result = json.loads(proc.stdout)
    assert result["speedup_basis"] == "it/s" and result["speedup"] > 1.4
    assert result["samples_per_iter_unknown"] == ["half"]
    assert any("basis is it/s because samples per iteration are unknown for half" in n for n in result["notes"])
    assert proc.returncode == 1 and "cannot decide" in proc.stderr and "half" in proc.stderr, proc.stderr
    # unknown on both sides: it/s is the only basis there is, no note and no refusal
    both = copy.deepcopy(json.loads(open(base).read()))
    both["iteration_timer"]["samples_per_s"] = None
    both_path = _write(tmp_path, "both", both)
    proc = _compare(both_path, cand_path, "--fail-if-slower", "5", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["samples_per_iter_unknown"] == []


# -- 19: a percentage of time is at most 100 ---------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["cpu_wait_pct", "host_steal_pct", "gpu_throttled_pct", "host_cpu_pct"])
def test_a_share_of_time_over_100_is_refused_like_any_bad_field(one_run, tmp_path, field):
    base = _write(tmp_path, "base", _run(one_run, 10.0))
    busy = _run(one_run, 12.0)
    busy["vram"] = {"activity": {"host_logical_cores": 2, "phases": {"train": {
        field: {"mean": 150.0, "p5": 30.0, "samples": 20}}}}}
    path = _write(tmp_path, "busy", busy)
    proc = _compare(base, path)
    assert proc.returncode == 2 and proc.stdout == "" and "150%" not in proc.stderr
    assert proc.stderr.strip() == (f"lightning-perf: error: {path}: `vram.activity.phases.train.{field}.mean` must be"
                                   " a finite number from 0 to 100, got 150.0"), proc.stderr
    busy["vram"]["activity"]["phases"]["train"][field]["mean"] = 100.0  # the bound itself is a reading
    assert _compare(base, _write(tmp_path, "full", busy)).returncode == 0
