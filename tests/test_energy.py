"""The device's energy per phase (VRAMMonitor, on the memory sampler's thread) and per unit of work (joined with
IterationTimer's counts), and its change in compare and report; only the hardware (NVML, a CUDA allocator) is
simulated, and every figure is checked against a closed form of what the simulated board reported."""

import json
import subprocess
import sys
import threading
import time

import pynvml
import pytest
from lightning.pytorch import Callback

import lightning_perf.measure.device.energy as energy_module
import lightning_perf.measure.memory.readers as memory_module
from helpers import TinyModel, find_summary, fit, hold_until_sampled
from lightning_perf import IterationTimer, VRAMMonitor
from lightning_perf.measure.device.energy import COUNTER, POWER_X_TIME, EnergyMeter
from test_device_activity import ActiveNvml

BATCH = 8  # make_loader's batch size: 64 training samples (8 batches) and 32 validation samples (4 batches) an epoch


class EnergyNvml(ActiveNvml):
    """A board with an energy counter (mJ) that the test (or the model's steps) advances; ``counter=False``: a board
    without one (NotSupported), whose power reading is then integrated."""

    def __init__(self, counter=True, **kwargs):
        super().__init__(**kwargs)
        self.mj = 10_000_000  # counted since the driver loaded: any start
        self.counter = counter
        self.energy_callers = set()

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy_callers.add(threading.current_thread().name)
        if not self.counter:
            raise pynvml.NVMLError_NotSupported()
        return self.mj


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


# -- the meter, tick by tick --------------------------------------------------------------------------------------
def test_counter_rising_at_a_known_power_gives_its_joules_per_phase():
    nvml, clock = EnergyNvml(), FakeClock()
    meter = EnergyMeter(nvml, "handle", clock=clock)
    meter.tick(None)  # the sanity check: read, not credited
    for phase, watts, ticks in (("train", 300.0, 40), ("validation", 120.0, 10), ("train", 280.0, 20)):
        for _ in range(ticks):  # every 50 ms, the counter rises watts x 0.05 s
            clock.t += 0.05
            nvml.mj += watts * 0.05 * 1000
            meter.tick(phase)
    phases = meter.phases()
    assert meter.source == COUNTER and meter.readings == 71
    assert phases["train"]["energy_j"] == pytest.approx(300 * 2.0 + 280 * 1.0)
    assert phases["train"]["seconds"] == pytest.approx(3.0)
    assert phases["train"]["mean_power_w"] == pytest.approx((600 + 280) / 3.0)
    # 0.5 s of validation: under the 1 s span the board's 20-100 ms updates allow, so no figure, and why
    assert phases["validation"]["energy_j"] is None and phases["validation"]["seconds"] == pytest.approx(0.5)
    assert "under the 1 s" in phases["validation"]["unavailable"]["energy_j"]


def test_without_a_counter_the_power_is_integrated_over_time():
    nvml, clock = EnergyNvml(counter=False), FakeClock()
    meter = EnergyMeter(nvml, "handle", clock=clock)
    nvml.power_mw = 100_000
    meter.tick("train")
    for i in range(1, 41):  # power rising linearly from 100 W to 300 W over 2 s: the trapezoid rule is exact
        clock.t += 0.05
        nvml.power_mw = 100_000 + 5_000 * i
        meter.tick("train")
    train = meter.phases()["train"]
    assert meter.source == POWER_X_TIME and "NVMLError_NotSupported" in meter.counter_reason
    assert train["energy_j"] == pytest.approx(0.5 * (100 + 300) * 2.0)
    assert train["mean_power_w"] == pytest.approx(200.0)


def test_a_reading_that_fails_midway_or_a_counter_that_goes_back_leaves_no_short_total():
    nvml, clock = EnergyNvml(), FakeClock()
    meter = EnergyMeter(nvml, "handle", clock=clock, min_span_s=0)
    for _ in range(3):
        clock.t += 1
        nvml.mj += 1000
        meter.tick("train")
    nvml.mj -= 5000
    meter.tick("train")
    assert meter.phases()["train"]["energy_j"] is None
    assert "went back" in meter.phases()["train"]["unavailable"]["energy_j"]
    nvml = EnergyNvml(counter=False, fail={"nvmlDeviceGetPowerUsage": pynvml.NVMLError_Unknown()})
    meter = EnergyMeter(nvml, "handle", clock=clock)
    meter.tick("train")
    assert meter.error.startswith("no energy counter") and "NVMLError_Unknown" in meter.error
    assert meter.phases() == {}


# -- in a real fit ------------------------------------------------------------------------------------------------
class Metered(TinyModel):
    """Each training batch draws ``train_mj`` from the simulated board, each validation batch ``val_mj``."""

    def __init__(self, nvml, train_mj=500, val_mj=200):
        super().__init__()
        self.board, self.train_mj, self.val_mj = nvml, train_mj, val_mj

    def training_step(self, batch, batch_idx):
        self.board.mj += self.train_mj
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.board.mj += self.val_mj
        return super().validation_step(batch, batch_idx)


class Ticker(Callback):
    """One tick of the sampler's thread after every batch, as the thread does on its own cadence: a deterministic
    trace in a real fit (VRAMMonitor's own thread sleeps 60 s between ticks)."""

    def __init__(self, monitor):
        self.monitor = monitor

    def _tick(self):
        sampler = self.monitor._sampler
        sampler.on_tick(sampler.phase)

    def on_train_batch_end(self, *args):
        self._tick()

    def on_validation_batch_end(self, *args, **kwargs):
        self._tick()


