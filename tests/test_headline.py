"""The headline figures a user acts on, checked against the clock: speed, its CI, time to N, best variant.

The tests that compare two fits time them on a :class:`helpers.VirtualClock` that the model advances by a known cost
per step: two real runs of one setup on a shared machine differ by more than any tolerance could hold (the first
version of these tests, on the real clock, failed about half the CI runs). The rule behind "significant" is proven on
synthetic series in test_speed_verdict.py, and one test here keeps two real-clock runs, checking what does not depend
on the machine's load.
"""

import json
import random
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import TinyModel, find_summary, fit, use_virtual_clock
from lightning_perf import IterationTimer, SectionProfiler
from lightning_perf.bench.matrix import best_variant, matrix_rows
from lightning_perf.summary.compare import compare_summaries
from lightning_perf.summary.report import format_report, report_rows


class PacedModel(TinyModel):
    """Each training step costs ``step_s``; every ``stall_every``-th costs ``stall_s`` instead (a checkpoint, a data
    stall). ``pace`` spends the cost: ``time.sleep`` on the real clock, or a virtual clock's ``advance``, where each
    cost gets a seeded jitter of 2% so that a run's iterations are not all equal."""

    def __init__(self, step_s=0.010, stall_every=0, stall_s=0.0, batch_size=8, val_s=0.0, pace=time.sleep, seed=0):
        super().__init__()
        self.step_s, self.stall_every, self.stall_s = step_s, stall_every, stall_s
        self.batch_size, self.val_s = batch_size, val_s
        self.steps = 0
        self.pace = pace
        self.jitter = random.Random(seed) if pace is not time.sleep else None

    def spend(self, seconds):
        self.pace(seconds if self.jitter is None else seconds * (1.0 + 0.02 * self.jitter.uniform(-1.0, 1.0)))

    def training_step(self, batch, batch_idx):
        self.steps += 1
        stall = self.stall_every and self.steps % self.stall_every == 0
        self.spend(self.stall_s if stall else self.step_s)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.spend(self.val_s)
        return super().validation_step(batch, batch_idx)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 16, generator=g)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=self.batch_size)


def run(root, name, model, **trainer_args):
    path = root / name / "perf_summary.json"
    trainer_args.setdefault("max_epochs", None)
    trainer_args.setdefault("limit_val_batches", 0)
    trainer_args.setdefault("num_sanity_val_steps", 0)
    fit(root / name, [IterationTimer(warmup_steps=2, summary_path=str(path))], model=model, **trainer_args)
    with open(path) as fh:
        return json.load(fh), str(path)


@pytest.fixture(scope="module")
def steady_and_stalling(tmp_path_factory):
    """A: 10 ms every step. B: 7 ms steps, but every 5th stalls 40 ms: B's median is lower, its mean higher
    ((4 x 7 + 40) / 5 = 13.6 ms), and its wall time is longer."""
    root = tmp_path_factory.mktemp("headline")
    with pytest.MonkeyPatch.context() as mp:
        clock = use_virtual_clock(mp)
        a = run(root, "steady", PacedModel(step_s=0.010, pace=clock.advance), max_steps=60)
        b = run(root, "stalling", PacedModel(step_s=0.007, stall_every=5, stall_s=0.040, pace=clock.advance),
                max_steps=60)
    return a, b


def test_compare_calls_the_run_with_fast_iterations_and_stalls_slower(steady_and_stalling):
    (a, _), (b, _) = steady_and_stalling
    ta, tb = a["iteration_timer"], b["iteration_timer"]
    assert tb["ms_per_iter"]["median"] < ta["ms_per_iter"]["median"]  # the trap: B's typical iteration is faster
    assert tb["train_time_s"] > ta["train_time_s"]  # but B takes longer on the clock
    result = compare_summaries(a, b)
    assert result["speedup_basis"] == "it/s"
    assert result["speedup"] < 1.0 and result["candidate_slower_pct"] > 0
    # the headline is the ratio of wall times per iteration, i.e. of the measured totals
    wall_ratio = (tb["histogram_ms"]["sum"] / tb["measured_iterations"]) / (
        ta["histogram_ms"]["sum"] / ta["measured_iterations"])
    assert result["speedup"] == pytest.approx(1.0 / wall_ratio, rel=1e-9)
    assert result["typical_iteration_speedup"] > 1.0  # the median line still says what it says
    lo, hi = result["speedup_ci95"]
    assert lo <= result["speedup"] <= hi and hi < 1.0 and result["speedup_beyond_within_run_noise"]
    assert result["speedup_significant"] is None  # one run a side: no verdict between runs


