"""benchmarks/overhead.py's --hooks-only and --against, run as a developer runs them (a subprocess)."""

import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
SCRIPT = os.path.join(ROOT, "benchmarks", "overhead.py")


def bench(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env)


def copy_of_package(tmp_path):
    other = tmp_path / "other checkout"  # a space in the path
    shutil.copytree(os.path.join(ROOT, "lightning_perf"), other / "lightning_perf")
    return other


def copy_that_sleeps(tmp_path, module, line, seconds, before=False):
    """A copy of the package whose ``module`` (a path under lightning_perf/) sleeps ``seconds`` right after ``line``
    (which it holds once), or right before it."""
    other = copy_of_package(tmp_path)
    path = other / "lightning_perf" / module
    source = path.read_text()
    assert source.count(line) == 1
    indent = line[:len(line) - len(line.lstrip())]
    sleep = f"{indent}__import__('time').sleep({seconds})\n"
    path.write_text(source.replace(line, sleep + line if before else line + sleep))
    return other


def test_bad_against_is_one_line_and_exit_2(tmp_path, capsys):
    """Through the script's main() in this process, as test_bad_paired_arguments_are_one_line_and_exit_2 does (which
    also runs one refusal as a subprocess): three subprocesses importing torch and Lightning took ~20 s."""
    overhead = load_benchmark()
    (tmp_path / "a file").write_text("")
    for argv, message in ((["--against", str(tmp_path)], "--against compares --hooks-only figures"),
                          (["--hooks-only", "IterationTimer", "--against", str(tmp_path)],
                           f"--against {str(tmp_path)!r}: no lightning_perf package"),
                          (["--hooks-only", "IterationTimer", "--against", str(tmp_path / "a file")],
                           "is not a directory: expected a checkout of lightning_perf")):
        with pytest.raises(SystemExit) as exit_:
            overhead.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and message in err[-1] and err[0].startswith("usage:"), (argv, err)


@pytest.mark.slow
def test_against_measures_the_other_checkout_in_runs_alternating_with_this_one(tmp_path):
    """A copy of the package whose IterationTimer sleeps 10 ms in a step hook: its figure holds the sleep, this
    checkout's does not, so each side ran its own code."""
    other = copy_that_sleeps(tmp_path, "callbacks/iteration_timer/callback.py", "        self._stepped = True\n", 0.010)
    proc = bench("--hooks-only", "IterationTimer", "--against", str(other), "--steps", "10", "--rounds", "1")
    assert proc.returncode == 0, proc.stderr
    rows = dict(re.findall(r"^  IterationTimer\s+(this checkout|--against)\s+median\s+([0-9.]+)", proc.stdout, re.M))
    assert set(rows) == {"this checkout", "--against"}, proc.stdout
    assert float(rows["--against"]) >= 10_000.0 and float(rows["this checkout"]) < 5_000.0
    assert "1 alternating round of" in proc.stdout and str(other) in proc.stdout


@pytest.mark.slow
def test_the_simulated_device_runs_the_cuda_path_and_goes_to_the_other_checkout_too(tmp_path):
    """``--simulated-device``: SectionProfiler records its device events on the CPU loop (the first 32 iterations after
    the warm-up and then one in 32: 100 steps record some, not one a switch), in this checkout's run and, through
    ``--against``, in the other's (a copy whose SectionProfiler sleeps 10 ms at each device mark, which only a device
    clock makes)."""
    proc = bench("--hooks-only", "SectionProfiler", "--simulated-device", "--steps", "100")
    assert proc.returncode == 0, proc.stderr
    records = int(re.search(r"^simulated device: (\d+) events recorded", proc.stdout, re.M).group(1))
    # 5 rounds of 100 steps, a warm-up of 5: 34 timed iterations (5 to 36, 37, 69), about 9 marks each (7 before the
    # fetch was data loading: its start and its return are two boundaries more)
    assert 5 * 34 * 5 <= records <= 5 * 34 * 11, proc.stdout
    mark = "        if current is not None and self.timed(fit + end_next):  # a timed piece ends here\n"
    other = copy_that_sleeps(tmp_path, "callbacks/section_profiler/device.py", mark, 0.010, before=True)
    proc = bench("--hooks-only", "SectionProfiler", "--simulated-device", "--against", str(other), "--steps", "10",
                 "--rounds", "1")
    assert proc.returncode == 0, proc.stderr
    assert "simulated device" in proc.stdout
    rows = dict(re.findall(r"^  SectionProfiler\s+(this checkout|--against)\s+median\s+([0-9.]+)", proc.stdout, re.M))
    # 10 steps, a warm-up of 5: the last 5 timed, a few device marks each
    assert float(rows["--against"]) >= 10_000.0 and float(rows["this checkout"]) < 5_000.0, proc.stdout
    # where it would measure nothing or stand in for a real GPU it is refused: in
    # test_bad_paired_arguments_are_one_line_and_exit_2, in this process


