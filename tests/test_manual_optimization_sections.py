"""Manual optimization measured: backward from Lightning's backward hooks, each ``opt.step()`` its own piece of
``optimizer_step`` (``optimizer_step[i]`` per optimizer where there are several), carved out of ``training_step``,
against the module's own clock around each ``manual_backward`` and ``opt.step()``; and iterations numbered by
batches where two optimizers advance ``global_step`` twice a batch."""

import contextlib
import logging
import re
import time
from html.parser import HTMLParser

import pytest
import torch
from torch import nn

from helpers import TinyModel, find_summary, fit, make_loader
from lightning_perf import IterationTimer, SectionProfiler, profile_section
from lightning_perf.cli import main as cli_main

BACKWARD_S = 0.004  # each manual_backward (a slow op's backward)
STEP_S = (0.003, 0.006)  # opt A's step, opt B's step


class SlowGrad(torch.autograd.Function):
    """Identity forward; its backward sleeps ``BACKWARD_S``: backward long enough to measure on a shared CPU."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(BACKWARD_S)
        return grad


class SleepySGD(torch.optim.SGD):
    """SGD whose step sleeps ``pause`` seconds first."""

    def __init__(self, params, pause):
        super().__init__(params, lr=0.01)
        self.pause = pause

    def step(self, closure=None):
        time.sleep(self.pause)
        return super().step(closure)


class GanLike(TinyModel):
    """Net A and net B, each with its own loss, ``manual_backward`` and ``opt.step()``; its own clock (perf_counter)
    around each of those calls, per batch. ``spike_at``: a batch whose training_step sleeps ``spike_s`` more."""

    def __init__(self, spike_at=None, spike_s=0.1, batches=8, section=False, closure=False):
        super().__init__()
        self.closure = closure  # opt B steps with a closure that runs net B's loss and backward inside the step
        self.section = section  # net A's part inside profile_section("gen"), with 2 ms of its own
        self.automatic_optimization = False
        self.net_a = nn.Linear(16, 16)
        self.net_b = nn.Linear(16, 1)
        self.spike_at, self.spike_s, self.batches = spike_at, spike_s, batches
        self.own = {"backward": [], "step0": [], "step1": [], "gen_outside_step": []}

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt_a, opt_b = self.optimizers()
        if batch_idx == self.spike_at:
            time.sleep(self.spike_s)
        backward = 0.0
        for opt, loss_of, key in ((opt_a, lambda: SlowGrad.apply(self.net_a(x)).pow(2).mean(), "step0"),
                                  (opt_b, lambda: (SlowGrad.apply(self.net_b(x)) - y).pow(2).mean(), "step1")):
            if self.closure and key == "step1":
                backward += self._closure_step(opt, loss_of, key)
                continue
            section = profile_section("gen") if self.section and key == "step0" else contextlib.nullcontext()
            start = time.perf_counter()
            with section:
                if self.section and key == "step0":
                    time.sleep(0.002)
                loss = loss_of()
                opt.zero_grad()
                t = time.perf_counter()
                self.manual_backward(loss)
                this_backward = time.perf_counter() - t
                t = time.perf_counter()
                opt.step()
                self.own[key].append(time.perf_counter() - t)
            if self.section and key == "step0":
                self.own["gen_outside_step"].append(time.perf_counter() - start - this_backward - self.own[key][-1])
            backward += this_backward
        self.own["backward"].append(backward)

    def _closure_step(self, opt, loss_of, key):
        """``opt.step(closure)``, the closure making the loss and its backward (run inside the step, as LBFGS
        needs): the own clock's step is the call less that backward. Returns the backward's seconds."""
        inside = []

        def closure():
            loss = loss_of()
            opt.zero_grad()
            t = time.perf_counter()
            self.manual_backward(loss)
            inside.append(time.perf_counter() - t)
            return loss

        t = time.perf_counter()
        opt.step(closure=closure)
        self.own[key].append(time.perf_counter() - t - sum(inside))
        return sum(inside)

    def configure_optimizers(self):
        return SleepySGD(self.net_a.parameters(), STEP_S[0]), SleepySGD(self.net_b.parameters(), STEP_S[1])

    def train_dataloader(self):
        return make_loader(n=8 * self.batches)


def close(measured_ms, own_ms):
    """The project's tolerance against an independent clock: within 15% or 0.1 ms."""
    return abs(measured_ms - own_ms) <= max(0.15 * own_ms, 0.1)


