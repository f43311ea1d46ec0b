"""`lightning-perf bench`, `matrix` and `report --plot`, run as a user runs them."""

import csv
import json
import math
import os
import re
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
QUICK = ["--warmup", "1", "--iters", "2", "--no-progress", "--rounds", "1"]  # the rounds: tests/test_bench_rounds.py


def cli(*args, cwd=TESTS, timeout=900):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def is_png(path):
    with open(path, "rb") as fh:
        return fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_sweep_writes_csv_plot_and_table_then_appends(tmp_path):
    out_csv, out_png = tmp_path / "bench.csv", tmp_path / "bench.png"
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "16", "24", "32", "--batch-sizes",
               "1", "2", "4", "--mode", "train", "--device", "cpu", "--csv", str(out_csv), "--plot", str(out_png),
               *QUICK)
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(out_csv)
    assert len(rows) == 9 and [(r["tile_size"], r["batch_size"]) for r in rows][:2] == [("16", "1"), ("16", "2")]
    for r in rows:
        assert r["error"] == "" and float(r["avg_time_ms"]) > 0 and float(r["forward_time_ms"]) > 0
        assert float(r["pixels_per_sec"]) == pytest.approx(float(r["throughput_samples_per_sec"]) *
                                                         int(r["tile_size"]) ** 2, rel=1e-6)
        assert r["mode"] == "train" and r["device"] == "cpu" and int(r["model_params"]) > 0
    assert is_png(out_png)
    assert "best throughput: size" in proc.stdout and "best efficiency: size" in proc.stdout
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "16", "--batch-sizes", "1",
               "--csv", str(out_csv), "--device", "cpu", *QUICK)
    assert proc.returncode == 0
    with open(out_csv) as fh:
        assert fh.read().count("timestamp,mode") == 1  # appended, one header
    assert len(read_csv(out_csv)) == 10


def test_out_of_memory_is_a_row_and_the_sweep_goes_on(tmp_path):
    out_csv = tmp_path / "b.csv"
    proc = cli("bench", "--model", "bench_models:oom_above_32", "--input-sizes", "16", "32", "48", "--batch-sizes",
               "1", "2", "--csv", str(out_csv), "--device", "cpu", *QUICK)
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(out_csv)
    assert [r["error"] for r in rows] == ["", "", "", "", "OOM", "OOM"]
    assert "OOM" in proc.stdout


def test_another_error_is_recorded_and_the_exit_code_says_so(tmp_path):
    out_csv = tmp_path / "b.csv"
    proc = cli("bench", "--model", "bench_models:broken_above_32", "--input-sizes", "16", "48", "--batch-sizes", "1",
               "--csv", str(out_csv), "--device", "cpu", *QUICK)
    assert proc.returncode == 1
    rows = read_csv(out_csv)
    assert rows[0]["error"] == "" and rows[1]["error"] == "ValueError: shape mismatch in block 3"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "no_such_module:f"], "cannot import 'no_such_module'"),
        (["--model", "bench_models:missing"], "has no 'missing'"),
        (["--model", "bench_models"], "expected 'package.module:callable'"),
        (["--model", "bench_models:not_a_module"], "not a torch.nn.Module"),
        (["--model", "bench_models:small_conv", "--batch-sizes", "0"], "expected a positive integer, got '0'"),
        (["--model", "bench_models:small_conv", "--input-sizes", "x"], "expected a positive integer, got 'x'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    out_csv = tmp_path / "b.csv"
    proc = cli("bench", *args, "--csv", str(out_csv), "--device", "cpu", *QUICK)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert not out_csv.exists()  # a factory that returns no module too: found before the CSV is opened


def test_a_csv_with_another_header_is_refused_untouched(tmp_path):
    out_csv = tmp_path / "b.csv"
    out_csv.write_text("time,size\n1,2\n")
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "16", "--batch-sizes", "1",
               "--csv", str(out_csv), "--device", "cpu", *QUICK)
    assert proc.returncode == 2 and "header does not match" in proc.stderr
    assert out_csv.read_text() == "time,size\n1,2\n"


def test_sweep_as_a_python_function():
    from bench_models import small_conv

    from lightning_perf.bench.sweep import run_sweep

    rows = run_sweep(small_conv, [16], [1, 2], mode="inference", warmup=1, iters=2, progress=False)
    assert [r["batch_size"] for r in rows] == [1, 2] and all(r["forward_time_ms"] is None for r in rows)


