"""One voice in race, matrix, bench and bench-compare (issue 59): no line claims a difference the verdict cannot
decide (memory within its noise floor, quality within its own run-to-run noise, speed within noise), every ratio
says its direction, and a known change is claimed with the right sign. The summaries are real fits on CPU; the A/A
copies are those files with noise added to every figure (speed, memory, quality, warm-up)."""

from __future__ import annotations

import copy as copy_module
import random
import re
import subprocess
import sys
import textwrap

import pytest

from helpers import SLEEPY_SCRIPT, TinyModel, claims, find_summary, fit
from lightning_perf import IterationTimer, QualityGate, SectionProfiler, VRAMMonitor
from lightning_perf.bench.analysis import analysis, compare_bench, format_bench_compare, frontier, frontier_lines
from lightning_perf.bench.matrix import format_matrix, matrix_rows
from lightning_perf.bench.race import format_race, race_result
from lightning_perf.summary.memory_floor import FLOOR_MIB, memory_change
from lightning_perf.summary.trial_view import trial_line


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A real summary: a tiny fit with the suite and a quality gate on the validation loss."""
    root = tmp_path_factory.mktemp("real")
    fit(root, [IterationTimer(warmup_steps=2), SectionProfiler(), VRAMMonitor(),
               QualityGate(metrics=(), monitor={"val_loss": "min"})], model=TinyModel(), max_epochs=3,
        num_sanity_val_steps=0, enable_progress_bar=False)
    return find_summary(root)


def _copy(real, rate=None, memory=None, loss=None, warmup_s=None, num_workers=None):
    """The real summary with its speed (it/s), train peak memory (MiB), validation loss and warm-up set."""
    s = copy_module.deepcopy(real)
    if rate is not None:
        s["iteration_timer"]["ms_per_iter"]["mean"] = 1000.0 / rate
    if memory is not None:
        phases = s["vram"]["phases"]
        for field in ("peak_allocated_mb", "nvml_peak_used_mb"):
            phases["train"].pop(field, None)
        phases["train"]["host_rss_peak_mb"] = memory
    if loss is not None:
        s["quality_gate"]["metrics"]["val_loss"]["value"] = loss
    if warmup_s is not None:
        s["iteration_timer"]["warmup_time_s"] = warmup_s
    if num_workers is not None:
        s["run"]["num_workers"] = num_workers
    return s


def _noisy(rng, real, rate=100.0, memory=800.0, loss=0.5, warmup=0.1, rate_sd=0.01, **kw):
    """A copy with noise on every figure: 1% on speed, a few MiB on memory, 0.1% on quality, warm-up anywhere
    between 0.02 and 0.21 s (what one start-up code did twice)."""
    return _copy(real, rate=rate * rng.lognormvariate(0.0, rate_sd), memory=memory + rng.uniform(-4.0, 4.0),
                 loss=loss * rng.uniform(0.999, 1.001), warmup_s=rng.uniform(0.02, 0.21) if warmup else None, **kw)


def _matrix_results(tmp_path, variants):
    """run_matrix's results: ``variants`` name -> (overrides, [summary of each round])."""
    rounds = len(next(iter(variants.values()))[1])
    info = {"planned": rounds, "done": rounds, "budget_s": None, "round_s": [1.0] * rounds, "stopped": None,
            "threads": None}
    out = []
    for name, (overrides, summaries) in variants.items():
        runs = [{"name": name, "overrides": overrides, "exit_code": 0, "wall_s": 1.0, "summary": s,
                 "summary_path": str(tmp_path / name / f"repeat_{k}.json"), "log": str(tmp_path / "none.log")}
                for k, s in enumerate(summaries, start=1)]
        first = runs[0]
        first["repeats"] = runs[1:]
        first["rounds"] = info
        out.append(first)
    return out


def _race_info(tmp_path, runs):
    """run_race's result: ``runs`` name -> [summary of each round]."""
    results = {name: [{"name": name, "exit_code": 0, "wall_s": 1.0, "summary": s, "problem": None,
                       "summary_path": str(tmp_path / name / f"repeat_{k}" / "perf_summary.json")}
                      for k, s in enumerate(summaries, start=1)] for name, summaries in runs.items()}
    done = len(next(iter(runs.values())))
    return {"results": results, "planned": done, "done": done, "budget_s": None, "round_s": [1.0] * done,
            "stopped": None}


