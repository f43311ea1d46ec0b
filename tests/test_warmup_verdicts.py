"""Verdicts that count warm-up: the warm-up cost (fit start to the first measured iteration), the end-to-end time and
speedup, the break-even of compare and matrix, Best by end-to-end or steady state, the 3x-slower flag, and matrix's
header and column units.

The fits run on :class:`helpers.VirtualClock` (see test_headline.py for why): the model advances it by a known startup
in ``configure_model`` (where ``torch.compile`` wraps), a known extra on its first training step (autotuning), a known
cost per step and per validation batch, and nothing else moves it. So every figure has a closed form, and the fit's
whole span on the clock is an independent measure of its end-to-end time.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import TinyModel, fit, use_virtual_clock
from lightning_perf import IterationTimer
from lightning_perf.bench.matrix import best_variant, findings, format_matrix, matrix_header, matrix_rows
from lightning_perf.summary.compare import break_even, compare_summaries, format_markdown, format_text

N = 40  # iterations of every run
VAL_S, VAL_BATCHES, VAL_EVERY = 0.050, 2, 20
EVAL_S = (N // VAL_EVERY) * VAL_BATCHES * VAL_S  # 2 validations of 2 batches

#: name -> (step_s, startup_s, first_step_extra_s, batch_size, num_workers)
VARIANTS = {
    "baseline": (0.010, 0.0, 0.0, 8, 0),
    "compile": (0.007, 2.0, 0.3, 8, 0),  # faster per iteration, 2.3 s more warm-up
    "quick": (0.008, 0.0, 0.0, 8, 1),  # faster, no warm-up; its loader has a worker
    "slowwarm": (0.012, 1.0, 0.0, 8, 0),  # slower and more warm-up
    "bs32": (0.036, 0.0, 0.0, 32, 0),  # 4x the samples per iteration: 1.125 ms a sample against 1.25
}


class WarmModel(TinyModel):
    def __init__(self, clock, step_s, startup_s, first_extra_s, batch_size, workers):
        super().__init__()
        self.clock, self.step_s, self.startup_s, self.first_extra_s = clock, step_s, startup_s, first_extra_s
        self.batch_size, self.workers, self.steps = batch_size, workers, 0

    def configure_model(self):
        self.clock.advance(self.startup_s)

    def training_step(self, batch, batch_idx):
        self.steps += 1
        self.clock.advance(self.step_s + (self.first_extra_s if self.steps == 1 else 0.0))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.clock.advance(VAL_S)
        return super().validation_step(batch, batch_idx)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(512, 16, generator=g)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=self.batch_size,
                          num_workers=self.workers)


def closed_form(name):
    """Warm-up cost and end-to-end time at the run's own length, from the injected costs alone."""
    step, startup, extra, _, _ = VARIANTS[name]
    cost = startup + extra  # the warm-up steps' time beyond as many steps at the mean is the first step's extra
    return cost, cost + N * step + EVAL_S


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (summary dict, path, the fit's span on the clock)."""
    root = tmp_path_factory.mktemp("warm")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        clock = use_virtual_clock(mp)
        for name, (step, startup, extra, batch, workers) in VARIANTS.items():
            path = root / name / "perf_summary.json"
            start = clock.t
            fit(root / name, [IterationTimer(warmup_steps=2, summary_path=str(path))],
                model=WarmModel(clock, step, startup, extra, batch, workers), max_epochs=None, max_steps=N,
                val_check_interval=VAL_EVERY, check_val_every_n_epoch=None, limit_val_batches=VAL_BATCHES,
                num_sanity_val_steps=0, enable_checkpointing=False)
            out[name] = (json.loads(path.read_text()), str(path), clock.t - start)
    return out


def decided(base, candidate, **names):
    """compare with a second run of each side (a copy started later): the verdict is decided between runs, so the
    break-even is said (with one run a side it is "not decided": issue 59)."""
    def again(summary):
        copy = json.loads(json.dumps(summary))
        copy["run"]["started_at"] = "2026-01-01T00:01:00+00:00"
        return copy

    return compare_summaries(base, candidate, base_repeats=[again(base)], candidate_repeats=[again(candidate)],
                             **names)


def results_of(runs, names):
    return [{"name": n, "overrides": [], "exit_code": 0, "wall_s": 1.0, "summary": runs[n][0], "log": "",
             "summary_path": runs[n][1]} for n in names]


def test_warm_up_cost_and_end_to_end_time_match_the_injected_costs_and_the_fits_own_clock(runs):
    rows = {r["variant"]: r for r in matrix_rows(results_of(runs, list(VARIANTS)))}
    for name in ("baseline", "compile", "quick", "slowwarm"):
        cost, end = closed_form(name)
        timer = runs[name][0]["iteration_timer"]
        assert timer["startup_time_s"] == pytest.approx(VARIANTS[name][1], abs=1e-9)
        assert rows[name]["warmup_cost_s"] == pytest.approx(cost, abs=1e-9)
        assert rows[name]["end_to_end_s"] == pytest.approx(end, rel=1e-9)
        assert rows[name]["end_to_end_s"] == pytest.approx(runs[name][2], rel=1e-9)  # the whole fit on the clock
        assert timer["validation_runs"] == N // VAL_EVERY
    base_end = closed_form("baseline")[1]
    assert rows["compile"]["end_to_end_speedup"] == pytest.approx(base_end / closed_form("compile")[1], rel=1e-9)
    assert rows["compile"]["speedup"] == pytest.approx(0.010 / 0.007, rel=1e-9)  # steady state: warm-up left out


def test_end_to_end_of_a_batch_size_variant_is_for_the_same_samples(runs):
    rows = {r["variant"]: r for r in matrix_rows(results_of(runs, ["baseline", "bs32"]))}
    n = N * 8 / 32  # the baseline's 320 samples are 10 iterations of 32
    eval_per_iteration = EVAL_S / N  # bs32 validated as often, per iteration, as the baseline
    assert rows["bs32"]["end_to_end_iterations"] == pytest.approx(n)
    assert rows["bs32"]["end_to_end_s"] == pytest.approx(n * (0.036 + eval_per_iteration), rel=1e-9)
    assert rows["bs32"]["speedup_basis"] == "samples/s"
    assert rows["bs32"]["speedup"] == pytest.approx(1.25 / 1.125, rel=1e-9)


def test_break_even_is_extra_warm_up_over_the_saving_per_iteration(runs):
    base, comp = runs["baseline"][0], runs["compile"][0]
    extra = closed_form("compile")[0] - closed_form("baseline")[0]  # 2.3 s
    saving = 0.010 - 0.007
    be = break_even(base, comp)
    assert be["verdict"] == "pays_back"
    assert be["extra_warmup_s"] == pytest.approx(extra, rel=1e-9)
    assert be["saving_ms_per_iter"] == pytest.approx(1000 * saving, rel=1e-9)
    assert be["iterations"] == math.ceil(extra / saving) == 767
    # the candidate's whole training to that point, warm-up included: the base's is no shorter
    assert be["seconds"] == pytest.approx(closed_form("compile")[0] + 767 * 0.007, rel=1e-9)
    assert closed_form("baseline")[0] + 767 * 0.010 >= be["seconds"] > closed_form("baseline")[0] + 766 * 0.010
    # the other way round: less warm-up but slower per iteration, ahead only until the same crossing
    back = break_even(comp, base)
    assert back["verdict"] == "ahead_until" and back["iterations"] == 767
    assert break_even(base, runs["slowwarm"][0])["verdict"] == "never"
    assert break_even(base, runs["quick"][0])["verdict"] == "no_warmup_cost"
    result = decided(base, comp, base_name="baseline", candidate_name="compile")
    assert result["break_even"] == be
    text = format_text(result)
    assert "Break-even:  pays back its 2.30 s of extra warm-up after 767 iterations (7.7 s)" in text
    assert "Warm-up:     baseline 0.00 s, compile 2.30 s" in text
    assert "**Break-even:** pays back its 2.30 s" in format_markdown(result)
    assert "never pays back: 1.00 s more warm-up" in format_text(decided(base, runs["slowwarm"][0]))
    # one run a side: the speed is not decided, so no break-even is named (issue 59)
    one = format_text(compare_summaries(base, comp, base_name="baseline", candidate_name="compile"))
    assert "Break-even:  not decided: the speed verdict decides no direction" in one and "pays back" not in one


def test_break_even_at_equal_warm_up_or_equal_speed(runs):
    """Edges: the same run is no warm-up cost to pay back; the same warm-up but slower per iteration is never ahead;
    the same speed with more warm-up never pays back."""
    base = runs["baseline"][0]
    assert break_even(base, base)["verdict"] == "no_warmup_cost" and break_even(base, base)["extra_warmup_s"] == 0
    slower = json.loads(json.dumps(base))
    slower["iteration_timer"]["ms_per_iter"]["mean"] = 11.0
    slower["iteration_timer"]["warmup_time_s"] = 2 * 0.011  # its warm-up steps at its own pace: no extra cost
    assert break_even(base, slower)["verdict"] == "never"
    assert "never ahead: no less warm-up and slower per iteration" in format_text(decided(base, slower))
    later = json.loads(json.dumps(base))
    later["iteration_timer"]["startup_time_s"] = 1.0
    be = break_even(base, later)
    assert be["verdict"] == "never" and be["extra_warmup_s"] == pytest.approx(1.0) and be["iterations"] is None


def test_break_even_fails_closed_without_a_startup_time(runs, tmp_path):
    base = runs["baseline"][0]
    old = json.loads(json.dumps(runs["compile"][0]))
    old["iteration_timer"].pop("startup_time_s")  # a file written before it was measured
    be = break_even(base, old)
    assert be["verdict"] is None and be["iterations"] is None and "startup_time_s" in be["reason"]
    assert "Break-even:  n/a: the candidate's warm-up cost is unknown" in format_text(compare_summaries(base, old))
    results = results_of(runs, ["baseline", "compile"])
    results[1]["summary"] = old
    rows = matrix_rows(results)
    assert rows[1]["end_to_end_s"] is None and rows[1]["end_to_end_speedup"] is None
    assert "startup_time_s" in rows[1]["end_to_end_reason"]
    assert best_variant(rows)["variant"] == "baseline"  # ranked only where the figure exists
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "compare", runs["baseline"][1], str(path),
                           "--format", "json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["break_even"]["verdict"] is None


def test_best_by_end_to_end_and_by_steady_state_pick_different_variants(runs):
    rows = matrix_rows(results_of(runs, ["baseline", "compile", "quick", "slowwarm"]))
    ends = {r["variant"]: closed_form(r["variant"])[1] for r in rows}
    assert best_variant(rows)["variant"] == min(ends, key=ends.get) == "quick"
    assert best_variant(rows, "steady")["variant"] == "compile"  # 1.43x per iteration, 2.3 s of warm-up
    text = format_matrix(rows)
    # one run a variant: no noise floor was measured, so the fastest is named as measured, not as decided
    assert ("**Best:** not decided: " in text
            and "fastest measured: quick, by end to end: the whole fit at 40 iterations, warm-up and evaluation"
            " included:" in text)
    steady = format_matrix(rows, best_by="steady")
    assert "fastest measured: compile, by steady state: mean ms/iter over the measured iterations" in steady
    # one run a variant: neither the speed nor the warm-up is decided, so nothing pays back (tests/test_one_voice_bench)
    assert "break-even: not decided: the speed per iteration is not decided against the baseline's" in steady
    assert any(f.startswith("Noise floor: not measured") for f in findings(rows, "steady"))  # one run a variant
    warm = [f for f in findings(rows) if f.startswith("Warm-up cost: compile's warm-up")]
    assert len(warm) == 1 and "2.30 s longer than baseline's (not decided" in warm[0] and "after 767" not in warm[0]
    with pytest.raises(ValueError, match=r"--best-by 'fastest': expected one of end-to-end, steady"):
        best_variant(rows, "fastest")


def test_a_variant_over_3x_slower_is_flagged_and_the_baseline_has_no_self_interval(runs):
    rows = {r["variant"]: r for r in matrix_rows(results_of(runs, ["baseline", "compile", "quick", "slowwarm"]))}
    slower = closed_form("compile")[1] / closed_form("baseline")[1]  # 2.78 / 0.6 = 4.6x
    assert rows["compile"]["flag"] == f"{slower:.1f}x slower than the baseline end to end"
    assert closed_form("slowwarm")[1] / closed_form("baseline")[1] < 3  # 2.8x: not flagged
    assert rows["slowwarm"]["flag"] is None and rows["quick"]["flag"] is None and rows["baseline"]["flag"] is None
    assert rows["compile"]["status"] == "completed"  # flagged, not failed
    assert rows["baseline"]["speedup_ci_low"] is None and rows["baseline"]["speedup_ci_high"] is None
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
             for line in format_matrix(list(rows.values())).splitlines() if line.startswith("| ")}
    header = lines["Variant"]
    base, comp = lines["baseline"], lines["compile"]
    assert base[header.index("Steady speedup (95% CI)")] == "baseline"
    assert base[header.index("End-to-end speedup")] == "baseline"
    assert comp[header.index("Status")] == f"⚠ completed: {slower:.1f}x slower than the baseline end to end"
    # one run a variant: no break-even is decided (with repeats: tests/test_one_voice_bench.py)
    assert {lines[n][header.index("Break-even")] for n in ("compile", "slowwarm", "quick")} == {"not decided"}