@pytest.mark.slow
def test_matrix_on_the_demo_with_two_variants_and_a_crash(tmp_path):
    report, out_csv = tmp_path / "matrix.md", tmp_path / "matrix.csv"
    proc = cli("matrix", "--script", os.path.join(ROOT, "examples", "denoise_cli.py"), "--config",
               os.path.join(ROOT, "examples", "denoise_matrix.yaml"),
               "--variant", "baseline",
               "--variant", "bs4=--data.batch_size=4",
               "--variant", "typo=--model.lr=fast",
               "--out", str(tmp_path / "runs"), "--report", str(report), "--csv", str(out_csv), "--repeats", "1",
               cwd=ROOT, timeout=1200)
    assert proc.returncode == 1, proc.stderr[-2000:]  # one variant crashed
    text = report.read_text()
    assert "| baseline |" in text and "| bs4 |" in text and "crashed (exit 2)" in text
    assert "**Best:**" in text
    assert "**System:**" in text and "**Versions:** torch" in text and "denoise_matrix.yaml" in text
    assert "max_steps 80" in text
    assert re.search(r"\| Total time \(train \+ eval\) \((s|min)\) \| Train time \((s|min)\) \|", text)
    assert "| End-to-end speedup |" in text and "| Break-even |" in text and "**Model:** denoise.DenoiseNet" in text
    assert "⚠ crashed (exit 2)" in text and "**Findings:**" in text and "Least memory:" in text
    rows = {r["variant"]: r for r in read_csv(out_csv)}
    assert float(rows["baseline"]["speedup"]) == pytest.approx(1.0)
    # half the batch: faster iterations but not the same work, so the headline is samples/s, as in compare
    assert rows["bs4"]["speedup_basis"] == "samples/s"
    bs4 = json.loads((tmp_path / "runs" / "bs4" / "perf_summary.json").read_text())["iteration_timer"]
    base = json.loads((tmp_path / "runs" / "baseline" / "perf_summary.json").read_text())["iteration_timer"]
    assert float(rows["bs4"]["speedup"]) == pytest.approx(bs4["samples_per_s"] / base["samples_per_s"], rel=1e-6)
    # Best: the whole fit, of the variants whose quality passed against the baseline's (bs4 trains on other batches)
    assert rows["baseline"]["quality_gate"] == "True" and rows["bs4"]["quality_gate"] in ("True", "False")
    quick = float(rows["bs4"]["end_to_end_speedup"]) > 1.0 and rows["bs4"]["quality_gate"] == "True"
    best = "bs4" if quick else "baseline"
    # one round: nothing decided between runs, the fastest named as measured; the A/A copy ran, never ranked
    assert f"**Best:** not decided: one run each, so the drift between runs was not measured (--repeats 2 or more);" \
           f" fastest measured: {best}," in text
    assert rows["baseline_aa"]["noise_floor"] == "True" and rows["bs4"]["aa_speedup"] != ""
    assert rows["bs4"]["psnr"] != "" and rows["typo"]["status"].startswith("crashed")
    summary = json.loads((tmp_path / "runs" / "bs4" / "perf_summary.json").read_text())
    for section in ("iteration_timer", "section_profiler", "vram", "eval_no_grad_guard", "quality_gate"):
        assert section in summary


#: docs/perf_suite.md's LightningCLI example (a PerfSuite entry) in a short CPU config.
SUITE_CONFIG = """
trainer:
  max_steps: 12
  logger: false
  enable_progress_bar: false
  enable_checkpointing: false
  enable_model_summary: false
  accelerator: cpu
  callbacks:
    - class_path: lightning_perf.PerfSuite
      init_args:
        callbacks:
          - class_path: lightning_perf.IterationTimer
            init_args: {warmup_steps: 2}
          - class_path: lightning_perf.SectionProfiler
          - class_path: lightning_perf.VRAMMonitor
          - class_path: lightning_perf.EvalNoGradGuard
"""

#: README's other form, separate entries, two of the four, writing to a summary_path of their own (every variant).
SEPARATE_CONFIG = """
trainer:
  callbacks:
    - class_path: lightning_perf.IterationTimer
      init_args: {warmup_steps: 3, summary_path: shared/perf_summary.json}
    - class_path: lightning_perf.SectionProfiler
      init_args: {summary_path: shared/perf_summary.json}
"""