# -- 1. memory has a noise floor ------------------------------------------------------------------------------------
def test_memory_change_is_decided_only_beyond_the_floor_or_the_spread_of_repeats():
    assert not memory_change([800.0], [803.5])["decided"]  # 1-4 MiB never decides
    assert not memory_change([6.0], [12.0])["decided"]  # 12 against 6 MiB at the smallest sizes
    assert memory_change([800.0], [500.0])["sign"] == -1
    # with repeats, the spread between them: 40 MiB apart is nothing where the runs of one side spread 60
    assert not memory_change([800.0, 860.0], [820.0, 840.0])["decided"]
    assert memory_change([800.0, 801.0, 802.0], [700.0, 701.0, 703.0])["sign"] == -1
    assert memory_change([800.0, 801.0], [800.0 + FLOOR_MIB - 1, 801.0 + FLOOR_MIB - 1])["sign"] == 0


def test_matrix_names_least_memory_only_from_a_decided_difference(real, tmp_path):
    rng = random.Random(1)
    alike = _matrix_results(tmp_path, {
        "baseline": ([], [_noisy(rng, real, memory=800.0) for _ in range(3)]),
        "other": (["--x=1"], [_noisy(rng, real, memory=797.0) for _ in range(3)]),
        "baseline_aa": ([], [_noisy(rng, real, memory=800.0) for _ in range(3)])})
    text = format_matrix(matrix_rows(alike, noise_floor="baseline_aa"))
    line = next(x for x in text.splitlines() if "Least memory" in x)
    assert "not decided" in line and "within the memory noise floor" in line, line
    smaller = _matrix_results(tmp_path, {
        "baseline": ([], [_noisy(rng, real, memory=800.0) for _ in range(3)]),
        "other": (["--x=1"], [_noisy(rng, real, memory=500.0) for _ in range(3)]),
        "baseline_aa": ([], [_noisy(rng, real, memory=800.0) for _ in range(3)])})
    text = format_matrix(matrix_rows(smaller, noise_floor="baseline_aa"))
    line = next(x for x in text.splitlines() if "Least memory" in x)
    assert line.startswith("- Least memory: other (") and "MiB less than baseline" in line, line
    assert " MB" not in text and "MiB" in text  # the figures are 2^20 bytes