def gan_fit(tmp_path, callbacks, **model_kwargs):
    model = GanLike(**model_kwargs)
    trainer = fit(tmp_path, callbacks, model=model, max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0)
    return trainer, model, find_summary(tmp_path)


def test_manual_backward_and_each_optimizer_step_match_the_modules_own_clock(tmp_path):
    trainer, model, summary = gan_fit(tmp_path, [SectionProfiler(warmup_steps=0, print_reports=False)])
    sp = summary["section_profiler"]
    sections = sp["sections"]
    n = sp["iterations"]
    assert n == 8 and trainer.global_step == 16  # two optimizer steps a batch; an iteration is a batch
    assert sp["manual_optimization"] is True
    own_ms = {key: 1000.0 * sum(v) / n for key, v in model.own.items()}
    assert sections["backward"]["count"] == n
    assert close(1000.0 * sections["backward"]["total_s"] / n, own_ms["backward"]), (sections["backward"], own_ms)
    for i in (0, 1):
        row = sections[f"optimizer_step[{i}]"]
        assert row["kind"] == "optimizer" and row["parent"] == "optimizer_step"
        assert row["count"] == n  # one step of this optimizer a batch
        assert close(1000.0 * row["total_s"] / n, own_ms[f"step{i}"]), (i, row, own_ms)
    step = sections["optimizer_step"]
    assert close(1000.0 * step["total_s"] / n, own_ms["step0"] + own_ms["step1"]), (step, own_ms)
    # the per-optimizer rows split optimizer_step: inside it, not beside it
    assert sections["optimizer_step[0]"]["total_s"] + sections["optimizer_step[1]"]["total_s"] == pytest.approx(
        step["total_s"], rel=1e-6)
    # training_step keeps the forward and the rest; the automatic rows still add up to the iteration
    assert "training_step" in sections and "forward" not in sections
    auto_s = sum(r["total_s"] for r in sections.values() if r["kind"] == "auto")
    assert auto_s == pytest.approx(n * sp["iteration_ms"]["mean"] / 1000.0, rel=1e-6)
    assert sections["training_step"]["total_s"] > 0
    for name in ("backward", "optimizer_step"):
        assert name not in sp["unavailable"], sp["unavailable"]
    assert "training_step" in sp["unavailable"]["forward"]


def test_a_closures_backward_inside_a_step_is_backward_and_the_step_keeps_the_rest(tmp_path):
    """Opt B steps with a closure that runs net B's loss and backward inside the step (Lightning runs the closure
    from the torch step, after the pre-hook): that backward is ``backward``, the step's sleep before it and its update
    after it are ``optimizer_step[1]``."""
    _, model, summary = gan_fit(tmp_path, [SectionProfiler(warmup_steps=0, print_reports=False)], closure=True)
    sp = summary["section_profiler"]
    sections, n = sp["sections"], sp["iterations"]
    own_ms = {key: 1000.0 * sum(v) / n for key, v in model.own.items()}
    assert close(1000.0 * sections["backward"]["total_s"] / n, own_ms["backward"]), (sections["backward"], own_ms)
    for i in (0, 1):
        row = sections[f"optimizer_step[{i}]"]
        assert row["count"] == n and close(1000.0 * row["total_s"] / n, own_ms[f"step{i}"]), (i, row, own_ms)