@pytest.mark.slow
def test_matrix_measures_with_the_configs_own_lightning_perf_callbacks(tmp_path):
    """A config that already has the suite (the LightningCLI example of docs/perf_suite.md): each variant runs with
    one set of callbacks, the config's own, and the matrix adds only what the config lacks; its summary is where the matrix
    reads it, also when the config's callbacks write to a summary_path of their own."""
    from helpers import write_toy_cli

    write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=64, print_callbacks=True)  # 16 steps an epoch, > 12
    (tmp_path / "both.yaml").write_text(SUITE_CONFIG)
    (tmp_path / "separate.yaml").write_text(SEPARATE_CONFIG)
    # one run of each variant: what is checked is which callbacks each run had and where its summary went, the same
    # in every round (the rounds and the A/A copy: test_matrix_cli_runs_the_aa_copy_in_the_rounds_...)
    proc = cli("matrix", "--script", "cli_toy.py", "--config", "both.yaml", "--variant", "baseline",
               "--variant", "separate=--config separate.yaml", "--repeats", "1", "--noise-floor", "off",
               "--out", "runs/m2", "--csv", "m.csv", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    rows = {r["variant"]: r for r in read_csv(tmp_path / "m.csv")}
    suite = "EvalNoGradGuard,IterationTimer,SectionProfiler,VRAMMonitor"
    for name, warmup in (("baseline", 2), ("separate", 3)):
        run_dir = tmp_path / "runs" / "m2" / name
        ran = [line for line in (run_dir / "output.log").read_text().splitlines() if line.startswith("RAN:")]
        assert ran == [f"RAN: {suite}"], ran  # each of the four once: none added twice beside the config's
        assert rows[name]["status"] == "completed", rows[name]
        for key in ("total_time_s", "train_time_s", "ms_per_iter", "samples_per_s", "speedup", "peak_memory_mb",
                    "end_to_end_s", "epoch_1_s"):
            assert float(rows[name][key]) > 0, (name, key, rows[name][key])
        summary = json.loads((run_dir / "perf_summary.json").read_text())
        timer = summary["iteration_timer"]
        assert timer["warmup_steps"] == warmup and timer["iterations"] == 12  # the config's IterationTimer measured
        assert {"section_profiler", "vram", "eval_no_grad_guard"} <= set(summary)
    assert "measured with the config's own lightning_perf callbacks (the matrix attached none)" in proc.stderr
    assert "VRAMMonitor, EvalNoGradGuard attached by the matrix" in proc.stderr
    assert "copied to runs/m2/separate/perf_summary.json" in proc.stderr


@pytest.mark.slow
def test_a_summary_the_matrix_cannot_copy_is_read_at_once_and_no_path_to_it_is_kept(tmp_path, monkeypatch):
    """The config's callbacks write every variant's summary to one shared file. When the matrix cannot copy it into
    the variant's folder (a full disk: a cut-off file, then ENOSPC), each variant's figures are those read right
    after it, and no recorded path leads to the shared file, which the next variant overwrites."""
    import errno
    import shutil

    from helpers import write_toy_cli
    from lightning_perf.bench.matrix import matrix_rows, parse_variants, run_matrix

    def disk_full(src, dst, *args, **kwargs):
        with open(src, "rb") as fh, open(dst, "wb") as out:
            out.write(fh.read(100))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)

    write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=64, print_callbacks=True)  # 16 steps an epoch, > 9
    (tmp_path / "both.yaml").write_text(SUITE_CONFIG)
    (tmp_path / "separate.yaml").write_text(SEPARATE_CONFIG)
    monkeypatch.chdir(tmp_path)  # the config's summary_path is relative: the variants share tmp_path/shared
    monkeypatch.setattr(shutil, "copyfile", disk_full)
    lines = []
    variants = parse_variants(["short=--config separate.yaml --trainer.max_steps=5",
                               "long=--config separate.yaml --trainer.max_steps=9"])
    results = run_matrix("cli_toy.py", variants, "runs", config="both.yaml", log=lines.append)
    shared = tmp_path / "shared" / "perf_summary.json"
    assert json.loads(shared.read_text())["iteration_timer"]["iterations"] == 9  # the last variant's figures
    for result, steps in zip(results, (5, 9)):
        assert result["exit_code"] == 0, (tmp_path / "runs" / result["name"] / "output.log").read_text()[-3000:]
        assert result["summary"]["iteration_timer"]["iterations"] == steps  # its own, read before the next ran
        assert result["summary_path"] is None and os.path.samefile(result["summary_from"], shared)
        own = os.path.join("runs", result["name"], "perf_summary.json")
        assert not os.path.lexists(own)  # the cut-off copy is not left for a reader to take as the summary
        assert result["summary_path_reason"] == (
            f"not copied to {own} (No space left on device); the figures were read from {result['summary_from']}"
            " right after the variant, a file the next variant may overwrite")
        assert any(line.startswith(f"[matrix] {result['name']}: ") and f"not copied to {own}" in line
                   and "keeps no summary file of its own" in line for line in lines), lines
    assert [row["status"] for row in matrix_rows(results)] == ["completed", "completed"]