def test_report_and_matrix_show_the_same_change_as_compare(steady_and_stalling):
    (a, pa), (b, pb) = steady_and_stalling
    result = compare_summaries(a, b)
    rows = report_rows([a, b], ["steady", "stalling"])
    assert rows[1]["change_pct"] == pytest.approx(result["change_pct"], rel=1e-9)
    table = format_report(rows)
    assert f"{result['change_pct']:+.1f}%" in table and "| baseline |" in table
    results = [{"name": n, "overrides": [], "exit_code": 0, "wall_s": 1.0, "summary": s, "log": p}
               for n, s, p in (("steady", a, pa), ("stalling", b, pb))]
    mrows = matrix_rows(results)
    assert mrows[1]["speedup"] == pytest.approx(result["speedup"], rel=1e-9)
    assert best_variant(mrows)["variant"] == "steady"


def test_cli_compare_text_lists_the_distribution_and_fails_the_slower_candidate(steady_and_stalling):
    (_, pa), (_, pb) = steady_and_stalling
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "compare", pa, pb, "--fail-if-slower", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "slower than base" in proc.stderr
    out = proc.stdout
    for word in ("min ", "median ", "mean ", "p95 ", "p99 ", "max "):
        assert word in out.split("Iteration time distribution:")[1]
    assert "Typical:" in out and "with evaluation" not in out  # no validation in these runs
    assert "steady:" in out and "stalling:" in out  # names: the part of the path that differs


def test_samples_per_second_is_the_headline_when_batch_sizes_differ(tmp_path, monkeypatch):
    """Batch 8 -> 32 at a step cost of 10 -> 20 ms: half the it/s, twice the samples/s. Best is the big batch."""
    clock = use_virtual_clock(monkeypatch)
    a, pa = run(tmp_path, "bs8", PacedModel(step_s=0.010, batch_size=8, pace=clock.advance), max_steps=30)
    b, pb = run(tmp_path, "bs32", PacedModel(step_s=0.020, batch_size=32, pace=clock.advance), max_steps=30)
    result = compare_summaries(a, b)
    assert result["speedup_basis"] == "samples/s"
    assert result["speedup"] == pytest.approx(result["samples_per_s_speedup"], rel=1e-9)
    assert result["speedup"] == pytest.approx(2.0, rel=0.03) and b["iteration_timer"]["it_per_s"] < a["iteration_timer"]["it_per_s"]
    rows = report_rows([a, b], ["bs8", "bs32"])
    assert rows[1]["change_pct"] > 50 and "(samples/s)" in format_report(rows)
    results = [{"name": n, "overrides": [], "exit_code": 0, "wall_s": 1.0, "summary": s, "log": p}
               for n, s, p in (("bs8", a, pa), ("bs32", b, pb))]
    assert best_variant(matrix_rows(results))["variant"] == "bs32"


def test_compare_of_two_real_runs_of_one_setup_is_consistent_whatever_the_load(tmp_path):
    """Two real-clock runs of one setup, back to back. Whether they come out "significant" depends on the machine
    (a neighbour, a clock boost): the false-positive rate of the rule is tested on synthetic series in
    test_speed_verdict.py. Here: every field is there, the verdict follows from the interval and the effect, the
    interval holds the speedup, and the text says what the interval does not cover."""
    (a, pa), (b, pb) = [run(tmp_path, name, PacedModel(step_s=0.006, stall_every=7, stall_s=0.030), max_steps=70)
                        for name in ("first", "second")]
    result = compare_summaries(a, b)
    lo, hi = result["speedup_ci95"]
    assert lo <= result["speedup"] <= hi
    excludes_one = lo > 1.0 or hi < 1.0
    big_enough = abs(result["speedup"] - 1.0) * 100.0 >= result["min_effect_pct"]
    assert result["speedup_beyond_within_run_noise"] is (excludes_one and big_enough)
    assert result["speedup_significant"] is None and result["speedup_interval"] == "within runs"
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "compare", pa, pb], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "95% CI" in proc.stdout and "same host" in proc.stdout


@pytest.mark.parametrize("stalls", [False, True])
def test_time_to_n_predicts_the_measured_train_and_eval_time(tmp_path, monkeypatch, stalls):
    """A run of N projects to N within 5% of its own train and train + eval time; projected to 2N, it predicts a
    second run of 2N within 8%. Validation every 20 iterations, 4 batches of 40 ms; checkpointing off. On the
    virtual clock (see the module's docstring): on the real one, a loaded machine moves the second run by more."""
    clock = use_virtual_clock(monkeypatch)

    def model():
        return PacedModel(step_s=0.030, stall_every=5 if stalls else 0, stall_s=0.090, val_s=0.040,
                          pace=clock.advance)

    args = dict(val_check_interval=20, limit_val_batches=4, check_val_every_n_epoch=None, enable_checkpointing=False)
    short, _ = run(tmp_path, "short", model(), max_steps=40, **args)
    t = short["iteration_timer"]
    assert t["projected_time_to_target_s"] == pytest.approx(t["train_time_s"], rel=0.05)
    assert t["projected_time_to_target_with_eval_s"] == pytest.approx(t["train_time_s"] + t["eval_time_s"], rel=0.05)
    timer = IterationTimer(warmup_steps=2, target_steps=80, summary_path=str(tmp_path / "again.json"))
    fit(tmp_path / "again", [timer], model=model(), max_epochs=None, max_steps=40, num_sanity_val_steps=0, **args)
    projected = json.loads((tmp_path / "again.json").read_text())["iteration_timer"]
    long, _ = run(tmp_path, "long", model(), max_steps=80, **args)
    lt = long["iteration_timer"]
    assert projected["projected_time_to_target_s"] == pytest.approx(lt["train_time_s"], rel=0.08)
    assert projected["projected_time_to_target_with_eval_s"] == pytest.approx(
        lt["train_time_s"] + lt["eval_time_s"], rel=0.08)


