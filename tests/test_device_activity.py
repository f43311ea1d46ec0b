"""VRAMMonitor's device activity: NVML utilisation, power, clock, temperature and host CPU use, read on the memory
sampler's thread; only the hardware (NVML, a CUDA allocator) is simulated."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import psutil
import pynvml
import pytest
import torch
from lightning.pytorch import Callback

import lightning_perf.measure.memory.readers as memory_module
from helpers import TinyModel, find_summary, fit, hold_until_sampled, make_loader, read_scalars
from lightning_perf import VRAMMonitor
from lightning_perf.measure.device.activity import (
    GPU_READINGS,
    HOST_READINGS,
    P5_RELATIVE_ACCURACY,
    ActivitySampler,
    HostActivityReader,
    NvmlActivityReader,
)
from test_vram_monitor import FakeNvml

GPU_KEYS = ("gpu/util_pct", "gpu/mem_util_pct", "gpu/power_w", "gpu/sm_clock_mhz", "gpu/temperature_c")


class ActiveNvml(FakeNvml):
    """A working driver that also answers the activity queries: the test sets what the board reports, and any query
    can raise a real NVMLError type."""

    def __init__(self, util=70, mem_util=30, power_mw=250_000, sm_mhz=1410, temp_c=61, fail=None, reasons=0):
        super().__init__()
        self.util, self.mem_util, self.power_mw, self.sm_mhz, self.temp_c = util, mem_util, power_mw, sm_mhz, temp_c
        self.reasons = reasons  # NVML's clock event (throttle) reason bits
        self.fail = fail or {}  # query name -> exception
        self.activity_calls = 0
        self.callers = set()  # the threads that queried activity

    def _query(self, name):
        self.activity_calls += 1
        self.callers.add(threading.current_thread().name)
        if name in self.fail:
            raise self.fail[name]

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._query("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=self.util, memory=self.mem_util)

    def nvmlDeviceGetPowerUsage(self, handle):
        self._query("nvmlDeviceGetPowerUsage")
        return self.power_mw

    def nvmlDeviceGetClockInfo(self, handle, clock):
        self._query("nvmlDeviceGetClockInfo")
        assert clock == pynvml.NVML_CLOCK_SM
        return self.sm_mhz

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._query("nvmlDeviceGetTemperature")
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self.temp_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        self._query("nvmlDeviceGetCurrentClocksEventReasons")
        return self.reasons


def p5(values):
    return float(np.percentile(values, 5))  # numpy's default (linear) rule, the one the histogram follows


def series(n, seed):
    """A utilisation trace with idle stretches (zeros) and bursts, as integers like NVML gives."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 101, size=n)
    values[rng.random(n) < 0.15] = 0
    return [int(v) for v in values]