def test_matrix_fill_mode_adds_only_what_the_trainer_lacks(tmp_path, monkeypatch):
    """The matrix's attaching (``lightning-perf run``'s hook in fill mode), in one process: a QualityGate alone gets
    the four; a PerfSuite of the four gets none; one the module adds in ``configure_callbacks`` is dropped at set-up."""
    from helpers import TinyModel, fit
    from lightning.pytorch.callbacks import Timer

    import lightning_perf._attach as attach
    from lightning_perf import IterationTimer, PerfSuite, QualityGate
    from lightning_perf._attach import FILL_ENV, hook
    from lightning_perf._attach.suite import AttachedSuite
    from lightning_perf.bench.matrix import SUITE

    monkeypatch.setenv("LIGHTNING_PERF_RUN_CALLBACKS", ",".join(SUITE))
    monkeypatch.setenv(FILL_ENV, "1")
    monkeypatch.setitem(attach._count, "trainers", 0)  # this process's Trainer count: its first, and given back after

    def attached(callbacks):
        built = hook.with_suite({"callbacks": callbacks}, "lightning.pytorch")["callbacks"]
        assert built[:-1] == callbacks and isinstance(built[-1], AttachedSuite)
        return [type(cb).__name__ for cb in built[-1].callbacks]

    assert attached([Timer(), QualityGate(metrics=["psnr"])]) == SUITE
    assert attached([PerfSuite()]) == []
    assert attached([IterationTimer(warmup_steps=1), Timer()]) == SUITE[1:]

    class AddsATimer(TinyModel):
        def configure_callbacks(self):
            return [IterationTimer(warmup_steps=1)]

    monkeypatch.setenv("LIGHTNING_PERF_SUMMARY_PATH", str(tmp_path / "perf_summary.json"))
    suite = hook.with_suite({"callbacks": []}, "lightning.pytorch")["callbacks"][-1]
    trainer = fit(tmp_path / "logs", [suite], model=AddsATimer(), max_epochs=1, logger=False)
    assert [type(cb).__name__ for cb in suite.callbacks] == SUITE[1:]  # the module's timer measured, not a second
    summary = json.loads((tmp_path / "perf_summary.json").read_text())
    assert summary["status"] == "completed" and summary["iteration_timer"]["warmup_steps"] == 1
    assert trainer.global_step == summary["iteration_timer"]["iterations"]


def test_matrix_bad_variants_exit_2(tmp_path):
    proc = cli("matrix", "--script", "x.py", "--variant", "turbo", cwd=ROOT)
    assert proc.returncode == 2 and "no preset" in proc.stderr
    proc = cli("matrix", "--script", "missing.py", "--variant", "baseline", cwd=ROOT)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_report_plot(tmp_path):
    from helpers import fit, TinyModel
    from lightning_perf import IterationTimer

    paths = []
    for name in ("a", "b"):
        path = tmp_path / name / "perf_summary.json"
        fit(tmp_path / name, [IterationTimer(summary_path=str(path))], model=TinyModel(), max_epochs=1)
        paths.append(str(path))
    png = tmp_path / "report.png"
    proc = cli("report", *paths, "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert is_png(png)


def _analysis_checks(stdout, rows):
    """The printed analysis against the CSV's own numbers: per-sample cost of 32 vs 16 at batch 1."""
    by = {(int(r["tile_size"]), int(r["batch_size"])): r for r in rows}
    ratio = float(by[(32, 1)]["avg_time_ms"]) / float(by[(16, 1)]["avg_time_ms"])
    assert "Analysis (train, cpu, precision 32):" in stdout
    words = f"{ratio:.2f}x slower" if ratio >= 1 else f"{1 / ratio:.2f}x faster"  # the factor is always >= 1
    assert f"- 32 is {words} per sample than 16 (batch 1)" in stdout
    assert "Batch size effects:" in stdout and "| Batch size | 16 throughput |" in stdout
    gain = (float(by[(16, 4)]["throughput_samples_per_sec"]) / float(by[(16, 1)]["throughput_samples_per_sec"]) - 1) * 100
    assert f"({gain:+.0f}%)" in stdout


def test_analysis_from_csv_and_bench_compare(tmp_path):
    out_csv = tmp_path / "bench.csv"
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "16", "32", "--batch-sizes", "1",
               "4", "--mode", "train", "--device", "cpu", "--csv", str(out_csv), *QUICK)
    assert proc.returncode == 0, proc.stderr
    rows = read_csv(out_csv)
    _analysis_checks(proc.stdout, rows)
    # the same analysis and plots from the CSV alone, no model
    png = tmp_path / "again.png"
    again = cli("bench", "--from-csv", str(out_csv), "--plot", str(png))
    assert again.returncode == 0, again.stderr
    _analysis_checks(again.stdout, rows) and is_png(png)
    assert is_png(png)
    # a "new" sweep: twice the throughput at size 32 batch 4, one configuration more
    new_csv = tmp_path / "new.csv"
    with open(out_csv, newline="") as fh:
        header, *lines = list(csv.reader(fh))
    for line in lines:  # two timed iterations' std may be anything: no spread, so that no change is within noise
        line[header.index("std_time_ms")] = "0"
    old_csv = tmp_path / "old.csv"
    with open(old_csv, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *lines])
    col = header.index("throughput_samples_per_sec")
    for line in lines:
        if line[header.index("tile_size")] == "32" and line[header.index("batch_size")] == "4":
            line[col] = str(2 * float(line[col]))
    extra = list(lines[0])
    extra[header.index("batch_size")] = "8"
    with open(new_csv, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *lines, extra])
    cmp = cli("bench-compare", str(old_csv), str(new_csv))
    assert cmp.returncode == 0, cmp.stderr
    row = next(line for line in cmp.stdout.splitlines() if line.startswith("| train | 32 | 4 |"))
    assert "| +100.0% |" in row
    assert "only in the new sweep" in cmp.stdout
    bad = cli("bench-compare", str(out_csv), str(tmp_path / "missing.csv"))
    assert bad.returncode == 2 and "no such file" in bad.stderr