def test_a_user_section_around_backward_and_step_keeps_its_time_outside_them(tmp_path):
    """profile_section("gen") around net A's forward, manual_backward and opt.step(): backward and optimizer_step
    keep their time; the section holds the rest, carved out of training_step, which never goes below zero."""
    _, model, summary = gan_fit(tmp_path, [SectionProfiler(warmup_steps=0, print_reports=False)], section=True)
    sp = summary["section_profiler"]
    sections, n = sp["sections"], sp["iterations"]
    own_ms = {key: 1000.0 * sum(v) / n for key, v in model.own.items()}
    gen = sections["gen"]
    assert gen["kind"] == "user" and gen["parent"] == "training_step" and gen["count"] == n
    backward_ms = 1000.0 * sections["backward"]["total_s"] / n
    step0_ms = 1000.0 * sections["optimizer_step[0]"]["total_s"] / n
    assert close(backward_ms, own_ms["backward"]), (sections["backward"], own_ms)
    assert close(step0_ms, own_ms["step0"]), (sections["optimizer_step[0]"], own_ms)
    # The own clock around manual_backward and opt.step() also holds Lightning's wrappers around them (the strategy's
    # backward, LightningOptimizer.step), which run before the first hook and after the last: the profiler leaves
    # that time in "gen". So gen is the own clock's outside time plus at most that wrapper time (an upper bound:
    # the backward's wrapper time of both nets), never less than the outside time.
    gen_ms = 1000.0 * gen["total_s"] / n
    wrappers_ms = max(0.0, own_ms["backward"] - backward_ms) + max(0.0, own_ms["step0"] - step0_ms)
    tolerance = max(0.15 * own_ms["gen_outside_step"], 0.1)
    assert own_ms["gen_outside_step"] - tolerance <= gen_ms <= own_ms["gen_outside_step"] + wrappers_ms + tolerance, (
        gen, own_ms, wrappers_ms)
    assert sections["training_step"]["min_ms"] >= 0.0
    top = sum(r["total_s"] for r in sections.values()
              if r["kind"] == "auto" or (r["kind"] == "user" and sections.get(r["parent"], {}).get("kind") == "auto"))
    assert top == pytest.approx(n * sp["iteration_ms"]["mean"] / 1000.0, rel=1e-6)


def test_one_optimizer_under_manual_optimization_has_no_breakdown(tmp_path):
    from helpers import ManualModel

    fit(tmp_path, [SectionProfiler(warmup_steps=0, print_reports=False)], model=ManualModel(), max_epochs=1,
        limit_val_batches=0, num_sanity_val_steps=0)
    sp = find_summary(tmp_path)["section_profiler"]
    sections = sp["sections"]
    assert sections["optimizer_step"]["count"] == sections["backward"]["count"] == sp["iterations"] == 8
    assert not [name for name in sections if name.startswith("optimizer_step[")]