# -- the sampler, driven tick by tick ---------------------------------------------------------------------------------
def test_mean_and_p5_per_phase_equal_the_closed_form_of_the_series_read():
    nvml = ActiveNvml()
    sampler = ActivitySampler([NvmlActivityReader(nvml, "handle")])
    train, val = series(300, 1), series(60, 2)
    schedule = [("train", v) for v in train[:150]] + [("validation", v) for v in val] + \
               [("train", v) for v in train[150:]]
    powers = {"train": [], "validation": []}
    for i, (phase, util) in enumerate(schedule):
        nvml.util, nvml.mem_util, nvml.power_mw = util, util // 2, 100_000 + 1000 * (i % 7)
        powers[phase].append(nvml.power_mw / 1000.0)
        sampler.tick(phase)
    sampler.tick(None)  # between phases (sanity check): read, not kept
    for phase, trace in (("train", train), ("validation", val)):
        stats = sampler.phase_stats(phase)
        assert stats["gpu_util_pct"]["samples"] == len(trace)
        assert stats["gpu_util_pct"]["mean"] == pytest.approx(np.mean(trace), rel=1e-12)
        assert stats["gpu_util_pct"]["p5"] == pytest.approx(p5(trace), rel=P5_RELATIVE_ACCURACY)
        assert stats["mem_util_pct"]["mean"] == pytest.approx(np.mean([v // 2 for v in trace]), rel=1e-12)
        assert stats["power_w"]["mean"] == pytest.approx(np.mean(powers[phase]), rel=1e-12)  # mW -> W
        assert stats["power_w"]["p5"] == pytest.approx(p5(powers[phase]), rel=P5_RELATIVE_ACCURACY)
        assert stats["sm_clock_mhz"] == {"mean": 1410.0, "p5": 1410.0, "samples": len(trace)}
        assert stats["temperature_c"]["mean"] == 61.0
    assert sampler.ticks == len(schedule) + 1
    assert sampler.phase_stats("train")["gpu_util_pct"]["p5"] < sampler.phase_stats("train")["gpu_util_pct"]["mean"]


def test_windows_hold_the_mean_since_the_last_take_per_phase():
    nvml = ActiveNvml()
    sampler = ActivitySampler([NvmlActivityReader(nvml, "handle")])
    for util in (10, 20, 60):
        nvml.util = util
        sampler.tick("train")
    nvml.util = 90
    sampler.tick("validation")  # a validation in between does not enter the training window
    assert sampler.take_window("train")["gpu_util_pct"] == pytest.approx(30.0)
    assert sampler.take_window("train") == {}  # nothing since: no figure rather than a stale one
    nvml.util = 50
    sampler.tick("train")
    assert sampler.take_window("train")["gpu_util_pct"] == 50.0
    assert sampler.take_window("validation")["gpu_util_pct"] == 90.0


def test_memory_stays_bounded_over_a_long_run():
    nvml = ActiveNvml()
    sampler = ActivitySampler([NvmlActivityReader(nvml, "handle")])
    rng = np.random.default_rng(0)
    for util in rng.integers(0, 101, size=20_000):  # 20,000 ticks: 17 minutes at the default 20 a second
        nvml.util = int(util)
        sampler.tick("train")
    hist = sampler._stats["train"]["gpu_util_pct"]
    assert hist.count == 20_000 and len(hist.bins) <= 100  # one bucket per distinct value at most, not per tick
    assert len(sampler._windows["train"]) == len(GPU_READINGS)  # one (sum, count) per reading


def test_a_query_that_is_not_supported_is_dropped_and_the_others_go_on():
    nvml = ActiveNvml(fail={"nvmlDeviceGetPowerUsage": pynvml.NVMLError_NotSupported()})
    reader = NvmlActivityReader(nvml, "handle")
    sampler = ActivitySampler([reader])
    for _ in range(5):
        sampler.tick("train")
    stats = sampler.phase_stats("train")
    assert stats["power_w"] is None
    assert "nvmlDeviceGetPowerUsage" in sampler.unavailable["power_w"]
    assert "NVMLError_NotSupported" in sampler.unavailable["power_w"]
    assert stats["gpu_util_pct"]["mean"] == 70.0 and stats["temperature_c"]["samples"] == 5
    assert set(sampler.unavailable) == {"power_w"}
    assert nvml.activity_calls == 5 + 4 * 4  # the failed query is asked once, not every tick


# -- host CPU -------------------------------------------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def fake_psutil(own, machine, cores=16):
    """psutil's counters as the kernel would give them: ``own`` and ``machine`` are lists the test appends to."""
    process = SimpleNamespace(cpu_times=lambda: own[-1])
    return SimpleNamespace(Process=lambda: process, cpu_times=lambda: machine[-1],
                           cpu_count=lambda logical=True: cores)


class Times(tuple):
    """A psutil scputimes: a tuple of all fields, with names."""

    def __new__(cls, **fields):
        obj = super().__new__(cls, fields.values())
        obj.__dict__.update(fields)
        return obj


def test_host_figures_from_the_counters_in_closed_form():
    clock = FakeClock()
    own = [SimpleNamespace(user=1.0, system=0.5)]
    machine = [Times(user=100.0, nice=0.0, system=20.0, idle=880.0, iowait=0.0, guest=0.0, guest_nice=0.0)]
    reader = HostActivityReader(min_span_s=0.25, clock=clock, psutil_module=fake_psutil(own, machine))
    assert reader.logical_cores == 16
    clock.t += 0.1
    assert reader.read() == {}  # within the shortest span: nothing yet
    clock.t += 0.9  # 1 s in all: this process used 1.5 s of CPU (1.5 cores); 16 cores had 16 s, 4 of them busy
    own.append(SimpleNamespace(user=2.0, system=1.0))
    machine.append(Times(user=103.0, nice=0.0, system=21.0, idle=892.0, iowait=0.0, guest=0.0, guest_nice=0.0))
    values = reader.read()
    assert values["process_cpu_cores"] == pytest.approx(1.5)
    assert values["host_cpu_pct"] == pytest.approx(100.0 * 4.0 / 16.0)
    clock.t += 0.5  # iowait is idle time, guest time is already in user time
    own.append(SimpleNamespace(user=2.0, system=1.0))
    machine.append(Times(user=105.0, nice=0.0, system=21.0, idle=896.0, iowait=2.0, guest=1.0, guest_nice=0.0))
    values = reader.read()
    assert values["process_cpu_cores"] == 0.0
    assert values["host_cpu_pct"] == pytest.approx(100.0 * 2.0 / 8.0)


def test_host_figures_agree_with_psutils_own_reading_of_a_busy_thread():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    reader = HostActivityReader(min_span_s=0.0)
    process = psutil.Process()
    process.cpu_percent(None), psutil.cpu_percent(None)  # psutil's own baseline, taken with ours
    busy = threading.Thread(target=spin)
    busy.start()
    try:
        time.sleep(1.0)
    finally:
        ours = reader.read()
        theirs_process, theirs_machine = process.cpu_percent(None) / 100.0, psutil.cpu_percent(None)
        stop.set()
        busy.join()
    # one spinning thread keeps at most one core busy; on a shared machine it may get less: both see the same
    assert ours["process_cpu_cores"] == pytest.approx(theirs_process, abs=0.1)
    assert 0.1 < ours["process_cpu_cores"] < 1.3
    assert ours["host_cpu_pct"] == pytest.approx(theirs_machine, abs=10)
    # the machine's busy cores include this process's
    assert ours["host_cpu_pct"] * psutil.cpu_count() / 100.0 >= ours["process_cpu_cores"] - 0.1


# -- in a real fit ----------------------------------------------------------------------------------------------------
class Ticker(Callback):
    """Takes one sample at every batch end, as the sampler's thread does on its own cadence, with the board
    reporting the next value of the phase's series: a deterministic trace in a real fit."""

    def __init__(self, monitor, nvml, traces):
        self.monitor, self.nvml, self.traces = monitor, nvml, traces
        self.read = {"train": [], "validation": []}

    def _tick(self, phase):
        sampler = self.monitor._sampler
        if sampler.phase != phase:  # the sanity check: between phases
            sampler.on_tick(sampler.phase)
            return
        trace = self.traces[phase]
        self.nvml.util = trace[len(self.read[phase]) % len(trace)]
        self.read[phase].append(self.nvml.util)
        sampler.on_tick(sampler.phase)  # what the thread does once

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._tick("train")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._tick("validation")


def test_a_fit_logs_window_means_and_writes_phase_figures_of_the_trace(tmp_path, simulated_gpu, monkeypatch):
    nvml = ActiveNvml()
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: nvml)
    monitor = VRAMMonitor(nvml_interval_s=60)  # the thread never ticks within this fit: the Ticker does
    ticker = Ticker(monitor, nvml, {"train": series(16, 3), "validation": series(8, 4)})
    fit(tmp_path, [ticker, monitor], max_epochs=2, log_every_n_steps=2)  # 8 batches an epoch, 4 in validation
    train, val = ticker.read["train"], ticker.read["validation"]
    assert len(train) == 16 and len(val) == 8
    scalars = read_scalars(tmp_path)
    # every 2 steps, the mean of the two ticks since the last log
    assert scalars["gpu/util_pct"] == [(s, pytest.approx(np.mean(train[s - 2:s]), rel=1e-6)) for s in range(2, 17, 2)]
    # each validation's mean at its end: after epoch 1 (step 8) and epoch 2 (step 16)
    assert scalars["gpu/eval_util_pct"] == [(8, pytest.approx(np.mean(val[:4]), rel=1e-6)),
                                            (16, pytest.approx(np.mean(val[4:]), rel=1e-6))]
    for key in GPU_KEYS[1:]:
        assert key in scalars and key.replace("gpu/", "gpu/eval_") in scalars, key
    assert {v for _, v in scalars["gpu/power_w"]} == {250.0}
    activity = find_summary(tmp_path)["vram"]["activity"]
    assert activity["source"] == "NVML + psutil + schedstat" and activity["unavailable"] == {}
    for phase, trace in (("train", train), ("validation", val)):
        util = activity["phases"][phase]["gpu_util_pct"]
        assert util["samples"] == len(trace)
        assert util["mean"] == pytest.approx(np.mean(trace), rel=1e-12)
        assert util["p5"] == pytest.approx(p5(trace), rel=P5_RELATIVE_ACCURACY)
        assert activity["phases"][phase]["power_w"]["mean"] == 250.0
    assert nvml.callers == {threading.current_thread().name}  # only the Ticker's ticks: nothing else queried


def test_the_sampler_thread_reads_activity_and_the_training_thread_never_does(tmp_path, simulated_gpu, monkeypatch):
    nvml = ActiveNvml(util=83, mem_util=41, power_mw=312_500, sm_mhz=1755, temp_c=58)

    class Steady(TinyModel):
        def training_step(self, batch, batch_idx):
            time.sleep(0.02)  # long enough for the 10 ms sampler to tick within most log windows
            if batch_idx == 0:  # and at least once in training, however starved its thread is on a busy machine
                assert hold_until_sampled(self.trainer), "the memory sampler thread took no reading in 10 s"
            return super().training_step(batch, batch_idx)

    monkeypatch.setattr(memory_module, "load_pynvml", lambda: nvml)
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], model=Steady(), max_epochs=1, log_every_n_steps=2)
    assert nvml.callers == {"lightning_perf-memory-sampler"}
    activity = find_summary(tmp_path)["vram"]["activity"]
    expected = {"gpu_util_pct": 83.0, "mem_util_pct": 41.0, "power_w": 312.5, "sm_clock_mhz": 1755.0,
                "temperature_c": 58.0}
    for name, value in expected.items():
        reading = activity["phases"]["train"][name]
        assert reading["mean"] == value and reading["p5"] == value and reading["samples"] > 0, name
    scalars = read_scalars(tmp_path)
    for key, value in zip(GPU_KEYS, expected.values()):
        assert scalars[key] and all(v == pytest.approx(value) for _, v in scalars[key]), key
    assert activity["host_logical_cores"] == psutil.cpu_count()
    own = activity["phases"]["train"]["process_cpu_cores"]
    if own is not None:  # a fit under 0.25 s of training would have no host span
        assert 0 <= own["mean"] <= psutil.cpu_count()