def test_without_csv_the_rows_go_to_runs_bench_csv(tmp_path):
    import shutil

    shutil.copy(os.path.join(TESTS, "bench_models.py"), tmp_path)
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "16", "--batch-sizes", "1",
               "--device", "cpu", *QUICK, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "rows appended to runs/bench.csv" in proc.stderr
    assert len(read_csv(tmp_path / "runs" / "bench.csv")) == 1
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "16", "--batch-sizes", "1",
               "--device", "cpu", "--no-csv", *QUICK, cwd=str(tmp_path))
    assert proc.returncode == 0 and len(read_csv(tmp_path / "runs" / "bench.csv")) == 1


def _variant(summary, name, mean_ms, epochs=None, peak=None, gate=None):
    import copy

    s = copy.deepcopy(summary)
    s["iteration_timer"]["ms_per_iter"]["mean"] = mean_ms
    s["iteration_timer"]["it_per_s"] = 1000.0 / mean_ms
    s["iteration_timer"]["samples_per_s"] = 8 * 1000.0 / mean_ms
    s["iteration_timer"].pop("blocks_ms", None)
    if epochs is not None:
        s["iteration_timer"]["epochs"] = [{"epoch": i, "time_s": t, "iterations": 10} for i, t in enumerate(epochs)]
    if peak is not None:
        s.setdefault("vram", {"phases": {}})["phases"] = {"train": {"host_rss_peak_mb": peak}}
    if gate is not None:
        s["quality_gate"] = {"passed": gate, "metrics": {}}
    return {"name": name, "overrides": [], "exit_code": 0, "wall_s": 1.0, "summary": s, "log": ""}


def test_matrix_findings_are_computed_from_the_numbers(tmp_path):
    """Seed 002's findings: AMP 1.34x and workers 1.91x, together only 1.96x (not 2.56x); cudnn's first epoch slow;
    a failed gate flagged and never Best."""
    from helpers import fit
    from lightning_perf import IterationTimer
    from lightning_perf.bench.matrix import findings, format_matrix, matrix_rows

    fit(tmp_path, [IterationTimer(warmup_steps=1, summary_path=str(tmp_path / "s.json"))], max_epochs=1)
    base = json.loads((tmp_path / "s.json").read_text())
    results = [
        _variant(base, "baseline", 100.0, epochs=[10.0, 10.0], peak=5203),
        _variant(base, "amp", 100.0 / 1.34, epochs=[7.5, 7.4], peak=6249),
        _variant(base, "workers", 100.0 / 1.91, epochs=[5.3, 5.2], peak=5100),
        _variant(base, "amp+workers", 100.0 / 1.96, epochs=[5.1, 5.0], peak=6245),
        _variant(base, "cudnn", 100.0 / 2.5, epochs=[30.0, 4.0], peak=7230, gate=False),
    ]
    rows = matrix_rows(results)
    found = findings(rows)
    assert any(f.startswith("Diminishing returns: amp+workers gains 1.96x") and "1.34 x 1.91 = 2.56x" in f
               for f in found), found
    assert any(f.startswith("Warm-up cost: cudnn's first epoch took 7.5x") for f in found), found
    # one run each, 5100 against 5203 MiB of host RSS: inside the memory noise floor (docs/bench.md), not decided
    assert "Least memory: not decided: workers 4.98 GiB, baseline 5.08 GiB" in " ".join(found), found
    assert any(f.startswith("No verdict between runs: one run each") for f in found), found
    text = format_matrix(rows)
    assert "⚠ quality gate FAILED" in text and "| Epoch 1 (s) | Epoch 2 (s) |" in text  # one unit per column
    # one run each decides nothing: the fastest is named as measured, not as Best (cudnn is faster, its gate failed)
    assert ("**Best:** not decided: one run each, so the drift between runs was not measured (--repeats 2 or more);"
            " fastest measured: amp+workers,") in text
    assert not any(f.startswith("Busy machine") for f in found)


def test_matrix_names_the_variants_measured_on_a_busy_machine(tmp_path):
    import copy

    from helpers import fit
    from lightning_perf import IterationTimer
    from lightning_perf.bench.matrix import findings, matrix_rows

    fit(tmp_path, [IterationTimer(warmup_steps=1, summary_path=str(tmp_path / "s.json"))], max_epochs=1)
    base = json.loads((tmp_path / "s.json").read_text())
    results = [_variant(base, "baseline", 100.0, epochs=[10.0], peak=5203),
               _variant(base, "amp", 100.0 / 1.34, epochs=[7.5], peak=6249)]
    busy = copy.deepcopy(results[1]["summary"])
    busy["vram"] = {"activity": {"host_logical_cores": 2, "phases": {"train": {
        "cpu_wait_pct": {"mean": 41.0, "p5": 30.0, "samples": 12}}}}}
    results[1]["summary"] = busy
    rows = matrix_rows(results)
    assert rows[0]["contention"] is None and rows[1]["contention"].startswith("the machine was busy")
    found = findings(rows)
    assert ("Busy machine: amp (the training thread waited for a CPU 41% of the time): their speed and every ratio"
            " against them may be the machine's, not the variant's.") in found, found