def test_each_time_column_has_one_unit():
    rows = [{"variant": v, "status": "completed", "baseline": i == 0, "end_to_end_s": e, "train_time_s": t,
             "speedup": 1.0} for i, (v, e, t) in enumerate((("a", 30.0, 5.0), ("b", 90.0, 7200.0)))]
    lines = [[c.strip() for c in line.split("|")[1:-1]] for line in format_matrix(rows).splitlines()
             if line.startswith("| ")]
    header = lines[0]
    assert "End to end (min)" in header and "Train time (h)" in header
    assert [row[header.index("End to end (min)")] for row in lines[1:]] == ["0.50", "1.50"]
    assert [row[header.index("Train time (h)")] for row in lines[1:]] == ["0.00", "2.00"]


def test_matrix_header_names_cores_ram_workers_and_the_model(runs):
    results = results_of(runs, ["baseline", "compile", "quick"])
    header = "\n".join(matrix_header(results))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert f"{cores} CPU cores, {ram:.1f} GB RAM" in header
    assert f"**Model:** {WarmModel.__module__}.WarmModel; num_workers 0 (quick: 1)" in header
    assert runs["quick"][0]["run"]["num_workers"] == 1


def test_cli_best_by(runs, tmp_path, monkeypatch):
    from lightning_perf import cli
    from lightning_perf.bench import matrix

    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "matrix", "--script", "x.py", "--variant",
                           "baseline", "--best-by", "fastest"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--best-by: invalid choice: 'fastest' (choose from" in proc.stderr and "'steady'" in proc.stderr
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setattr(matrix, "run_matrix", lambda *a, **k: results_of(runs, ["baseline", "compile", "quick"]))
    report = tmp_path / "report.md"
    argv = ["matrix", "--script", str(script), "--out", str(tmp_path / "out"), "--report", str(report),
            "--variant", "baseline", "--variant", "compile", "--variant", "quick=--data.num_workers=1"]
    assert cli.main(argv + ["--best-by", "steady"]) == 0
    assert "fastest measured: compile, by steady state" in report.read_text()
    assert cli.main(argv) == 0
    assert "fastest measured: quick, by end to end" in report.read_text()


def test_a_checkpoint_without_startup_time_gives_null_with_a_reason():
    timer = IterationTimer()
    state = timer.state_dict()
    state.pop("startup_time_s")
    state["fits"] = 1
    timer.load_state_dict(state)
    section = timer.summary_section()
    assert section["startup_time_s"] is None and "older version" in section["unavailable"]["startup_time_s"]
