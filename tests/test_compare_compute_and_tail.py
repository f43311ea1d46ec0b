"""compare, report and matrix show what IterationTimer measured of compute and of the tail: TFLOP/s and MFU where
the runs have them, and the slow iterations in one line, the same figures the summary holds."""

import json

import pytest

from helpers import TinyModel, fit, use_virtual_clock
from lightning_perf import IterationTimer
from lightning_perf.bench.matrix import format_matrix, matrix_rows
from lightning_perf.cli import main
from lightning_perf.measure.timing.tail_advice import tail_line
from lightning_perf.summary.report import format_report, report_rows


class Paced(TinyModel):
    """Each step costs ``step_s`` on the virtual clock; every 10th costs ``stall_s`` instead."""

    def __init__(self, clock, step_s, stall_s):
        super().__init__()
        self.clock, self.step_s, self.stall_s, self.steps = clock, step_s, stall_s, 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        self.clock.advance(self.stall_s if self.steps % 10 == 0 else self.step_s)
        return super().training_step(batch, batch_idx)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs with a given FLOPs per batch and device peak: 2e9 FLOPs at 10 ms and 5 ms a step (stalls of 50 ms
    every 10th step); the second's peak is given, the first's is not."""
    root = tmp_path_factory.mktemp("compute")
    paths = {}
    with pytest.MonkeyPatch.context() as mp:
        clock = use_virtual_clock(mp)
        for name, step_s, peak in (("slow", 0.010, None), ("fast", 0.005, 1e12)):
            path = root / name / "perf_summary.json"
            timer = IterationTimer(warmup_steps=1, flops_per_batch=2e9, available_flops=peak, summary_path=str(path))
            fit(root / name, [timer], model=Paced(clock, step_s, 0.050), max_epochs=5)
            paths[name] = str(path)
    return paths


def test_compare_shows_tflops_mfu_and_the_tail_from_the_summaries(runs, capsys):
    assert main(["compare", runs["slow"], runs["fast"]]) == 0
    out = capsys.readouterr().out
    timers = {name: json.load(open(path))["iteration_timer"] for name, path in runs.items()}
    fast, slow = timers["fast"], timers["slow"]
    # TFLOP/s = FLOPs per batch / mean seconds per iteration, recomputed from the file's own fields
    assert fast["tflops_per_s"] == pytest.approx(2e9 / (fast["ms_per_iter"]["mean"] / 1000) / 1e12, rel=1e-6)
    assert fast["mfu_pct"] == pytest.approx(100 * fast["tflops_per_s"] * 1e12 / 1e12, rel=1e-6)
    assert f"{fast['tflops_per_s']:.3f} TFLOP/s, MFU {fast['mfu_pct']:.1f}%" in out
    assert f"{slow['tflops_per_s']:.3f} TFLOP/s, MFU n/a" in out
    # the tail line carries the same figures as the console line at the end of fit
    for tail in (fast["tail"], slow["tail"]):
        assert tail["iterations"] > 0
        assert tail_line(tail).replace("  tail: ", "") in out


def test_report_and_matrix_have_compute_columns_only_where_a_run_counted(runs, tmp_path):
    summaries = [json.load(open(runs[n])) for n in ("slow", "fast")]
    table = format_report(report_rows(summaries, ["slow", "fast"]))
    header, _, slow_row, fast_row = table.splitlines()[:4]
    cells = [c.strip() for c in header.split("|")]
    fast_cells = [c.strip() for c in fast_row.split("|")]
    t = summaries[1]["iteration_timer"]
    assert fast_cells[cells.index("TFLOP/s")] == f"{t['tflops_per_s']:.3f}"
    assert fast_cells[cells.index("MFU")] == f"{t['mfu_pct']:.1f}%"
    assert [c.strip() for c in slow_row.split("|")][cells.index("MFU")] == "n/a"
    results = [{"name": n, "overrides": [], "exit_code": 0, "wall_s": 1.0, "summary": s, "log": runs[n]}
               for n, s in zip(("slow", "fast"), summaries)]
    rows = matrix_rows(results)
    assert rows[1]["tflops_per_s"] == t["tflops_per_s"] and rows[1]["mfu_pct"] == t["mfu_pct"]
    assert "| TFLOP/s | MFU |" in format_matrix(rows)
    plain = [dict(s, iteration_timer={k: v for k, v in s["iteration_timer"].items()
                                      if k not in ("tflops_per_s", "mfu_pct")}) for s in summaries]
    assert "TFLOP/s" not in format_report(report_rows(plain, ["slow", "fast"]))