def test_presets_combine_by_name():
    from lightning_perf.bench.matrix import parse_variants

    (name, overrides), = parse_variants(["amp+cudnn+workers"])
    assert name == "amp+cudnn+workers"
    assert overrides == ["--trainer.precision=bf16-mixed", "--trainer.benchmark=true", "--data.num_workers=2",
                         "--data.persistent_workers=true", "--data.prefetch_factor=4"]
    with pytest.raises(ValueError, match="'turbo' is no preset"):
        parse_variants(["amp+turbo"])


def test_matrix_says_which_callbacks_measured_after_set_up_dropped_some():
    """The module's configure_callbacks gave the Trainer an IterationTimer: the matrix's own, attached at the
    Trainer's construction, was dropped at set-up, and the variant's note says the config's own measured."""
    from lightning_perf.bench.matrix import SUITE, _callbacks_note

    attached = {"event": "attached", "callbacks": list(SUITE)}
    dropped = {"event": "left_alone", "reason": "the Trainer has IterationTimer of its own", "dropped": ["IterationTimer"]}
    assert _callbacks_note([attached]) == ", ".join(SUITE) + " attached by the matrix"
    assert _callbacks_note([attached, dropped]) == (", ".join(SUITE[1:]) + " attached by the matrix, the config's own"
                                                    " IterationTimer")


# -- the matrix's quality: each variant gated against the baseline variant, and "no gate ran" where none did ---------

def _gate(psnr=None, ssim=None, l1=None, reasons=None):
    """A QualityGate section without a baseline of its own (the demo's config): values measured, nothing gated."""
    metrics = {}
    for name, value, mode in (("psnr", psnr, "max"), ("ssim", ssim, "max"), ("l1", l1, "min")):
        reason = (reasons or {}).get(name)
        if value is not None or reason:
            metrics[name] = {"value": value, "mode": mode, "passed": None, **({"reason": reason} if reason else {})}
    return {"passed": None, "metrics": metrics, "checks": 1, "failed_check_count": 0, "failed_checks": []}


@pytest.fixture(scope="module")
def timer_summary(tmp_path_factory):
    from helpers import fit
    from lightning_perf import IterationTimer

    folder = tmp_path_factory.mktemp("timer")
    fit(folder, [IterationTimer(warmup_steps=1, summary_path=str(folder / "s.json"))], max_epochs=1)
    return json.loads((folder / "s.json").read_text())


def _gated_variant(summary, name, mean_ms, gate):
    result = _variant(summary, name, mean_ms)
    if gate is not None:
        result["summary"]["quality_gate"] = gate
    return result


def test_matrix_without_a_quality_gate_says_no_gate_ran(timer_summary):
    from lightning_perf.bench.matrix import format_matrix, matrix_rows

    rows = matrix_rows([_gated_variant(timer_summary, "baseline", 100.0, None),
                        _gated_variant(timer_summary, "amp", 80.0, None)])
    assert [r["quality_gate"] for r in rows] == [None, None] and [r["status"] for r in rows] == ["completed"] * 2
    text = format_matrix(rows, best_by="steady")
    best = text.splitlines()[-1]
    assert best.split("fastest measured: ")[-1].startswith("amp,") and "quality gate not failed" not in best, best
    assert best.endswith("; quality: no gate ran: the variant's run has no QualityGate."), best
    assert "| no gate ran | completed |" in text