def test_compare_reads_a_schema_1_summary(steady_and_stalling, tmp_path):
    """Old files keep working: schema 1 had no blocks, warm-up time or validation count."""
    (a, _), (b, _) = steady_and_stalling
    old = json.loads(json.dumps(a))
    old["schema_version"] = 1
    for key in ("blocks_ms", "warmup_time_s", "validation_runs", "fits", "eval_time_per_validation_s"):
        old["iteration_timer"].pop(key)
    result = compare_summaries(old, b)
    assert result["speedup"] == pytest.approx(compare_summaries(a, b)["speedup"], rel=1e-9)
    assert result["speedup_ci95"] is None and any("schema 1" in n for n in result["notes"])
    assert result["time_to_iterations_s"]["base"] == pytest.approx(
        30000 * a["iteration_timer"]["ms_per_iter"]["mean"] / 1000.0)


class PacedBackward(torch.autograd.Function):
    """Identity whose backward costs ``seconds``, spent by ``pace``: ``time.sleep``, or a virtual clock's
    ``advance``."""

    pace = staticmethod(time.sleep)

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        PacedBackward.pace(ctx.seconds)
        return grad, None


class SlowBackwardModel(TinyModel):
    """2 ms of forward, 20 ms of backward: 10x, far past the usual 2x."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        PacedBackward.pace(0.002)
        out = PacedBackward.apply(self(x), 0.020)
        return torch.nn.functional.mse_loss(out, y)


class UserSectionInForward(TinyModel):
    """Like the demo: the whole forward inside a user section, so the automatic `forward` remainder is tiny. 4 ms of
    forward, 67% of the iteration, and 2 ms of backward, which reads as a slow backward if the section is left out."""

    def training_step(self, batch, batch_idx):
        from lightning_perf import profile_section

        x, y = batch
        with profile_section("net_forward"):
            PacedBackward.pace(0.004)
            out = PacedBackward.apply(self(x), 0.002)
        loss = torch.nn.functional.mse_loss(out, y)
        return loss


def _insights(tmp_path, model):
    fit(tmp_path, [SectionProfiler(warmup_steps=1, print_reports=False)], model=model, max_epochs=1)
    return find_summary(tmp_path)["section_profiler"]


def test_backward_insight_fires_for_a_truly_slow_backward_only(tmp_path, monkeypatch):
    """On the virtual clock: on a loaded machine, the sleeps' overshoot and Lightning's own time move the shares
    across the insights' thresholds."""
    monkeypatch.setattr(PacedBackward, "pace", staticmethod(use_virtual_clock(monkeypatch).advance))
    slow = _insights(tmp_path / "slow", SlowBackwardModel())
    assert any(i.startswith("Backward takes") for i in slow["insights"]), slow["insights"]
    carved = _insights(tmp_path / "carved", UserSectionInForward())
    assert not any(i.startswith("Backward takes") for i in carved["insights"]), carved["insights"]
    fwd = carved["sections"]["forward"]
    assert fwd["inclusive_mean_ms"] >= 4.0 > fwd["mean_ms"]  # the user section is forward time again
    assert any(i.startswith("The forward pass takes") for i in carved["insights"])
    assert not any(i.startswith("The forward pass takes") for i in slow["insights"])


def test_runs_are_named_by_the_part_of_their_paths_that_differs():
    from lightning_perf.summary.fields import run_names

    paths = ["runs/base/lightning_logs/version_0/perf_summary.json",
             "runs/amp/lightning_logs/version_0/perf_summary.json",
             "runs/amp/lightning_logs/version_1/perf_summary.json"]
    assert run_names(paths[:2]) == ["base", "amp"]
    assert run_names(paths[1:]) == ["version_0", "version_1"]
    assert run_names(paths) == ["base/lightning_logs/version_0", "amp/lightning_logs/version_0",
                                "amp/lightning_logs/version_1"]
    named = [{"run": {"name": "phase 2d"}}, {"run": {}}]
    assert run_names(paths[:2], named) == ["phase 2d", "amp"]
    assert run_names([paths[0], paths[0]]) == ["version_0 (1)", "version_0 (2)"]
    # files named apart: their names count (without .json), in one folder or in several
    assert run_names(["runs/base.json", "runs/zero.json"]) == ["base", "zero"]
    assert run_names(["runs/a/x.json", "runs/b/x.json", "runs/b/y.json"]) == ["a/x", "b/x", "b/y"]
    assert run_names(["runs/a/x.json", "runs/b/y.json"]) == ["a/x", "b/y"]