def test_a_steppers_post_hook_is_removed_after_the_fit(tmp_path):
    trainer, model, _ = gan_fit(tmp_path, [SectionProfiler(warmup_steps=0, print_reports=False)])
    for opt in trainer.optimizers:
        assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_the_periodic_header_numbers_iterations_by_batches_with_the_optimizer_step_beside(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        gan_fit(tmp_path, [SectionProfiler(warmup_steps=0, report_every_n_steps=4)])
    headers = re.findall(r"=== SectionProfiler report \(([^)]*\)?)[^)]*\)", caplog.text)
    assert headers, caplog.text
    assert "SectionProfiler report (iteration 4 (optimizer step 8), last 4 iterations" in caplog.text
    assert "SectionProfiler report (iteration 8 (optimizer step 16), last 4 iterations" in caplog.text
    assert "(step 16" not in caplog.text and "(step 8" not in caplog.text


def test_slow_iterations_are_named_by_iteration_not_by_optimizer_step(tmp_path):
    batches = 16
    _, model, summary = gan_fit(tmp_path, [IterationTimer(warmup_steps=0), SectionProfiler(warmup_steps=0,
                                                                                           print_reports=False)],
                                spike_at=10, spike_s=0.15, batches=batches)
    tail = summary["iteration_timer"]["tail"]
    slowest = tail["slowest"][0]
    assert slowest["iteration"] == 11 and slowest["step"] == 22  # batch 10, the 11th iteration
    unexplained = [line for line in tail["insights"] if "no epoch start" in line]
    assert unexplained, tail["insights"]
    assert re.search(r"slowest at iterations? 11 \(optimizer step 22\)", unexplained[0]), unexplained[0]
    # the HTML report's table of slow iterations: by iteration, the optimizer step beside it
    out = tmp_path / "report.html"
    path = next(tmp_path.rglob("perf_summary.json"))
    assert cli_main(["report", str(path), "--html", str(out)]) == 0
    cells = _slow_table_rows(out.read_text())
    assert cells[0][0] == "iteration" and cells[1][0] == "11 (optimizer step 22)", cells[:2]
    numbers = [int(row[0].split()[0]) for row in cells[1:]]
    assert max(numbers) <= batches


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables, self.row, self.cell, self.after_slow = [], None, None, False
        self.heading = ""

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append((self.heading, []))
        elif tag == "tr":
            self.row = []
            self.tables[-1][1].append(self.row)
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.row is not None:
            self.row.append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data
        else:
            self.heading = data if data.strip() else self.heading


def _slow_table_rows(html):
    parser = _Tables()
    parser.feed(html)
    found = [rows for heading, rows in parser.tables if rows and rows[0] and rows[0][1:3] == ["ms", "causes"]]
    assert found, [rows[:1] for _, rows in parser.tables]
    return found[0]


def test_the_device_times_backward_and_each_step_where_the_host_does(tmp_path):
    """On a simulated device (helpers.SimulatedDevice: events that read the host clock), every iteration timed:
    backward and optimizer_step get a device time equal to their host time (within the tolerance: the two reads of
    a boundary are apart on a loaded machine)."""
    from helpers import SimulatedDevice

    sp = SectionProfiler(warmup_steps=0, print_reports=False, device_timing_every_n_iterations=1)
    _, _, summary = gan_fit(tmp_path, [sp, SimulatedDevice(sp)])
    sections = summary["section_profiler"]["sections"]
    for name in ("backward", "optimizer_step"):
        host, device = sections[name]["mean_ms"], sections[name]["device_mean_ms"]
        assert device is not None and close(device, host), (name, host, device)


def test_manual_is_refused_without_hooks_only_in_one_line_with_exit_2(capsys):
    from test_overhead_benchmark import load_benchmark

    overhead = load_benchmark()
    with pytest.raises(SystemExit) as exit_:
        overhead.main(["--manual"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and "--manual runs with --hooks-only or --per-hook on the CPU loop" in err[-1], err


@pytest.mark.slow
def test_the_benchmark_counts_the_step_hooks_under_manual_optimization_only(tmp_path):
    """``benchmarks/overhead.py --hooks-only SectionProfiler --manual``: a copy of the package whose torch step
    post-hook sleeps 2 ms reads both steps of each batch (two optimizers); without ``--manual`` (automatic
    optimization, where no step hook is installed) it reads none of it."""
    import os

    from test_overhead_benchmark import bench, copy_that_sleeps

    line = ("                self._ledger.optimizer_stepped(self._optimizer_rows.get(id(optimizer)), self._step_resume,"
            " t)\n")
    other = copy_that_sleeps(tmp_path, "callbacks/section_profiler/callback.py", line, 0.002)
    env = {**os.environ, "LIGHTNING_PERF_BENCH_SOURCE": str(other)}
    figures = {}
    for mode in ("--manual", None):
        proc = bench("--hooks-only", "SectionProfiler", "--steps", "20", *([mode] if mode else []), env=env)
        assert proc.returncode == 0, proc.stderr
        figures[mode] = float(re.search(r"^in hooks SectionProfiler: ([0-9.]+) µs/step", proc.stdout, re.M)[1])
    assert figures["--manual"] >= 3900.0 and figures[None] < 2000.0, figures