def test_matrix_gates_each_variant_against_the_baseline_variant(timer_summary):
    """Seed 002's channels_last variant was named Best with a gate that scored nothing: a variant is Best only with
    its quality within tolerance of the baseline variant's; one that could not be scored is 'not checked'."""
    from lightning_perf.bench.matrix import findings, format_matrix, matrix_rows

    base = _gate(psnr=26.0, ssim=0.90, l1=0.040)
    results = [
        _gated_variant(timer_summary, "baseline", 100.0, base),
        _gated_variant(timer_summary, "amp", 80.0, _gate(psnr=25.9, ssim=0.899, l1=0.0401)),  # -0.38%: within 0.5%
        _gated_variant(timer_summary, "worse_psnr", 50.0, _gate(psnr=25.0, ssim=0.90, l1=0.040)),  # -3.8%
        _gated_variant(timer_summary, "worse_l1", 55.0, _gate(psnr=26.0, ssim=0.90, l1=0.0404)),  # +1%: lower is better
        _gated_variant(timer_summary, "channels_last", 60.0, _gate(
            psnr=26.0, ssim=0.90, reasons={"l1": "not checked: could not score the validation outputs (RuntimeError:"
                                                 " view size is not compatible ...)"})),
    ]
    rows = {r["variant"]: r for r in matrix_rows(results)}
    assert rows["baseline"]["quality_gate"] is True and rows["baseline"]["quality_gate_note"].startswith("reference:")
    assert rows["amp"]["quality_gate"] is True and rows["amp"]["status"] == "completed"
    assert rows["amp"]["quality_gate_note"].startswith("passed: psnr 25.9 vs 26 (-0.38%, 0.5% allowed)")
    assert rows["worse_psnr"]["quality_gate"] is False and rows["worse_psnr"]["status"] == "quality gate FAILED"
    assert rows["worse_psnr"]["quality_gate_note"] == "FAILED: psnr 25 vs 26 (-3.85%, 0.5% allowed)"
    assert rows["worse_l1"]["quality_gate_note"] == "FAILED: l1 0.0404 vs 0.04 (+1.00%, 0.5% allowed)"
    cl = rows["channels_last"]
    assert cl["quality_gate"] is None and cl["status"] == "quality gate not checked"
    assert cl["quality_gate_note"].startswith("not checked: l1 not checked: could not score the validation outputs")
    text = format_matrix(list(rows.values()), best_by="steady")
    best = text.splitlines()[-1]
    assert best.split("fastest measured: ")[-1].startswith("amp,")
    assert best.endswith("; quality: " + rows["amp"]["quality_gate_note"] + ".")
    assert "| FAILED | ⚠ quality gate FAILED |" in text and "| not checked | ⚠ quality gate not checked |" in text
    assert not any("worse_psnr" in f for f in findings(list(rows.values()), "steady") if f.startswith("Decided"))
    csv_rows = {r["variant"]: r for r in csv.DictReader(format_matrix(list(rows.values()), "csv").splitlines())}
    assert csv_rows["worse_psnr"]["quality_gate"] == "False" and "psnr 25 vs 26" in csv_rows["worse_psnr"][
        "quality_gate_note"]


def test_matrix_names_no_best_when_no_fast_variant_passed_its_quality(timer_summary):
    from lightning_perf.bench.matrix import format_matrix, matrix_rows

    rows = matrix_rows([_gated_variant(timer_summary, "baseline", 100.0, _gate(psnr=26.0)),
                        _gated_variant(timer_summary, "worse", 50.0, _gate(psnr=20.0))])
    assert rows[0]["quality_gate"] is True  # the baseline is the reference: it can be Best
    assert format_matrix(rows, best_by="steady").splitlines()[-1].startswith("**Best:** baseline,")
    rows = matrix_rows([_gated_variant(timer_summary, "baseline", 100.0, _gate(psnr=None, reasons={
        "psnr": "not checked: scored no image in this validation"})),
        _gated_variant(timer_summary, "fast", 50.0, _gate(psnr=26.0))])
    best = format_matrix(rows, best_by="steady").splitlines()[-1]
    assert best.startswith("**Best:** n/a: no variant with the steady figure passed its quality gate"), best
    assert "fast: not checked: nothing to gate against: baseline scored no quality metric" in best


def test_matrix_repeats_run_interleaved_and_each_variant_keeps_its_runs(tmp_path, monkeypatch):
    """Three rounds of two variants of a toy LightningCLI script: the order alternates (A B, B A, A B), each run in
    a fresh process with its own folder, and the rows' intervals come from the spread between the runs."""
    from helpers import write_toy_cli
    from lightning_perf.bench.matrix import matrix_rows, parse_variants, run_matrix

    write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=64)
    monkeypatch.chdir(tmp_path)
    lines = []
    variants = parse_variants(["a=--trainer.max_steps=40", "b=--trainer.max_steps=40"])
    results = run_matrix("cli_toy.py", variants, "runs", log=lines.append, repeats=3)
    started = [line.split(":")[0].split("] ")[1] for line in lines
               if line.startswith("[matrix] ") and " fit" in line and "round" not in line]
    assert started == ["a", "b", "b", "a", "a", "b"], lines
    for result in results:
        assert [r["exit_code"] for r in [result, *result["repeats"]]] == [0, 0, 0]
        folders = [os.path.dirname(r["summary_path"]) for r in result["repeats"]]
        assert folders == [os.path.join("runs", result["name"], "repeat_2"),
                           os.path.join("runs", result["name"], "repeat_3")]
    rows = matrix_rows(results)
    assert [r["runs"] for r in rows] == [3, 3]
    assert rows[1]["speedup_ci_low"] is not None and rows[1]["speedup_significant"] in (True, False)