@pytest.fixture(scope="module")
def sweep_rows():
    """Real bench rows: a sweep of a small conv net on CPU at two batch sizes of one input size."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from bench_models import small_conv

    from lightning_perf.bench.sweep import run_sweep
    from lightning_perf.bench.sweep_rounds import combine_rounds

    rows = run_sweep(small_conv, [16], [1, 2], mode="train", device="cpu", precision="32", warmup=1, iters=3,
                     progress=False, rounds=1, oom_snapshot=False)
    return combine_rounds(rows)


def _set(rows, **by_batch):
    out = copy_module.deepcopy(rows)
    for r in out:
        pixels, memory = by_batch[f"b{r['batch_size']}"]
        r.update(pixels_per_sec=pixels, memory_peak_mb=memory, std_time_ms=0.01 * r["avg_time_ms"])
    return out


def test_twelve_against_six_mib_does_not_drive_the_frontier(sweep_rows):
    rows = _set(sweep_rows, b1=(1.0e6, 6.0), b2=(2.0e6, 12.0))
    on = frontier(rows)
    assert [r["batch_size"] for r in on] == [2]  # the same memory within the floor: the faster one alone
    text = "\n".join(frontier_lines(rows))
    assert "MiB" in text and " MB" not in text
    assert "within the memory noise floor of every other" in text and "least peak memory" not in text, text
    rows = _set(sweep_rows, b1=(1.0e6, 60.0), b2=(2.0e6, 400.0))  # a decided cost: both on the frontier
    assert [r["batch_size"] for r in frontier(rows)] == [1, 2]


def test_bench_compare_says_a_memory_change_within_the_floor_is_within_it(sweep_rows):
    old = _set(sweep_rows, b1=(1.0e6, 6.0), b2=(2.0e6, 12.0))
    new = _set(sweep_rows, b1=(1.0e6, 9.0), b2=(2.0e6, 11.0))
    rows = compare_bench(old, new)
    assert all(r["memory_decided"] is False for r in rows)
    text = format_bench_compare(rows)
    assert "within floor" in text and "peak MiB" in text and "+50.0%" not in text


# -- 2. quality against its own noise -------------------------------------------------------------------------------
def _quality_note(rows, name):
    return next(r for r in rows if r["variant"] == name)["quality_gate_note"]


def test_a_tolerance_below_the_aa_noise_is_said_instead_of_failed(real, tmp_path):
    results = _matrix_results(tmp_path, {
        "baseline": ([], [_copy(real, loss=0.500)]),
        "amp": (["--trainer.precision=bf16-mixed"], [_copy(real, loss=0.508)]),  # 1.6% worse, 0.5% allowed
        "baseline_aa": ([], [_copy(real, loss=0.515)])})  # the A/A pair itself moved 3%
    rows = matrix_rows(results, noise_floor="baseline_aa")
    note = _quality_note(rows, "amp")
    assert not note.startswith("FAILED") and "tolerance is below the run-to-run noise" in note, note
    assert "A/A moved val_loss by 3.0%" in note
    assert "FAILED" not in format_matrix(rows)


def test_a_variant_whose_data_order_changes_does_not_fail_for_it(real, tmp_path):
    results = _matrix_results(tmp_path, {
        "baseline": ([], [_copy(real, loss=0.500, num_workers=0)]),
        "workers": (["--data.num_workers=2"], [_copy(real, loss=0.504, num_workers=2)]),
        "baseline_aa": ([], [_copy(real, loss=0.500, num_workers=0)])})
    rows = matrix_rows(results, noise_floor="baseline_aa")
    note = _quality_note(rows, "workers")
    assert note.startswith("not checked") and "num_workers" in note, note


def test_a_gate_that_cannot_compare_is_not_checked_never_passed(real, tmp_path):
    own = _copy(real, loss=0.5)
    own["quality_gate"].update(passed=True, images_scored=10, baseline_images=20)
    results = _matrix_results(tmp_path, {"baseline": ([], [_copy(real, loss=0.5)]), "other": (["--x=1"], [own])})
    rows = matrix_rows(results, noise_floor=None)
    note = _quality_note(rows, "other")
    assert note.startswith("not checked") and "different validation sets" in note, note


# -- 3. labels ------------------------------------------------------------------------------------------------------
def test_race_says_between_runs_in_a_sentence_and_one_voice(real, tmp_path):
    rng = random.Random(3)
    runs = {"a": [_noisy(rng, real, rate_sd=0.05) for _ in range(3)],
            "b": [_noisy(rng, real, rate=108.0, rate_sd=0.05) for _ in range(3)],
            "a_aa": [_noisy(rng, real, rate_sd=0.05) for _ in range(3)]}
    commands = [(name, ["true"]) for name in runs]
    result = race_result(commands, _race_info(tmp_path, runs), "a_aa")
    assert result["comparisons"]["b"]["verdict"]["verdict"] == "within noise"
    text = format_race(result)
    between = next(x for x in text.splitlines() if x.lstrip().startswith("Between:"))
    assert "{" not in between and between.split(":", 1)[1].strip().startswith("within noise ("), between
    assert " significant" not in text.replace("not significant", "")
    verdict = next(x for x in text.splitlines() if x.startswith("  b against a:"))
    assert re.search(r"within noise \(1\.\d+x (faster|slower), 95% CI", verdict), verdict


def test_race_says_a_quality_change_within_the_aa_noise_is_no_change(real, tmp_path):
    runs = {"a": [_copy(real, loss=v) for v in (0.500, 0.503, 0.498)],
            "b": [_copy(real, loss=v) for v in (0.508, 0.506, 0.509)],
            "a_aa": [_copy(real, loss=v) for v in (0.515, 0.497, 0.501)]}
    for s in runs["b"]:  # its own gate failed against a baseline the A/A pair moves by 3%
        s["quality_gate"]["metrics"]["val_loss"].update(passed=False, baseline=0.5, delta_pct=1.6)
    result = race_result([(n, ["true"]) for n in runs], _race_info(tmp_path, runs), "a_aa")
    text = format_race(result)
    line = next(x for x in text.splitlines() if x.startswith("  Quality val_loss, b against a:"))
    assert "within noise: the A/A pair moved val_loss by 3.00%" in line, line
    assert not re.search(r"val_loss: .*FAILED", text)


def test_a_refused_trial_leads_with_its_refusal_and_shows_no_ceiling(real):
    s = copy_module.deepcopy(real)
    s["trial"] = {"change": "channels_last", "targets": "compute-bound", "status": "not-started",
                  "reason": "no 4-d weights", "pairs": 0, "blocks": 0,
                  "line": "ABTrial: with channels_last: no result (0 complete pair(s) of blocks measured; the"
                          " interval needs 2; no 4-d weights)"}
    line = trial_line(s)
    assert line.startswith("with channels_last: not tried: no 4-d weights"), line
    assert "ceiling" not in line and "needs 2" not in line
    s["trial"].update(status="done", reason=None, pairs=12, blocks=24, speedup=1 / 1.048, speedup_low=0.93,
                      speedup_high=1.02, verdict="within-noise",
                      line="ABTrial: with channels_last: within noise (0.954x) (95% CI 0.93–1.02, paired over 24"
                           " blocks)")
    line = trial_line(s)
    assert line.startswith("with channels_last: within noise (1.048x slower, 95% CI 0.93–1.02"), line


def test_a_name_ending_in_s_has_a_plain_possessive_and_a_trial_ratio_its_direction(real, tmp_path):
    from lightning_perf.bench.matrix_trial import pooled_trial, trial_findings

    results = _matrix_results(tmp_path, {"baseline": ([], [_copy(real, warmup_s=0.02)]),
                                          "workers": (["--data.num_workers=2"], [_copy(real, warmup_s=5.0)])})
    text = format_matrix(matrix_rows(results, noise_floor=None))
    assert "workers's" not in text and "Warm-up cost: workers' warm-up" in text
    summary = copy_module.deepcopy(real)
    summary["trial"] = {"change": "channels_last", "status": "done", "pair_off_ms": [10.0, 10.2, 9.9, 10.1],
                        "pair_on_ms": [10.4, 10.1, 10.6, 10.3]}
    row = dict(variant="baseline", **pooled_trial("channels_last", [{"summary": summary}]))
    line = trial_findings([row])[0]
    assert re.search(r"baseline: (within noise|slower) \(1\.\d{3}x slower\), 0\.\d{3}x \[", line), line


def test_a_warmup_that_is_not_decided_pays_nothing_back(real, tmp_path):
    results = _matrix_results(tmp_path, {"baseline": ([], [_copy(real, rate=100.0, warmup_s=0.02)]),
                                          "again": (["--x=1"], [_copy(real, rate=100.3, warmup_s=0.21)])})
    text = format_matrix(matrix_rows(results, noise_floor=None))
    assert "pays back" not in text and not re.search(r"after [\d,]+ it", text), text


def test_a_decided_speed_and_warmup_pay_back_with_repeats(real, tmp_path):
    rng = random.Random(11)
    base = [_copy(real, rate=100.0 * rng.uniform(0.999, 1.001), warmup_s=0.1 + rng.uniform(0, 0.01)) for _ in range(3)]
    fast = [_copy(real, rate=140.0 * rng.uniform(0.999, 1.001), warmup_s=2.4 + rng.uniform(0, 0.01)) for _ in range(3)]
    rows = matrix_rows(_matrix_results(tmp_path, {"baseline": ([], base), "compile": (["--x=1"], fast)}))
    text = format_matrix(rows, best_by="steady")
    row = next(x for x in text.splitlines() if x.startswith("| compile |"))
    assert re.search(r"\| after [\d,]+ it \(", row), row
    assert "longer than baseline's in every run: 1.40x faster per iteration" in text and "pays back its" in text


# -- 4. the A/A property and a known change -------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_no_line_of_an_aa_race_or_matrix_claims_a_difference(real, tmp_path, seed):
    rng = random.Random(seed)
    runs = {name: [_noisy(rng, real) for _ in range(3)] for name in ("a", "b", "a_aa")}
    result = race_result([(name, ["true"]) for name in runs], _race_info(tmp_path, runs), "a_aa")
    assert claims(format_race(result)) == [], claims(format_race(result))
    results = _matrix_results(tmp_path, {name: ([] if name != "b" else ["--x=1"], summaries)
                                         for name, summaries in runs.items()})
    text = format_matrix(matrix_rows(results, noise_floor="a_aa"), best_by="steady")
    assert claims(text) == []
    tied = next(x for x in text.splitlines() if x.startswith("- Within noise of a:"))
    assert re.search(r"b \(1\.\d\dx (faster|slower), 95% CI", tied), tied


def test_a_known_change_is_claimed_with_its_sign(real, tmp_path):
    rng = random.Random(7)
    # a sleep worth 30% of the step: 1.3x the time, 1/1.3 the rate; and 300 MiB less memory
    runs = {"a": [_noisy(rng, real) for _ in range(3)], "slow": [_noisy(rng, real, rate=100 / 1.3, memory=500.0)
                                                                  for _ in range(3)],
            "a_aa": [_noisy(rng, real) for _ in range(3)]}
    result = race_result([(name, ["true"]) for name in runs], _race_info(tmp_path, runs), "a_aa")
    text = format_race(result)
    verdict = next(x for x in text.splitlines() if x.startswith("  slow against a:"))
    assert re.search(r"1\.[23]\dx slower, decided", verdict) and "faster" not in verdict, verdict
    assert "significant" in next(x for x in text.splitlines() if x.lstrip().startswith("Slowdown:"))
    memory = next(x for x in text.splitlines() if x.startswith("  Train peak memory, slow against a:"))
    assert re.search(r"[23]\d\d\.\d MiB less \(beyond the 16 MiB floor: spread of repeats\)", memory), memory
    results = _matrix_results(tmp_path, {name: ([] if name != "slow" else ["--x=1"], s) for name, s in runs.items()})
    text = format_matrix(matrix_rows(results, noise_floor="a_aa"), best_by="steady")
    assert re.search(r"Decided against a: slow 1\.[23]\dx slower", text) and "Least memory: slow (" in text, text


def test_no_line_of_an_aa_bench_or_bench_compare_claims_a_difference(sweep_rows):
    rng = random.Random(5)

    def noisy():
        rows = copy_module.deepcopy(sweep_rows)
        for r in rows:
            r.update(pixels_per_sec=r["pixels_per_sec"] * rng.uniform(0.99, 1.01),
                     memory_peak_mb=6.0 + rng.uniform(0.0, 6.0))
        return rows

    old, new = noisy(), noisy()
    text = "\n".join(frontier_lines(old))
    # a size against the smallest inside the rows' noise says so (the per-sample line of the analysis)
    two = copy_module.deepcopy(old) + [dict(r, tile_size=17, avg_time_ms=r["avg_time_ms"] * 1.01,
                                            pixels_per_sec=r["pixels_per_sec"] * 17 ** 2 / 16 ** 2 / 1.01,
                                            std_time_ms=0.2 * r["avg_time_ms"]) for r in copy_module.deepcopy(old)]
    line = next(x for x in analysis(two).splitlines() if x.startswith("- 17 is "))
    assert "(within noise, ±" in line, line
    assert claims(text) == [] and "more memory" not in text.lower()
    assert all(not r["memory_decided"] for r in compare_bench(old, new))

@pytest.mark.slow
def test_the_run_commands_printed_answer_claims_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SLEEPY_SCRIPT).lstrip())
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "run", "--out", "out", "--", sys.executable,
                           str(script), "40", "0.003"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert claims(proc.stdout + proc.stderr) == []


def _sweep_row(size, batch, ms, std_ms, peak_mib):
    samples = 1000.0 * batch / ms
    return {"tile_size": size, "batch_size": batch, "avg_time_ms": ms, "std_time_ms": std_ms, "error": "",
            "throughput_samples_per_sec": samples, "pixels_per_sec": samples * size * size,
            "memory_peak_mb": peak_mib, "efficiency_pixels_per_sec_per_mb": samples * size * size / peak_mib}


def test_the_tables_best_rows_name_what_is_within_noise_of_them():
    """The sweep table's best throughput is the highest reading; a row within the noise of it (2x the larger spread of
    the two rows' times, bench-compare's rule) is named beside it, one beyond it is not."""
    from lightning_perf.bench.sweep import format_table

    rows = [_sweep_row(32, 4, 10.0, 0.5, 100.0),   # 400 samples/s, 5% spread
            _sweep_row(32, 2, 5.3, 0.2, 100.0),    # 377 samples/s: 5.7% below, within 2 x 5%
            _sweep_row(32, 1, 4.0, 0.1, 100.0)]    # 250 samples/s: far below
    text = format_table(rows)
    line = next(x for x in text.splitlines() if x.startswith("best throughput:"))
    assert line.startswith("best throughput: size 32 batch 4 (400.0 samples/s)"), line
    assert line.endswith("; within noise of it: size 32 batch 2"), line
    steady = format_table([dict(r, std_time_ms=0.0) for r in rows])
    assert "within noise of it" not in next(x for x in steady.splitlines() if x.startswith("best throughput:"))