@pytest.mark.slow
def test_a_run_that_fails_in_the_other_checkout_stops_with_its_own_error(tmp_path):
    other = copy_of_package(tmp_path)
    init = other / "lightning_perf" / "__init__.py"
    init.write_text("raise ImportError('an older lightning_perf without what the benchmark needs')\n")
    proc = bench("--hooks-only", "QualityGate", "--against", str(other), "--steps", "10", "--rounds", "2")
    assert proc.returncode == 1
    assert f"with the lightning_perf of {other} (--against) failed" in proc.stderr
    assert "an older lightning_perf without what the benchmark needs" in proc.stderr


def load_script(name):
    """benchmarks/<name>.py as a module (in this process), with the measured package this checkout's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_benchmark():
    module = load_script("overhead")
    module.LOGGER["on"] = False
    return module


@pytest.mark.slow
def test_the_paired_ab_finds_a_known_cost_and_none_where_there_is_none(tmp_path, monkeypatch):
    """Real fits, the probes' clock virtual: every training step takes 1 ms plus a seeded jitter of up to 100 µs, and
    a callback adds 2 ms at each batch end. The paired A/B finds the 2 ms (its median and mean, with the truth inside
    their 95% CIs) and the bare step; a no-op callback, which moves the clock by nothing, comes out at zero."""
    import random

    from lightning.pytorch import Callback

    from helpers import VirtualClock

    overhead = load_benchmark()
    clock, jitter = VirtualClock(), random.Random(0)  # the probes' clock: it moves only where this test moves it
    monkeypatch.setitem(overhead.CLOCK, "fn", clock)
    original = overhead.Busy.training_step

    def training_step(self, batch, batch_idx):
        clock.advance(0.001 + 1e-4 * jitter.random())
        return original(self, batch, batch_idx)

    monkeypatch.setattr(overhead.Busy, "training_step", training_step)

    class Spin(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clock.advance(0.002)

    spun = overhead.run_paired([Spin()], steps=244, skip=20, block=7, root=str(tmp_path))
    assert spun["pairs"] == 16 and spun["steps"] == (16 * 6, 16 * 6)
    # the jitter (uniform over 100 µs, sd 28.9) leaves a difference of 96 steps' means an sd of ~4.2 µs, of their
    # medians ~7.2: 95% CIs ~16 and ~28 µs wide; neither degenerate nor unbounded
    for field in ("median", "mean"):
        low, high = spun[f"{field}_ci"]
        assert abs(spun[field] - 2000.0) < 30.0 and low <= 2000.0 <= high and 2.0 < high - low < 60.0, spun
    assert abs(spun["without_median"] - 1050.0) < 30.0, spun
    nothing = overhead.run_paired([overhead.Noop()], steps=244, skip=20, block=7, root=str(tmp_path))
    for field in ("median", "mean"):
        low, high = nothing[f"{field}_ci"]
        assert abs(nothing[field]) < 30.0 and low <= 0.0 <= high and 2.0 < high - low < 60.0, nothing


def test_the_three_monitors_have_a_timer_that_checks_its_limit_at_each_step_they_take_part_in(tmp_path, monkeypatch):
    """The paired A/B's "Lightning monitors (3)", the three the suite's 0.85x goal is set against: ThroughputMonitor,
    DeviceStatsMonitor and a Timer with a limit, which checks it at every batch end of a block with the monitors (a
    Timer with no limit would cost its dispatch only); "(2)" is the first two."""
    from lightning.pytorch.callbacks import DeviceStatsMonitor, ThroughputMonitor, Timer

    overhead = load_benchmark()
    two, three = overhead.lightning_monitors(timer=False), overhead.lightning_monitors(timer=True)
    assert [type(cb) for cb in two] == [ThroughputMonitor, DeviceStatsMonitor]
    assert [type(cb) for cb in three[:2]] == [ThroughputMonitor, DeviceStatsMonitor] and isinstance(three[2], Timer)
    checks = []
    original = Timer._check_time_remaining
    monkeypatch.setattr(Timer, "_check_time_remaining",
                        lambda self, trainer: checks.append(1) or original(self, trainer))
    monkeypatch.setitem(overhead.LOGGER, "on", True)  # (DeviceStatsMonitor refuses a Trainer without a logger)
    blocks = overhead.Blocks(three, block=7, skip=10)
    overhead.fit([overhead._BlocksHead(blocks), *three, blocks], steps=59, root=str(tmp_path))
    with_steps = 10 + sum(1 for step in range(11, 60) if (step - 11) // 7 % 2 == 1)  # (as the test below counts)
    assert len(checks) == 1 + with_steps, (len(checks), with_steps)  # (and once at the fit's start, a resume's check)


@pytest.mark.slow
def test_paired_blocks_take_the_callbacks_and_what_they_set_up_out_and_give_them_back(tmp_path):
    """PerfSuite in and out in blocks: in a step without it no global forward hook of EvalNoGradGuard is in torch's
    dict and the strategy has no SectionProfiler wrapper; IterationTimer counts exactly the iterations whose batch end
    it saw; at the end the suite is back for the end of training (its summary is written, the wrapper given back)."""
    import json

    import torch

    overhead = load_benchmark()
    seen, strategies = [], set()
    original = overhead.Busy.training_step

    def training_step(self, batch, batch_idx):
        blocks = self.trainer.callbacks[-1]
        hooks = len(torch.nn.modules.module._global_forward_pre_hooks)
        seen.append((blocks.on, hooks, "batch_to_device" in vars(self.trainer.strategy)))
        strategies.add(self.trainer.strategy)
        return original(self, batch, batch_idx)

    overhead.Busy.training_step = training_step
    try:
        suite = __import__("lightning_perf").PerfSuite()
        blocks = overhead.Blocks([suite], block=7, skip=10)
        trainer_out = tmp_path / "run"
        # the last step, 59, is in an off block: the suite comes back for the end of training
        overhead.fit([overhead._BlocksHead(blocks), suite, blocks], steps=59, root=str(trainer_out))
    finally:
        overhead.Busy.training_step = original
    assert {on for on, _, _ in seen} == {True, False} and len(seen) == 59 and seen[-1][0] is False
    assert all(hooks == 0 for _, hooks, _ in seen)  # the guard is disarmed in every step's forward
    assert all(wrapped == on for on, _, wrapped in seen[11:])  # past the warm-up: the wrapper only with the suite
    summary_path = next(trainer_out.rglob("perf_summary.json"))
    summary = json.loads(summary_path.read_text())
    with_steps = 10 + sum(1 for step in range(11, 60) if (step - 11) // 7 % 2 == 1)
    assert summary["status"] == "completed" and summary["iteration_timer"]["iterations"] == with_steps
    (strategy,) = strategies
    assert "batch_to_device" not in vars(strategy)  # given back at teardown


@pytest.mark.slow
def test_bad_paired_arguments_are_one_line_and_exit_2(capsys):
    """The script's argument checks, through its main() in this process (each as a subprocess, importing torch and
    Lightning, took ~6 s): argparse's usage and one line of error, exit 2, before anything runs; one run as a
    subprocess shows the same from the command line."""
    import logging

    import torch

    overhead = load_benchmark()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # (a pytest-xdist worker runs torch on one thread: the script's own 1 would not show)
    before = (torch.get_num_threads(), logging.getLogger("lightning.pytorch").level)
    cases = [(["--paired", "--block", "1"], "--block must be >= 2"),
             (["--paired", "--block", "10", "--paired-steps", "30"], "--paired-steps must be >= 4 * --block + 10"),
             (["--paired", "--ab-only"], "--paired runs the paired A/B alone"),
             (["--paired", "--spin-us", "40", "0"], "--spin-us must be > 0 and <= 100000 (µs), got [40.0, 0.0]"),
             (["--paired", "--spin-us", "40", "40.0"], "--spin-us names one value twice"),
             (["--per-hook", "PerfSuite", "--spin-us", "40"], "--spin-us adds configurations to the A/B"),
             (["--paired", "--configs", "PerfSuite", "--spin-us", "40"],
              "leaves out the spin configurations; add 'spin' to --configs"),
             (["--paired", "--spin-us", "40", "--spin-hooks", "0"],
              "--spin-hooks must be between 1 and 6 (the step hooks), got [0]"),
             (["--paired", "--spin-us", "40", "--spin-hooks", "1", "7"],
              "--spin-hooks must be between 1 and 6 (the step hooks), got [1, 7]"),
             (["--paired", "--spin-us", "40", "--spin-hooks", "6", "6"], "--spin-hooks names one value twice"),
             (["--paired", "--spin-hooks", "6"], "--spin-hooks spreads the spins of --spin-us: give --spin-us too"),
             (["--simulated-device"], "--simulated-device runs with --hooks-only or --per-hook"),
             (["--simulated-device", "--device", "cuda", "--per-hook", "SectionProfiler"],
              "--simulated-device stands in for a GPU on the CPU loop"),
             (["--hooks-only", "IterationTimer", "--event-us", "3"],
              "--event-us prices the simulated device's event records: give --simulated-device too"),
             (["--hooks-only", "IterationTimer", "--simulated-device", "--event-us", "-1"],
              "--event-us must be between 0 and 1000 µs, got -1.0"),
             (["--hooks-only", "IterationTimer", "--simulated-device", "--event-us", "nan"],
              "--event-us must be between 0 and 1000 µs, got nan")]
    try:
        for argv, message in cases:
            with pytest.raises(SystemExit) as exit_:
                overhead.main(argv)
            err = capsys.readouterr().err.strip().splitlines()
            assert exit_.value.code == 2 and message in err[-1] and err[0].startswith("usage:"), (argv, err)
        # refused before the script sets up its runs (torch's threads, Lightning's logging): nothing of it is left
        assert (torch.get_num_threads(), logging.getLogger("lightning.pytorch").level) == before
    finally:
        torch.set_num_threads(threads)
    proc = bench("--paired", "--block", "1")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith("--block must be >= 2 (a block's"
                                                                                  " first step is left out), got 1")


@pytest.mark.slow
def test_the_spin_calibration_spins_what_it_says_and_runs_in_the_paired_ab():
    """--spin-us: the calibration callback takes at least its µs in its hook (on perf_counter, which it spins on: a
    lower bound that a busy machine cannot break), and its configuration has a row in the paired A/B."""
    import time

    overhead = load_benchmark()
    spin = overhead.Spin(300.0)
    start = time.perf_counter()
    spin.on_train_batch_end(None, None, None, None, 0)
    assert time.perf_counter() - start >= 300e-6
    # spread over six hooks: 50 µs in each of the six step hooks, none in the others
    spread = overhead.Spin(300.0, hooks=6)
    for name in overhead.SPIN_HOOKS:
        start = time.perf_counter()
        getattr(spread, name)(None, None, None, None, 0)
        assert time.perf_counter() - start >= 50e-6, name
    assert all(name not in vars(spread) for name in ("on_validation_batch_end", "on_train_epoch_end"))
    assert sorted(vars(overhead.Spin(300.0, hooks=2))) == sorted(["us", "hooks", "each_s", "on_train_batch_end",
                                                                   "on_train_batch_start"])
    proc = bench("--paired", "--quick", "--configs", "spin", "--spin-us", "300", "--spin-hooks", "1", "6")
    assert proc.returncode == 0, proc.stderr
    rows = re.findall(r"^(\S.*?)\s{2,}[0-9.]+\s+-?[0-9.]+\s+\[", proc.stdout, re.M)
    assert rows == ["spin 300 µs (calibration)", "spin 300 µs over 6 hooks (calibration)"], proc.stdout


@pytest.mark.slow
def test_the_cache_pollution_probe_times_its_copy_and_refuses_bad_sizes():
    script = os.path.join(ROOT, "benchmarks", "cache_pollution.py")
    proc = subprocess.run([sys.executable, script, "--kb", "0", "256", "--steps", "80"], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = re.findall(r"^\s+(0|256)\s+([0-9.]+)\s+(-?[0-9.]+)\s+\[", proc.stdout, re.M)
    assert [kb for kb, _, _ in rows] == ["0", "256"], proc.stdout
    assert float(rows[1][1]) > float(rows[0][1])  # copying 256 KB takes longer in the hook than copying nothing
    proc = subprocess.run([sys.executable, script, "--kb", "-1"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--kb must be >= 0, got [-1]" in proc.stderr


@pytest.mark.slow
def test_own_steps_puts_a_known_cost_on_the_steps_that_paid_it(tmp_path):
    """benchmarks/own_steps.py: a suite callback that spins 2 ms at every 10th batch end: those steps, and only
    those, are over 5x the median, each with the spin's time on top of the others' own time, and what the steps over
    5x carry of the mean is their time; where a step falls is named as SectionProfiler and IterationTimer count
    their windows. Timed on a clock the test moves (helpers.TickingClock, passed as own_time_per_step's ``clock``):
    1 µs a timed call (each step hook and SectionProfiler's close), and the spin's 2 ms. On wall time a busy machine
    preempted hooks into steps over 5x the median; here every step's time is known exactly."""
    import lightning_perf
    from helpers import TickingClock
    from lightning_perf.callbacks.core.base import PerfCallback

    own_steps = load_script("own_steps")
    own_steps.overhead.LOGGER["on"] = False
    tick, spin_s = 1e-6, 0.002
    clock = TickingClock(tick)

    class Spin(PerfCallback):
        section_name = "spin"

        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.batches % 10 == 9:
                clock.advance(spin_s)
            self.batches += 1

        def _summary_section(self):
            return {}

    spin = Spin()
    suite = lightning_perf.PerfSuite([lightning_perf.IterationTimer(),
                                      lightning_perf.SectionProfiler(print_reports=False, report_every_n_steps=1000),
                                      lightning_perf.EvalNoGradGuard(), spin])
    per_step = own_steps.own_time_per_step(suite, 120, str(tmp_path), clock=clock)
    assert len(per_step) == 120 and spin.batches == 120
    spun = set(range(29, 120, 10))
    # a step: its step hooks, SectionProfiler's fetch mark (where the previous iteration closes; a report made inside
    # it is not timed twice) and its transfer mark, one tick each, and the spin where it ran
    calls = len(own_steps.STEP_HOOKS) + 2
    expected = [tick * calls + spin_s * (i % 10 == 9) for i in range(120)]
    assert per_step == pytest.approx(expected, abs=1e-9)
    d = own_steps.describe(per_step, every=1000)
    assert d["median"] == pytest.approx(1e6 * calls * tick)
    big = {i for i in range(20, 120) if 1e6 * per_step[i] > 5 * d["median"]}
    assert big == spun, (sorted(big), d)
    spun_us = 1e6 * (calls * tick + spin_s)
    assert d["big_share_us"] == pytest.approx(len(spun) * spun_us / 100)
    assert d["mean"] == pytest.approx((len(spun) * spun_us + (100 - len(spun)) * 1e6 * calls * tick) / 100)
    assert d["by"] == {"other": (len(spun), pytest.approx(spun_us))}  # no report in 120 steps of 1000
    assert [own_steps.place(i, 50) for i in (50, 49, 51)] == ["report step", "step before", "other"]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "own_steps.py"), "--steps", "5"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--steps must be >= 100" in proc.stderr and "got 5" in proc.stderr


def test_on_cuda_the_probes_time_steps_by_events_and_never_wait_for_the_device(monkeypatch):
    """On CUDA the probes record one event a mark and read the distances after the run: a synchronize at each mark
    (the clock of 2026-11-23) kept the host from running ahead, so every hook after it cost wall time on a GPU-bound
    step. A simulated event, reached by the device at a virtual time, gives the steps' times exactly, in StepClock
    and in the paired A/B's blocks; any wait for the device before the marks are read fails."""
    import torch

    from helpers import VirtualClock

    overhead = load_benchmark()
    device, reading = VirtualClock(), [False]  # when the device reaches each event; whether the run is over

    class Event:
        def record(self, stream=None):
            assert stream == "the stream"  # the probes' stream, asked for once
            self.t = device()

        def synchronize(self):
            assert reading[0], "a wait for the device at a mark"

        def elapsed_time(self, other):
            assert reading[0], "a read at a mark"
            return 1000.0 * (other.t - self.t)

    asked = []
    monkeypatch.setitem(overhead.DEVICE, "kind", "cuda")
    monkeypatch.setitem(overhead.EVENT, "factory", Event)
    monkeypatch.setitem(overhead.EVENT, "stream", lambda: asked.append(1) or "the stream")
    monkeypatch.setattr(overhead, "_STREAM", [])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("a synchronize at a mark"))
    probe = overhead.StepClock(skip=2)
    for ms in (5, 5, 1, 1, 7):  # the first step is skipped; marks at 10, 11, 12 and 19 ms
        device.advance(ms / 1000)
        probe.on_train_batch_end(None, None, None, None, 0)

    # the paired A/B's probe, driven as Lightning drives it: steps of 1 ms without the callbacks, 3 ms with them
    blocks = overhead.Blocks([], block=2, skip=1)
    trainer = SimpleNamespace(callbacks=[], max_steps=21, strategy=SimpleNamespace(), profiler=SimpleNamespace())
    blocks.setup(trainer, None, "fit")
    for _ in range(trainer.max_steps):
        blocks.on_train_batch_start(trainer, None, None, 0)
        device.advance(0.003 if blocks.on else 0.001)
        blocks.on_train_batch_end(trainer, None, None, None, 0)
    assert len(asked) == 1 and all(isinstance(mark, Event) for mark in probe.marks)
    reading[0] = True
    times = probe.us_per_step()
    assert times.mean == pytest.approx(3000.0) and times.median == pytest.approx(1000.0)
    paired = overhead.paired_overhead(blocks)
    assert paired["mean"] == pytest.approx(2000.0) and paired["median"] == pytest.approx(2000.0)
    assert paired["without_median"] == pytest.approx(1000.0) and paired["pairs"] == 5