@pytest.mark.slow
def test_matrix_cli_runs_the_aa_copy_in_the_rounds_and_a_budget_stops_them(tmp_path):
    """The command as a user runs it, on a toy LightningCLI script: the baseline's A/A copy added and run in the same
    interleaved rounds, its ratio and interval beside the variant; then a budget that lets one round of three run."""
    from helpers import write_toy_cli

    write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=64)
    proc = cli("matrix", "--script", "cli_toy.py", "--variant", "baseline=--trainer.max_steps=40", "--variant",
               "b=--trainer.max_steps=40 --model.lr=0.01", "--repeats", "2", "--out", "runs", "--csv", "m.csv",
               cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    started = [line.split(":")[0].split("] ")[1] for line in proc.stderr.splitlines()
               if line.startswith("[matrix] ") and " fit" in line and "round" not in line]
    assert started == ["baseline", "b", "baseline_aa", "baseline_aa", "b", "baseline"], proc.stderr
    assert (tmp_path / "runs" / "baseline_aa" / "repeat_2" / "perf_summary.json").is_file()
    rows = {r["variant"]: r for r in read_csv(tmp_path / "m.csv")}
    assert rows["baseline_aa"]["noise_floor"] == "True" and rows["b"]["noise_floor"] == "False"
    assert float(rows["b"]["aa_speedup"]) == pytest.approx(float(rows["baseline_aa"]["speedup"]))
    assert rows["b"]["steady_verdict"] in ("faster", "slower", "within noise", "no verdict")
    assert rows["b"]["rounds_done"] == "2" and "rounds" not in rows["b"]
    assert "Rounds: 2 of 2 interleaved rounds ran" in proc.stdout and "| A/A noise floor (95% CI) |" in proc.stdout
    assert "Noise floor (A/A: baseline_aa, the baseline's setup again in the same rounds" in proc.stdout
    proc = cli("matrix", "--script", "cli_toy.py", "--variant", "baseline=--trainer.max_steps=20", "--repeats", "3",
               "--budget", "0.01", "--noise-floor", "off", "--out", "runs2", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("Rounds: 1 of 3 interleaved rounds ran" in proc.stdout and "stopped after 1 of 3 matrix: round 2 would"
            " have passed the budget of 0.01 s" in proc.stdout and "the verdicts are from the rounds that ran" in
            proc.stdout), proc.stdout
    assert not (tmp_path / "runs2" / "baseline" / "repeat_2").exists()


def test_matrix_rows_decide_between_runs_an_aa_pair_ties_and_a_slow_variant_is_found(tmp_path):
    """Repeats given to the rows: a copy of the baseline (A/A) is within noise, a variant 10% slower in every run is
    significant; the findings say which ties."""
    from helpers import fit
    from lightning_perf import IterationTimer
    from lightning_perf.bench.matrix import findings, format_matrix, matrix_rows

    fit(tmp_path, [IterationTimer(warmup_steps=1, summary_path=str(tmp_path / "s.json"))], max_epochs=1)
    base = json.loads((tmp_path / "s.json").read_text())

    def variant(name, means, peak=None):
        first, *rest = [_variant(base, name, m, epochs=[10.0], peak=peak) for m in means]
        first["repeats"] = rest
        return first

    rows = matrix_rows([variant("baseline", [100.0, 103.0, 98.0], peak=500),
                        variant("baseline2", [101.0, 97.0, 102.0], peak=490),
                        variant("slow", [110.0, 113.0, 108.0], peak=520)], noise_floor="baseline2")
    aa, slow = rows[1], rows[2]
    assert aa["runs"] == 3 and aa["speedup_significant"] is False and aa["speedup_ci_low"] < 1.0 < aa["speedup_ci_high"]
    assert aa["noise_floor"] is True and slow["noise_floor"] is False
    assert slow["speedup_significant"] is True and slow["speedup_ci_high"] < 1.0
    # by ranks against the baseline's 3 runs and its A/A copy's 3: the median of the 18 ratios of their speeds
    pairs = sorted(b / s for s in (110.0, 113.0, 108.0) for b in (100.0, 103.0, 98.0, 101.0, 97.0, 102.0))
    assert slow["speedup"] == pytest.approx(math.sqrt(pairs[8] * pairs[9]))
    # the A/A ratio and its interval beside the slow variant: baseline2's own figures against the baseline's
    assert slow["aa_speedup"] == pytest.approx(aa["speedup"])
    assert slow["aa_ci_low"] == pytest.approx(aa["speedup_ci_low"])
    assert slow["steady_verdict"] == "slower" and aa["steady_verdict"] == "within noise"
    found = findings(rows, best_by="steady")
    assert any(f.startswith("Noise floor (A/A: baseline2, the baseline's setup again in the same rounds, against"
                            " baseline; steady state") and "over 3 + 3 runs" in f for f in found), found
    assert any(f.startswith("Decided against baseline: slow 1.10x slower (0.91x, 95% CI") for f in found), found
    assert not any(f.startswith("Within noise") and "slow (" in f for f in found), found
    assert "Least memory: baseline (500 MiB" in " ".join(found), found  # the A/A copy is no choice to make
    # the baseline is decided faster than the slow variant and the A/A copy is never Best: named
    best = format_matrix(rows, best_by="steady").splitlines()[-1]
    assert best.startswith("**Best:** baseline, by steady state"), best