def metered_fit(tmp_path, monkeypatch, train_mj=500, timer=True, **overrides):
    nvml = EnergyNvml()
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: nvml)
    monkeypatch.setattr(energy_module, "MIN_SPAN_S", 0.0)  # the span rule has its own test: this fit takes < 1 s
    monitor = VRAMMonitor(nvml_interval_s=60)
    callbacks = [Ticker(monitor), monitor] + ([IterationTimer(warmup_steps=1)] if timer else [])
    fit(tmp_path, callbacks, model=Metered(nvml, train_mj=train_mj), **overrides)
    return find_summary(tmp_path), nvml


@pytest.mark.parametrize("accumulate", [1, 2])
def test_joules_per_iteration_and_per_sample_equal_the_closed_form(tmp_path, simulated_gpu, monkeypatch, accumulate):
    summary, _ = metered_fit(tmp_path, monkeypatch, accumulate_grad_batches=accumulate)
    energy = summary["vram"]["activity"]["energy"]
    assert energy["source"] == COUNTER and energy["unavailable"] == {}
    train, val = energy["phases"]["train"], energy["phases"]["validation"]
    batches, iterations, samples = 16, 16 // accumulate, 16 * BATCH  # 2 epochs of 8 batches of 8
    assert energy["train_batches"] == batches
    assert train["energy_j"] == pytest.approx(0.5 * batches)
    assert (train["iterations"], train["samples"]) == (iterations, samples)
    assert train["j_per_iteration"] == pytest.approx(0.5 * accumulate)
    assert train["j_per_sample"] == pytest.approx(0.5 / BATCH)
    assert train["samples_per_j"] == pytest.approx(BATCH / 0.5)
    assert val["energy_j"] == pytest.approx(0.2 * 8)  # 2 validations of 4 batches; the sanity check not counted
    assert val.get("j_per_sample") is None  # per-work figures are the training phase's


def test_without_iteration_timer_the_energy_stands_and_per_work_says_why(tmp_path, simulated_gpu, monkeypatch):
    summary, _ = metered_fit(tmp_path, monkeypatch, timer=False, max_epochs=1)
    train = summary["vram"]["activity"]["energy"]["phases"]["train"]
    assert train["energy_j"] == pytest.approx(0.5 * 8)
    assert train["j_per_sample"] is None and "add it to the run" in train["unavailable"]["j_per_iteration"]


def test_the_sampler_thread_reads_the_energy_and_the_training_thread_never_does(tmp_path, simulated_gpu, monkeypatch):
    nvml = EnergyNvml()

    class Steady(TinyModel):
        def training_step(self, batch, batch_idx):
            time.sleep(0.02)
            if batch_idx == 0:
                assert hold_until_sampled(self.trainer), "the memory sampler thread took no reading in 10 s"
            return super().training_step(batch, batch_idx)

    monkeypatch.setattr(memory_module, "load_pynvml", lambda: nvml)
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01), IterationTimer()], model=Steady(), max_epochs=1)
    assert nvml.energy_callers == {"lightning_perf-memory-sampler"}
    energy = find_summary(tmp_path)["vram"]["activity"]["energy"]
    assert energy["source"] == COUNTER and energy["readings"] > 0


def test_nvml_absent_or_a_cpu_run_gives_null_energy_with_the_reason(tmp_path, simulated_gpu):
    # this machine has the pynvml package but no NVML library: the real LibraryNotFound path
    fit(tmp_path / "gpu", [VRAMMonitor(nvml_interval_s=0.01), IterationTimer()], max_epochs=1)
    activity = find_summary(tmp_path / "gpu")["vram"]["activity"]
    assert activity["energy"] is None and "NVMLError_LibraryNotFound" in activity["unavailable"]["energy"]


def test_a_cpu_run_says_nvml_applies_to_cuda(tmp_path):
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], max_epochs=1)
    activity = find_summary(tmp_path)["vram"]["activity"]
    assert activity["energy"] is None
    assert activity["unavailable"]["energy"] == "NVML applies to CUDA devices, this run is on cpu"


def test_compare_and_report_show_the_change_in_energy_per_sample(tmp_path, simulated_gpu, monkeypatch):
    base, _ = metered_fit(tmp_path / "base", monkeypatch, max_epochs=1)
    cand, _ = metered_fit(tmp_path / "cand", monkeypatch, train_mj=250, max_epochs=1)
    paths = []
    for name, summary in (("base", base), ("cand", cand)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(summary))
    cli = [sys.executable, "-m", "lightning_perf.cli"]
    text = subprocess.run(cli + ["compare", *map(str, paths)], capture_output=True, text=True, check=True).stdout
    # 0.5 J a batch of 8 -> 0.25 J: J/sample halves, samples/J doubles
    assert "J/sample: 0.0625 -> 0.0312 (-50.0%)" in text, text
    assert "samples/J: 16 -> 32 (+100.0%)" in text, text
    data = json.loads(subprocess.run(cli + ["compare", *map(str, paths), "--format", "json"], capture_output=True,
                                     text=True, check=True).stdout)
    assert data["energy"]["j_per_sample"] == {"base": 0.0625, "candidate": 0.03125, "delta_pct": -50.0}
    table = subprocess.run(cli + ["report", *map(str, paths)], capture_output=True, text=True, check=True).stdout
    header = [c.strip() for c in table.splitlines()[0].split("|")]
    row = [c.strip() for c in table.splitlines()[3].split("|")]
    assert row[header.index("J/sample")] == "0.0312 (-50.0%)", table