def test_a_reading_the_board_does_not_support_is_named_and_the_rest_are_reported(tmp_path, simulated_gpu,
                                                                                 monkeypatch):
    nvml = ActiveNvml(fail={"nvmlDeviceGetTemperature": pynvml.NVMLError_NotSupported()})
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: nvml)
    monitor = VRAMMonitor(nvml_interval_s=60)
    fit(tmp_path, [Ticker(monitor, nvml, {"train": [55], "validation": [5]}), monitor], max_epochs=1)
    activity = find_summary(tmp_path)["vram"]["activity"]
    assert activity["phases"]["train"]["temperature_c"] is None
    assert "NVMLError_NotSupported" in activity["unavailable"]["temperature_c"]
    assert list(activity["unavailable"]) == ["temperature_c"]
    assert activity["phases"]["train"]["gpu_util_pct"]["mean"] == 55.0
    assert activity["phases"]["validation"]["gpu_util_pct"]["mean"] == 5.0
    assert "gpu/temperature_c" not in read_scalars(tmp_path)


def test_nvml_absent_says_why_and_host_figures_go_on(tmp_path, simulated_gpu):
    # this machine has the pynvml package but no NVML library: the real LibraryNotFound path
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], max_epochs=1)
    activity = find_summary(tmp_path)["vram"]["activity"]
    for name in GPU_READINGS:
        assert "NVMLError_LibraryNotFound" in activity["unavailable"][name], name
        # a phase appears once the sampler ticked in it (under load a short phase may see none): no GPU figure
        assert (activity["phases"].get("train") or {}).get(name) is None
    assert not set(HOST_READINGS) & set(activity["unavailable"])
    assert activity["source"] == "psutil + schedstat"