def test_the_probes_host_clock_takes_any_number():
    overhead = load_benchmark()
    assert overhead.seconds_between(3, 5) == 2 and overhead.seconds_between(1.5, 2.0) == 0.5


def test_a_priced_simulated_event_spins_its_price_at_each_record(monkeypatch):
    """``--event-us``: each record of the simulated device's events costs the host what a real one would (the
    records that go, counted, and the time they take, on the host clock; the event reads its time before the
    spin, so the intervals between events are the host's own)."""
    import time as time_module

    overhead = load_benchmark()
    monkeypatch.setattr(overhead.SimulatedEvent, "price_s", 0.002)
    monkeypatch.setattr(overhead.SimulatedEvent, "records", 0)
    first, second = overhead.SimulatedEvent(), overhead.SimulatedEvent()
    start = time_module.perf_counter()
    first.record()
    second.record()
    spent = time_module.perf_counter() - start
    assert overhead.SimulatedEvent.records == 2 and spent >= 0.004
    assert first.elapsed_time(second) >= 2.0  # ms: the first record's spin lies between the two
    assert first.t - start <= spent - 0.004  # its time read before its spin (both spins came after it)


def test_per_hook_times_the_section_profilers_marks_as_its_hooks(tmp_path):
    """``--per-hook SectionProfiler`` times its fetch marks, transfer wrapper and report too: a copy whose fetch return
    sleeps 2 ms reads it on that line alone, and each line's µs a step is its calls' mean times their count over the
    steps."""
    other = copy_that_sleeps(tmp_path, "callbacks/section_profiler/callback.py", "        self._fetch_marks.after()\n",
                             0.002)
    proc = bench("--per-hook", "SectionProfiler", "--steps", "60",
                 env={**os.environ, "LIGHTNING_PERF_BENCH_SOURCE": str(other)})
    assert proc.returncode == 0, proc.stderr
    rows = {name: (int(calls), float(median), float(mean), float(per_step)) for name, calls, median, mean, per_step
            in re.findall(r"^  (\S+)\s+(\d+) calls\s+median\s+([-0-9.]+)\s+mean\s+([-0-9.]+)\s+µs a step\s+([-0-9.]+)",
                          proc.stdout, re.M)}
    assert {"on_train_batch_end", "SectionProfiler._fetch_started", "SectionProfiler._batch_transfer",
            "SectionProfiler._report_window"} <= set(rows), proc.stdout
    calls, median, mean, per_step = rows["SectionProfiler._fetch_stopped"]
    assert calls >= 60 and median >= 1990.0 and per_step == pytest.approx(mean * calls / 60, rel=0.01, abs=0.02)
    assert all(row[1] < 2000.0 for name, row in rows.items() if name not in ("SectionProfiler._fetch_stopped",
                                                                              "SectionProfiler._report_window"))