def test_cpu_run_and_switched_off(tmp_path, caplog):
    with caplog.at_level("INFO"):
        fit(tmp_path / "cpu", [VRAMMonitor(nvml_interval_s=0.01)], max_epochs=1)
    activity = find_summary(tmp_path / "cpu")["vram"]["activity"]
    assert "NVML applies to CUDA devices, this run is on cpu" == activity["unavailable"]["gpu_util_pct"]
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("VRAMMonitor activity"))
    assert "GPU" not in line  # no GPU figure claimed on a CPU run
    fit(tmp_path / "off", [VRAMMonitor(activity=False)], max_epochs=1)
    vram = find_summary(tmp_path / "off")["vram"]
    assert vram["activity"] is None and vram["unavailable"]["activity"] == "switched off (`activity=False`)"
    assert not [k for k in read_scalars(tmp_path / "off") if k.startswith(("gpu/", "host/"))]


def test_the_verdict_puts_gpu_idle_beside_host_cpu(tmp_path, simulated_gpu, monkeypatch, caplog):
    nvml = ActiveNvml()
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: nvml)
    monitor = VRAMMonitor(nvml_interval_s=60)
    with caplog.at_level("INFO"):
        fit(tmp_path, [Ticker(monitor, nvml, {"train": [60, 0, 60, 60], "validation": [10]}), monitor],
            max_epochs=1)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("VRAMMonitor activity"))
    assert "train: GPU busy 45% (p5 0%)" in line and "validation: GPU busy 10% (p5 10%)" in line, line


def test_bad_activity_argument_names_it():
    with pytest.raises(ValueError, match=r"VRAMMonitor\(activity='no'\)"):
        VRAMMonitor(activity="no")


class DeviceBusyProbe(Callback):
    """An independent measure of how busy the GPU was in training: CUDA events at each batch's start and end (the
    device time of the step's kernels, queued back to back) over the host's wall time from train start to train end.
    The gaps between steps, where the device waits for the host, are what it leaves out."""

    def __init__(self, idle: bool = False):
        self.idle = idle  # after each step, wait for it and leave the device idle as long as it was busy

    def on_train_start(self, trainer, pl_module):
        self.pairs, self.t0 = [], time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.pairs.append([torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)])
        self.pairs[-1][0].record()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        start, end = self.pairs[-1]
        end.record()
        if self.idle:
            end.synchronize()
            time.sleep(start.elapsed_time(end) / 1000.0)

    def on_train_end(self, trainer, pl_module):
        torch.cuda.synchronize()
        wall_ms = 1000 * (time.perf_counter() - self.t0)
        self.busy_pct = 100 * sum(a.elapsed_time(b) for a, b in self.pairs) / wall_ms


@pytest.mark.gpu
@pytest.mark.parametrize("idle", [False, True], ids=["busy", "half idle"])
def test_real_nvml_utilisation_matches_the_device_time_of_the_steps(tmp_path, idle):
    class Matmuls(TinyModel):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.randn(4096, 4096))

        def training_step(self, batch, batch_idx):
            x = self.a
            for _ in range(16):  # tens of ms of kernels a step, queued ahead of the host
                x = (x @ self.a) / 64.0
            return super().training_step(batch, batch_idx) + 0.0 * x.mean()

        def train_dataloader(self):
            return make_loader(n=8 * (160 if idle else 320))  # one epoch, ~10 s on an H100

    # one long epoch and no checkpoint: the first H100 run (40 epochs of 8 steps, a 64 MB checkpoint written at
    # each epoch end while the device waited) read 61% busy, and NVML was right
    probe = DeviceBusyProbe(idle)
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.05), probe], model=Matmuls(), accelerator="gpu", max_epochs=1,
        limit_val_batches=0, num_sanity_val_steps=0, enable_checkpointing=False)
    activity = find_summary(tmp_path)["vram"]["activity"]
    if "gpu_util_pct" in activity["unavailable"]:
        pytest.skip(f"NVML utilisation is unavailable here: {activity['unavailable']['gpu_util_pct']}")
    train = activity["phases"]["train"]
    assert train["gpu_util_pct"]["samples"] >= 100
    # the loop keeps the device busy, or half idle by construction: two points, so a figure stuck high fails one
    assert (30 < probe.busy_pct < 70) if idle else (probe.busy_pct > 80), probe.busy_pct
    # NVML's figure is a share of its own sample period (up to 1 s), so its first samples still see the idle device
    # before the first kernel: within 15 points of the events' share over ~10 s
    assert train["gpu_util_pct"]["mean"] == pytest.approx(probe.busy_pct, abs=15), (train, probe.busy_pct)
    if train["power_w"] is not None:
        assert train["power_w"]["mean"] > 50
    if train["sm_clock_mhz"] is not None:
        assert train["sm_clock_mhz"]["mean"] > 300
